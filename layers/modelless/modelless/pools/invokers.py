"""How the dispatcher reaches compute: a pool worker over HTTP, or the Lambda tier.

Both take an ``Invocation`` and give back a ``Reply`` (``modelless.serving.invocation``), so a query can
move between a worker and the Lambda tier as it is; each encodes it for its transport
(``modelless.serving.wire``: frames to a worker, JSON to a Lambda function).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from modelless.exceptions import (
    ModellessError,
    ServiceUnavailableError,
    WorkerBusyError,
    WorkerUnreachableError,
)
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.wire import FRAMES_MEDIA_TYPE, decode_frames, encode_frames, to_json_message


class WorkerInvoker(Protocol):
    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply: ...


class LambdaInvoker(Protocol):
    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        """Run the invocation on the Lambda tier; the reply says whether it was a cold start."""


class HttpWorkerInvoker:
    """POSTs invocations to workers over keep-alive HTTP/1.1 connections, pooled per worker, in
    binary frames (``modelless.serving.wire``): a query's tensor crosses the hop as raw ``.npy`` bytes.

    The standard library's ``http.client``, not httpx: this call is on every query's path, and
    httpx spent ~1.0-1.3 ms of the gateway's CPU per call (request and response models, cookie
    extraction) against ~0.33 ms here, measured sequentially against a real worker on a 2-core VM
    (see docs/bench/serving.md). Thread-safe: each call has a connection to itself.
    """

    MAX_IDLE_PER_WORKER = 64  # connections kept open per worker once their calls are done

    def __init__(self) -> None:
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply:
        body = encode_frames(invocation.to_message())  # binary: the inputs go raw, not as base64 in JSON
        for attempt in range(2):
            connection, reused = self._checkout(address, timeout_s)
            try:
                if connection.sock is not None:
                    connection.sock.settimeout(timeout_s)
                connection.request(
                    "POST", "/invoke", body, {"Content-Type": FRAMES_MEDIA_TYPE, "Accept": FRAMES_MEDIA_TYPE}
                )
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                if reused and attempt == 0 and not isinstance(error, TimeoutError):
                    continue  # the worker had closed this idle connection: once more, on a new one
                raise WorkerUnreachableError(f"worker {address} did not answer: {error!r}") from error
            if response.will_close:
                connection.close()
            else:
                self._checkin(address, connection)
            framed = response.getheader("Content-Type", "").startswith(FRAMES_MEDIA_TYPE)
            message = decode_frames(data) if framed else json.loads(data)
            return Reply.from_message(raise_for_worker_error(response.status, message))
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _checkout(self, address: str, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(address)
            if idle:
                return idle.pop(), True
        url = urlsplit(address)
        if url.hostname is None:
            raise WorkerUnreachableError(f"worker address {address!r} has no host")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        connection = kind(url.hostname, url.port, timeout=timeout_s)
        try:
            connection.connect()
        except OSError as error:
            raise WorkerUnreachableError(f"worker {address} did not answer: {error!r}") from error
        # Request headers and body go out in separate writes: without NODELAY, Nagle's algorithm
        # would hold the body back for the worker's delayed ACK.
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, False

    def _checkin(self, address: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < self.MAX_IDLE_PER_WORKER:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


def raise_for_worker_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """Turn a worker's or function's error reply back into the domain error it stands for: a 4xx
    as itself, a 503 as ``WorkerBusyError`` (the dispatcher retries it elsewhere), any other 5xx
    as a 502 (the compute behind the gateway failed)."""
    if status < 400:
        return body
    error = body.get("error", {})
    message = str(error.get("message", "worker failed"))
    if status == 503:
        busy = WorkerBusyError(message)
        busy.code = str(error.get("code", busy.code))
        raise busy
    raised = ModellessError(message)
    raised.status_code = status if status < 500 else 502
    raised.code = str(error.get("code", "worker_error"))
    raise raised


def lambda_functions(setting: str) -> dict[int, str]:
    """The Lambda tier's functions from ``MODELLESS_LAMBDA_FUNCTION``: one name (or ARN) for every
    variant, or ``1769=name-a,3538=name-b``, a function per memory size (a Lambda function has one
    memory size, and a variant placed at 3,538 MB must run with that memory's two vCPUs). A plain
    entry is the default, key 0."""
    functions: dict[int, str] = {}
    for entry in (e.strip() for e in setting.split(",")):
        if not entry:
            continue
        memory, sep, name = entry.partition("=")
        if not sep:
            functions[0] = entry
        elif memory.strip().isdigit() and name.strip():
            functions[int(memory)] = name.strip()
        else:
            raise ValueError(f"Lambda tier entry {entry!r} is not NAME or MEMORY_MB=NAME")
    return functions


THROTTLED = {"TooManyRequestsException", "EC2ThrottledException", "ResourceNotReadyException"}


class AwsLambdaInvoker:
    """The Lambda tier in AWS: synchronous ``lambda:Invoke`` of the cpu_worker function that has
    the variant's memory size (its profile's ``memory_mb``)."""

    def __init__(self, functions: str | Mapping[int, str], client: Any | None = None) -> None:
        from modelless import aws_clients

        self._functions = lambda_functions(functions) if isinstance(functions, str) else dict(functions)
        if not self._functions:
            raise ValueError("the Lambda tier needs at least one function")
        self._lambda = client or aws_clients.client("lambda")

    def function_for(self, memory_mb: int) -> str:
        """The function of exactly this memory size, else the default, else the smallest larger one
        (never a smaller one: the variant was profiled with at least this many vCPUs)."""
        if memory_mb in self._functions:
            return self._functions[memory_mb]
        if 0 in self._functions:
            return self._functions[0]
        larger = sorted(m for m in self._functions if m > memory_mb)
        return self._functions[larger[0] if larger else max(self._functions)]

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        from botocore.exceptions import ClientError

        function = self.function_for(invocation.variant.memory_mb)
        try:
            response = self._lambda.invoke(
                FunctionName=function,
                InvocationType="RequestResponse",
                Payload=json.dumps(to_json_message(invocation.to_message())),
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in THROTTLED:
                raise ServiceUnavailableError(f"Lambda tier is at its concurrency limit ({code})") from error
            raise
        body: dict[str, Any] = json.loads(response["Payload"].read())
        if response.get("FunctionError"):
            raise ServiceUnavailableError(f"Lambda tier failed: {body.get('errorMessage', body)}")
        return Reply.from_message(raise_for_worker_error(int(body.get("statusCode", 200)), body))
