"""The FastAPI application: routers, correlation ids, size limits and error mapping."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from modelless import __version__
from modelless.api.limits import BodyLimitMiddleware
from modelless.api.routers import apps, models, operations, queries
from modelless.api.services import Services
from modelless.exceptions import ModellessError
from modelless.observability import logger

CORRELATION_HEADER = "X-Correlation-Id"


def create_app(services: Services) -> FastAPI:
    app = FastAPI(
        title="modelless",
        version=__version__,
        description="Model-less inference: register models, query by latency and accuracy targets.",
    )
    app.state.services = services
    for router in (apps.router, models.router, queries.router, operations.router):
        app.include_router(router)

    @app.middleware("http")
    async def correlate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        correlation_id = request.headers.get(CORRELATION_HEADER) or uuid.uuid4().hex
        request.state.correlation_id = correlation_id
        logger.set_correlation_id(correlation_id)
        response = await call_next(request)
        response.headers[CORRELATION_HEADER] = correlation_id
        return response

    app.add_middleware(BodyLimitMiddleware, limit_for_path=lambda path: _body_limit(services, path))

    @app.exception_handler(ModellessError)
    async def domain_error(_: Request, error: ModellessError) -> JSONResponse:
        if error.status_code >= 500:
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


def _body_limit(services: Services, path: str) -> int:
    settings = services.settings
    return settings.register_body_limit if path.endswith("/register_model") else settings.max_query_bytes


def _error_response(error: ModellessError) -> JSONResponse:
    return JSONResponse(status_code=error.status_code, content={"error": error.to_dict()})
