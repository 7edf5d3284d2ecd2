"""The scaling function, run on a schedule (EventBridge): ticks every ``MODELLESS_SCALER_PERIOD_S``
until the next invocation is due, each tick solving the variant mix and applying it to the worker
pools' Auto Scaling groups (``modelless.entrypoints.scaler``).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.config import get_settings
from modelless.entrypoints.scaler import ScalerFunction, logger, metrics, tracer

scaler = ScalerFunction.from_settings(get_settings())


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    return scaler.handle(event, context)
