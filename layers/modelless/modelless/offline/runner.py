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

Here: the job's changes of state, one method each (``JobRunner``). Elsewhere: what a run works on
(``run_plan``), one group of inputs from objects to results (``groups``), the lease and its
keepalive thread (``lease``), the result and summary objects (``results``), and what a run is
configured with and keeps between batches (``run_state``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from aws_lambda_powertools import Logger

from modelless.cache.predictions import CachedPredictions
from modelless.exceptions import ModellessError, S3AccessDeniedError
from modelless.metadata.base import JobSave, OfflineJobStore
from modelless.offline.compute import Compute, Paused
from modelless.offline.groups import BatchRefused, GroupRunner
from modelless.offline.jobs import S3Path, is_watch_source, summary_key
from modelless.offline.lease import STALLED_AFTER_S, JobLease, LeaseLost
from modelless.offline.objects import ObjectStore
from modelless.offline.results import MAX_SUMMARY_ERRORS, summary_object
from modelless.offline.run_plan import RunPlanner
from modelless.offline.run_state import RunnerConfig, RunOutcome, RunReport, RunState, running_on
from modelless.pipelines.store import PipelineStore
from modelless.types import Decision, JobStatus, ModelRecord, OfflineJob, VariantProfile

logger = Logger(service="offline", child=True)

# What a job says when its run stopped before the deadline (it goes on in its next run).
UNTIL_NEXT_RUN = "stopped before the deadline; the job continues in its next run"


class _DeadlineNear(Exception):
    """This run must stop now to end before its deadline. Raised only from the waits deep inside
    a batch (for capacity, before a retry), whose callers have no result to give back; between
    groups the runner checks the deadline itself (``_deadline_near``)."""


class JobRunner:
    """Runs offline jobs, one ``run`` at a time. A job's run goes through these changes, each a
    method: ``_claim`` (its lease), ``_start`` (running), ``_pause`` and ``_resume`` (online
    traffic needs the workers, then no longer), and one end: ``_finish`` (completed), ``_fail``,
    ``_stop_until_next_run`` (the deadline nears), ``_interrupted`` (an outage), or the lease lost
    (``LeaseLost``, from any renewal or write)."""

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
        rows are cached are not run, and what runs is cached (``GroupRunner``). ``pipelines``:
        where a pipeline job's DAG is read (None: pipeline jobs fail, saying so)."""
        self._store = store
        self._objects = objects
        self._compute = compute
        self._config = config or RunnerConfig()
        self._clock = clock
        self._sleep = sleep
        self.owner = owner or f"runner-{uuid.uuid4().hex[:12]}"
        self._lease = JobLease(store, self.owner, self._config, clock)
        self._planner = RunPlanner(store, objects, compute, self._config, variants, models, pipelines)
        self._groups = GroupRunner(
            store,
            objects,
            self._config,
            self._run_batch,
            variants=variants,
            predictions=predictions,
            pipelines=pipelines,
        )

    # --- entry point ------------------------------------------------------------------------------

    def run(self, job_id: str, deadline: float | None = None) -> RunReport:
        """Work the job until it is finished, the deadline nears, or the lease is lost."""
        claimed = self._claim(job_id)
        if isinstance(claimed, RunReport):
            return claimed
        job = claimed
        try:
            with self._lease.kept_alive(job):
                return self._run_leased(job, deadline)
        except LeaseLost:
            logger.warning("lost the job's lease; another runner goes on", extra={"job_id": job_id})
            return RunReport(job_id, RunOutcome.LOST_LEASE, message="lease lost")
        except Exception as error:
            self._interrupted(job, error)
            raise
        finally:
            self._store.release_job_lease(job_id, self.owner)

    # --- claim and start ----------------------------------------------------------------------------

    def _claim(self, job_id: str) -> OfflineJob | RunReport:
        """Take the job's lease: the job, or the report of why this runner leaves it (there is
        no such job, it is finished, another runner holds it)."""
        job = self._store.get_job(job_id)
        if job is None:
            return RunReport(job_id, RunOutcome.NOT_FOUND, message=f"no job {job_id!r}")
        if job.status.finished and not self._caught_up_since(job):
            return RunReport(job_id, RunOutcome(job.status.value), message="already finished")
        if not self._store.acquire_job_lease(job_id, self.owner, self._config.lease_s):
            holder = self._store.job_lease_holder(job_id)
            return RunReport(job_id, RunOutcome.BUSY, message=f"held by {holder}")
        # A fresh hold for this run: the last run's signs of life are not this one's.
        self._lease = JobLease(self._store, self.owner, self._config, self._clock)
        return job

    def _caught_up_since(self, job: OfflineJob) -> bool:
        """A watch's job marked completed that has gained inputs since (its re-queueing was cut
        short: a crash between adding the input and queueing the job again)."""
        if not is_watch_source(job.source) or job.status is not JobStatus.COMPLETED:
            return False
        return self._store.job_progress(job.job_id)[0] < self._store.job_item_count(job.job_id)

    def _start(self, job: OfflineJob) -> float:
        """Mark the job running, in one more run; returns when it started."""
        now = self._clock()
        job.status = JobStatus.RUNNING
        job.runs += 1
        job.started_at = job.started_at or now
        job.finished_at = None
        job.paused, job.pause_reason = False, ""
        job.message = "listing inputs" if job.runs == 1 else "resuming where the last run stopped"
        job.heartbeat_at = now  # the last run's heartbeat is not this runner's
        self._lease.last_heartbeat = now
        self._lease.save(job)
        return now

    # --- one leased run ---------------------------------------------------------------------------

    def _run_leased(self, job: OfflineJob, deadline: float | None) -> RunReport:
        """The run, its lease held: start the job, settle its inputs and variants, work its
        inputs group by group, and end it: completed, failed, or stopped for its next run."""
        report = RunReport(job.job_id, RunOutcome.COMPLETED)
        now = self._start(job)
        input_path = S3Path.parse(job.input_path, "inputPath")
        output_path = S3Path.parse(job.output_path, "outputPath")
        try:
            plan = self._planner.plan(job, input_path)
        except ModellessError as error:
            return self._fail(job, report, error.message)
        state = RunState(
            job,
            plan.variant,
            plan.model,
            input_path,
            output_path,
            deadline,
            report,
            active_since=now,
            pipeline=plan.pipeline,
            stages=plan.stages,
        )
        try:
            with ThreadPoolExecutor(self._config.io_threads, thread_name_prefix="offline-io") as io:
                stopped = self._work(state, plan.items, io)
        except _DeadlineNear:
            stopped = UNTIL_NEXT_RUN
        except S3AccessDeniedError as error:
            # The results cannot be written: no retry helps until someone grants the access.
            return self._fail(job, report, error.message)
        if stopped is not None:
            self._stop_until_next_run(state, stopped)
        return report

    def _work(self, state: RunState, items: list[str], io: ThreadPoolExecutor) -> str | None:
        """Work the job's inputs, group by group, until the job is completed (None) or this run
        must stop and leave the rest to the next one (why: the job's message until then)."""
        job = state.job
        while True:
            done = self._store.done_items(job.job_id)
            pending = [key for key in items if key not in done]
            job.total = len(items)
            job.message = f"{len(pending)} of {len(items)} inputs to go on {running_on(state)}"
            self._heartbeat(state, force=True)
            for group in _chunks(pending, max(1, job.batch, self._config.group_inputs)):
                if self._deadline_near(state):
                    return UNTIL_NEXT_RUN
                self._lease.renew(job)
                self._groups.process(state, group, io)
                self._heartbeat(state)
            marked, failed = self._store.job_progress(job.job_id)
            if marked < job.total:
                # Cannot happen while the lease held; if it did, the next run completes the rest.
                return f"{job.total - marked} inputs are not marked done; the next run completes them"
            if self._finish(state, marked, failed):
                return None
            items = self._store.job_items(job.job_id)  # a watch's job gained inputs meanwhile

    # --- one batch: pause, resume, retry ------------------------------------------------------------

    def _run_batch(self, state: RunState, variant: VariantProfile, rows: np.ndarray) -> np.ndarray:
        """One inference run where and when the compute allows, retrying worker failures."""
        delay = self._config.retry_s
        while True:
            decision = self._wait_for_capacity(state, variant, len(rows))
            try:
                return self._compute.run(decision, rows, f"{state.job.job_id}:{uuid.uuid4().hex[:8]}").outputs
            except ModellessError as error:
                if 400 <= error.status_code < 500:
                    raise BatchRefused(error) from error
                failure = error.message
            except Exception as error:  # a worker that died mid-run, a network error
                failure = f"{type(error).__name__}: {error}"
            logger.warning(
                "offline batch failed; retrying", extra={"job_id": state.job.job_id, "error": failure}
            )
            state.job.message = f"retrying after a worker failure: {failure}"
            self._idle(state, delay)
            delay = min(self._config.max_retry_s, delay * 2)

    def _wait_for_capacity(self, state: RunState, variant: VariantProfile, rows: int) -> Decision:
        """Where the batch may run now; while nowhere (online traffic has the workers), wait."""
        self._lease.renew(state.job)  # before every run: a run may wait long for an idle moment
        while True:
            verdict = self._compute.acquire(variant, rows)
            if not isinstance(verdict, Paused):
                if state.paused_since is not None:
                    self._resume(state, state.paused_since)
                return verdict
            self._pause(state, verdict.reason)
            self._idle(state, self._config.poll_s)

    def _pause(self, state: RunState, reason: str) -> None:
        """Online traffic needs the workers: the job says why it waits, and its active time
        stops counting (from the first of a row of refusals)."""
        with self._lease.lock:
            if state.paused_since is None:
                now = self._clock()
                state.job.active_s += now - state.active_since
                state.paused_since = now
                if len(state.report.pauses) < 5:
                    state.report.pauses.append(reason)
                logger.info("offline work pauses", extra={"job_id": state.job.job_id, "reason": reason})
            state.job.paused, state.job.pause_reason = True, reason

    def _resume(self, state: RunState, paused_since: float) -> None:
        """The workers may take offline work again: the pause is over, and the record says so."""
        with self._lease.lock:
            state.report.paused_s += self._clock() - paused_since
            state.active_since = self._clock()
            state.paused_since = None
            state.job.paused, state.job.pause_reason = False, ""
        logger.info("offline work resumes", extra={"job_id": state.job.job_id})
        self._heartbeat(state, force=True)

    def _idle(self, state: RunState, seconds: float) -> None:
        """Wait, keeping the lease and the job record fresh, and stopping before the deadline."""
        self._heartbeat(state)
        if self._deadline_near(state):
            raise _DeadlineNear()
        self._lease.renew(state.job)
        self._sleep(seconds)

    # --- the end ------------------------------------------------------------------------------

    def _finish(self, state: RunState, done: int, failed: int) -> bool:
        """Write the summary and mark the job completed (every input is marked done); False when
        a watch's job gained inputs since its runner listed them (it is not completed: the runner
        goes on with them)."""
        job = state.job
        watch = is_watch_source(job.source)
        self._lease.renew(job)  # a runner that lost the job leaves its completion to the new holder
        now = self._clock()
        key = summary_key(state.output_path.prefix, job.job_id)
        errors = self._store.job_errors(job.job_id, MAX_SUMMARY_ERRORS)
        data = summary_object(state, done, failed, errors, now)
        if watch:
            # A watch's summary is a living report: rewritten each time its job catches up.
            self._objects.put(state.output_path.bucket, key, data, "application/json")
        else:
            self._objects.put_once(state.output_path.bucket, key, data, job.job_id, "application/json")
        with self._lease.lock:  # the keepalive's heartbeat writes "running" before this, never after
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
                raise LeaseLost()
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
        """The job cannot run (no retry would help): failed, saying why."""
        with self._lease.lock:
            job.status = JobStatus.FAILED
            job.finished_at = self._clock()
            job.message = message
            self._lease.save(job)
        logger.warning("offline job failed", extra={"job_id": job.job_id, "reason": message})
        report.outcome = RunOutcome.FAILED
        report.message = message
        return report

    def _stop_until_next_run(self, state: RunState, message: str) -> None:
        """This run ends with the job unfinished (``message``: why); its next run goes on."""
        state.job.message = message
        state.report.outcome = RunOutcome.YIELDED
        state.report.message = state.job.message
        self._heartbeat(state, force=True)

    def _interrupted(self, job: OfflineJob, error: Exception) -> None:
        """Infrastructure trouble (the object store, the metadata store): the job stays
        unfinished, says why, and resumes in its next run; the caller hears the error."""
        job.message = f"interrupted ({type(error).__name__}: {error}); resumes in its next run"
        with contextlib.suppress(Exception):  # the store may be what failed
            self._store.save_job(job, self.owner)  # only while the job is still this runner's

    # --- deadline, heartbeat ------------------------------------------------------------------------

    def _deadline_near(self, state: RunState) -> bool:
        return state.deadline is not None and self._clock() >= state.deadline - self._config.yield_margin_s

    def _heartbeat(self, state: RunState, force: bool = False) -> None:
        """Rewrite the job record (progress, pause state) at most once per heartbeat period."""
        with self._lease.lock:
            now = self._clock()
            if not force and now - self._lease.last_heartbeat < self._config.heartbeat_s:
                return
            job = state.job
            job.done, job.errors = self._store.job_progress(job.job_id)
            if state.paused_since is None:
                job.active_s += now - state.active_since
                state.active_since = now
            job.heartbeat_at = now
            self._lease.last_heartbeat = now
            self._lease.save(job)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# Names importers have always found here, whose homes are now run_state, lease and results.
__all__ = [
    "MAX_SUMMARY_ERRORS",
    "STALLED_AFTER_S",
    "JobRunner",
    "RunOutcome",
    "RunReport",
    "RunnerConfig",
]
