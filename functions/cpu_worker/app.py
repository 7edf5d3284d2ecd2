"""The burst-absorbing Lambda tier: runs one variant on the CPU with onnxruntime.

Event: ``{"variant_id", "variant": <profile JSON>, "memory_mb", "inputs_npy_b64", "correlation_id"}``
(``modelless.runtime.invocation_payload``). The variant is fetched from the model repository into
/tmp once per container. In AWS there is one such function per memory size (template.yaml:
CpuWorker1769, CpuWorker3538); the gateway picks it from the variant's ``memory_mb``.

The first reply of a container says so (``cold_start``) with the container's init time
(``init_ms``), which the gateway adds to the query's timings.
"""

# ruff: noqa: E402  (the clock is read before the imports it times)
from __future__ import annotations

import time

IMPORT_STARTED = time.perf_counter()  # the container's init is timed from here (or earlier)

import os
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.exceptions import ModellessError
from modelless.lambda_events import InvocationEvent, container_init_ms
from modelless.repository import open_repository
from modelless.runtime import VariantRuntime

logger = Logger(service="cpu_worker")
metrics = Metrics(namespace="Modelless", service="cpu_worker")

# Created once per container: every warm invocation reuses the loaded sessions.
runtime = VariantRuntime(
    open_repository(os.environ.get("MODELLESS_REPOSITORY_URL", ".modelless/repo")),
    Path(os.environ.get("MODELLESS_CACHE_DIR", "/tmp/modelless-cache")),
)
INIT_MS = container_init_ms(IMPORT_STARTED)
_cold = True


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path="correlation_id", log_event=False)
@event_source(data_class=InvocationEvent)
def handler(event: InvocationEvent, context: LambdaContext) -> dict[str, Any]:
    global _cold
    cold, _cold = _cold, False
    try:
        result = runtime.handle_invocation(event.payload)
    except ModellessError as error:
        logger.warning("invocation refused", extra={"error": error.to_dict()})
        return {"statusCode": error.status_code, "error": error.to_dict()}
    metrics.add_dimension(name="variant", value=event.variant_id)
    metrics.add_metric(name="InferenceLatency", unit=MetricUnit.Milliseconds, value=result["inference_ms"])
    if result["load_ms"]:
        metrics.add_metric(name="VariantLoadLatency", unit=MetricUnit.Milliseconds, value=result["load_ms"])
    return {"statusCode": 200, **result, "cold_start": cold, "init_ms": INIT_MS if cold else 0.0}
