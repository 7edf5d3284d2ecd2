"""The FastAPI application: routers, correlation ids, size limits and error mapping.

Every error reply has one shape, ``{"error": {"code", "message", "details"?}}``: domain errors
with their own status, the framework's (unknown route, malformed body) as 4xx, and anything
unexpected as a 503 ``store_unavailable`` (the metadata store did not answer) or a 500
``internal_error``; every 503 carries ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import AsyncIterator

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from modelless import __version__
from modelless.api.limits import ASGIApp, BodyLimitMiddleware, Message, Receive, Scope, Send
from modelless.api.openapi import document_errors
from modelless.api.query_strings import StrictQueryStringMiddleware
from modelless.api.routers import apps, dashboard, feedback, models, offline, operations, pipelines, queries
from modelless.api.routers import metrics as prometheus_metrics
from modelless.api.services import Services
from modelless.exceptions import (
    ModellessError,
    ServiceUnavailableError,
    StoreUnavailableError,
    UnsupportedMediaTypeError,
    first_line,
)
from modelless.metadata.factory import unreachable_errors
from modelless.observability.metrics import logger

CORRELATION_HEADER = "X-Correlation-Id"


# Threads the gateway's blocking work runs on (anyio's pool; 40 by default). A query holds one
# while its worker computes, up to its deadline: with a worker hung, 40 would be taken in a second
# of load and every query behind them would wait for a thread. They mostly wait on sockets.
GATEWAY_THREADS = 256


@contextlib.asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = GATEWAY_THREADS
    yield


def create_app(services: Services) -> FastAPI:
    app = FastAPI(
        title="modelless",
        version=__version__,
        description="Model-less inference: register models, query by latency and accuracy targets.",
        lifespan=_lifespan,
    )
    app.state.services = services
    _include_routers(app)
    document_errors(app)  # the OpenAPI document lists each operation's real errors, in this shape
    _add_middleware(app, services)
    _add_error_handlers(app)
    return app


def _include_routers(app: FastAPI) -> None:
    for router in (
        apps.router,
        models.router,
        queries.router,
        feedback.router,
        pipelines.router,
        offline.router,
        operations.router,
        prometheus_metrics.router,
        dashboard.router,
    ):
        app.include_router(router)


def _add_middleware(app: FastAPI, services: Services) -> None:
    """The middleware, innermost first (each one added wraps those before it)."""
    app.add_middleware(
        BodyLimitMiddleware,
        limit_for_path=lambda path: _body_limit(services, path),
        setting_for_path=lambda path: _body_limit_setting(services, path),
    )
    app.add_middleware(StrictQueryStringMiddleware)  # a repeated parameter is a 400 before any route
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(CorrelationMiddleware)  # outermost: error replies carry the id too


def _add_error_handlers(app: FastAPI) -> None:
    """Domain errors, the framework's own and refused request bodies, all in the API's shape."""
    app.exception_handler(ModellessError)(_domain_error)

    # A closure: a 405's Allow asks the routes of this very app.
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return _framework_error_response(app, request, error)

    app.exception_handler(RequestValidationError)(_validation_error)


async def _domain_error(_: Request, error: ModellessError) -> JSONResponse:
    if isinstance(error, ServiceUnavailableError):
        # Retryable and expected while a part heals (a store outage answers every request
        # so): a warning, not an error per request; the failing part logs its own outage.
        logger.warning("request refused for now", extra={"error": error.to_dict()})
    elif error.status_code >= 500:
        logger.error("request failed", extra={"error": error.to_dict()})
    return _error_response(error)


def _framework_error_response(app: FastAPI, request: Request, error: StarletteHTTPException) -> JSONResponse:
    # Raised by the framework itself (unknown route, unparsable multipart, wrong method):
    # answered in the same shape as every other error.
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "bad_request")
    headers = dict(getattr(error, "headers", None) or {})
    message = str(error.detail)
    if error.status_code == 405:
        # Starlette's Allow names the methods of the first route matching the path only; a
        # path served by several (GET and POST /v1/pipelines) has them all.
        allowed = allowed_methods(app, request.scope)
        headers["Allow"] = ", ".join(allowed)
        message = f"{request.method} is not allowed on {request.url.path}; it allows {', '.join(allowed)}"
    return JSONResponse(
        status_code=error.status_code,
        content={"error": {"code": code, "message": message}},
        headers=headers or None,
    )


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    if _body_not_read_as_json(error):
        return _error_response(_not_json(request.headers.get("content-type")))
    problems = [
        f"{'.'.join(str(p) for p in item.get('loc', ()))}: {item.get('msg', 'invalid')}"
        for item in error.errors()
    ]
    return JSONResponse(
        status_code=400,
        content={
            "error": {
                "code": "bad_request",
                "message": "; ".join(problems),
                "details": {"problems": problems},
            }
        },
    )


class CorrelationMiddleware:
    """Every request gets a correlation id (the caller's ``X-Correlation-Id``, else a new one): in
    the logs, in ``request.state.correlation_id`` and echoed in the reply's header.

    Plain ASGI rather than ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware runs the
    rest of the app in a task of its own and streams the response through it, which cost the
    gateway more CPU per query than selection does (measured with py-spy on the live stack)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = CORRELATION_HEADER.lower().encode()
        given = next((value for name, value in scope.get("headers") or () if name == header), b"")
        correlation_id = given.decode("latin-1") or uuid.uuid4().hex
        scope.setdefault("state", {})["correlation_id"] = correlation_id
        logger.set_correlation_id(correlation_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (header, correlation_id.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


class UnexpectedErrorMiddleware:
    """An exception no handler answered becomes a reply in the API's error shape: a redis-py
    error meaning the store is unreachable (raised outside the store's own translation) a 503
    ``store_unavailable``, anything else a 500 ``internal_error``, logged with its traceback.

    Not ``@app.exception_handler(Exception)``: Starlette runs that one in its outermost
    ServerErrorMiddleware, which sends the reply and then raises the exception again, after which
    uvicorn logs it a second time and closes the connection. Here the reply is the end of it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_noting_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_noting_start)
        except ClientDisconnect:
            # The caller went away mid-body (or the body limit cut it off, having answered 413):
            # no one is left to answer, and nothing was accepted. A line, not a traceback.
            logger.info(
                "client disconnected before its request was read", extra={"path": scope.get("path", "")}
            )
        except Exception as error:
            if started:
                raise  # part of a reply went out: nothing else can be said on this connection
            await _unexpected_error_response(error, scope)(scope, receive, send)


def _unexpected_error_response(error: Exception, scope: Scope) -> JSONResponse:
    if isinstance(error, unreachable_errors()):
        message = f"the metadata store does not answer ({first_line(error)}); try again shortly"
        return _error_response(StoreUnavailableError(message))
    correlation_id = scope.get("state", {}).get("correlation_id", "")
    logger.error(
        "unexpected error",
        exc_info=error,
        extra={"path": scope.get("path", ""), "error_type": type(error).__name__},
    )
    return JSONResponse(
        status_code=500,
        content={
            "error": {
                "code": "internal_error",
                "message": f"an unexpected error ({type(error).__name__}) ended this request; it is "
                f"logged under correlation id {correlation_id}",
            }
        },
    )


# The methods a 405's Allow may name (HTTP's, less CONNECT and TRACE, which no route serves).
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route of ``app`` fully matches at ``scope``'s path (asked of each route
    as the router itself asks, one method at a time)."""
    return [
        method
        for method in HTTP_METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in app.router.routes)
    ]


def _body_not_read_as_json(error: RequestValidationError) -> bool:
    """Whether a JSON body was refused whole as raw bytes: FastAPI reads a body as JSON only when
    its content type says so (application/json or +json), and hands the model the bytes else.
    (Bytes that were read as JSON and are not JSON are ``json_invalid``: a 400.)"""
    return any(
        item.get("loc") == ("body",)
        and isinstance(item.get("input"), bytes)
        and item.get("type") != "json_invalid"
        for item in error.errors()
    )


def _not_json(content_type: str | None) -> UnsupportedMediaTypeError:
    sent = f"is sent as {content_type!r}" if content_type else "is sent without a Content-Type"
    return UnsupportedMediaTypeError(
        f"this operation's body is JSON, and this one {sent}: send it with Content-Type: application/json",
        accepted=["application/json"],
        received=content_type,
    )


def _body_limit(services: Services, path: str) -> int:
    settings = services.settings
    return settings.register_body_limit if path.endswith("/register_model") else settings.max_query_bytes


def _body_limit_setting(services: Services, path: str) -> str | None:
    """The setting behind ``_body_limit``'s answer, named in the 413."""
    if path.endswith("/register_model"):
        return services.settings.register_body_setting
    return "MODELLESS_MAX_QUERY_BYTES"


def _error_response(error: ModellessError) -> JSONResponse:
    headers = None
    if isinstance(error, ServiceUnavailableError):
        retry_after_s = float(error.details.get("retry_after_s", error.retry_after_s))
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    return JSONResponse(status_code=error.status_code, content={"error": error.to_dict()}, headers=headers)
