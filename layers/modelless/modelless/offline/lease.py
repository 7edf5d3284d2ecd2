"""A runner's hold on its job: the lease in the metadata store, every write of the job's record
conditional on still holding it, and the keepalive thread that renews both while the runner's
main thread waits in a batch.

The keepalive renews only while the main thread shows life (a lease renewal no older than
``RunnerConfig.max_quiet_s``), so that a hung runner does not hold its job for ever: its lease
expires and another runner takes the job over.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from enum import Enum

from aws_lambda_powertools import Logger

from modelless.metadata.base import JobSave, OfflineJobStore
from modelless.offline.run_state import RunnerConfig
from modelless.types import JobStatus, OfflineJob

logger = Logger(service="offline", child=True)

# A running job whose heartbeat is older than this has lost its runner (dead, hung, cut off from
# the store): five heartbeat periods (RunnerConfig.heartbeat_s), so that one slow write on a busy
# machine does not make a live runner look stalled.
STALLED_AFTER_S = 5.0


class LeaseLost(Exception):
    """The job is no longer this runner's (its lease expired; another runner may hold it).

    An exception, not a return value: any renewal or write, however deep in a batch (a wait for
    capacity, a retry), may find the lease gone, and the whole run then stops at once."""


class _Beat(Enum):
    """What one round of the keepalive found."""

    HELD = "held"  # the lease renewed (and the heartbeat written when due)
    FINISHING = "finishing"  # the job is no longer running: the main thread writes the last word
    LOST = "lost"


class JobLease:
    """One run's lease on one job, shared by the run's main thread and its keepalive thread.
    ``lock`` orders every write of the job's record (and the job's fields the writes read), so
    that the keepalive never writes a view older than one the main thread wrote (say "running"
    over "completed")."""

    def __init__(
        self, store: OfflineJobStore, owner: str, config: RunnerConfig, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._owner = owner
        self._config = config
        self._clock = clock
        self.lock = threading.RLock()
        self.alive_at = clock()  # the main thread's last sign of life: its last lease renewal
        self.last_heartbeat = 0.0
        self.lost = False  # set by the keepalive; the main thread stops at its next renewal

    def renew(self, job: OfflineJob) -> None:
        """Keep the lease (also the main thread's sign of life to its keepalive thread)."""
        if self.lost or not self._store.renew_job_lease(job.job_id, self._owner, self._config.lease_s):
            raise LeaseLost()
        self.alive_at = self._clock()

    def save(self, job: OfflineJob) -> None:
        """Write the job's record, if the job is still this runner's (atomically: see save_job)."""
        with self.lock:
            if self._store.save_job(job, self._owner) is JobSave.NOT_HOLDER:
                raise LeaseLost()

    @contextlib.contextmanager
    def kept_alive(self, job: OfflineJob) -> Iterator[None]:
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
        warned = failing = False  # one log line per episode, not one per second
        while not stop.wait(max(0.05, self._config.heartbeat_s)):
            quiet_s = self._clock() - self.alive_at
            if quiet_s > self._config.max_quiet_s:
                if not warned:
                    logger.warning(
                        "the runner shows no life: its lease is left to expire",
                        extra={"job_id": job.job_id, "quiet_s": round(quiet_s, 1)},
                    )
                    warned = True
                continue
            try:
                beat = self._beat(job)
            except Exception:  # the store unreachable: the lease may still hold at the next try
                if not failing:
                    logger.warning(
                        "could not renew the job's lease", extra={"job_id": job.job_id}, exc_info=True
                    )
                failing = True
                continue
            if beat is _Beat.LOST:
                self.lost = True
                return
            if beat is _Beat.HELD:
                failing = False

    def _beat(self, job: OfflineJob) -> _Beat:
        """Renew the lease and, once per heartbeat period, write the job's heartbeat."""
        with self.lock:
            if job.status is not JobStatus.RUNNING:
                return _Beat.FINISHING
            if not self._store.renew_job_lease(job.job_id, self._owner, self._config.lease_s):
                return _Beat.LOST
            now = self._clock()
            if now - self.last_heartbeat >= self._config.heartbeat_s:
                job.heartbeat_at = self.last_heartbeat = now
                if self._store.save_job(job, self._owner) is JobSave.NOT_HOLDER:
                    return _Beat.LOST
            return _Beat.HELD
