"""The registrar function (``functions/registrar``): the background part of a registration, in AWS.

The gateway validates an upload, puts the model and its validation set in the model repository
(S3), records the registration as queued in the metadata store (Redis), and invokes this
function asynchronously with the registration's job:
``{"registrationId", "appID", "modelName", "metric", "correlationId"}``
(``modelless.registration.service.RegistrationJob``). Here the variants are built, profiled (each step a
``python -m variants`` child process, as in the embedded stack) and pruned, and the kept ones
published; a failure is recorded on the registration, with every trace of the model removed.

The invocation is never retried (template.yaml: a dead invocation goes to the RegistrarFailures
queue instead); a duplicate delivery of a job that is no longer queued is not run again.

Settings: ``MODELLESS_METADATA_URL``, ``MODELLESS_REPOSITORY_URL``, ``MODELLESS_PROFILE_RUNS``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from modelless.catalog import DEFAULT_POOLS
from modelless.config import Settings
from modelless.exceptions import ModellessError
from modelless.lambda_events import RegistrationEvent
from modelless.metadata import open_metadata_store
from modelless.registration.service import RegistrationService
from modelless.repository import open_repository
from modelless.types import RegistrationStatus

logger = Logger(service="registrar")
metrics = Metrics(namespace="Modelless", service="registrar")
# X-Ray (template.yaml: Tracing: Active); off outside Lambda. Patched: the model repository in S3.
tracer = Tracer(service="registrar", patch_modules=("botocore",))

# Anything else: a duplicate delivery of a job that had already left the queue.
OUTCOMES = {RegistrationStatus.READY: "Ready", RegistrationStatus.FAILED: "Failed"}


class Registrar:
    """One container: the registration service (its store and repository clients)."""

    def __init__(self, registrar: RegistrationService) -> None:
        self.registrar = registrar

    @classmethod
    def from_settings(cls, settings: Settings) -> Registrar:
        # The variant steps run as `python -m variants` children: they import what this process
        # imports (the function's packages and the shared layer), whatever the runtime put on
        # PYTHONPATH.
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        return cls(
            RegistrationService(
                open_metadata_store(settings.metadata_url),
                open_repository(settings.repository_url),
                settings,
                DEFAULT_POOLS,
            )
        )

    def handle(self, event: RegistrationEvent) -> dict[str, Any]:
        try:
            job = event.job
            registration = self.registrar.run(job)
        except ModellessError as error:
            # Nothing to run (a malformed event, a registration that does not exist): not retried.
            logger.warning("registration job refused", extra={"error": error.to_dict()})
            return {"statusCode": error.status_code, "error": error.to_dict()}
        logger.append_keys(app_id=job.app_id, model=job.model_name, registration_id=job.registration_id)
        metrics.add_metric(
            name=f"Registrations{OUTCOMES.get(registration.status, 'Skipped')}",
            unit=MetricUnit.Count,
            value=1,
        )
        if registration.finished_at is not None and registration.created_at:
            metrics.add_metric(
                name="RegistrationTime",
                unit=MetricUnit.Seconds,
                value=registration.finished_at - registration.created_at,
            )
        metrics.add_metric(name="VariantsKept", unit=MetricUnit.Count, value=len(registration.variant_ids))
        metrics.add_metric(name="VariantsPruned", unit=MetricUnit.Count, value=registration.pruned)
        logger.info("registration finished", extra={"status": registration.status.value})
        return {
            "statusCode": 200,
            "registrationId": registration.registration_id,
            "status": registration.status.value,
            "variants": len(registration.variant_ids),
            "pruned": registration.pruned,
            "message": registration.message,
        }
