"""What the OpenAPI document says of errors: each operation lists the statuses it really answers,
every one of them in the API's one error shape (``ErrorResponse``).

FastAPI on its own lists a 422 ``HTTPValidationError`` for every operation with parameters or a
body; this API answers a malformed request 400 in its own shape (``app._validation_error``), and
422 only for a query whose targets no variant meets. ``document_errors`` drops FastAPI's 422
where an operation does not list one of its own, and lists what the app answers before any route:
a 400 for a repeated query parameter, a 415 for a JSON body sent as another content type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query

from modelless.api.schemas import ErrorResponse
from modelless.validation import NAME_SCHEMA

# Path and query parameters that name an app, a model or a pipeline: the name rule in the schema
# (the routes check it themselves, answering 400 in the API's shape).
NamePath = Annotated[str, Path(json_schema_extra=NAME_SCHEMA)]
NameQuery = Annotated[str, Query(json_schema_extra=NAME_SCHEMA)]

ERROR_STATUSES: dict[int, str] = {
    400: "bad_request, invalid_input, invalid_model or invalid_job: the request is malformed or "
    "breaks a rule the message names",
    401: "unauthorized: no API key, or one this deployment does not know",
    403: "forbidden: the key belongs to another app, or the call needs the admin key",
    404: "not_found: what the request names does not exist (in the caller's app)",
    409: "conflict, not_ready or idempotency_conflict: the name is taken, the model is not ready "
    "yet, or the Idempotency-Key was used for another request",
    413: "payload_too_large: the body exceeds its limit (details.limit, and the setting that sets it)",
    415: "unsupported_media_type: a content type the operation (or this model) does not take",
    422: "targets_unreachable: no variant meets the latency and accuracy targets (names the closest)",
    501: "planner_unavailable: this deployment's gateway cannot run the pipeline planner",
    503: "store_unavailable, store_emptied or another part down or busy for now: retry after "
    "Retry-After seconds",
    500: "internal_error: an unexpected failure, logged under the reply's X-Correlation-Id",
}

RETRY_AFTER_HEADER: dict[str, Any] = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}

# What every operation behind an API key can answer besides its own errors.
AUTHENTICATED = (401, 503)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for these error statuses, each in the error shape; 500 always."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, 500}):
        response: dict[str, Any] = {"model": ErrorResponse, "description": ERROR_STATUSES[status]}
        if status == 503:
            response["headers"] = RETRY_AFTER_HEADER
        responses[status] = response
    return responses


def document_errors(app: FastAPI) -> None:
    """Make ``app.openapi()`` leave out FastAPI's own 422 (and its schemas) where an operation
    does not list a 422 of its own."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _drop_framework_422(schema)
            _document_middleware_errors(schema)
        return app.openapi_schema  # type: ignore[return-value]  # set by generate()

    app.openapi = openapi  # type: ignore[method-assign]


def _document_middleware_errors(schema: dict[str, Any]) -> None:
    """What the app answers before any route, listed where a route does not list it already:
    400 to a query string that repeats a parameter (every operation, ``api.query_strings``), and
    415 to a JSON body sent as another content type (``app._not_json``)."""
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            body = operation.get("requestBody", {}).get("content", {})
            responses = operation.setdefault("responses", {})
            for status in [400, 415] if "application/json" in body else [400]:
                responses.setdefault(
                    str(status), {"description": ERROR_STATUSES[status], "content": error_body}
                )
            operation["responses"] = dict(sorted(responses.items()))  # by status, as FastAPI lists them


def _drop_framework_422(schema: dict[str, Any]) -> None:
    framework_ref = "#/components/schemas/HTTPValidationError"
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            content = responses.get("422", {}).get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref") == framework_ref:
                del responses["422"]
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
