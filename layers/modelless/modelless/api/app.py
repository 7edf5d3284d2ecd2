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

from modelless import __version__
from modelless.api.limits import ASGIApp, BodyLimitMiddleware, Message, Receive, Scope, Send
from modelless.api.openapi import document_errors
from modelless.api.routers import apps, dashboard, feedback, models, offline, operations, pipelines, queries
from modelless.api.routers import metrics as prometheus_metrics
from modelless.api.services import Services
from modelless.exceptions import ModellessError, ServiceUnavailableError, StoreUnavailableError, first_line
from modelless.metadata.redis import UNREACHABLE_ERRORS
from modelless.observability import logger

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
    document_errors(app)  # the OpenAPI document lists each operation's real errors, in this shape

    app.add_middleware(
        BodyLimitMiddleware,
        limit_for_path=lambda path: _body_limit(services, path),
        setting_for_path=lambda path: _body_limit_setting(services, path),
    )
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(CorrelationMiddleware)  # outermost: error replies carry the id too

    @app.exception_handler(ModellessError)
    async def domain_error(_: Request, error: ModellessError) -> JSONResponse:
        if isinstance(error, ServiceUnavailableError):
            # Retryable and expected while a part heals (a store outage answers every request
            # so): a warning, not an error per request; the failing part logs its own outage.
            logger.warning("request refused for now", extra={"error": error.to_dict()})
        elif error.status_code >= 500:
            logger.error("request failed", extra={"error": error.to_dict()})
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        # Raised by the framework itself (unknown route, unparsable multipart, wrong method):
        # answered in the same shape as every other error.
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "bad_request")
        return JSONResponse(
            status_code=error.status_code,
            content={"error": {"code": code, "message": str(error.detail)}},
            headers=getattr(error, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
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

    return app


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
        except Exception as error:
            if started:
                raise  # part of a reply went out: nothing else can be said on this connection
            await _unexpected_error_response(error, scope)(scope, receive, send)


def _unexpected_error_response(error: Exception, scope: Scope) -> JSONResponse:
    if isinstance(error, UNREACHABLE_ERRORS):
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
