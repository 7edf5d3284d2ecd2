"""API gateway function: the FastAPI app behind an HTTP API (payload format 2.0), through Mangum
(``modelless.entrypoints.gateway``): services built once per container, the correlation id from
the ``X-Correlation-Id`` header or API Gateway's request id, the admin key from Secrets Manager.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.config import get_settings
from modelless.entrypoints.gateway import CORRELATION_ID_PATH, Gateway, logger, metrics, tracer

gateway = Gateway.from_settings(get_settings())


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=CORRELATION_ID_PATH)
@tracer.capture_lambda_handler(capture_response=False)  # replies too large for X-Ray metadata
@event_source(data_class=APIGatewayProxyEventV2)
def handler(event: APIGatewayProxyEventV2, context: LambdaContext) -> dict[str, Any]:
    return gateway.handle(event, context)
