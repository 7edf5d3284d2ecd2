"""An offline job as ``job status`` shows it: its record with its live progress, and, for a job
whose runner has gone quiet (stalled), what is wrong and when it moves again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from modelless.config import Settings
from modelless.metadata.base import OfflineJobStore
from modelless.offline.jobs import is_watch_source
from modelless.offline.lease import STALLED_AFTER_S
from modelless.types import JobStatus, OfflineJob

ERROR_SAMPLES = 20  # failed inputs a status reply names


def utc_time(epoch_s: float) -> str:
    """An instant as messages show it: ISO 8601, UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


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


def view_of(store: OfflineJobStore, settings: Settings, job: OfflineJob, now: float) -> JobView:
    """The job's view at ``now``: its progress as the store counts it (or its record's final
    counts), a few of its failed inputs, and, when it is stalled, why."""
    total = job.total
    if is_watch_source(job.source):
        # A standing job: its inputs grow with every object, its markers never expire.
        done, errors = store.job_progress(job.job_id)
        total = store.job_item_count(job.job_id)
    elif job.status is JobStatus.COMPLETED:
        # The per-input markers may have expired by now; the record holds the final counts.
        done, errors = job.done, job.errors
    else:
        done, errors = store.job_progress(job.job_id)
    samples = store.job_errors(job.job_id, ERROR_SAMPLES) if errors else {}
    view = JobView(job, done, errors, samples, now, total)
    if view.stalled:
        view.stall_message = stall_message(store, settings, view)
    return view


def stall_message(store: OfflineJobStore, settings: Settings, view: JobView) -> str:
    """Why a stalled job is not moving, and when it moves again."""
    said = f"no heartbeat from its runner for {view.heartbeat_age_s or 0.0:.1f} s (dead, hung or cut off)"
    left_s = store.job_lease_expires_in_s(view.job.job_id)
    if left_s is not None:
        return (
            f"{said}: it resumes by itself when its lease expires at {utc_time(view.now + left_s)} "
            f"(in {left_s:.1f} s)"
        )
    if settings.offline_function:
        return f"{said}; nobody holds it: the offline function's resume schedule resumes it"
    return f"{said}; nobody holds it: it resumes within {settings.offline_resume_every_s:g} s"
