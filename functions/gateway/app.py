"""API gateway function: the FastAPI app behind an HTTP API (payload format 2.0), through Mangum.

Services (store clients, dispatcher, the Lambda tier's and the registrar's clients) are built once
per container, at import, never per request; Mangum's lifespan is off, so nothing is set up again
on an invocation. A request's correlation id is its ``X-Correlation-Id`` header, else API
Gateway's request id; logs and the reply carry it.

The admin key comes from Secrets Manager when ``MODELLESS_ADMIN_KEY_SECRET`` names a secret (as
template.yaml deploys it), read once per container; else from ``MODELLESS_ADMIN_KEY``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from mangum import Mangum

from modelless.api import create_app
from modelless.api.app import CORRELATION_HEADER
from modelless.api.services import build_services
from modelless.config import Settings
from modelless.observability import logger, metrics

CORRELATION_ID_PATH = 'headers."x-correlation-id" || requestContext.requestId'


def settings_for_container() -> Settings:
    settings = Settings()
    secret = os.environ.get("MODELLESS_ADMIN_KEY_SECRET")
    if secret:
        settings = dataclasses.replace(settings, admin_key=str(parameters.get_secret(secret)))
    return settings


app = create_app(build_services(settings_for_container()))
asgi_handler = Mangum(app, lifespan="off")


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=CORRELATION_ID_PATH)
@event_source(data_class=APIGatewayProxyEventV2)
def handler(event: APIGatewayProxyEventV2, context: LambdaContext) -> dict[str, Any]:
    raw = event.raw_event
    if not event.headers.get(CORRELATION_HEADER):
        # HTTP APIs lower-case header names; the app reads this one case-insensitively.
        raw["headers"] = {
            **(raw.get("headers") or {}),
            CORRELATION_HEADER.lower(): event.request_context.request_id,
        }
    # Powertools' and Mangum's context types describe the same Lambda object.
    response: dict[str, Any] = asgi_handler(raw, context)  # type: ignore[arg-type]
    return response
