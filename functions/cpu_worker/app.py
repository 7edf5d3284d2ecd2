"""The burst-absorbing Lambda tier: runs one variant on the CPU with onnxruntime
(``modelless.entrypoints.cpu_worker``). In AWS there is one such function per memory size
(template.yaml: CpuWorker1769, CpuWorker3538); the gateway picks it from the variant's ``memory_mb``.
"""

# ruff: noqa: E402  (the clock is read before the imports it times)
from __future__ import annotations

import time

IMPORT_STARTED = time.perf_counter()  # the container's init is timed from here (or earlier)

from typing import Any

from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.config import get_settings
from modelless.entrypoints.cpu_worker import CpuWorker, logger, metrics, tracer
from modelless.lambda_events import InvocationEvent

# Created once per container: every warm invocation reuses the loaded sessions.
worker = CpuWorker.from_settings(get_settings(), IMPORT_STARTED)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path="correlation_id", log_event=False)
@tracer.capture_lambda_handler(capture_response=False)  # replies too large for X-Ray metadata
@event_source(data_class=InvocationEvent)
def handler(event: InvocationEvent, context: LambdaContext) -> dict[str, Any]:
    return worker.handle(event)
