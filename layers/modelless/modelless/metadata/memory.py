"""In-memory metadata store for the single-process embedded default and unit tests."""

from __future__ import annotations

import threading
import time

from modelless.exceptions import ConflictError
from modelless.metadata.base import LOAD_RETENTION_S, WORKER_STALE_AFTER_S
from modelless.types import ModelRecord, Registration, VariantProfile, WorkerState


class InMemoryMetadataStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apps: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._models: dict[tuple[str, str], ModelRecord] = {}
        self._registrations: dict[str, Registration] = {}
        self._variants: dict[str, dict[str, VariantProfile]] = {}
        self._workers: dict[str, WorkerState] = {}
        self._versions: dict[str, int] = {}
        self._load: dict[int, dict[str, int]] = {}

    def create_app(self, app_id: str, key_hash: str) -> None:
        with self._lock:
            if app_id in self._apps:
                raise ConflictError(f"app {app_id!r} already exists", app_id=app_id)
            self._apps[app_id] = key_hash
            self._keys[key_hash] = app_id

    def app_exists(self, app_id: str) -> bool:
        return app_id in self._apps

    def app_for_key(self, key_hash: str) -> str | None:
        return self._keys.get(key_hash)

    def add_model(self, model: ModelRecord, registration: Registration) -> None:
        with self._lock:
            key = (model.app_id, model.model_name)
            if key in self._models:
                raise ConflictError(
                    f"model {model.model_name!r} is already registered in app {model.app_id!r}",
                    model_name=model.model_name,
                )
            self._models[key] = model
            self._registrations[registration.registration_id] = _copy(registration)

    def get_model(self, app_id: str, model_name: str) -> ModelRecord | None:
        return self._models.get((app_id, model_name))

    def list_models(self, app_id: str) -> list[ModelRecord]:
        return sorted(
            (m for (app, _), m in self._models.items() if app == app_id), key=lambda m: m.model_name
        )

    def delete_model(self, app_id: str, model_name: str) -> None:
        with self._lock:
            self._models.pop((app_id, model_name), None)
            app_variants = self._variants.get(app_id, {})
            for variant_id in [v for v, p in app_variants.items() if p.model_name == model_name]:
                del app_variants[variant_id]
            self._versions[app_id] = self._versions.get(app_id, 0) + 1

    def put_registration(self, registration: Registration) -> None:
        with self._lock:
            self._registrations[registration.registration_id] = _copy(registration)

    def get_registration(self, registration_id: str) -> Registration | None:
        found = self._registrations.get(registration_id)
        return _copy(found) if found else None

    def publish_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        with self._lock:
            app_variants = self._variants.setdefault(model.app_id, {})
            for variant in variants:
                app_variants[variant.variant_id] = variant
            self._versions[model.app_id] = self._versions.get(model.app_id, 0) + 1
            self._models[(model.app_id, model.model_name)] = model
            self._registrations[registration.registration_id] = _copy(registration)

    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]:
        variants = self._variants.get(app_id, {}).values()
        return sorted(
            (v for v in variants if model_name is None or v.model_name == model_name),
            key=lambda v: v.variant_id,
        )

    def candidate_variants(
        self, app_id: str, min_accuracy: float, model_name: str | None = None
    ) -> list[VariantProfile]:
        return [v for v in self.list_variants(app_id, model_name) if v.accuracy >= min_accuracy]

    def profiles_version(self, app_id: str) -> int:
        return self._versions.get(app_id, 0)

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        return self.profiles_version(app_id), self.list_workers()

    def add_load(self, counts: dict[str, int], second: int) -> None:
        with self._lock:
            bucket = self._load.setdefault(second, {})
            for group, count in counts.items():
                bucket[group] = bucket.get(group, 0) + count
            for old in [s for s in self._load if s < second - LOAD_RETENTION_S]:
                del self._load[old]

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        last = int(now) - 1  # the current second is still being counted
        totals: dict[str, float] = {}
        with self._lock:
            for second in range(last - window_s + 1, last + 1):
                for group, count in self._load.get(second, {}).items():
                    totals[group] = totals.get(group, 0.0) + count
        return {group: total / window_s for group, total in totals.items()}

    def put_worker_state(self, state: WorkerState) -> None:
        with self._lock:
            self._workers[state.worker_id] = state

    def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        fresh_after = time.time() - WORKER_STALE_AFTER_S
        live = [
            w
            for w in self._workers.values()
            if w.reported_at >= fresh_after and (pool is None or w.pool == pool)
        ]
        return sorted(live, key=lambda w: (w.utilisation, w.worker_id))

    def close(self) -> None:
        pass


def _copy(registration: Registration) -> Registration:
    # Registrations are mutable progress records: never share an instance with a caller.
    return Registration.from_json(registration.to_json())
