"""The metadata store interface every backend implements and the contract tests check."""

from __future__ import annotations

from typing import Protocol

from modelless.types import ModelRecord, Registration, VariantProfile, WorkerState

# A worker whose last report is older than this is treated as gone: selection never routes to it.
WORKER_STALE_AFTER_S = 10.0
# Per-second load counts are kept this long: the scaler looks back a minute at most.
LOAD_RETENTION_S = 120


class MetadataStore(Protocol):
    # --- apps and their API keys (only a hash of each key is kept) -----------------------------
    def create_app(self, app_id: str, key_hash: str) -> None:
        """Create an app; raises ConflictError if it exists."""

    def app_exists(self, app_id: str) -> bool: ...

    def app_for_key(self, key_hash: str) -> str | None: ...

    # --- models and registrations ---------------------------------------------------------------
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

    # --- variant profiles -----------------------------------------------------------------------
    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]: ...

    def candidate_variants(
        self, app_id: str, min_accuracy: float, model_name: str | None = None
    ) -> list[VariantProfile]:
        """Variants of the app (or of one model) whose accuracy is at least ``min_accuracy``."""

    def profiles_version(self, app_id: str) -> int:
        """A counter that changes whenever the app's variant profiles change."""

    # --- query load per group (what the scaler provisions for) ----------------------------------
    def add_load(self, counts: dict[str, int], second: int) -> None:
        """Add query counts per group key to the given second (epoch seconds)."""

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        """Queries per second per group key over the last ``window_s`` whole seconds."""

    # --- live worker state ----------------------------------------------------------------------
    def put_worker_state(self, state: WorkerState) -> None: ...

    def remove_worker(self, worker_id: str) -> None: ...

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        """Workers that reported within WORKER_STALE_AFTER_S, least utilised first."""

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        """What a selection reads on its critical path, in one round trip: the app's profiles
        version (to revalidate the gateway's profile cache) and the live workers."""

    def close(self) -> None: ...


def open_metadata_store(url: str) -> MetadataStore:
    """``memory://`` or ``redis://host:port/db[?prefix=name:]``."""
    if url.startswith("memory://"):
        from modelless.metadata.memory import InMemoryMetadataStore

        return InMemoryMetadataStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from modelless.metadata.redis import RedisMetadataStore

        return RedisMetadataStore.from_url(url)
    raise ValueError(f"unsupported metadata store URL {url!r}: use memory:// or redis://")
