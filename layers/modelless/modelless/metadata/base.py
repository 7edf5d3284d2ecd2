"""The metadata store interface every backend implements and the contract tests check."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

from modelless.types import ModelRecord, OfflineJob, Registration, VariantProfile, WorkerState

# A worker whose last report is older than this is treated as gone: selection never routes to it.
# Workers report every second: this is two reports missed, so that a worker whose process died or
# froze without anyone watching it (an EC2 instance lost whole) leaves every gateway's selection
# within 3 s, while a report a busy machine delayed by a second does not drop a healthy worker.
# Where its processes are watched (the embedded stack's pool) a dead or hung worker goes sooner
# (``modelless.pools.health``), and a gateway whose query a worker failed holds it out at once.
WORKER_STALE_AFTER_S = 3.0
# Per-second load counts are kept this long: the scaler looks back a minute at most.
LOAD_RETENTION_S = 120


def mean_load(series: dict[str, list[int]], window_s: int) -> dict[str, float]:
    """Queries per second per group over a ``load_series`` of ``window_s`` seconds."""
    return {group: sum(counts) / window_s for group, counts in series.items()}


class JobSave(StrEnum):
    """What became of a runner's write of its job's record (``OfflineJobStore.save_job``)."""

    SAVED = "saved"
    NOT_HOLDER = "not-holder"  # the runner's lease expired (another runner may hold the job now)
    NEW_INPUTS = "new-inputs"  # "completed", but inputs were added since (a watch's job): not written


@dataclass(frozen=True)
class IdempotentRequest:
    """What the store keeps for one ``Idempotency-Key`` of an app (``MetadataStore.claim_request``):
    the fingerprint of the request that first used it, the token of the claim that runs it, and
    its reply (JSON) once it has one (None while it runs)."""

    fingerprint: str
    claim: str
    reply: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)  # one spelling: compared as text in Redis

    @classmethod
    def from_json(cls, raw: str | bytes) -> IdempotentRequest:
        data = json.loads(raw)
        return cls(str(data["fingerprint"]), str(data["claim"]), data.get("reply"))


class OfflineJobStore(Protocol):
    """Offline jobs (docs/ARCHITECTURE.md §6): their records, per-input done markers and the runner's lease.

    Exactly-once rests on three things kept here: the input list fixed when a job first runs,
    a done marker per input set only once (``mark_items`` counts only markers it set), and a
    lease with a TTL so that one runner works a job at a time and a crashed one's job is free
    again once its lease expires."""

    def set_offline_buckets(self, app_id: str, buckets: list[str]) -> None: ...

    def offline_buckets(self, app_id: str) -> list[str] | None:
        """The app's allowed buckets; None when never set (the deployment's default applies)."""

    def create_job(self, job: OfflineJob) -> bool:
        """Store a new job; False (and nothing written) when a job with its id exists."""

    def put_job(self, job: OfflineJob) -> None:
        """Replace the job's record; a finished job leaves the unfinished set. For writers that
        hold no lease (tests, refusals); a runner writes with ``save_job``."""

    def save_job(self, job: OfflineJob, owner: str) -> JobSave:
        """A runner's write of its job's record, done only while ``owner`` holds the job's lease,
        atomically with that check: a runner whose lease expired (its job perhaps taken, even
        completed, by another) never writes its stale view over the record. A record that says
        completed is written only when every recorded input is marked done (a watch's job may
        have gained inputs since the runner looked). Nothing is written unless SAVED."""

    def add_job_items(self, job_id: str, keys: list[str], reopen_message: str) -> int:
        """Append the inputs not yet among the job's (a watch's standing job grows one input per
        new object), atomically; returns how many were new. A completed job that gains inputs is
        queued again (status queued, ``reopen_message``). A runner completing the job meanwhile
        never hides them: ``save_job`` refuses "completed" while an input is not done."""

    def job_item_count(self, job_id: str) -> int:
        """How many inputs the job has recorded."""

    def get_job(self, job_id: str) -> OfflineJob | None: ...

    def list_jobs(self, app_id: str) -> list[OfflineJob]:
        """The app's jobs, newest first."""

    def unfinished_jobs(self) -> list[str]:
        """Ids of every job neither completed nor failed."""

    def fix_job_items(self, job_id: str, keys: list[str]) -> list[str]:
        """Record the job's inputs unless already recorded; return the recorded list either way
        (a resumed job keeps the list it started with)."""

    def job_items(self, job_id: str) -> list[str]: ...

    def mark_items(self, job_id: str, outcomes: dict[str, tuple[str, str]]) -> int:
        """Mark inputs done, each with (output key, error message) — one of them empty. An input
        already marked keeps its first outcome. Returns how many were newly marked."""

    def done_items(self, job_id: str) -> set[str]: ...

    def job_progress(self, job_id: str) -> tuple[int, int]:
        """(inputs done, of which failed)."""

    def job_errors(self, job_id: str, limit: int) -> dict[str, str]:
        """Up to ``limit`` failed inputs and why, in input-key order."""

    def acquire_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        """Take the job's lease if nobody holds it (or the holder's expired)."""

    def renew_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        """Extend the lease if ``owner`` still holds it; False when it was lost."""

    def release_job_lease(self, job_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it."""

    def job_lease_holder(self, job_id: str) -> str | None: ...

    def job_lease_expires_in_s(self, job_id: str) -> float | None:
        """Seconds until the job's lease expires unless renewed; None when nobody holds it."""

    def expire_job_progress(self, job_id: str, after_s: float) -> None:
        """Let a finished job's per-input sets go after ``after_s`` (its record says the totals)."""


class AppStore(Protocol):
    """Apps and their API keys (only a hash of each key is kept): what the key check reads."""

    def create_app(self, app_id: str, key_hash: str) -> None:
        """Create an app; raises ConflictError if it exists."""

    def app_exists(self, app_id: str) -> bool: ...

    def app_for_key(self, key_hash: str) -> str | None: ...

    def list_apps(self) -> list[str]:
        """Every app's id, sorted: what the admin's dashboard lists (never on a query's path)."""


class ModelStore(Protocol):
    """Models, their registrations and their variants' profiles: what registration writes and
    selection reads."""

    def add_model(self, model: ModelRecord, registration: Registration) -> None:
        """Atomically record a new model and its registration; ConflictError if the name is taken."""

    def get_model(self, app_id: str, model_name: str) -> ModelRecord | None: ...

    def list_models(self, app_id: str) -> list[ModelRecord]: ...

    def delete_model(self, app_id: str, model_name: str) -> None:
        """Remove a model with its variants and index entries (used to undo a failed registration)."""

    def put_registration(self, registration: Registration) -> None: ...

    def get_registration(self, registration_id: str) -> Registration | None: ...

    def publish_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        """Atomically store profiles, index them, mark the model ready and the registration done."""

    def add_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        """Publish some of a model's variants while its registration goes on: atomically store
        (or replace) these profiles and index them, beside those already published, and write
        the model record and the registration as given. Bumps the app's profiles version, so
        that gateways' caches see the new variants at their next decision."""

    def remove_variants(self, app_id: str, variant_ids: list[str], registration: Registration) -> None:
        """Unpublish variants (pruned at the end of their registration) and write the
        registration, atomically; bumps the app's profiles version. Unknown ids are ignored."""

    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]: ...

    def candidate_variants(
        self, app_id: str, min_accuracy: float, model_name: str | None = None
    ) -> list[VariantProfile]:
        """Variants of the app (or of one model) whose accuracy is at least ``min_accuracy``."""

    def profiles_version(self, app_id: str) -> int:
        """A counter that changes whenever the app's variant profiles change."""



class LiveStateStore(Protocol):
    """What changes by the second: the query load per group (what the scaler provisions for), the
    workers' live state, the scaler's lease and the plan it applied last."""

    def add_load(self, counts: dict[str, int], second: int, peaks: dict[str, int] | None = None) -> None:
        """Add query counts per group key to the given second (epoch seconds), and ``peaks``: per
        group key the most queries that arrived in one ``query_load.PEAK_SLICE_S`` slice. Peaks
        from several gateways in one second add up: a bound on their combined peak, never below."""

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        """Queries per second per group key over the last ``window_s`` whole seconds."""

    def load_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        """Queries per group key in each of the last ``window_s`` whole seconds, oldest first
        (groups with no query in them left out): the arrival envelope's input."""

    def peak_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        """Per group key, its peak (``add_load``'s ``peaks``) in each of the last ``window_s``
        whole seconds, oldest first, as ``load_series`` gives the counts."""

    def put_worker_state(self, state: WorkerState) -> None: ...

    def remove_worker(self, worker_id: str) -> None: ...

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        """Workers that reported within WORKER_STALE_AFTER_S, least utilised first."""

    def list_worker_reports(self, pool: str | None = None) -> list[WorkerState]:
        """Every worker's last report, stale ones too (until ``remove_worker``): how a pool provider
        tells a worker that went silent from one still booting, which never reported."""

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        """What a selection reads on its critical path, in one round trip: the app's profiles
        version (to revalidate the gateway's profile cache) and the live workers."""

    # --- the scaler's lease: one scheduled invocation ticks at a time ---------------------------
    def acquire_scaler_lease(self, owner: str, ttl_s: float) -> bool:
        """Take the lease for ``ttl_s`` if nobody holds it (or the holder's expired), or extend
        it if ``owner`` holds it; False while another owner holds it."""

    def release_scaler_lease(self, owner: str) -> None:
        """Drop the lease if ``owner`` holds it."""

    def scaler_lease_holder(self) -> str | None: ...

    # --- the plan the scaler applied last (JSON): what the dashboard shows ---------------------
    def put_scaling_plan(self, plan: str) -> None:
        """Replace the recorded plan (the scaler runs apart from every gateway: this is how they
        learn what it decided)."""

    def scaling_plan(self) -> str | None:
        """The recorded plan; None before the first tick."""



class MetadataStore(AppStore, ModelStore, LiveStateStore, OfflineJobStore, Protocol):
    """Everything a deployment keeps, in one store (``memory`` or ``redis``); its parts are the
    interfaces above, which a caller that needs one part asks for instead."""

    # --- idempotency keys: a retried request gets its first reply, and nothing runs twice -------
    def claim_request(
        self, app_id: str, operation: str, key: str, pending: IdempotentRequest, ttl_s: float
    ) -> IdempotentRequest | None:
        """Take ``key`` (the app's, for ``operation``) for a request about to run, atomically,
        writing ``pending`` (no reply) for ``ttl_s``: None when this call took it (the caller runs
        the request, then ``complete_request`` or ``release_request``); else the record that
        holds it, left as it is: another request's, still running (no reply) or done."""

    def complete_request(
        self, app_id: str, operation: str, key: str, done: IdempotentRequest, ttl_s: float
    ) -> None:
        """Record the reply of the request that took ``key`` (``done``), kept ``ttl_s``."""

    def release_request(self, app_id: str, operation: str, key: str, pending: IdempotentRequest) -> None:
        """Give ``key`` up while it holds ``pending`` (its request failed and changed nothing: a
        retry may run); a record written by another claim, or a reply, is left as it is."""

    # --- the store itself: readiness, and the marker that tells an emptied store ----------------
    kind: ClassVar[str]  # "redis", "memory": what /health/ready reports

    def ping(self) -> None:
        """Return once the store answers; StoreUnavailableError when it does not."""

    def epoch(self) -> str | None:
        """The marker ``set_epoch`` wrote; None in a new store, or one emptied since."""

    def set_epoch(self, epoch: str) -> str:
        """Write the marker unless the store holds one; return the one it holds (atomically)."""

    def close(self) -> None: ...
