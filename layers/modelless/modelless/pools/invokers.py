"""How the dispatcher reaches compute: a pool worker over HTTP, or the Lambda tier.

The payload is the same for both (the cpu_worker Lambda event), so a query can move between a
worker and the Lambda tier without being re-encoded.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import httpx

from modelless.exceptions import ModellessError, ServiceUnavailableError


class WorkerUnreachableError(ServiceUnavailableError):
    """The chosen worker did not answer: the dispatcher may retry elsewhere."""

    code = "worker_unreachable"


class WorkerInvoker(Protocol):
    def invoke(self, address: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]: ...


class LambdaInvoker(Protocol):
    def invoke(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Run the payload on the Lambda tier; the result says whether it was a cold start."""


class HttpWorkerInvoker:
    def __init__(self) -> None:
        # One pooled keep-alive client: a connection set-up per query would dwarf small models.
        self._client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=64, max_connections=256))

    def invoke(self, address: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            response = self._client.post(f"{address}/invoke", json=payload, timeout=timeout_s)
        except httpx.HTTPError as error:
            raise WorkerUnreachableError(f"worker {address} did not answer: {error}") from error
        return raise_for_worker_error(response.status_code, response.json())

    def close(self) -> None:
        self._client.close()


def raise_for_worker_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """Turn a worker's or function's error reply back into the domain error it stands for."""
    if status < 400:
        return body
    error = body.get("error", {})
    raised = ModellessError(str(error.get("message", "worker failed")))
    raised.status_code = status if status < 500 else 502
    raised.code = str(error.get("code", "worker_error"))
    raise raised


class AwsLambdaInvoker:
    """The Lambda tier in AWS: synchronous ``lambda:Invoke`` of the cpu_worker function."""

    def __init__(self, function_name: str, client: Any | None = None) -> None:
        import boto3

        self._function = function_name
        self._lambda = client or boto3.client("lambda")

    def invoke(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        response = self._lambda.invoke(
            FunctionName=self._function, InvocationType="RequestResponse", Payload=json.dumps(payload)
        )
        body: dict[str, Any] = json.loads(response["Payload"].read())
        if response.get("FunctionError"):
            raise ServiceUnavailableError(f"Lambda tier failed: {body.get('errorMessage', body)}")
        return raise_for_worker_error(int(body.get("statusCode", 200)), body)
