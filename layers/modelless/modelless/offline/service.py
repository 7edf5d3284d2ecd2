"""Offline jobs as the API and the S3 events see them: refuse what cannot run, create the job,
hand it to a launcher, report its progress.

Everything a caller can get wrong is refused before a job exists: a path that is not
``s3://bucket/prefix``, a bucket the app may not use, an output prefix inside the input prefix
(the results would become inputs and re-trigger the job) or under a watched prefix, a bucket
that does not exist or that the service's credentials may not read (S3's 403), a model or
accuracy no provisioned variant serves, no inputs at all.

A watched prefix has one standing job (``Watch.job_id``): each object created under it becomes
one more input of that job, which completes whenever it has caught up and is queued again by the
next object; ``job status`` shows its done/total growing.

Launchers: in the embedded stack, background threads of the gateway process (and a supervisor
that resumes unfinished jobs nobody holds: a crashed runner, a restart); in AWS, an asynchronous
invoke of the offline function, which runs the job with its remaining time and hands what is
left to its next invocation.

Runners heal: a runner child process that dies is seen by its parent at once, which frees its
lease, says on the job how it died and starts it again (``ChildProcessRunner``); a runner nobody
watches (a gateway thread, a Lambda invocation) stops renewing its lease, which frees the job
within ``offline_lease_s`` for the supervisor (or the resume schedule). Meanwhile ``job status``
says the job is stalled, and when it resumes (``JobView``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aws_lambda_powertools import Logger

from modelless.cache.predictions import CachedPredictions
from modelless.catalog import PoolSpec
from modelless.config import Settings
from modelless.exceptions import (
    ForbiddenError,
    InvalidJobError,
    ModellessError,
    NotFoundError,
    S3AccessDeniedError,
    ServiceUnavailableError,
    first_line,
)
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.offline.compute import Compute, WorkerCompute, explain_no_candidates, offline_candidates
from modelless.offline.jobs import (
    JobSpec,
    S3Path,
    is_input,
    is_watch_source,
    new_job_id,
    watch_job_id,
    watch_source,
)
from modelless.offline.objects import ObjectStore, S3ObjectStore
from modelless.offline.runner import STALLED_AFTER_S, JobRunner, RunnerConfig, RunOutcome, RunReport
from modelless.offline.throttle import ThrottleConfig
from modelless.outages import RepeatedFailures
from modelless.pipelines.factory import pipeline_store_for
from modelless.pipelines.store import PipelineStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.types import JobStatus, OfflineJob, WorkerState
from modelless.validation import check_name, check_targets

logger = Logger(service="offline", child=True)

ERROR_SAMPLES = 20  # failed inputs a status reply names
# The lease a launcher takes to write on a job whose runner died (moments: one read, one write).
RECORD_LEASE_S = 5.0
REFUSED = "refused: "  # the message of a job recorded only to say why it was refused


def is_refusal(job: OfflineJob) -> bool:
    return job.status is JobStatus.FAILED and job.message.startswith(REFUSED)


def utc_time(epoch_s: float) -> str:
    """An instant as messages show it: ISO 8601, UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


@dataclass(frozen=True)
class Watch:
    """A watched input prefix (``MODELLESS_OFFLINE_WATCHES``): one standing job, to which every
    object created under the prefix is added as an input."""

    prefix: S3Path
    app_id: str
    output_path: str
    min_accuracy: float = 0.0
    model_name: str | None = None

    @property
    def job_id(self) -> str:
        return watch_job_id(self.prefix, self.app_id, self.output_path, self.min_accuracy, self.model_name)

    @property
    def source(self) -> str:
        return watch_source(self.prefix)

    def spec(self) -> JobSpec:
        return JobSpec(self.app_id, str(self.prefix), self.output_path, self.min_accuracy, self.model_name)

    @classmethod
    def parse_all(cls, raw: str) -> list[Watch]:
        try:
            entries = json.loads(raw or "[]")
            return [
                cls(
                    S3Path.parse(entry["prefix"], "prefix"),
                    str(entry["appID"]),
                    str(entry["outputPath"]),
                    float(entry.get("accuracy") or 0.0),
                    entry.get("modelName"),
                )
                for entry in entries
            ]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"MODELLESS_OFFLINE_WATCHES is not a JSON list of watches: {error}") from error


@dataclass
class JobView:
    """A job with its live progress, as ``job status`` shows it."""

    job: OfflineJob
    done: int
    errors: int
    error_samples: dict[str, str]
    now: float
    total: int
    # Set only for a stalled job (the round trip it costs is spent only then): why, and when it resumes.
    stall_message: str = ""

    @property
    def heartbeat_age_s(self) -> float | None:
        """Seconds since a running job's runner last showed life; None unless running."""
        if self.job.status is not JobStatus.RUNNING or self.job.heartbeat_at is None:
            return None
        return max(0.0, self.now - self.job.heartbeat_at)

    @property
    def stalled(self) -> bool:
        """Running, but its runner has said nothing for STALLED_AFTER_S: dead, hung or cut off."""
        age = self.heartbeat_age_s
        return age is not None and age > STALLED_AFTER_S

    @property
    def message(self) -> str:
        """What the job's status says: its runner's last word; for a stalled job (whose last
        word is stale) what is wrong and when it resumes, first."""
        if self.stalled:
            return f"{self.stall_message} (its runner's last word: {self.job.message})"
        return self.job.message

    @property
    def elapsed_s(self) -> float:
        if self.job.started_at is None:
            return 0.0
        return max(0.0, (self.job.finished_at or self.now) - self.job.started_at)

    @property
    def throughput(self) -> float:
        """Inputs per second since the job started (pauses included)."""
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0


class JobLauncher(Protocol):
    def launch(self, job_id: str) -> None:
        """Have the job run (again) somewhere; a no-op when it is already queued here."""

    def close(self) -> None: ...


class LambdaLauncher:
    """AWS: an asynchronous invoke of the offline function with ``{"jobId": …}``."""

    def __init__(self, function_name: str, client: Any | None = None) -> None:
        self._function = function_name
        self._lambda = client  # made on first launch: a gateway's cold start does not pay for it

    def launch(self, job_id: str) -> None:
        if self._lambda is None:
            from modelless import aws_clients

            self._lambda = aws_clients.client("lambda")
        self._lambda.invoke(
            FunctionName=self._function, InvocationType="Event", Payload=json.dumps({"jobId": job_id})
        )

    def close(self) -> None:
        pass


def runs_in_child_processes(settings: Settings) -> bool:
    """``MODELLESS_OFFLINE_RUNNER``: "process", "thread", or "auto" (the default): a child
    process per job whenever the metadata store is shared (Redis), since a job run in the
    gateway's own process competes with online queries for its CPU and GIL (bench/offline.py
    measures the difference); a thread otherwise (the in-memory store lives in this process)."""
    mode = settings.offline_runner
    if mode not in {"auto", "process", "thread"}:
        raise ValueError(f"MODELLESS_OFFLINE_RUNNER must be auto, process or thread; it is {mode!r}")
    shared = settings.metadata_url.startswith(("redis://", "rediss://", "unix://"))
    return mode == "process" or (mode == "auto" and shared)


@dataclass(frozen=True)
class RestartPolicy:
    """How a ``ChildProcessRunner`` starts a job's runner again after it died."""

    first_delay_s: float = 0.5  # the first restart comes this soon; doubled per death in a row
    max_delay_s: float = 8.0
    # Deaths in a row with no input finished between them, over at least give_up_after_s, after
    # which the job is failed: a job that kills its runner every time (an input that crashes the
    # decoder, say) must not loop for ever, while an outage of S3 shorter than that (a runner
    # exits on an error it cannot handle) must not fail it.
    max_in_a_row: int = 5
    give_up_after_s: float = 60.0
    # A child seen holding its job's lease that no longer does, and still runs this long after,
    # is hung (its keepalive stopped renewing: runner.RunnerConfig.max_quiet_s): it is killed.
    hung_grace_s: float = 10.0
    watch_every_s: float = 1.0  # how often a running child's lease is looked at


class ChildProcessRunner:
    """Runs a job in a child process (``python -m modelless.offline run JOB``): its CPU and its
    GIL apart from the gateway's, which serves online queries. The child reaches the job through
    the metadata store, so that store must be shared (Redis). Its logs go where the gateway's go
    (inherited stdout and stderr); its outcome comes back through a report file of its own, never
    fished out of the log stream. ``command`` is the child's program (tests replace it).

    A child that dies (killed, crashed: a non-zero exit) or hangs is known at once: the parent
    gave it its lease owner (``--owner``), so it frees the dead child's lease, records on the job
    how the runner died (``restarts``, ``runner_failure``) and starts a new child after a short,
    growing delay (``RestartPolicy``); after too many deaths in a row without progress the job is
    failed, saying why. The next child resumes where the dead one stopped: outputs stay exactly
    once (see ``offline.runner``)."""

    def __init__(
        self,
        metadata_url: str,
        command: Sequence[str] = (sys.executable, "-m", "modelless.offline"),
        store: MetadataStore | None = None,
        restarts: RestartPolicy | None = None,
    ) -> None:
        if not metadata_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("offline jobs run in child processes need a shared metadata store (redis://)")
        self._env = {**os.environ, "MODELLESS_METADATA_URL": metadata_url}
        self._metadata_url = metadata_url
        self._command = list(command)
        self._store = store
        self._owns_store = store is None  # made on first need from metadata_url, closed with this
        self._restarts = restarts or RestartPolicy()
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # job -> the child running it
        self._lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            self._store = open_metadata_store(self._metadata_url)
        return self._store

    def pid_of(self, job_id: str) -> int | None:
        """The process id of the child running the job now, if any."""
        with self._lock:
            child = self._children.get(job_id)
        return child.pid if child is not None else None

    def __call__(self, job_id: str) -> RunReport:
        """Run the job in a child, and in a new one each time one dies, until the job ends."""
        in_a_row = 0  # deaths with no input finished since the previous one
        streak_since = 0.0  # when the first of them happened (monotonic)
        while True:
            owner = f"child-{uuid.uuid4().hex[:12]}"
            done_before = self.store.job_progress(job_id)[0]
            ended = self._run_child(job_id, owner)
            if isinstance(ended, RunReport):
                return ended
            # Died: its lease is freed at once (only if it is still the dead child's), not left
            # to expire, so that the job resumes now.
            self.store.release_job_lease(job_id, owner)
            if self._closed.is_set():
                return RunReport(job_id, RunOutcome.YIELDED, message="shutting down")
            in_a_row = 0 if self.store.job_progress(job_id)[0] > done_before else in_a_row + 1
            if in_a_row <= 1:
                streak_since = time.monotonic()
            logger.warning(
                "offline runner died", extra={"job_id": job_id, "death": ended, "in_a_row": in_a_row}
            )
            policy = self._restarts
            give_up = in_a_row >= policy.max_in_a_row and (
                time.monotonic() - streak_since >= policy.give_up_after_s
            )
            final = self._record_death(job_id, ended, in_a_row, give_up)
            if final is not None:
                return final
            delay = min(policy.max_delay_s, policy.first_delay_s * 2 ** max(0, in_a_row - 1))
            if self._closed.wait(delay):
                return RunReport(job_id, RunOutcome.YIELDED, message="shutting down")

    def _run_child(self, job_id: str, owner: str) -> RunReport | str:
        """One child's run: its report, or how it died."""
        with tempfile.TemporaryDirectory(prefix="modelless-offline-") as scratch:
            report_file = Path(scratch) / "report.jsonl"
            with self._lock:
                if self._closed.is_set():
                    return RunReport(job_id, RunOutcome.YIELDED, message="shutting down")
                child = subprocess.Popen(
                    [*self._command, "run", job_id, "--owner", owner, "--report-file", str(report_file)],
                    env=self._env,
                )
                self._children[job_id] = child
            try:
                if self._watch(child, job_id, owner):
                    return f"runner hung (stopped renewing its lease); killed at {utc_time(time.time())}"
            finally:
                with self._lock:
                    self._children.pop(job_id, None)
            if child.returncode != 0:
                return f"runner exited with {_exit_status(child.returncode)} at {utc_time(time.time())}"
            try:
                lines = report_file.read_text().splitlines()
            except FileNotFoundError:
                raise RuntimeError(f"offline runner for {job_id} wrote no report") from None
        for line in lines:
            report = json.loads(line)
            if report.get("jobId") == job_id:
                return RunReport(job_id, RunOutcome(report["outcome"]), processed=int(report["processed"]))
        raise RuntimeError(f"offline runner for {job_id} reported on other jobs only")

    def _watch(self, child: subprocess.Popen[bytes], job_id: str, owner: str) -> bool:
        """Wait for the child to exit; True when it hung and was killed (it had held its lease,
        lost it, and still ran ``hung_grace_s`` later: a runner that ends releases its lease
        and exits at once)."""
        held = False
        lost_at: float | None = None
        while True:
            try:
                child.wait(self._restarts.watch_every_s)
                return False
            except subprocess.TimeoutExpired:
                pass
            try:
                holder = self.store.job_lease_holder(job_id)
            except Exception:  # the store unreachable: the child's own renewals say the rest
                continue
            if holder == owner:
                held, lost_at = True, None
            elif held:
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at >= self._restarts.hung_grace_s:
                    child.kill()
                    child.wait()
                    return True

    def _record_death(self, job_id: str, death: str, in_a_row: int, give_up: bool) -> RunReport | None:
        """Say on the job how its runner died, and fail it (``give_up``). None: start it again;
        else how the run ended (failed now; finished, or taken by another runner, meanwhile)."""
        recorder = f"launcher-{uuid.uuid4().hex[:12]}"
        if not self.store.acquire_job_lease(job_id, recorder, RECORD_LEASE_S):
            holder = self.store.job_lease_holder(job_id)
            message = f"its runner died ({death}); {holder} holds the job now"
            return RunReport(job_id, RunOutcome.BUSY, message=message)
        try:
            job = self.store.get_job(job_id)
            if job is None:
                return RunReport(job_id, RunOutcome.NOT_FOUND, message=f"no job {job_id!r}")
            if job.status.finished:
                return RunReport(job_id, RunOutcome(job.status.value), message=f"finished; then {death}")
            if give_up:
                job.runner_failure = death
                job.status, job.finished_at = JobStatus.FAILED, time.time()
                job.message = (
                    f"its runner died {in_a_row} times in a row without finishing an input (last: "
                    f"{death}); the job is failed (the gateway's log says why the runner died)"
                )
                self.store.save_job(job, recorder)
                logger.error("offline job failed: its runner keeps dying", extra={"job_id": job_id})
                return RunReport(job_id, RunOutcome.FAILED, message=job.message)
            job.restarts += 1
            job.runner_failure = f"{death}; resumed"
            job.message = f"{death}; resuming"
            self.store.save_job(job, recorder)
            return None
        finally:
            self.store.release_job_lease(job_id, recorder)

    def close(self) -> None:
        """Stop the children and free their jobs: the next start resumes them."""
        with self._lock:
            self._closed.set()
            children = list(self._children.values())
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
        if self._owns_store and self._store is not None:
            self._store.close()


def _exit_status(returncode: int) -> str:
    """``code 3``, or ``signal 9 (SIGKILL)`` for a process a signal ended (a negative code)."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        return f"signal {-returncode} ({signal.Signals(-returncode).name})"
    except ValueError:  # a signal without a name (a real-time one)
        return f"signal {-returncode}"


class ThreadLauncher:
    """The embedded stack: jobs run from background threads of this process (in the thread
    itself, or in a child process per job when ``run`` is a ``ChildProcessRunner``). A supervisor
    thread (``start_supervisor``) resumes every unfinished job whose lease nobody holds: one whose
    runner crashed, or every unfinished job after a restart."""

    def __init__(
        self,
        run: Callable[[str], RunReport],
        resumable: Callable[[], list[str]],
        concurrency: int = 1,
        resume_every_s: float = 1.0,
    ) -> None:
        self._run = run
        self._resumable = resumable
        self._resume_every_s = resume_every_s
        self._pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="offline-job")
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    def launch(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._queued or self._stop.is_set():
                return
            self._queued.add(job_id)
        self._pool.submit(self._work, job_id)

    def _work(self, job_id: str) -> None:
        try:
            report = self._run(job_id)
            logger.info("offline run ended", extra={"job_id": job_id, "outcome": report.outcome.value})
        except ServiceUnavailableError as error:
            # A part down (the store): nothing to debug; the supervisor resumes the job after it.
            logger.warning(
                "offline run stopped: a part it needs is down; the supervisor resumes the job",
                extra={"job_id": job_id, "error": first_line(error)},
            )
        except Exception:
            logger.exception("offline run failed; the supervisor resumes the job", extra={"job_id": job_id})
        finally:
            with self._lock:
                self._queued.discard(job_id)

    def start_supervisor(self) -> None:
        if self._supervisor is not None:
            return

        # A store outage fails every round alike: a line when it starts, a reminder a minute and
        # one when it ends, not a traceback a round; anything else is a bug, logged in full.
        outage = RepeatedFailures(
            logger,
            "could not look for offline jobs to resume; retrying",
            "looking for offline jobs to resume again",
        )

        def loop() -> None:
            while True:
                try:
                    for job_id in self._resumable():
                        self.launch(job_id)
                    outage.succeeded()
                except ServiceUnavailableError as error:
                    outage.failed(error)
                except Exception:
                    logger.exception("could not look for offline jobs to resume")
                if self._stop.wait(self._resume_every_s):
                    return

        self._supervisor = threading.Thread(target=loop, name="offline-supervisor", daemon=True)
        self._supervisor.start()

    def close(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        # A job running in a thread stops when the process ends; its lease then expires and the
        # next start resumes it. Queued ones are simply not started.
        self._pool.shutdown(wait=False, cancel_futures=True)
        if isinstance(self._run, ChildProcessRunner):
            self._run.close()


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

    def allowed_buckets(self, app_id: str) -> list[str]:
        own = self.store.offline_buckets(app_id)
        return own if own is not None else list(self.settings.offline_buckets)

    def validate(self, spec: JobSpec, require_inputs: bool = True) -> tuple[S3Path, S3Path]:
        """Every reason the job cannot run, as a 4xx error, before anything is written
        (``require_inputs=False``: a watch, whose inputs arrive later)."""
        if not self.store.app_exists(spec.app_id):
            raise NotFoundError(f"no app {spec.app_id!r}", app=spec.app_id)
        check_targets(None, spec.min_accuracy)
        if spec.model_name is not None:
            check_name("modelName", spec.model_name)
        inputs = S3Path.parse(spec.input_path, "inputPath")
        outputs = S3Path.parse(spec.output_path, "outputPath")
        allowed = self.allowed_buckets(spec.app_id)
        for what, path in (("inputPath", inputs), ("outputPath", outputs)):
            if path.bucket not in allowed:
                raise ForbiddenError(
                    f"{what} {path}: app {spec.app_id!r} may not use bucket {path.bucket!r} for offline "
                    f"jobs (allowed: {', '.join(allowed) or 'none'}; an admin allows buckets with "
                    f"`modelless allow-buckets {spec.app_id} BUCKET…`)",
                    bucket=path.bucket,
                    allowed=allowed,
                )
        if inputs.covers(outputs):
            raise InvalidJobError(
                f"outputPath {outputs} lies inside inputPath {inputs}: the job's results would become "
                "its own inputs (and start it again); choose an output prefix outside the input prefix",
                inputPath=str(inputs),
                outputPath=str(outputs),
            )
        for watch in self.watches:
            if watch.prefix.covers(outputs) or (
                outputs.bucket == watch.prefix.bucket and watch.prefix.prefix.startswith(outputs.prefix)
            ):
                raise InvalidJobError(
                    f"outputPath {outputs} overlaps the watched prefix {watch.prefix}: every result "
                    "would start a new job; choose an output prefix outside it",
                    outputPath=str(outputs),
                )
        for what, path in (("inputPath", inputs), ("outputPath", outputs)):
            try:
                exists = self.objects.bucket_exists(path.bucket)
            except S3AccessDeniedError as error:
                error.message = f"{what} {path}: {error.message}"
                raise
            if not exists:
                raise NotFoundError(
                    f"{what} {path}: bucket {path.bucket!r} does not exist", bucket=path.bucket
                )
        if spec.pipeline is not None:
            self._check_pipeline(spec)
        elif not offline_candidates(self.store, self.pools, spec.app_id, spec.min_accuracy, spec.model_name):
            raise explain_no_candidates(self.store, spec.app_id, spec.min_accuracy, spec.model_name)
        if require_inputs:
            # A few keys are enough to know there is an input (folder markers and manifests are not).
            listed = [
                i for i in self.objects.list_objects(inputs.bucket, inputs.prefix, 16) if is_input(i.key)
            ]
            if not listed:
                raise InvalidJobError(f"inputPath {inputs}: no objects under it", inputPath=str(inputs))
        return inputs, outputs

    def pipeline_store(self) -> PipelineStore:
        if self.pipelines is None:
            self.pipelines = pipeline_store_for(self.store)
        return self.pipelines

    def _check_pipeline(self, spec: JobSpec) -> None:
        """A pipeline job: the app has the pipeline, and every stage has a variant an offline job
        may use (its model's, on a provisioned pool, at the stricter of the job's and the stage's
        accuracy floors)."""
        assert spec.pipeline is not None
        check_name("pipeline", spec.pipeline)
        if spec.model_name is not None:
            raise InvalidJobError(
                "give a modelName or a pipeline, not both: a pipeline names its stages' models",
                modelName=spec.model_name,
                pipeline=spec.pipeline,
            )
        pipeline = self.pipeline_store().get(spec.app_id, spec.pipeline)
        if pipeline is None:
            raise NotFoundError(
                f"app {spec.app_id!r} has no pipeline named {spec.pipeline!r}", pipeline=spec.pipeline
            )
        for stage in pipeline.stages:
            floor = max(spec.min_accuracy, pipeline.accuracy if stage.accuracy is None else stage.accuracy)
            if not offline_candidates(self.store, self.pools, spec.app_id, floor, stage.model):
                error = explain_no_candidates(self.store, spec.app_id, floor, stage.model)
                if isinstance(error, ModellessError):
                    error.within(f"pipeline {pipeline.name!r}, stage {stage.name!r}", stage=stage.name)
                raise error

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
        total = job.total
        if is_watch_source(job.source):
            # A standing job: its inputs grow with every object, its markers never expire.
            done, errors = self.store.job_progress(job.job_id)
            total = self.store.job_item_count(job.job_id)
        elif job.status is JobStatus.COMPLETED:
            # The per-input markers may have expired by now; the record holds the final counts.
            done, errors = job.done, job.errors
        else:
            done, errors = self.store.job_progress(job.job_id)
        samples = self.store.job_errors(job.job_id, ERROR_SAMPLES) if errors else {}
        view = JobView(job, done, errors, samples, self.clock(), total)
        if view.stalled:
            view.stall_message = self._stall_message(view)
        return view

    def _stall_message(self, view: JobView) -> str:
        """Why a stalled job is not moving, and when it moves again."""
        said = f"no heartbeat from its runner for {view.heartbeat_age_s or 0.0:.1f} s (dead, hung or cut off)"
        left_s = self.store.job_lease_expires_in_s(view.job.job_id)
        if left_s is not None:
            return (
                f"{said}: it resumes by itself when its lease expires at {utc_time(view.now + left_s)} "
                f"(in {left_s:.1f} s)"
            )
        if self.settings.offline_function:
            return f"{said}; nobody holds it: the offline function's resume schedule resumes it"
        return f"{said}; nobody holds it: it resumes within {self.settings.offline_resume_every_s:g} s"

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
]
