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

import numpy as np
import pytest

from modelless.exceptions import (
    ModellessError,
    ProtocolMismatchError,
    ServiceUnavailableError,
    WorkerBusyError,
    WorkerUnreachableError,
)
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.wire import FRAMES_MEDIA_TYPE, decode_frames, encode_frames, to_json_message
from tests.unit.dispatch_kit import make_variant

VARIANT = make_variant("echo")


def numbered(n: int, correlation_id: str = "q") -> Invocation:
    """An invocation whose one input is ``n``; the fake worker answers it with ``n`` as its
    output, and behaves as its correlation id says (``fail``, ``busy``, ``crash``, ``old``)."""
    return Invocation(VARIANT, np.full((1, 1), n, dtype=np.int64), correlation_id)


def echo(reply: Reply) -> int:
    return int(reply.outputs[0, 0])


class Worker(ThreadingHTTPServer):
    daemon_threads = True
    # As the real worker's (modelless/worker/server.py): socketserver's backlog of 5 makes a
    # burst of concurrent callers see "connection reset" on a busy machine.
    request_queue_size = 1024
    close_after_reply = False  # drop each connection after its reply, without saying so
    requests = 0
    connections = 0
    paths: list[str]

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.paths = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Worker

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_POST(self) -> None:
        self.server.requests += 1
        self.server.paths.append(self.path)
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        # The invoker sends binary frames, as the real worker expects (modelless.serving.wire).
        framed = self.headers["Content-Type"] == FRAMES_MEDIA_TYPE
        invocation = Invocation.from_message(decode_frames(raw) if framed else json.loads(raw))
        behaviour = invocation.correlation_id
        reply: dict[str, Any]
        if behaviour == "fail":
            status, reply = 404, {"error": {"code": "not_found", "message": "no such variant"}}
        elif behaviour == "busy":
            status, reply = 503, {"error": {"code": "batch_timeout", "message": "batch did not complete"}}
        elif behaviour == "crash":
            status, reply = 500, {"error": {"code": "worker_error", "message": "ValueError: bad"}}
        else:
            status, reply = 200, Reply(outputs=invocation.inputs, batch=invocation.rows).to_message()
            if behaviour == "old":  # a worker of a release from before protocol versions
                del reply["version"]
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
        reply = invoker.invoke(address(worker), numbered(n), 5.0)
        assert echo(reply) == n and reply.batch == 1
    assert worker.paths == ["/invoke"] * 5
    assert worker.requests == 5
    assert worker.connections == 1


def test_a_worker_that_answers_json_is_read_as_json(invoker: HttpWorkerInvoker) -> None:
    class JsonOnly(Handler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            reply = Reply(outputs=np.arange(3, dtype=np.uint8).reshape(1, 3), batch=1, inference_ms=2.0)
            data = json.dumps(to_json_message(reply.to_message())).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = Worker(("127.0.0.1", 0), JsonOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        reply = invoker.invoke(address(server), numbered(1), 5.0)
        np.testing.assert_array_equal(reply.outputs, [[0, 1, 2]])
        assert reply.outputs.dtype == np.uint8 and reply.inference_ms == 2.0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_worker_error_reply_becomes_the_domain_error(worker: Worker, invoker: HttpWorkerInvoker) -> None:
    with pytest.raises(ModellessError) as raised:
        invoker.invoke(address(worker), numbered(1, "fail"), 5.0)
    assert raised.value.status_code == 404
    assert raised.value.code == "not_found"
    assert echo(invoker.invoke(address(worker), numbered(2), 5.0)) == 2  # the connection lives on


def test_a_reply_of_another_protocol_version_is_a_protocol_mismatch(
    worker: Worker, invoker: HttpWorkerInvoker
) -> None:
    with pytest.raises(ProtocolMismatchError) as raised:
        invoker.invoke(address(worker), numbered(1, "old"), 5.0)
    assert raised.value.status_code == 502
    assert raised.value.code == "protocol_mismatch"
    assert echo(invoker.invoke(address(worker), numbered(2), 5.0)) == 2  # the connection lives on


def test_a_worker_503_is_a_retryable_busy_error_and_other_5xx_a_bad_gateway(
    worker: Worker, invoker: HttpWorkerInvoker
) -> None:
    with pytest.raises(WorkerBusyError) as busy:
        invoker.invoke(address(worker), numbered(1, "busy"), 5.0)
    assert busy.value.status_code == 503
    assert busy.value.code == "batch_timeout"  # the worker's own code is kept
    assert busy.value.message == "batch did not complete"

    with pytest.raises(ModellessError) as crashed:
        invoker.invoke(address(worker), numbered(2, "crash"), 5.0)
    assert not isinstance(crashed.value, ServiceUnavailableError)  # not retried: it would fail anywhere
    assert crashed.value.status_code == 502
    assert crashed.value.code == "worker_error"


def test_a_connection_the_worker_closed_while_idle_is_replaced(
    worker: Worker, invoker: HttpWorkerInvoker
) -> None:
    worker.close_after_reply = True
    for n in range(3):
        assert echo(invoker.invoke(address(worker), numbered(n), 5.0)) == n
    assert worker.requests == 3  # each request ran once: no retry sent a request twice
    assert worker.connections == 3


def test_a_worker_that_is_gone_is_unreachable(invoker: HttpWorkerInvoker) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WorkerUnreachableError):
        invoker.invoke(f"http://127.0.0.1:{port}", numbered(1), 2.0)


def test_a_stopped_worker_is_unreachable_on_a_pooled_connection(worker: Worker) -> None:
    invoker = HttpWorkerInvoker()
    try:
        assert echo(invoker.invoke(address(worker), numbered(1), 5.0)) == 1
        target = address(worker)
        worker.shutdown()
        worker.server_close()
        worker.close_after_reply = True
        with pytest.raises(WorkerUnreachableError):
            # The pooled connection's handler thread still runs: it answers once and drops the
            # connection; the call after that finds nobody listening.
            for n in range(3):
                invoker.invoke(target, numbered(n), 2.0)
    finally:
        invoker.close()


def test_concurrent_callers_each_get_their_own_reply(worker: Worker, invoker: HttpWorkerInvoker) -> None:
    replies: dict[int, int] = {}
    errors: list[BaseException] = []

    def call(n: int) -> None:
        try:
            replies[n] = echo(invoker.invoke(address(worker), numbered(n), 5.0))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert replies == {n: n for n in range(32)}
