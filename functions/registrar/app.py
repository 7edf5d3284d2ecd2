"""The registrar function: the background part of a registration, in AWS: the variants of a
registered model built, profiled (``python -m variants`` children) and pruned, the kept ones
published (``modelless.entrypoints.registrar``).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.config import get_settings
from modelless.entrypoints.registrar import Registrar, logger, metrics, tracer
from modelless.lambda_events import RegistrationEvent

registrar = Registrar.from_settings(get_settings())


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path="correlationId || registrationId", log_event=True)
@tracer.capture_lambda_handler
@event_source(data_class=RegistrationEvent)
def handler(event: RegistrationEvent, context: LambdaContext) -> dict[str, Any]:
    return registrar.handle(event)
