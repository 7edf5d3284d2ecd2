"""The dispatcher's HTTP client for workers (``HttpWorkerInvoker``), against a small real HTTP
server on 127.0.0.1: replies and errors, pooled keep-alive connections, a connection the worker
closed while it sat idle, a worker that is gone, concurrent callers."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from modelless.exceptions import (
    ModellessError,
    ServiceUnavailableError,
    WorkerBusyError,
    WorkerUnreachableError,
)
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.wire import FRAMES_MEDIA_TYPE, binary_field, decode_frames, encode_frames


class Worker(ThreadingHTTPServer):
    daemon_threads = True
    # As the real worker's (modelless/worker/server.py): socketserver's backlog of 5 makes a
    # burst of concurrent callers see "connection reset" on a busy machine.
    request_queue_size = 1024
    close_after_reply = False  # drop each connection after its reply, without saying so
    requests = 0
    connections = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Worker

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_POST(self) -> None:
        self.server.requests += 1
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        # The invoker sends binary frames, as the real worker expects (modelless.wire).
        framed = self.headers["Content-Type"] == FRAMES_MEDIA_TYPE
        body = decode_frames(raw) if framed else json.loads(raw)
        reply: dict[str, Any]
        if body.get("fail"):
            status, reply = 404, {"error": {"code": "not_found", "message": "no such variant"}}
        elif body.get("busy"):
            status, reply = 503, {"error": {"code": "batch_timeout", "message": "batch did not complete"}}
        elif body.get("crash"):
            status, reply = 500, {"error": {"code": "worker_error", "message": "ValueError: bad"}}
        else:
            status, reply = 200, {"echo": body["n"], "path": self.path}
        data = encode_frames(reply) if framed else json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", FRAMES_MEDIA_TYPE if framed else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.server.close_after_reply:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def worker() -> Iterator[Worker]:
    server = Worker(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def address(server: Worker) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_replies_come_back_over_one_kept_alive_connection(worker: Worker, invoker: HttpWorkerInvoker) -> None:
    for n in range(5):
        assert invoker.invoke(address(worker), {"n": n}, 5.0) == {"echo": n, "path": "/invoke"}
    assert worker.requests == 5
    assert worker.connections == 1


def test_a_worker_that_answers_json_is_read_as_json(invoker: HttpWorkerInvoker) -> None:
    class JsonOnly(Handler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps({"outputs_npy_b64": "AAEC"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = Worker(("127.0.0.1", 0), JsonOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        reply = invoker.invoke(address(server), {"inputs_npy": b"\x00\x01"}, 5.0)
        assert binary_field(reply, "outputs_npy") == b"\x00\x01\x02"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_worker_error_reply_becomes_the_domain_error(worker: Worker, invoker: HttpWorkerInvoker) -> None:
    with pytest.raises(ModellessError) as raised:
        invoker.invoke(address(worker), {"n": 1, "fail": True}, 5.0)
    assert raised.value.status_code == 404
    assert raised.value.code == "not_found"
    assert invoker.invoke(address(worker), {"n": 2}, 5.0)["echo"] == 2  # the connection lives on


def test_a_worker_503_is_a_retryable_busy_error_and_other_5xx_a_bad_gateway(
    worker: Worker, invoker: HttpWorkerInvoker
) -> None:
    with pytest.raises(WorkerBusyError) as busy:
        invoker.invoke(address(worker), {"n": 1, "busy": True}, 5.0)
    assert busy.value.status_code == 503
    assert busy.value.code == "batch_timeout"  # the worker's own code is kept
    assert busy.value.message == "batch did not complete"

    with pytest.raises(ModellessError) as crashed:
        invoker.invoke(address(worker), {"n": 2, "crash": True}, 5.0)
    assert not isinstance(crashed.value, ServiceUnavailableError)  # not retried: it would fail anywhere
    assert crashed.value.status_code == 502
    assert crashed.value.code == "worker_error"


def test_a_connection_the_worker_closed_while_idle_is_replaced(
    worker: Worker, invoker: HttpWorkerInvoker
) -> None:
    worker.close_after_reply = True
    for n in range(3):
        assert invoker.invoke(address(worker), {"n": n}, 5.0)["echo"] == n
    assert worker.requests == 3  # each request ran once: no retry sent a request twice
    assert worker.connections == 3


def test_a_worker_that_is_gone_is_unreachable(invoker: HttpWorkerInvoker) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WorkerUnreachableError):
        invoker.invoke(f"http://127.0.0.1:{port}", {"n": 1}, 2.0)


def test_a_stopped_worker_is_unreachable_on_a_pooled_connection(worker: Worker) -> None:
    invoker = HttpWorkerInvoker()
    try:
        assert invoker.invoke(address(worker), {"n": 1}, 5.0)["echo"] == 1
        target = address(worker)
        worker.shutdown()
        worker.server_close()
        worker.close_after_reply = True
        with pytest.raises(WorkerUnreachableError):
            # The pooled connection's handler thread still runs: it answers once and drops the
            # connection; the call after that finds nobody listening.
            for n in range(3):
                invoker.invoke(target, {"n": n}, 2.0)
    finally:
        invoker.close()


def test_concurrent_callers_each_get_their_own_reply(worker: Worker, invoker: HttpWorkerInvoker) -> None:
    replies: dict[int, int] = {}
    errors: list[BaseException] = []

    def call(n: int) -> None:
        try:
            replies[n] = invoker.invoke(address(worker), {"n": n}, 5.0)["echo"]
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert replies == {n: n for n in range(32)}
