"""Run one offline job, exactly once per input, resuming wherever an earlier run stopped.

Exactly-once rests on four things, each enough to stop a different duplicate:

1. **a lease** in the metadata store (with a TTL, renewed before every batch and every heartbeat
   period by a keepalive thread, so that a batch that waits long in its worker keeps it): one
   runner works a job at a time; a duplicate event or a second launcher finds it held and leaves;
   a crashed runner's lease expires (or its parent frees it) and the job is free to resume.
   Every write of the job's record is conditional on still holding it (``save_job``, atomic in
   the store): a runner that stalled past its lease never writes its stale view (say, "running")
   over what the runner that took the job over wrote (say, "completed");
2. **a fixed input list**, recorded when the job first runs: a resume works on the same inputs;
3. **a done marker per input**, set only once (``mark_items``) and only after its result object
   is written: a resume skips what is marked and redoes what is not;
4. **deterministic output keys written conditionally** (``put_once``): redoing an input whose
   result was written just before a crash (marker not yet set) finds its own object and writes
   no second copy, and neither does a runner that lost its lease mid-batch.

Between batches the runner asks ``Compute`` where the next batch may run; while online traffic
needs the workers (the throttle) it waits, renewing its lease, and resumes when they calm down.
With a deadline (the Lambda function's remaining time) it stops cleanly before it and says so.

Liveness: the job's record carries ``heartbeat_at``, rewritten every heartbeat period while the
runner lives (by the keepalive thread when the main thread is busy in a batch). A record whose
heartbeat is older than ``STALLED_AFTER_S`` says its runner is gone or hung (``job status`` shows
it stalled); the lease, which nobody renews then, frees the job for another runner within
``lease_s``. The keepalive renews only while the main thread shows life (``max_quiet_s``), so that
a hung runner does not hold its job for ever.

A watch's standing job (``jobs.is_watch_source``) gains inputs one S3 event at a time: its runner
never lists the prefix, and when it has caught up it completes only if no input arrived since
(checked atomically by ``save_job``); otherwise it goes on with the new ones.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.cache.predictions import CachedPredictions
from modelless.exceptions import (
    InvalidInputError,
    ModellessError,
    NotFoundError,
    OfflineInputError,
    S3AccessDeniedError,
)
from modelless.inputs import check_batch
from modelless.metadata.base import JobSave, OfflineJobStore
from modelless.offline.compute import Compute, Paused, batch_rows
from modelless.offline.decoding import decode_input
from modelless.offline.jobs import RESULT_SUFFIX, S3Path, is_input, is_watch_source, output_key, summary_key
from modelless.offline.objects import ObjectStore
from modelless.pipelines.batch import run_batch
from modelless.pipelines.spec import REQUEST_INPUT, PipelineSpec
from modelless.pipelines.store import PipelineStore
from modelless.selection import Candidates
from modelless.types import Decision, JobStatus, ModelRecord, OfflineJob, VariantProfile

logger = Logger(service="offline", child=True)

MAX_SUMMARY_ERRORS = 1000  # the summary names at most this many failed inputs (the count is exact)
# A running job whose heartbeat is older than this has lost its runner (dead, hung, cut off from
# the store): five heartbeat periods (RunnerConfig.heartbeat_s), so that one slow write on a busy
# machine does not make a live runner look stalled.
STALLED_AFTER_S = 5.0


@dataclass(frozen=True)
class RunnerConfig:
    # A job's lease: how long a runner that died without a word holds its job. Renewed every
    # heartbeat by the keepalive thread, so it need only outlast a few missed heartbeats, not a batch.
    lease_s: float = 10.0
    max_rows: int = 32  # rows per inference run, at most (see compute.batch_rows)
    run_ms: float = 10.0
    max_input_bytes: int = 16 * 1024 * 1024
    max_inputs: int = 100_000
    max_rows_per_input: int = 4096
    poll_s: float = 0.25  # while paused: how often the workers are looked at again
    heartbeat_s: float = 1.0  # the job record is rewritten at most this often
    # Renew the lease and the heartbeat from a background thread every heartbeat period, while
    # the main thread waits in a batch (off: the tests that drive a fake clock).
    keepalive: bool = True
    # ... but only while the main thread showed life (a lease renewal) this recently: longer than
    # one offline run may wait in its worker (compute.OFFLINE_INVOKE_TIMEOUT_S) plus a group's
    # reads and writes. A main thread quiet for longer is hung: its lease is left to expire.
    max_quiet_s: float = 90.0
    retry_s: float = 0.5  # after a worker failure; doubles up to max_retry_s
    # Bounds the wait after the failures of a worker that is being replaced: the next batch goes
    # to the replacement at most this long after it is up.
    max_retry_s: float = 5.0
    yield_margin_s: float = 10.0  # with a deadline: stop this long before it
    io_threads: int = 8  # concurrent object reads and writes within a group
    # Inputs read, run (in batches of the job's batch size) and written per group, at least: a
    # group's reads and writes overlap one another, and its inputs are marked done together.
    group_inputs: int = 32
    progress_retention_s: float = 7 * 86400.0  # per-input markers kept this long after the end


class RunOutcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    YIELDED = "yielded"  # stopped before the deadline; the job continues in another run
    BUSY = "busy"  # another runner holds the job's lease
    LOST_LEASE = "lost-lease"  # the lease expired under this runner and another took the job
    NOT_FOUND = "not-found"


@dataclass
class RunReport:
    job_id: str
    outcome: RunOutcome
    processed: int = 0  # inputs this run marked done (failed ones included)
    failed: int = 0
    paused_s: float = 0.0
    pauses: list[str] = field(default_factory=list)  # why it paused (the first few times)
    message: str = ""


class _LeaseLost(Exception):
    pass


class _Yield(Exception):
    pass


class _BatchRefused(Exception):
    """The worker refused a batch as bad input (4xx): its inputs are tried one by one."""

    def __init__(self, error: ModellessError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class _Decoded:
    key: str
    rows: np.ndarray
    cached_by: str | None = None  # answered from the prediction cache: the variant that computed it
    answered_by: list[str] | None = None  # a pipeline job's: per row, the stage that answered it


@dataclass(frozen=True)
class _Stage:
    """A pipeline job's stage: its pinned variant and its model (the contract its rows meet)."""

    variant: VariantProfile
    model: ModelRecord


@dataclass
class _RunState:
    """What one run keeps between batches."""

    job: OfflineJob
    variant: VariantProfile
    model: ModelRecord
    input_path: S3Path
    output_path: S3Path
    deadline: float | None
    report: RunReport
    active_since: float = 0.0
    paused_since: float | None = None
    recent: list[str] = field(default_factory=list)
    cache_admits: frozenset[str] | None = None  # variants whose cached answers the job may take
    # A pipeline job's DAG and stages (None: a one-model job); ``variant`` and ``model`` are then
    # its entry stage's, whose model the inputs are decoded for.
    pipeline: PipelineSpec | None = None
    stages: dict[str, _Stage] = field(default_factory=dict)


@dataclass
class _Liveness:
    """What a run's main thread shares with its keepalive thread. ``lock`` orders every write of
    the job's record (and the job's fields the writes read), so that the keepalive never writes
    a view older than one the main thread wrote (say "running" over "completed")."""

    alive_at: float  # the main thread's last sign of life: its last lease renewal
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_heartbeat: float = 0.0
    lease_lost: bool = False


class JobRunner:
    def __init__(
        self,
        store: OfflineJobStore,
        objects: ObjectStore,
        compute: Compute,
        config: RunnerConfig | None = None,
        *,
        variants: Callable[[str], list[VariantProfile]],
        models: Callable[[str, str], ModelRecord | None],
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        owner: str | None = None,
        predictions: CachedPredictions | None = None,
        pipelines: PipelineStore | None = None,
    ) -> None:
        """``predictions``: the prediction cache online queries share (None: none): inputs whose
        rows are cached are not run, and what runs is cached (``_infer_cached``). ``pipelines``:
        where a pipeline job's DAG is read (None: pipeline jobs fail, saying so)."""
        self._store = store
        self._pipelines = pipelines
        self._predictions = predictions
        self._objects = objects
        self._compute = compute
        self._config = config or RunnerConfig()
        self._variants = variants
        self._models = models
        self._clock = clock
        self._sleep = sleep
        self.owner = owner or f"runner-{uuid.uuid4().hex[:12]}"
        self._live = _Liveness(alive_at=clock())

    # --- entry point ------------------------------------------------------------------------------

    def run(self, job_id: str, deadline: float | None = None) -> RunReport:
        """Work the job until it is finished, the deadline nears, or the lease is lost."""
        job = self._store.get_job(job_id)
        if job is None:
            return RunReport(job_id, RunOutcome.NOT_FOUND, message=f"no job {job_id!r}")
        if job.status.finished and not self._caught_up_since(job):
            return RunReport(job_id, RunOutcome(job.status.value), message="already finished")
        if not self._store.acquire_job_lease(job_id, self.owner, self._config.lease_s):
            holder = self._store.job_lease_holder(job_id)
            return RunReport(job_id, RunOutcome.BUSY, message=f"held by {holder}")
        self._live = _Liveness(alive_at=self._clock())
        try:
            with self._keepalive(job):
                return self._run_leased(job, deadline)
        except _LeaseLost:
            logger.warning("lost the job's lease; another runner goes on", extra={"job_id": job_id})
            return RunReport(job_id, RunOutcome.LOST_LEASE, message="lease lost")
        except Exception as error:
            # Infrastructure trouble (the object store, the metadata store): the job stays
            # unfinished, says why, and resumes in its next run; the caller hears the error.
            job.message = f"interrupted ({type(error).__name__}: {error}); resumes in its next run"
            with contextlib.suppress(Exception):  # the store may be what failed
                self._store.save_job(job, self.owner)  # only while the job is still this runner's
            raise
        finally:
            self._store.release_job_lease(job_id, self.owner)

    def _caught_up_since(self, job: OfflineJob) -> bool:
        """A watch's job marked completed that has gained inputs since (its re-queueing was cut
        short: a crash between adding the input and queueing the job again)."""
        if not is_watch_source(job.source) or job.status is not JobStatus.COMPLETED:
            return False
        return self._store.job_progress(job.job_id)[0] < self._store.job_item_count(job.job_id)

    # --- one leased run ---------------------------------------------------------------------------

    def _run_leased(self, job: OfflineJob, deadline: float | None) -> RunReport:
        report = RunReport(job.job_id, RunOutcome.COMPLETED)
        now = self._clock()
        job.status = JobStatus.RUNNING
        job.runs += 1
        job.started_at = job.started_at or now
        job.finished_at = None
        job.paused, job.pause_reason = False, ""
        job.message = "listing inputs" if job.runs == 1 else "resuming where the last run stopped"
        job.heartbeat_at = now  # the last run's heartbeat is not this runner's
        self._live.last_heartbeat = now
        self._save(job)
        input_path = S3Path.parse(job.input_path, "inputPath")
        output_path = S3Path.parse(job.output_path, "outputPath")
        try:
            items = self._inputs(job, input_path)
            pipeline, stages = self._pipeline_stages(job)
            if pipeline is None:
                variant = self._variant(job)
                model = self._model_of(job, variant)
            else:
                variant, model = stages[pipeline.entry].variant, stages[pipeline.entry].model
        except ModellessError as error:
            return self._fail(job, report, error.message)
        state = _RunState(
            job,
            variant,
            model,
            input_path,
            output_path,
            deadline,
            report,
            active_since=now,
            pipeline=pipeline,
            stages=stages,
        )
        try:
            with ThreadPoolExecutor(self._config.io_threads, thread_name_prefix="offline-io") as io:
                while True:
                    done = self._store.done_items(job.job_id)
                    pending = [key for key in items if key not in done]
                    job.total = len(items)
                    job.message = f"{len(pending)} of {len(items)} inputs to go on {_running_on(state)}"
                    self._heartbeat(state, force=True)
                    for group in _chunks(pending, max(1, job.batch, self._config.group_inputs)):
                        self._check_deadline(state)
                        self._renew(job)
                        self._process(state, group, io)
                        self._heartbeat(state)
                    if self._finish(state):
                        break
                    items = self._store.job_items(job.job_id)  # a watch's job gained inputs meanwhile
        except _Yield as stop:
            job.message = str(stop) or "stopped before the deadline; the job continues in its next run"
            report.outcome = RunOutcome.YIELDED
            report.message = job.message
            self._heartbeat(state, force=True)
        except S3AccessDeniedError as error:
            # The results cannot be written: no retry helps until someone grants the access.
            return self._fail(job, report, error.message)
        return report

    def _inputs(self, job: OfflineJob, input_path: S3Path) -> list[str]:
        """The job's inputs: as recorded when it first ran (or, for a watch's job, as its events
        added them), or listed and recorded now."""
        items = self._store.job_items(job.job_id)
        if items or job.total or is_watch_source(job.source):
            job.total = len(items)
            return items
        listed = self._objects.list_objects(input_path.bucket, input_path.prefix, self._config.max_inputs + 1)
        if len(listed) > self._config.max_inputs:
            raise ModellessError(
                f"more than {self._config.max_inputs} objects under {input_path}: split the job"
            )
        items = self._store.fix_job_items(job.job_id, [info.key for info in listed if is_input(info.key)])
        job.total = len(items)
        return items

    def _variant(self, job: OfflineJob) -> VariantProfile:
        """The job's variant: pinned at its first run, so that every result comes from it."""
        if job.variant_id is not None:
            return self._pinned(job, job.variant_id, "the job's variant")
        variant = self._compute.choose_variant(job)
        job.variant_id = variant.variant_id
        job.batch = batch_rows(variant, self._config.max_rows, self._config.run_ms)
        return variant

    def _pinned(self, job: OfflineJob, variant_id: str, what: str) -> VariantProfile:
        found = next((v for v in self._variants(job.app_id) if v.variant_id == variant_id), None)
        if found is None:
            raise NotFoundError(f"{what} {variant_id} no longer exists")
        return found

    def _model_of(self, job: OfflineJob, variant: VariantProfile) -> ModelRecord:
        model = self._models(job.app_id, variant.model_name)
        if model is None:
            raise NotFoundError(f"model {variant.model_name!r} of app {job.app_id!r} no longer exists")
        return model

    def _pipeline_stages(self, job: OfflineJob) -> tuple[PipelineSpec | None, dict[str, _Stage]]:
        """A pipeline job's DAG and its stages' variants, each chosen as a one-model job's would
        be (its model, the stricter of the job's and the stage's accuracy floors) and pinned at
        the first run, so that every result comes from the same variants."""
        if job.pipeline is None:
            return None, {}
        spec = None if self._pipelines is None else self._pipelines.get(job.app_id, job.pipeline)
        if spec is None:
            raise NotFoundError(f"pipeline {job.pipeline!r} of app {job.app_id!r} no longer exists")
        stages: dict[str, _Stage] = {}
        for stage in spec.stages:
            pinned = job.stage_variants.get(stage.name)
            if pinned is not None:
                variant = self._pinned(job, pinned, f"stage {stage.name!r}'s variant")
            else:
                floor = max(job.min_accuracy, spec.accuracy if stage.accuracy is None else stage.accuracy)
                try:
                    variant = self._compute.choose_variant(
                        replace(job, model_name=stage.model, min_accuracy=floor)
                    )
                except ModellessError as error:
                    error.within(f"pipeline {spec.name!r}, stage {stage.name!r}", stage=stage.name)
                    raise
            stages[stage.name] = _Stage(variant, self._model_of(job, variant))
        job.stage_variants = {name: stage.variant.variant_id for name, stage in stages.items()}
        entry = stages[spec.entry].variant
        job.variant_id = entry.variant_id
        job.batch = batch_rows(entry, self._config.max_rows, self._config.run_ms)
        return spec, stages

    # --- one group of inputs ----------------------------------------------------------------------

    def _process(self, state: _RunState, group: list[str], io: ThreadPoolExecutor) -> None:
        """Read and decode the group, run it, write each result once, then mark it done."""
        job = state.job
        decoded: list[_Decoded] = []
        outcomes: dict[str, tuple[str, str]] = {}
        for key, result in zip(group, io.map(lambda k: self._decode(state, k), group), strict=True):
            if isinstance(result, str):
                outcomes[key] = ("", result)
            else:
                decoded.append(_Decoded(key, result))
        outputs = self._infer_cached(state, decoded)
        writes = [(item, out) for item, out in zip(decoded, outputs, strict=True) if not isinstance(out, str)]
        for item, out in zip(decoded, outputs, strict=True):
            if isinstance(out, str):
                outcomes[item.key] = ("", out)
        for (item, _), key in zip(
            writes, io.map(lambda w: self._write_result(state, *w), writes), strict=True
        ):
            outcomes[item.key] = (key, "")
        # Only now, with every result object in place, are the inputs marked done.
        added = self._store.mark_items(job.job_id, outcomes)
        state.report.processed += added
        state.report.failed += sum(1 for _, error in outcomes.values() if error)

    def _decode(self, state: _RunState, key: str) -> np.ndarray | str:
        """The input's rows, or why it cannot be used."""
        try:
            data = self._objects.get(state.input_path.bucket, key)
        except NotFoundError:
            return "the object was deleted after the job started"
        except S3AccessDeniedError as error:
            return error.message
        if len(data) > self._config.max_input_bytes:
            return f"input of {len(data)} bytes exceeds the limit of {self._config.max_input_bytes}"
        try:
            return decode_input(key, data, state.model, self._config.max_rows_per_input)
        except OfflineInputError as error:
            return str(error)

    def _infer_cached(self, state: _RunState, decoded: list[_Decoded]) -> list[np.ndarray | str]:
        """``_infer``, with the prediction cache online queries share: an input whose every row
        is cached for the job's model, by a variant the job's targets admit (as selection would
        for an online query with them), is answered from it; the rest run, and their rows are
        cached under the model's generation (its registration id as this run read it)."""
        cache = self._predictions
        if cache is None or not decoded:
            return self._infer(state, decoded)
        job, model = state.job, state.model
        if state.pipeline is not None:
            # Rows are cached per model; a pipeline's answer is per row of several models (not
            # cached: its stages' rows would need a cache entry of their own each).
            return self._infer(state, decoded)
        if state.cache_admits is None:
            admitted = Candidates(self._variants(job.app_id)).subset(job.min_accuracy, job.model_name)
            state.cache_admits = frozenset(v.variant_id for v in admitted)
        generations = {model.model_name: model.registration_id}
        digests = [cache.digests(item.rows) for item in decoded]
        hits = cache.find_each(job.app_id, generations, digests, state.cache_admits.__contains__)
        missed = [index for index, hit in enumerate(hits) if hit is None]
        ran = iter(self._infer(state, [decoded[index] for index in missed]))
        results: list[np.ndarray | str] = []
        computed: list[np.ndarray] = []
        computed_digests: list[str] = []
        for item, hit, item_digests in zip(decoded, hits, digests, strict=True):
            if hit is not None:
                item.cached_by = hit.variant_ids[0]
                results.append(hit.outputs)
                continue
            out = next(ran)
            results.append(out)
            if not isinstance(out, str):
                computed.append(out)
                computed_digests.extend(item_digests)
        if computed:
            cache.remember(
                job.app_id,
                model.model_name,
                model.registration_id,
                computed_digests,
                np.concatenate(computed),
                state.variant.variant_id,
            )
        cache.count(hits=len(decoded) - len(missed), misses=len(missed))
        return results

    def _infer(self, state: _RunState, decoded: list[_Decoded]) -> list[np.ndarray | str]:
        """Each input's output rows (or why the worker refused it): the group's rows run in
        batches of ``job.batch`` rows."""
        if not decoded:
            return []
        try:
            outputs = self._run_all(state, decoded, np.concatenate([d.rows for d in decoded]))
        except _BatchRefused as refused:
            if len(decoded) == 1:
                return [f"the worker refused the input: {refused.error.message}"]
            # One bad input must not fail the others: each is tried alone.
            return [out for item in decoded for out in self._infer(state, [item])]
        split: list[np.ndarray | str] = []
        offset = 0
        for item in decoded:
            split.append(outputs[offset : offset + len(item.rows)])
            offset += len(item.rows)
        return split

    def _run_all(self, state: _RunState, decoded: list[_Decoded], rows: np.ndarray) -> np.ndarray:
        """The rows' outputs from the job's variant; for a pipeline job, each row's answer from
        one stage-wise pass over the DAG (``pipelines.batch``), whose stages' answered rows are
        noted on the inputs; their outputs are padded with NaN to the widest stage's width."""
        if state.pipeline is None:
            return self._run_rows(state, rows, state.variant, state.job.batch)
        stages = state.stages
        pipeline = state.pipeline

        def run_stage(name: str, stage_rows: np.ndarray) -> np.ndarray:
            stage = stages[name]
            if pipeline.stage(name).input != REQUEST_INPUT:
                try:  # a predecessor's outputs, as the stage's model takes them
                    stage_rows = check_batch(stage_rows, stage.model, len(stage_rows))
                except InvalidInputError as error:
                    error.within(f"stage {name!r} cannot take its input stage's outputs")
                    raise _BatchRefused(error) from error
            batch = batch_rows(stage.variant, self._config.max_rows, self._config.run_ms)
            return self._run_rows(state, stage_rows, stage.variant, batch)

        routed = run_batch(pipeline, rows, run_stage)
        if self._pipelines is not None:
            self._pipelines.add_branch_counts(state.job.app_id, pipeline.name, routed.branches)
        offset = 0
        for item in decoded:
            item.answered_by = routed.answered_by[offset : offset + len(item.rows)]
            offset += len(item.rows)
        width = max(len(row) for row in routed.outputs)
        padded = np.full((len(routed.outputs), width), np.nan)
        for index, row in enumerate(routed.outputs):
            padded[index, : len(row)] = row
        return padded

    def _run_rows(
        self, state: _RunState, rows: np.ndarray, variant: VariantProfile, batch: int
    ) -> np.ndarray:
        step = max(1, batch)
        parts = [
            self._run_batch(state, variant, rows[start : start + step]) for start in range(0, len(rows), step)
        ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _run_batch(self, state: _RunState, variant: VariantProfile, rows: np.ndarray) -> np.ndarray:
        """One inference run where and when the compute allows, retrying worker failures."""
        delay = self._config.retry_s
        while True:
            decision = self._wait_for_capacity(state, variant, len(rows))
            try:
                return self._compute.run(decision, rows, f"{state.job.job_id}:{uuid.uuid4().hex[:8]}").outputs
            except ModellessError as error:
                if 400 <= error.status_code < 500:
                    raise _BatchRefused(error) from error
                failure = error.message
            except Exception as error:  # a worker that died mid-run, a network error
                failure = f"{type(error).__name__}: {error}"
            logger.warning(
                "offline batch failed; retrying", extra={"job_id": state.job.job_id, "error": failure}
            )
            state.job.message = f"retrying after a worker failure: {failure}"
            self._idle(state, delay)
            delay = min(self._config.max_retry_s, delay * 2)

    def _wait_for_capacity(self, state: _RunState, variant: VariantProfile, rows: int) -> Decision:
        """Where the batch may run now; while nowhere (online traffic has the workers), wait."""
        self._renew(state.job)  # before every run: a run may wait long for an idle moment
        while True:
            verdict = self._compute.acquire(variant, rows)
            if not isinstance(verdict, Paused):
                if state.paused_since is not None:
                    with self._live.lock:
                        state.report.paused_s += self._clock() - state.paused_since
                        state.active_since = self._clock()
                        state.paused_since = None
                        state.job.paused, state.job.pause_reason = False, ""
                    logger.info("offline work resumes", extra={"job_id": state.job.job_id})
                    self._heartbeat(state, force=True)
                return verdict
            with self._live.lock:
                if state.paused_since is None:
                    now = self._clock()
                    state.job.active_s += now - state.active_since
                    state.paused_since = now
                    if len(state.report.pauses) < 5:
                        state.report.pauses.append(verdict.reason)
                    logger.info(
                        "offline work pauses", extra={"job_id": state.job.job_id, "reason": verdict.reason}
                    )
                state.job.paused, state.job.pause_reason = True, verdict.reason
            self._idle(state, self._config.poll_s)

    def _idle(self, state: _RunState, seconds: float) -> None:
        """Wait, keeping the lease and the job record fresh, and stopping before the deadline."""
        self._heartbeat(state)
        self._check_deadline(state)
        self._renew(state.job)
        self._sleep(seconds)

    def _write_result(self, state: _RunState, item: _Decoded, outputs: np.ndarray) -> str:
        job = state.job
        key = output_key(state.input_path.prefix, state.output_path.prefix, item.key)
        values = np.asarray(outputs, dtype=np.float64)
        body: dict[str, Any] = {
            "input": state.input_path.url_of(item.key),
            "job": job.job_id,
            "model": state.variant.model_name,
            "variant": item.cached_by or state.variant.variant_id,
            "cached": item.cached_by is not None,
        }
        if state.pipeline is not None and item.answered_by is not None:
            # Each row's answer is its answering stage's outputs (rows of stages with fewer
            # classes were padded with NaN for the batch: the padding is not theirs).
            rows = [row[~np.isnan(row)] for row in values]
            body |= {
                "pipeline": state.pipeline.name,
                "answeredBy": item.answered_by,
                "stages": {
                    name: {"model": s.variant.model_name, "variant": s.variant.variant_id}
                    for name, s in state.stages.items()
                },
                "predictions": [int(np.argmax(row)) for row in rows],
                "outputs": [row.round(6).tolist() for row in rows],
            }
            del body["model"], body["variant"]
        else:
            body |= {
                "predictions": np.argmax(values, axis=1).astype(int).tolist(),
                "outputs": values.round(6).tolist(),
            }
        data = json.dumps(body, sort_keys=True).encode()
        self._objects.put_once(state.output_path.bucket, key, data, job.job_id, "application/json")
        return key

    # --- the end ------------------------------------------------------------------------------

    def _finish(self, state: _RunState) -> bool:
        """Write the summary and mark the job completed; False when a watch's job gained inputs
        since its runner listed them (it is not completed: the runner goes on with them)."""
        job = state.job
        watch = is_watch_source(job.source)
        done, failed = self._store.job_progress(job.job_id)
        if done < job.total:
            # Cannot happen while the lease held; if it did, the next run completes the rest.
            raise _Yield(f"{job.total - done} inputs are not marked done; the next run completes them")
        self._renew(job)  # a runner that lost the job leaves its completion to the new holder
        now = self._clock()
        key = summary_key(state.output_path.prefix, job.job_id)
        errors = self._store.job_errors(job.job_id, MAX_SUMMARY_ERRORS)
        summary: dict[str, Any] = {
            "jobId": job.job_id,
            "appID": job.app_id,
            "inputPath": job.input_path,
            "outputPath": job.output_path,
            "source": job.source,
            "model": state.variant.model_name,
            "variant": state.variant.variant_id,
            "variantAccuracy": state.variant.accuracy,
            "requested": {
                "accuracy": job.min_accuracy,
                "modelName": job.model_name,
                "pipeline": job.pipeline,
            },
            "total": job.total,
            "succeeded": done - failed,
            "failed": failed,
            "errors": [{"input": state.input_path.url_of(k), "error": v} for k, v in errors.items()],
            "errorsTruncated": failed > len(errors),
            "startedAt": job.started_at,
            "finishedAt": now,
            "runs": job.runs,
            "resultSuffix": RESULT_SUFFIX,
        }
        if state.pipeline is not None:
            summary["pipeline"] = state.pipeline.name
            summary["stages"] = {
                name: {
                    "model": s.variant.model_name,
                    "variant": s.variant.variant_id,
                    "accuracy": s.variant.accuracy,
                }
                for name, s in state.stages.items()
            }
        data = json.dumps(summary, indent=2, sort_keys=True).encode()
        if watch:
            # A watch's summary is a living report: rewritten each time its job catches up.
            self._objects.put(state.output_path.bucket, key, data, "application/json")
        else:
            self._objects.put_once(state.output_path.bucket, key, data, job.job_id, "application/json")
        with self._live.lock:  # the keepalive's heartbeat writes "running" before this, never after
            job.active_s += now - state.active_since
            state.active_since = now
            job.summary_key = state.output_path.url_of(key)
            job.done, job.errors = done, failed
            job.status = JobStatus.COMPLETED
            job.finished_at = now
            job.paused, job.pause_reason = False, ""
            job.message = f"{done - failed} of {job.total} inputs succeeded, {failed} failed"
            if watch:
                job.message += f"; watching {job.input_path} for new objects"
            saved = self._store.save_job(job, self.owner)
            if saved is JobSave.NOT_HOLDER:
                raise _LeaseLost()
            if saved is JobSave.NEW_INPUTS:
                job.status, job.finished_at = JobStatus.RUNNING, None
                return False
        if not watch:  # a watch's markers stay: they are how its job knows which objects it has
            self._store.expire_job_progress(job.job_id, self._config.progress_retention_s)
        logger.info(
            "offline job completed",
            extra={"job_id": job.job_id, "total": job.total, "failed": failed, "variant": job.variant_id},
        )
        return True

    def _fail(self, job: OfflineJob, report: RunReport, message: str) -> RunReport:
        with self._live.lock:
            job.status = JobStatus.FAILED
            job.finished_at = self._clock()
            job.message = message
            self._save(job)
        logger.warning("offline job failed", extra={"job_id": job.job_id, "reason": message})
        report.outcome = RunOutcome.FAILED
        report.message = message
        return report

    # --- lease, deadline, heartbeat -----------------------------------------------------------

    def _renew(self, job: OfflineJob) -> None:
        """Keep the lease (also the main thread's sign of life to its keepalive thread)."""
        if self._live.lease_lost or not self._store.renew_job_lease(
            job.job_id, self.owner, self._config.lease_s
        ):
            raise _LeaseLost()
        self._live.alive_at = self._clock()

    def _save(self, job: OfflineJob) -> None:
        """Write the job's record, if the job is still this runner's (atomically: see save_job)."""
        with self._live.lock:
            if self._store.save_job(job, self.owner) is JobSave.NOT_HOLDER:
                raise _LeaseLost()

    @contextlib.contextmanager
    def _keepalive(self, job: OfflineJob) -> Iterator[None]:
        """While the block runs, a thread renews the lease and the job's heartbeat every
        heartbeat period: a batch may wait long in its worker (for an idle moment, up to
        compute.OFFLINE_INVOKE_TIMEOUT_S), and neither may lapse meanwhile."""
        if not self._config.keepalive:
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._keep_alive, args=(job, stop), name=f"offline-keepalive-{job.job_id}", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _keep_alive(self, job: OfflineJob, stop: threading.Event) -> None:
        live = self._live
        warned = failing = False  # one log line per episode, not one per second
        while not stop.wait(max(0.05, self._config.heartbeat_s)):
            quiet_s = self._clock() - live.alive_at
            if quiet_s > self._config.max_quiet_s:
                if not warned:
                    logger.warning(
                        "the runner shows no life: its lease is left to expire",
                        extra={"job_id": job.job_id, "quiet_s": round(quiet_s, 1)},
                    )
                    warned = True
                continue
            try:
                with live.lock:
                    if job.status is not JobStatus.RUNNING:
                        continue  # finishing: the main thread writes the last word
                    if not self._store.renew_job_lease(job.job_id, self.owner, self._config.lease_s):
                        raise _LeaseLost()
                    now = self._clock()
                    if now - live.last_heartbeat >= self._config.heartbeat_s:
                        job.heartbeat_at = live.last_heartbeat = now
                        self._save(job)
                failing = False
            except _LeaseLost:
                live.lease_lost = True  # the main thread stops at its next renewal
                return
            except Exception:  # the store unreachable: the lease may still hold at the next try
                if not failing:
                    logger.warning(
                        "could not renew the job's lease", extra={"job_id": job.job_id}, exc_info=True
                    )
                failing = True

    def _check_deadline(self, state: _RunState) -> None:
        if state.deadline is not None and self._clock() >= state.deadline - self._config.yield_margin_s:
            raise _Yield()

    def _heartbeat(self, state: _RunState, force: bool = False) -> None:
        """Rewrite the job record (progress, pause state) at most once per heartbeat period."""
        with self._live.lock:
            now = self._clock()
            if not force and now - self._live.last_heartbeat < self._config.heartbeat_s:
                return
            job = state.job
            job.done, job.errors = self._store.job_progress(job.job_id)
            if state.paused_since is None:
                job.active_s += now - state.active_since
                state.active_since = now
            job.heartbeat_at = now
            self._live.last_heartbeat = now
            self._save(job)


def _running_on(state: _RunState) -> str:
    if state.pipeline is None:
        return state.variant.variant_id
    return (
        f"pipeline {state.pipeline.name!r} ({', '.join(s.variant.variant_id for s in state.stages.values())})"
    )


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
