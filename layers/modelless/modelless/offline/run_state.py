"""What one run of an offline job is configured with (``RunnerConfig``), what it reports
(``RunReport``), and what it keeps between batches (``RunState``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from modelless.offline.jobs import S3Path
from modelless.pipelines.spec import PipelineSpec
from modelless.types import ModelRecord, OfflineJob, VariantProfile


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


@dataclass
class Decoded:
    """One input of a group, read and decoded into its model's rows."""

    key: str
    rows: np.ndarray
    cached_by: str | None = None  # answered from the prediction cache: the variant that computed it
    answered_by: list[str] | None = None  # a pipeline job's: per row, the stage that answered it


@dataclass(frozen=True)
class Stage:
    """A pipeline job's stage: its pinned variant and its model (the contract its rows meet)."""

    variant: VariantProfile
    model: ModelRecord


@dataclass
class RunState:
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
    stages: dict[str, Stage] = field(default_factory=dict)


def running_on(state: RunState) -> str:
    """What the job's messages say it runs on: its variant, or its pipeline's stages' variants."""
    if state.pipeline is None:
        return state.variant.variant_id
    return (
        f"pipeline {state.pipeline.name!r} ({', '.join(s.variant.variant_id for s in state.stages.values())})"
    )
