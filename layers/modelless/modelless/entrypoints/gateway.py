"""The API gateway function (``functions/gateway``): the FastAPI app behind an HTTP API (payload
format 2.0), through Mangum.

Services (store clients, dispatcher, the Lambda tier's and the registrar's clients) are built once
per container, never per request; Mangum's lifespan is off, so nothing is set up again on an
invocation. A request's correlation id is its ``X-Correlation-Id`` header, else API Gateway's
request id; logs and the reply carry it.

The admin key comes from Secrets Manager when ``MODELLESS_ADMIN_KEY_SECRET`` names a secret (as
template.yaml deploys it), read once per container; else from ``MODELLESS_ADMIN_KEY``.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from aws_lambda_powertools.utilities.typing import LambdaContext
from fastapi import FastAPI
from mangum import Mangum

from modelless.api import create_app
from modelless.api.app import CORRELATION_HEADER
from modelless.api.services import build_services
from modelless.config import Settings
from modelless.observability.metrics import logger, metrics, tracer

__all__ = ["CORRELATION_ID_PATH", "Gateway", "container_settings", "logger", "metrics", "tracer"]

CORRELATION_ID_PATH = 'headers."x-correlation-id" || requestContext.requestId'


def container_settings(settings: Settings) -> Settings:
    """The settings with the admin key from Secrets Manager when a secret is named."""
    if settings.admin_key_secret:
        return settings.with_overrides(admin_key=str(parameters.get_secret(settings.admin_key_secret)))
    return settings


class Gateway:
    """One container: the app and its services, and the Mangum adapter in front of them."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.asgi_handler = Mangum(app, lifespan="off")

    @classmethod
    def from_settings(cls, settings: Settings) -> Gateway:
        return cls(create_app(build_services(container_settings(settings))))

    def handle(self, event: APIGatewayProxyEventV2, context: LambdaContext) -> dict[str, Any]:
        raw = event.raw_event
        if not event.headers.get(CORRELATION_HEADER):
            # HTTP APIs lower-case header names; the app reads this one case-insensitively.
            raw["headers"] = {
                **(raw.get("headers") or {}),
                CORRELATION_HEADER.lower(): event.request_context.request_id,
            }
        # Powertools' and Mangum's context types describe the same Lambda object.
        response: dict[str, Any] = self.asgi_handler(raw, context)  # type: ignore[arg-type]
        return response
