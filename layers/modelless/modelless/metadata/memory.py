"""In-memory metadata store for the single-process embedded default and unit tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import ClassVar

from modelless.exceptions import ConflictError
from modelless.metadata.base import (
    LOAD_RETENTION_S,
    WORKER_STALE_AFTER_S,
    IdempotentRequest,
    JobSave,
    mean_load,
)
from modelless.types import JobStatus, ModelRecord, OfflineJob, Registration, VariantProfile, WorkerState


class InMemoryMetadataStore:
    kind: ClassVar[str] = "memory"

    def __init__(self, lease_clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._epoch: str | None = None
        self._lease_clock = lease_clock  # leases (offline jobs', the scaler's) expire on it
        self._apps: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._models: dict[tuple[str, str], ModelRecord] = {}
        self._registrations: dict[str, Registration] = {}
        self._variants: dict[str, dict[str, VariantProfile]] = {}
        self._workers: dict[str, WorkerState] = {}
        self._versions: dict[str, int] = {}
        self._load: dict[int, dict[str, int]] = {}
        self._peaks: dict[int, dict[str, int]] = {}  # second -> group -> its peak slice
        # Offline jobs: records (as JSON, never shared), inputs, done markers, errors, leases.
        self._offline_buckets: dict[str, list[str]] = {}
        self._jobs: dict[str, str] = {}
        self._job_items: dict[str, list[str]] = {}
        self._job_done: dict[str, dict[str, str]] = {}
        self._job_errors: dict[str, dict[str, str]] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # job -> (owner, expiry on the lease clock)
        self._scaler_lease: dict[str, tuple[str, float]] = {}  # the scaler's lease, as a job's
        self._scaling_plan: str | None = None
        # Idempotency keys: (app, operation, key) -> (record, expiry on the lease clock).
        self._request_keys: dict[tuple[str, str, str], tuple[IdempotentRequest, float]] = {}

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

    def list_apps(self) -> list[str]:
        with self._lock:
            return sorted(self._apps)

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

    def add_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        # Storing a profile replaces any of the same id, so publishing is incremental already.
        self.publish_variants(model, variants, registration)

    def remove_variants(self, app_id: str, variant_ids: list[str], registration: Registration) -> None:
        with self._lock:
            app_variants = self._variants.get(app_id, {})
            for variant_id in variant_ids:
                app_variants.pop(variant_id, None)
            self._versions[app_id] = self._versions.get(app_id, 0) + 1
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

    def add_load(self, counts: dict[str, int], second: int, peaks: dict[str, int] | None = None) -> None:
        with self._lock:
            for series, added in ((self._load, counts), (self._peaks, peaks or {})):
                bucket = series.setdefault(second, {})
                for group, count in added.items():
                    bucket[group] = bucket.get(group, 0) + count
                for old in [s for s in series if s < second - LOAD_RETENTION_S]:
                    del series[old]

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        return mean_load(self.load_series(window_s, now), window_s)

    def load_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        return self._series(self._load, window_s, now)

    def peak_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        return self._series(self._peaks, window_s, now)

    def _series(
        self, per_second: dict[int, dict[str, int]], window_s: int, now: float
    ) -> dict[str, list[int]]:
        last = int(now) - 1  # the current second is still being counted
        series: dict[str, list[int]] = {}
        with self._lock:
            for position, second in enumerate(range(last - window_s + 1, last + 1)):
                for group, count in per_second.get(second, {}).items():
                    series.setdefault(group, [0] * window_s)[position] += count
        return series

    def put_worker_state(self, state: WorkerState) -> None:
        with self._lock:
            self._workers[state.worker_id] = state

    def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        fresh_after = time.time() - WORKER_STALE_AFTER_S
        live = [w for w in self.list_worker_reports(pool) if w.reported_at >= fresh_after]
        return sorted(live, key=lambda w: (w.utilisation, w.worker_id))

    def list_worker_reports(self, pool: str | None = None) -> list[WorkerState]:
        with self._lock:
            return [w for w in self._workers.values() if pool is None or w.pool == pool]

    # --- offline jobs ---------------------------------------------------------------------------
    def set_offline_buckets(self, app_id: str, buckets: list[str]) -> None:
        with self._lock:
            self._offline_buckets[app_id] = sorted(set(buckets))

    def offline_buckets(self, app_id: str) -> list[str] | None:
        found = self._offline_buckets.get(app_id)
        return list(found) if found is not None else None

    def create_job(self, job: OfflineJob) -> bool:
        with self._lock:
            if job.job_id in self._jobs:
                return False
            self._jobs[job.job_id] = job.to_json()
            return True

    def put_job(self, job: OfflineJob) -> None:
        with self._lock:
            self._jobs[job.job_id] = job.to_json()

    def save_job(self, job: OfflineJob, owner: str) -> JobSave:
        now = self._lease_clock()
        with self._lock:
            held = self._leases.get(job.job_id)
            if held is None or held[0] != owner or held[1] <= now:
                return JobSave.NOT_HOLDER
            if job.status is JobStatus.COMPLETED and len(self._job_done.get(job.job_id, {})) < len(
                self._job_items.get(job.job_id, [])
            ):
                return JobSave.NEW_INPUTS
            self._jobs[job.job_id] = job.to_json()
            return JobSave.SAVED

    def add_job_items(self, job_id: str, keys: list[str], reopen_message: str) -> int:
        with self._lock:
            items = self._job_items.setdefault(job_id, [])
            known = set(items)
            new = [k for k in dict.fromkeys(keys) if k not in known]
            items.extend(new)
            raw = self._jobs.get(job_id)
            if new and raw is not None:
                job = OfflineJob.from_json(raw)
                if job.status is JobStatus.COMPLETED:
                    job.status, job.finished_at, job.message = JobStatus.QUEUED, None, reopen_message
                    self._jobs[job_id] = job.to_json()
            return len(new)

    def job_item_count(self, job_id: str) -> int:
        return len(self._job_items.get(job_id, []))

    def get_job(self, job_id: str) -> OfflineJob | None:
        raw = self._jobs.get(job_id)
        return OfflineJob.from_json(raw) if raw is not None else None

    def list_jobs(self, app_id: str) -> list[OfflineJob]:
        jobs = [OfflineJob.from_json(raw) for raw in list(self._jobs.values())]
        return sorted((j for j in jobs if j.app_id == app_id), key=lambda j: (-j.created_at, j.job_id))

    def unfinished_jobs(self) -> list[str]:
        jobs = [OfflineJob.from_json(raw) for raw in list(self._jobs.values())]
        return sorted(j.job_id for j in jobs if not j.status.finished)

    def fix_job_items(self, job_id: str, keys: list[str]) -> list[str]:
        with self._lock:
            return list(self._job_items.setdefault(job_id, list(keys)))

    def job_items(self, job_id: str) -> list[str]:
        return list(self._job_items.get(job_id, []))

    def mark_items(self, job_id: str, outcomes: dict[str, tuple[str, str]]) -> int:
        added = 0
        with self._lock:
            done = self._job_done.setdefault(job_id, {})
            errors = self._job_errors.setdefault(job_id, {})
            for item, (output_key, error) in outcomes.items():
                if item in done:
                    continue
                done[item] = output_key
                if error:
                    errors[item] = error
                added += 1
        return added

    def done_items(self, job_id: str) -> set[str]:
        return set(self._job_done.get(job_id, {}))

    def job_progress(self, job_id: str) -> tuple[int, int]:
        return len(self._job_done.get(job_id, {})), len(self._job_errors.get(job_id, {}))

    def job_errors(self, job_id: str, limit: int) -> dict[str, str]:
        errors = self._job_errors.get(job_id, {})
        return {key: errors[key] for key in sorted(errors)[:limit]}

    def acquire_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        return self._acquire_lease(self._leases, job_id, owner, ttl_s)

    def _acquire_lease(
        self, leases: dict[str, tuple[str, float]], name: str, owner: str, ttl_s: float
    ) -> bool:
        now = self._lease_clock()
        with self._lock:
            held = leases.get(name)
            if held is not None and held[1] > now and held[0] != owner:
                return False
            leases[name] = (owner, now + ttl_s)
            return True

    def renew_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        now = self._lease_clock()
        with self._lock:
            held = self._leases.get(job_id)
            if held is None or held[0] != owner or held[1] <= now:
                return False
            self._leases[job_id] = (owner, now + ttl_s)
            return True

    def release_job_lease(self, job_id: str, owner: str) -> None:
        self._release_lease(self._leases, job_id, owner)

    def _release_lease(self, leases: dict[str, tuple[str, float]], name: str, owner: str) -> None:
        with self._lock:
            held = leases.get(name)
            if held is not None and held[0] == owner:
                del leases[name]

    def job_lease_holder(self, job_id: str) -> str | None:
        return self._lease_holder(self._leases, job_id)

    def job_lease_expires_in_s(self, job_id: str) -> float | None:
        held = self._leases.get(job_id)
        left = held[1] - self._lease_clock() if held is not None else 0.0
        return left if left > 0 else None

    def _lease_holder(self, leases: dict[str, tuple[str, float]], name: str) -> str | None:
        held = leases.get(name)
        return held[0] if held is not None and held[1] > self._lease_clock() else None

    def acquire_scaler_lease(self, owner: str, ttl_s: float) -> bool:
        return self._acquire_lease(self._scaler_lease, "scaler", owner, ttl_s)

    def release_scaler_lease(self, owner: str) -> None:
        self._release_lease(self._scaler_lease, "scaler", owner)

    def scaler_lease_holder(self) -> str | None:
        return self._lease_holder(self._scaler_lease, "scaler")

    def put_scaling_plan(self, plan: str) -> None:
        self._scaling_plan = plan

    def scaling_plan(self) -> str | None:
        return self._scaling_plan

    def expire_job_progress(self, job_id: str, after_s: float) -> None:
        # Nothing outlives the process here; the sets stay for as long as it runs.
        pass

    # --- idempotency keys ------------------------------------------------------------------------
    def claim_request(
        self, app_id: str, operation: str, key: str, pending: IdempotentRequest, ttl_s: float
    ) -> IdempotentRequest | None:
        now = self._lease_clock()
        with self._lock:
            held = self._request_keys.get((app_id, operation, key))
            if held is not None and held[1] > now:
                return held[0]
            self._request_keys[(app_id, operation, key)] = (pending, now + ttl_s)
            for name in [k for k, (_, expiry) in self._request_keys.items() if expiry <= now]:
                del self._request_keys[name]  # expired ones go, as Redis lets them
            return None

    def complete_request(
        self, app_id: str, operation: str, key: str, done: IdempotentRequest, ttl_s: float
    ) -> None:
        with self._lock:
            self._request_keys[(app_id, operation, key)] = (done, self._lease_clock() + ttl_s)

    def release_request(self, app_id: str, operation: str, key: str, pending: IdempotentRequest) -> None:
        with self._lock:
            held = self._request_keys.get((app_id, operation, key))
            if held is not None and held[0] == pending:
                del self._request_keys[(app_id, operation, key)]

    def ping(self) -> None:
        pass  # in this process: always answers

    def epoch(self) -> str | None:
        return self._epoch

    def set_epoch(self, epoch: str) -> str:
        with self._lock:
            if self._epoch is None:
                self._epoch = epoch
            return self._epoch

    def close(self) -> None:
        pass


def _copy(registration: Registration) -> Registration:
    # Registrations are mutable progress records: never share an instance with a caller.
    return Registration.from_json(registration.to_json())
