"""A small threaded JSON-over-HTTP server for worker processes (stdlib only: fast start-up)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from modelless.exceptions import ModellessError

Route = Callable[[dict[str, Any]], dict[str, Any]]


def make_server(host: str, port: int, routes: dict[tuple[str, str], Route]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses its connections

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm
            # meets the client's delayed ACK and every reply waits ~40 ms.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _handle(self, method: str) -> None:
            route = routes.get((method, self.path.split("?")[0]))
            if route is None:
                self._reply(
                    404, {"error": {"code": "not_found", "message": f"no route {method} {self.path}"}}
                )
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length)) if length else {}
                self._reply(200, route(body))
            except ModellessError as error:
                self._reply(error.status_code, {"error": error.to_dict()})
            except Exception as error:  # a worker must answer, never drop the connection
                self._reply(
                    500, {"error": {"code": "worker_error", "message": f"{type(error).__name__}: {error}"}}
                )

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # request logs would swamp the stack's output; monitoring reports the numbers

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def announce_ready(server: ThreadingHTTPServer) -> None:
    """Tell the parent process which port the OS gave us (the first stdout line)."""
    sys.stdout.write(f"READY {server.server_address[1]}\n")
    sys.stdout.flush()
