"""Offline jobs as the API and the S3 events see them: refuse what cannot run, create the job,
hand it to a launcher, report its progress.

Everything a caller can get wrong is refused before a job exists (``job_validation``).

A watched prefix has one standing job (``Watch.job_id``): each object created under it becomes
one more input of that job, which completes whenever it has caught up and is queued again by the
next object; ``job status`` shows its done/total growing.

Launchers (``launchers``): in the embedded stack, background threads of the gateway process (and
a supervisor that resumes unfinished jobs nobody holds: a crashed runner, a restart); in AWS, an
asynchronous invoke of the offline function, which runs the job with its remaining time and hands
what is left to its next invocation.

Runners heal: a runner child process that dies is seen by its parent at once, which frees its
lease, says on the job how it died and starts it again (``child_processes.ChildProcessRunner``);
a runner nobody watches (a gateway thread, a Lambda invocation) stops renewing its lease, which
frees the job within ``offline_lease_s`` for the supervisor (or the resume schedule). Meanwhile
``job status`` says the job is stalled, and when it resumes (``views.JobView``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from aws_lambda_powertools import Logger

from modelless.cache.predictions import CachedPredictions
from modelless.catalog import PoolSpec
from modelless.config import Settings
from modelless.exceptions import NotFoundError
from modelless.metadata import MetadataStore
from modelless.offline.child_processes import ChildProcessRunner, RestartPolicy, runs_in_child_processes
from modelless.offline.compute import Compute, WorkerCompute
from modelless.offline.job_validation import JobValidator
from modelless.offline.jobs import JobSpec, S3Path, Watch, new_job_id
from modelless.offline.launchers import JobLauncher, LambdaLauncher, ThreadLauncher
from modelless.offline.objects import ObjectStore, S3ObjectStore
from modelless.offline.runner import JobRunner, RunnerConfig, RunOutcome, RunReport
from modelless.offline.throttle import ThrottleConfig
from modelless.offline.views import JobView, view_of
from modelless.pipelines.factory import pipeline_store_for
from modelless.pipelines.store import PipelineStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.types import JobStatus, OfflineJob, WorkerState

logger = Logger(service="offline", child=True)

REFUSED = "refused: "  # the message of a job recorded only to say why it was refused


def is_refusal(job: OfflineJob) -> bool:
    return job.status is JobStatus.FAILED and job.message.startswith(REFUSED)


@dataclass
class OfflineService:
    store: MetadataStore
    settings: Settings
    pools: Mapping[str, PoolSpec]
    live_workers: Callable[[], Sequence[WorkerState]]
    objects_factory: Callable[[], ObjectStore] = S3ObjectStore
    launcher: JobLauncher | None = None
    clock: Callable[[], float] = time.time
    watches: list[Watch] = field(default_factory=list)
    # The prediction cache online queries share (None: none; modelless.cache).
    predictions: CachedPredictions | None = None
    # Where a pipeline job's DAG is read (None: beside the metadata store, as the gateway's).
    pipelines: PipelineStore | None = None
    _objects: ObjectStore | None = field(default=None, init=False)
    _invoker: HttpWorkerInvoker | None = field(default=None, init=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        store: MetadataStore,
        pools: Mapping[str, PoolSpec],
        live_workers: Callable[[], Sequence[WorkerState]] | None = None,
        objects_factory: Callable[[], ObjectStore] = S3ObjectStore,
        predictions: CachedPredictions | None = None,
    ) -> OfflineService:
        """``predictions``: the prediction cache the gateway's queries use, shared with the jobs
        its threads run (a runner process of its own opens the one its settings configure:
        with Redis, the same cache)."""
        service = cls(
            store,
            settings,
            pools,
            live_workers or (lambda: store.list_workers()),
            objects_factory,
            watches=Watch.parse_all(settings.offline_watches),
            predictions=predictions,
        )
        if settings.offline_function:
            service.launcher = LambdaLauncher(settings.offline_function)
        else:
            run: Callable[[str], RunReport] = service.run
            if runs_in_child_processes(settings):
                run = ChildProcessRunner(settings.metadata_url, store=store)
            service.launcher = ThreadLauncher(
                run,
                service.resumable,
                concurrency=settings.offline_concurrency,
                resume_every_s=settings.offline_resume_every_s,
            )
        return service

    @property
    def objects(self) -> ObjectStore:
        # Made on first use: a gateway that never sees an offline job never builds an S3 client.
        if self._objects is None:
            self._objects = self.objects_factory()
        return self._objects

    # --- refusals up front ----------------------------------------------------------------------

    def validator(self) -> JobValidator:
        """The checks of this service's job requests (made per request: cheap, and always over
        the service's current watches, objects and pipelines)."""
        return JobValidator(
            self.store,
            self.pools,
            self.settings.offline_buckets,
            self.watches,
            lambda: self.objects,
            self.pipeline_store,
        )

    def allowed_buckets(self, app_id: str) -> list[str]:
        return self.validator().allowed_buckets(app_id)

    def validate(self, spec: JobSpec, require_inputs: bool = True) -> tuple[S3Path, S3Path]:
        """Every reason the job cannot run, as a 4xx error, before anything is written
        (``require_inputs=False``: a watch, whose inputs arrive later)."""
        return self.validator().validate(spec, require_inputs)

    def pipeline_store(self) -> PipelineStore:
        if self.pipelines is None:
            self.pipelines = pipeline_store_for(self.store)
        return self.pipelines

    # --- jobs -----------------------------------------------------------------------------------

    def submit(
        self, spec: JobSpec, job_id: str | None = None, source: str = "api", launch: bool = True
    ) -> OfflineJob:
        """Validate, create the job (or find it: a duplicate event gives the same id) and launch
        it (``launch=False``: the caller runs it itself, as the offline function does)."""
        inputs, outputs = self.validate(spec)
        job = OfflineJob(
            job_id=job_id or new_job_id(),
            app_id=spec.app_id,
            input_path=str(inputs),
            output_path=str(outputs),
            min_accuracy=spec.min_accuracy,
            model_name=spec.model_name,
            source=source,
            created_at=self.clock(),
            message="queued",
            pipeline=spec.pipeline,
        )
        if not self.store.create_job(job):
            existing = self.store.get_job(job.job_id)
            if existing is None:  # deleted in between: nothing sensible to do but report it
                raise NotFoundError(f"job {job.job_id} vanished while being created")
            logger.info("job exists already (a duplicate event)", extra={"job_id": job.job_id})
            job = existing
        if launch and not job.status.finished:
            self.launch(job.job_id)
        return job

    def record_refusal(self, spec: JobSpec, job_id: str, source: str, message: str) -> OfflineJob | None:
        """An S3-started job that was refused: kept as a failed job (when its app exists), so
        that ``job status`` and the app's job list say why nothing ran. A refusal recorded
        earlier under the id is replaced (a watch refused again, for a new reason); a job that
        did run is never touched."""
        if not self.store.app_exists(spec.app_id):
            return None
        now = self.clock()
        job = OfflineJob(
            job_id=job_id,
            app_id=spec.app_id,
            input_path=str(spec.input_path),
            output_path=str(spec.output_path),
            min_accuracy=spec.min_accuracy,
            model_name=spec.model_name,
            pipeline=spec.pipeline,
            source=source,
            status=JobStatus.FAILED,
            message=f"{REFUSED}{message}",
            created_at=now,
            finished_at=now,
        )
        if self.store.create_job(job):
            return job
        existing = self.store.get_job(job_id)
        if existing is not None and is_refusal(existing):
            job.created_at = existing.created_at
            self.store.put_job(job)
            return job
        return existing

    def watch_for(self, path: S3Path) -> Watch | None:
        """The watch an object's key falls under, if any."""
        return next((w for w in self.watches if w.prefix.covers(path)), None)

    def watch_job(self, watch: Watch) -> OfflineJob:
        """The watch's standing job: created (validated like any job, inputs aside) at its first
        object; a watch refused earlier is validated again, since an admin may have fixed what
        was wrong. Raises the refusal (a 4xx error)."""
        job = self.store.get_job(watch.job_id)
        if job is not None and not is_refusal(job):
            return job
        inputs, outputs = self.validate(watch.spec(), require_inputs=False)
        fresh = OfflineJob(
            job_id=watch.job_id,
            app_id=watch.app_id,
            input_path=str(inputs),
            output_path=str(outputs),
            min_accuracy=watch.min_accuracy,
            model_name=watch.model_name,
            source=watch.source,
            created_at=self.clock(),
            message=f"watching {inputs}",
        )
        if job is None:
            if self.store.create_job(fresh):
                return fresh
            return self.store.get_job(watch.job_id) or fresh
        fresh.created_at = job.created_at
        self.store.put_job(fresh)  # the refusal is over (a refused job has no runner to race)
        return fresh

    def add_watched_input(self, watch: Watch, key: str) -> tuple[OfflineJob, bool]:
        """One object created under the watch: an input of its standing job (once, whatever the
        number of deliveries; a completed job is queued again). Returns the job and whether the
        object was new to it. Raises the watch's refusal (a 4xx error)."""
        job = self.watch_job(watch)
        added = self.store.add_job_items(job.job_id, [key], f"new objects under {watch.prefix}; queued") > 0
        return self.store.get_job(job.job_id) or job, added

    def launch(self, job_id: str) -> None:
        if self.launcher is None:
            raise RuntimeError("this OfflineService has no launcher")
        self.launcher.launch(job_id)

    def view(self, job_id: str, app_id: str) -> JobView:
        job = self.store.get_job(job_id)
        if job is None or job.app_id != app_id:
            raise NotFoundError(f"no job {job_id!r} in app {app_id!r}")
        return self._view(job)

    def views(self, app_id: str) -> list[JobView]:
        return [self._view(job) for job in self.store.list_jobs(app_id)]

    def _view(self, job: OfflineJob) -> JobView:
        return view_of(self.store, self.settings, job, self.clock())

    # --- running ------------------------------------------------------------------------------------

    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            lease_s=self.settings.offline_lease_s,
            max_rows=min(self.settings.offline_max_batch, self.settings.max_batch),
            run_ms=self.settings.offline_run_ms,
            max_input_bytes=self.settings.offline_max_input_bytes,
            max_inputs=self.settings.offline_max_inputs,
        )

    def throttle_config(self) -> ThrottleConfig:
        return ThrottleConfig(
            pause_utilisation=self.settings.offline_pause_utilisation,
            resume_utilisation=self.settings.offline_resume_utilisation,
            pause_latency_ratio=self.settings.offline_pause_latency_ratio,
            resume_latency_ratio=self.settings.offline_resume_latency_ratio,
        )

    def compute(self) -> Compute:
        if self._invoker is None:
            self._invoker = HttpWorkerInvoker()
        return WorkerCompute(self.store, self.pools, self.live_workers, self._invoker, self.throttle_config())

    def runner(self, config: RunnerConfig | None = None, owner: str | None = None) -> JobRunner:
        return JobRunner(
            self.store,
            self.objects,
            self.compute(),
            config or self.runner_config(),
            variants=self.store.list_variants,
            models=self.store.get_model,
            clock=self.clock,
            owner=owner,
            predictions=self.predictions,
            pipelines=self.pipeline_store(),
        )

    def run(self, job_id: str, deadline: float | None = None, owner: str | None = None) -> RunReport:
        """Run the job here (``owner``: the lease owner id to run under, one the caller knows)."""
        return self.runner(owner=owner).run(job_id, deadline)

    def resumable(self) -> list[str]:
        """Unfinished jobs no runner holds: their runner crashed, or this process restarted."""
        return [
            job_id for job_id in self.store.unfinished_jobs() if self.store.job_lease_holder(job_id) is None
        ]

    def close(self) -> None:
        if self.launcher is not None:
            self.launcher.close()
        if self._invoker is not None:
            self._invoker.close()


# Names importers have always found here, whose homes are now the modules named above.
__all__ = [
    "ChildProcessRunner",
    "JobLauncher",
    "JobView",
    "LambdaLauncher",
    "OfflineService",
    "RestartPolicy",
    "RunOutcome",
    "ThreadLauncher",
    "Watch",
    "runs_in_child_processes",
]
