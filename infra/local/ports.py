"""A free TCP port on 127.0.0.1, for the local servers the stack, the benchmarks and the tests
start (Redis, gateways, workers on a fixed port)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS had free a moment ago. Another process may take it before it is bound again:
    callers that cannot retry bind it themselves (port 0) where they can."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
