"""The Lambda tier (``functions/cpu_worker``): runs one variant on the CPU with onnxruntime.

Event: an ``Invocation`` (``modelless.serving.invocation``) in its JSON form (``modelless.serving.wire``:
``{"version", "variant_id", "variant": <profile JSON>, "memory_mb", "inputs_npy_b64", ...}``); the
reply, its ``Reply`` in the same form with a ``statusCode``. The variant is fetched from the model
repository into the cache directory once per container. The first reply of a container says so
(``cold_start``) with the container's init time (``init_ms``), which the gateway adds to the
query's timings.

Kept light: no metadata store, no HTTP client (onnxruntime itself is imported on the first
variant load).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from modelless.config import Settings
from modelless.exceptions import ModellessError
from modelless.lambda_events import InvocationEvent, container_init_ms
from modelless.repository import open_repository
from modelless.serving.invocation import Invocation
from modelless.serving.runtime import VariantRuntime
from modelless.serving.wire import to_json_message

logger = Logger(service="cpu_worker")
metrics = Metrics(namespace="Modelless", service="cpu_worker")
# X-Ray (template.yaml: Tracing: Active); off outside Lambda. Patched: S3 reads of variants.
tracer = Tracer(service="cpu_worker", patch_modules=("botocore",))


class CpuWorker:
    """One container: its runtime (the loaded sessions, reused by every warm invocation) and
    whether it has answered yet."""

    def __init__(self, runtime: VariantRuntime, import_started: float) -> None:
        self.runtime = runtime
        # Read once the container is set up: from ``import_started`` (the top of the function's
        # module), or the process's start in the Lambda runtime.
        self.init_ms = container_init_ms(import_started)
        self._cold = True

    @classmethod
    def from_settings(cls, settings: Settings, import_started: float) -> CpuWorker:
        return cls(
            VariantRuntime(open_repository(settings.repository_url), settings.cache_dir), import_started
        )

    def handle(self, event: InvocationEvent) -> dict[str, Any]:
        cold, self._cold = self._cold, False
        try:
            reply = self.runtime.serve(Invocation.from_message(event.payload))
        except ModellessError as error:
            logger.warning("invocation refused", extra={"error": error.to_dict()})
            return {"statusCode": error.status_code, "error": error.to_dict()}
        metrics.add_dimension(name="variant", value=event.variant_id)
        metrics.add_metric(name="InferenceLatency", unit=MetricUnit.Milliseconds, value=reply.inference_ms)
        if reply.load_ms:
            metrics.add_metric(name="VariantLoadLatency", unit=MetricUnit.Milliseconds, value=reply.load_ms)
        reply = dataclasses.replace(reply, cold_start=cold, init_ms=self.init_ms if cold else 0.0)
        return {"statusCode": 200, **to_json_message(reply.to_message())}
