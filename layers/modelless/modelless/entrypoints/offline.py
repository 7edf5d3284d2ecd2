"""The offline function (``functions/offline``): S3-triggered batch jobs, idempotent, resumable,
throttled (docs/ARCHITECTURE.md §6).

Events it takes:

- **S3 ObjectCreated** (straight from S3, or through SQS): a manifest (``*.job.json``) starts a
  job; an object under a watched prefix becomes one more input of the watch's standing job.
  Powertools' idempotency utility, with Redis persistence (the metadata store's ElastiCache),
  turns a duplicate delivery away (one delivered while the first is still being handled does
  nothing at all); the job id is derived from the object (or the watch) too, so even past the
  idempotency window a duplicate finds the same job. The job then runs here, with this
  invocation's remaining time (another invocation holding it makes that a no-op).
- ``{"jobId": …}``: run (or resume) that job: what the gateway sends for an API-submitted job, and
  what this function sends itself when its time runs out with inputs left.
- **a schedule** (EventBridge): resume every unfinished job nobody holds (a runner that crashed
  or timed out mid-job; its lease expired).

Settings: ``MODELLESS_METADATA_URL`` (Redis), ``MODELLESS_OFFLINE_FUNCTION`` (this function's
name, for continuations; defaults to ``AWS_LAMBDA_FUNCTION_NAME``), ``MODELLESS_OFFLINE_WATCHES``
and the other ``MODELLESS_OFFLINE_*`` settings (see ``modelless.config``).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.cache import open_cached_predictions
from modelless.catalog import DEFAULT_POOLS
from modelless.config import Settings
from modelless.metadata import open_metadata_store
from modelless.offline.events import S3JobStarter, idempotency_layer, idempotent_start, s3_records
from modelless.offline.runner import RunOutcome, RunReport
from modelless.offline.service import OfflineService

logger = Logger(service="offline")
metrics = Metrics(namespace="Modelless", service="offline")
# X-Ray (template.yaml: Tracing: Active); off outside Lambda. Patched: S3 and Lambda calls
# (botocore), the workers (httpx).
tracer = Tracer(service="offline", patch_modules=("botocore", "httpx"))

# The correlation id of every event shape it takes: S3's request id, the SQS message, the job
# being continued, the schedule's event id.
CORRELATION_ID_PATH = 'Records[0].responseElements."x-amz-request-id" || Records[0].messageId || jobId || id'
# Stop this long before the invocation's own limit: the runner hands the job on cleanly.
TIME_MARGIN_S = 15.0


class OfflineFunction:
    """One container: the store, the job service and the idempotent S3 job starter."""

    def __init__(self, settings: Settings) -> None:
        # With a function name (always, in Lambda), a job left unfinished is handed to a new
        # invocation.
        self.settings = settings.offline_function_or_own()
        self.store = open_metadata_store(self.settings.metadata_url)
        # The prediction cache the gateways use (Redis): jobs answer cached inputs and cache theirs.
        self.service = OfflineService.from_settings(
            self.settings, self.store, DEFAULT_POOLS, predictions=open_cached_predictions(self.settings)
        )
        # S3 events start jobs; this invocation runs them itself (no launch), with its remaining time.
        self.starter = S3JobStarter(self.service, launch=False)
        persistence, idempotency_prefix = idempotency_layer(self.settings.metadata_url)
        self.start_job, self.idempotency_config = idempotent_start(
            self.starter, persistence, idempotency_prefix
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> OfflineFunction:
        return cls(settings)

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        self.idempotency_config.register_lambda_context(context)
        deadline = time.time() + context.get_remaining_time_in_millis() / 1000.0 - TIME_MARGIN_S
        if "jobId" in event:
            return {"runs": [self.run(str(event["jobId"]), deadline)]}
        if event.get("source") == "aws.events":
            return {"runs": [self.run(job_id, deadline) for job_id in self.service.resumable()]}
        started: list[dict[str, Any]] = []
        for record in s3_records(event):
            try:
                result = self.start_job(record=record)
            except IdempotencyAlreadyInProgressError:
                # The same event is being handled by another invocation right now.
                metrics.add_metric(name="DuplicateEvents", unit=MetricUnit.Count, value=1)
                logger.info("duplicate S3 event, already being handled")
                continue
            metrics.add_metric(name=f"Jobs{result['status'].capitalize()}", unit=MetricUnit.Count, value=1)
            started.append(result)
        runs = [
            self.run(r["job_id"], deadline)
            for r in started
            if r["status"] in {"started", "exists"} and r["job_id"]
        ]
        return {"events": started, "runs": runs}

    def run(self, job_id: str, deadline: float) -> dict[str, Any]:
        """Run the job until it finishes or the time is nearly up; then hand it to a new invocation."""
        logger.append_keys(job_id=job_id)
        if time.time() >= deadline:
            report = RunReport(job_id, RunOutcome.YIELDED, message="no time left in this invocation")
        else:
            report = self.service.run(job_id, deadline)
        metrics.add_metric(name="InputsProcessed", unit=MetricUnit.Count, value=report.processed)
        metrics.add_metric(name="InputsFailed", unit=MetricUnit.Count, value=report.failed)
        metrics.add_metric(name="OfflinePausedTime", unit=MetricUnit.Seconds, value=report.paused_s)
        if report.outcome is RunOutcome.YIELDED:
            self.service.launch(job_id)  # continues where this run stopped
        logger.info(
            "offline run ended", extra={"outcome": report.outcome.value, "processed": report.processed}
        )
        logger.remove_keys(["job_id"])
        return {"jobId": job_id, "outcome": report.outcome.value, "processed": report.processed}

    def close(self) -> None:
        self.service.close()
        self.store.close()
