"""A small threaded HTTP server for worker processes (stdlib only: fast start-up). It speaks
JSON, and binary frames (``modelless.serving.wire``) to a caller that sends them: the gateway's
invocations, whose tensors cross as raw bytes."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from modelless.exceptions import ModellessError
from modelless.serving.wire import FRAMES_MEDIA_TYPE, decode_frames, encode_frames, to_json_message

Route = Callable[[dict[str, Any]], dict[str, Any]]


# Graceful stop: wait for requests in flight, and for a quiet spell in which callers that had
# not yet heard of the stop (a dispatcher's cached view of the workers) stop coming.
DRAIN_QUIET_S = 0.3
DRAIN_LIMIT_S = 4.0  # under the parent's 5 s before it kills the process
# ``shutdown()`` returns at the serving loop's next poll: socketserver's 0.5 s would be most of a
# stop's time.
SHUTDOWN_POLL_S = 0.05


class JsonServer(ThreadingHTTPServer):
    """Counts requests in flight so that a stop can wait for them (no answer is lost)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._in_flight = 0
        self._last_request = time.monotonic()
        self._idle = threading.Condition()
        # When each request in flight started (monotonic), by a token of its own: the age of the
        # oldest is what a health check compares with an inference deadline (a hung run).
        self._started: dict[object, float] = {}

    def request_started(self) -> object:
        """Count a request in; returns the token ``request_finished`` takes."""
        token = object()
        with self._idle:
            self._in_flight += 1
            self._last_request = time.monotonic()
            self._started[token] = self._last_request
        return token

    def request_finished(self, token: object) -> None:
        with self._idle:
            self._in_flight -= 1
            self._last_request = time.monotonic()
            self._started.pop(token, None)
            self._idle.notify_all()

    def serve_forever(self, poll_interval: float = SHUTDOWN_POLL_S) -> None:
        super().serve_forever(poll_interval)

    @property
    def in_flight(self) -> int:
        with self._idle:
            return self._in_flight

    def oldest_in_flight_s(self) -> float:
        """How long the oldest request in flight has been running (0 when none is)."""
        with self._idle:
            oldest = min(self._started.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def drain(self, quiet_s: float = DRAIN_QUIET_S, limit_s: float = DRAIN_LIMIT_S) -> bool:
        """Wait until no request is in flight and none came for ``quiet_s``; at most ``limit_s``.
        Returns whether it drained (False: requests still running at the limit)."""
        deadline = time.monotonic() + limit_s
        with self._idle:
            while True:
                now = time.monotonic()
                quiet_until = self._last_request + quiet_s
                if self._in_flight == 0 and now >= quiet_until:
                    return True
                if now >= deadline:
                    return False
                self._idle.wait(min(deadline, max(quiet_until, now + 0.01)) - now)


def stop_gracefully_on_sigterm(server: JsonServer, before_drain: Callable[[], None] = lambda: None) -> None:
    """On SIGTERM (a scale-down): call ``before_drain`` (stop reporting as available), let the
    requests in flight finish, then end ``serve_forever``."""

    def drain_then_shutdown() -> None:
        before_drain()
        server.drain()
        server.shutdown()

    def on_sigterm(signum: int, frame: object) -> None:
        # shutdown() blocks until serve_forever returns: never call it on the serving thread.
        threading.Thread(target=drain_then_shutdown, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)


def make_server(host: str, port: int, routes: dict[tuple[str, str], Route]) -> JsonServer:
    """A server of ``routes``, and of ``GET /health`` (``health_route``) unless they have one."""
    table = dict(routes)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses its connections

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm
            # meets the client's delayed ACK and every reply waits ~40 ms.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _handle(self, method: str) -> None:
            # Per request: one handler serves every request of a keep-alive connection.
            framed = (self.headers.get("Content-Type") or "").startswith(FRAMES_MEDIA_TYPE)
            self._framed_reply = framed or FRAMES_MEDIA_TYPE in (self.headers.get("Accept") or "")
            route = table.get((method, self.path.split("?")[0]))
            if route is None:
                self._reply(
                    404, {"error": {"code": "not_found", "message": f"no route {method} {self.path}"}}
                )
                return
            length = int(self.headers.get("Content-Length") or 0)
            token = server.request_started()
            try:
                raw = self.rfile.read(length) if length else b""
                body = (decode_frames(raw) if framed else json.loads(raw)) if raw else {}
                self._reply(200, route(body))
            except ModellessError as error:
                self._reply(error.status_code, {"error": error.to_dict()})
            except Exception as error:  # a worker must answer, never drop the connection
                self._reply(
                    500, {"error": {"code": "worker_error", "message": f"{type(error).__name__}: {error}"}}
                )
            finally:
                server.request_finished(token)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        _framed_reply = False

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            if self._framed_reply:
                data, media_type = encode_frames(payload), FRAMES_MEDIA_TYPE
            else:
                data, media_type = json.dumps(to_json_message(payload)).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", media_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # request logs would swamp the stack's output; monitoring reports the numbers

    server = JsonServer((host, port), Handler)
    table.setdefault(("GET", "/health"), health_route(server))
    return server


def health_route(server: JsonServer) -> Route:
    """``GET /health``: the process serves HTTP, and how long its oldest request has been running
    (a pool provider's probe takes a run far past any deadline for a hung worker)."""
    return lambda _: {
        "ok": True,
        "in_flight": server.in_flight,
        "oldest_in_flight_s": server.oldest_in_flight_s(),
    }


def announce_ready(server: JsonServer) -> None:
    """Tell the parent process which port the OS gave us (the first stdout line), and from now
    on stop when that parent is gone (``exit_with_parent``)."""
    sys.stdout.write(f"READY {server.server_address[1]}\n")
    sys.stdout.flush()
    exit_with_parent()


# Set by the process that spawned us (``modelless.pools.processes.spawn``): its pid.
PARENT_PID_ENV = "MODELLESS_PARENT_PID"
# Where the kernel cannot say when the parent exits (no pidfd), how often its pid is checked.
PARENT_CHECK_S = 0.1


def exit_with_parent() -> None:
    """A child of the embedded stack stops (SIGTERM to itself: a worker drains first) once the
    stack that started it is gone, even when the stack was killed without a chance to stop its
    children: an orphan would go on serving and reporting, and clash with the next stack's
    workers. The parent's exit is waited for on a pidfd (Linux 5.3: readable the moment the
    process exits), else ``getppid`` is polled; not ``PR_SET_PDEATHSIG``, which fires when the
    parent's *thread* that spawned us ends (the Lambda tier starts containers from short-lived
    threads). A process started otherwise (systemd on EC2) has no such parent and is left alone."""
    raw = os.environ.get(PARENT_PID_ENV)
    if not raw or not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        try:
            handle: int | None = os.pidfd_open(parent)
        except ProcessLookupError:
            handle = None  # gone already
        except (OSError, AttributeError):  # no pidfd here: poll
            handle = None
            while os.getppid() == parent:
                time.sleep(PARENT_CHECK_S)
        # Opened after the parent died and its pid was reused: the pidfd is another process's.
        if handle is not None and os.getppid() == parent:
            select.select([handle], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
