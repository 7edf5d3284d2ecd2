"""Offline jobs run in child processes of the gateway (``python -m modelless.offline run JOB``),
one per job, and started again when one dies (``ChildProcessRunner``).

A child's CPU and GIL are apart from the gateway's, which serves online queries. A child that
dies is seen by its parent at once, which frees its lease, says on the job how it died and
starts it again after a short, growing delay (``RestartPolicy``); a job that kills its runner
every time is failed, saying why.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_lambda_powertools import Logger

from modelless.config import Settings
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.offline.run_state import RunOutcome, RunReport
from modelless.offline.views import utc_time
from modelless.types import JobStatus

logger = Logger(service="offline", child=True)

# The lease a launcher takes to write on a job whose runner died (moments: one read, one write).
RECORD_LEASE_S = 5.0


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
