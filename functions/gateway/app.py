"""API gateway function: the FastAPI app behind an HTTP API, through Mangum.

Services (store clients, dispatcher) are built once per container, at import, never per request.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from mangum import Mangum

from modelless.api import create_app
from modelless.api.services import build_services
from modelless.observability import logger, metrics

app = create_app(build_services())
asgi_handler = Mangum(app, lifespan="off")


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Powertools' and Mangum's context types describe the same Lambda object.
    response: dict[str, Any] = asgi_handler(event, context)  # type: ignore[arg-type]
    return response
