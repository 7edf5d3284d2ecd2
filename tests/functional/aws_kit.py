"""The AWS side of the function tests: an emulated AWS endpoint (moto's server) for S3 and Auto
Scaling, a real Redis, and the Lambda service for the functions' own invocations.

moto's server cannot run Lambda code without Docker, so ``InProcessLambda`` stands in for the
Lambda service: a botocore ``before-send`` hook on ``lambda:Invoke`` answers the request the
caller's real boto3 client built and serialised, by calling the target function's handler in this
process with the request's payload, and replies with what the Lambda API replies (200 and the
handler's JSON, ``X-Amz-Function-Error`` when it raised; 202 for an asynchronous invocation, whose
event is queued for the test to deliver, as Lambda's own queue would). Everything else the
functions call goes to the emulated endpoint unchanged.
"""

from __future__ import annotations

import base64
import copy
import importlib
import io
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote

import boto3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders

EVENTS = Path(__file__).resolve().parents[2] / "events"

Handler = Callable[[dict[str, Any], Any], Any]


def sample_event(name: str) -> dict[str, Any]:
    """A fresh copy of one of the sample events under events/."""
    loaded: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return loaded


def fresh_import(module: str) -> ModuleType:
    """Import a function module as a new container would: its module-level set-up runs again."""
    sys.modules.pop(module, None)
    return importlib.import_module(module)


class LambdaContext:
    """The attributes of Lambda's context object that Powertools reads."""

    def __init__(
        self, function_name: str, memory_mb: int = 1024, request_id: str = "req-1", remaining_ms: int = 30_000
    ) -> None:
        self.function_name = function_name
        self._remaining_ms = remaining_ms
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.aws_request_id = request_id
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2026/11/22/[$LATEST]0123456789abcdef"

    def get_remaining_time_in_millis(self) -> int:
        return self._remaining_ms


class _Body(io.BytesIO):
    """A raw HTTP body as botocore reads one (``stream()`` for parsed replies, ``read()`` for
    streaming payloads such as Invoke's)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


@dataclass
class Invocation:
    function: str
    invocation_type: str
    event: dict[str, Any]


@dataclass
class InProcessLambda:
    handlers: dict[str, Handler] = field(default_factory=dict)
    invocations: list[Invocation] = field(default_factory=list)
    queued: list[Invocation] = field(default_factory=list)  # asynchronous events not yet delivered

    def register(self, function: str, handler: Handler) -> None:
        """``function``: a name, or an ARN with or without a qualifier (as the caller names it)."""
        self.handlers[function] = handler

    def install(self) -> None:
        """Answer lambda:Invoke for every boto3 client created from now on in this process."""
        session = boto3.Session()
        # A before-send handler that returns a response stands in for the HTTP exchange.
        session.events.register("before-send.lambda.Invoke", self._on_invoke)  # type: ignore[arg-type]
        boto3.DEFAULT_SESSION = session

    def _on_invoke(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        # POST /2015-03-31/functions/{FunctionName}/invocations
        path = request.url.split("/functions/", 1)[1].split("/invocations", 1)[0]
        function = unquote(path)
        invocation_type = request.headers.get("X-Amz-Invocation-Type", b"RequestResponse")
        if isinstance(invocation_type, bytes):
            invocation_type = invocation_type.decode()
        event = json.loads(_body_bytes(request.body) or b"{}")
        invocation = Invocation(function, invocation_type, event)
        self.invocations.append(invocation)
        if function not in self.handlers:
            return _reply(
                request.url,
                404,
                {"Type": "User", "Message": f"Function not found: {function}"},
                {"X-Amzn-ErrorType": "ResourceNotFoundException"},
            )
        if invocation_type == "Event":
            self.queued.append(invocation)
            return _reply(request.url, 202, None)
        try:
            result = self.handlers[function](copy.deepcopy(event), LambdaContext(function.split(":")[-1]))
        except Exception as error:
            return _reply(
                request.url,
                200,
                {
                    "errorMessage": str(error),
                    "errorType": type(error).__name__,
                    "stackTrace": traceback.format_exception(error),
                },
                {"X-Amz-Function-Error": "Unhandled"},
            )
        return _reply(request.url, 200, result)

    def deliver(self) -> list[Any]:
        """Run the queued asynchronous invocations, as Lambda's event queue would."""
        results = []
        while self.queued:
            invocation = self.queued.pop(0)
            handler = self.handlers[invocation.function]
            results.append(handler(copy.deepcopy(invocation.event), LambdaContext(invocation.function)))
        return results


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    data = body.read()
    return data.encode() if isinstance(data, str) else bytes(data)


def _reply(url: str, status: int, body: Any, headers: dict[str, str] | None = None) -> AWSResponse:
    data = b"" if body is None else json.dumps(body).encode()
    all_headers = HTTPHeaders()  # case-insensitive, as the HTTP layer hands botocore its headers
    for name, value in {"Content-Type": "application/json", "X-Amz-Executed-Version": "$LATEST"}.items():
        all_headers[name] = value
    for name, value in (headers or {}).items():
        all_headers[name] = value
    return AWSResponse(url, status, all_headers, _Body(data))


def multipart_parts(event: dict[str, Any]) -> dict[str, bytes]:
    """The form fields of a (base64) multipart API Gateway event, by name."""
    body = base64.b64decode(event["body"]) if event.get("isBase64Encoded") else event["body"].encode()
    boundary = event["headers"]["content-type"].split("boundary=", 1)[1].encode()
    parts: dict[str, bytes] = {}
    for chunk in body.split(b"--" + boundary)[1:-1]:
        head, _, content = chunk.strip(b"\r\n").partition(b"\r\n\r\n")
        name = head.split(b'name="', 1)[1].split(b'"', 1)[0].decode()
        parts[name] = content
    return parts
