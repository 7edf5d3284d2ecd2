"""The offline function: S3-triggered batch jobs, idempotent (Powertools' idempotency utility on
Redis), resumable, throttled (``modelless.entrypoints.offline``; docs/ARCHITECTURE.md §6). Events: S3
ObjectCreated (straight or through SQS), ``{"jobId": …}`` continuations, the resume schedule.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.config import get_settings
from modelless.entrypoints.offline import CORRELATION_ID_PATH, OfflineFunction, logger, metrics, tracer

offline = OfflineFunction.from_settings(get_settings())


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path=CORRELATION_ID_PATH, log_event=False)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return offline.handle(event, context)
