"""The burst-absorbing Lambda tier: runs one variant on the CPU with onnxruntime.

Event: ``{"variant_id", "variant": <profile JSON>, "inputs_npy_b64", "correlation_id"}``.
The variant is fetched from the model repository into /tmp once per container.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.exceptions import ModellessError
from modelless.repository import open_repository
from modelless.runtime import VariantRuntime

logger = Logger(service="cpu_worker")
metrics = Metrics(namespace="Modelless", service="cpu_worker")

# Created once per container: every warm invocation reuses the loaded sessions.
runtime = VariantRuntime(
    open_repository(os.environ.get("MODELLESS_REPOSITORY_URL", ".modelless/repo")),
    Path(os.environ.get("MODELLESS_CACHE_DIR", "/tmp/modelless-cache")),
)


@metrics.log_metrics(capture_cold_start_metric=True)
@logger.inject_lambda_context(correlation_id_path="correlation_id", log_event=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        result = runtime.handle_invocation(event)
    except ModellessError as error:
        logger.warning("invocation refused", extra={"error": error.to_dict()})
        return {"statusCode": error.status_code, "error": error.to_dict()}
    metrics.add_dimension(name="variant", value=str(event.get("variant_id", "unknown")))
    metrics.add_metric(name="InferenceLatency", unit=MetricUnit.Milliseconds, value=result["inference_ms"])
    if result["load_ms"]:
        metrics.add_metric(name="VariantLoadLatency", unit=MetricUnit.Milliseconds, value=result["load_ms"])
    return {"statusCode": 200, **result}
