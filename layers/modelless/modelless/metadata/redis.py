"""Redis metadata store: hashes for profiles, sorted sets for the accuracy/latency/load indexes.

Multi-key writes go through MULTI/EXEC pipelines so that a reader never sees half a model.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from modelless.exceptions import ConflictError
from modelless.metadata.base import LOAD_RETENTION_S, WORKER_STALE_AFTER_S
from modelless.metadata.keys import KeySpace
from modelless.types import ModelRecord, Registration, VariantProfile, WorkerState


class RedisMetadataStore:
    def __init__(self, client: redis.Redis, keys: KeySpace | None = None) -> None:  # type: ignore[type-arg]
        self._redis = client
        self.keys = keys or KeySpace()

    @classmethod
    def from_url(cls, url: str) -> RedisMetadataStore:
        """``redis://host:port/db?prefix=name:`` — the prefix namespaces every key."""
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        prefix = query.pop("prefix", ["modelless:"])[0]
        remaining = "&".join(f"{k}={v[0]}" for k, v in query.items())
        client_url = urlunsplit((parts.scheme, parts.netloc, parts.path, remaining, ""))
        return cls(redis.Redis.from_url(client_url), KeySpace(prefix))

    # --- apps -----------------------------------------------------------------------------------
    def create_app(self, app_id: str, key_hash: str) -> None:
        created = self._redis.hsetnx(self.keys.app(app_id), "key_hash", key_hash)
        if not created:
            raise ConflictError(f"app {app_id!r} already exists", app_id=app_id)
        self._redis.set(self.keys.api_key(key_hash), app_id)

    def app_exists(self, app_id: str) -> bool:
        return bool(self._redis.exists(self.keys.app(app_id)))

    def app_for_key(self, key_hash: str) -> str | None:
        raw = self._redis.get(self.keys.api_key(key_hash))
        return raw.decode() if isinstance(raw, bytes) else None

    # --- models and registrations ---------------------------------------------------------------
    def add_model(self, model: ModelRecord, registration: Registration) -> None:
        model_key = self.keys.model(model.app_id, model.model_name)
        if not self._redis.set(model_key, model.to_json(), nx=True):
            raise ConflictError(
                f"model {model.model_name!r} is already registered in app {model.app_id!r}",
                model_name=model.model_name,
            )
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self.keys.models(model.app_id), model.model_name)
            pipe.set(self.keys.registration(registration.registration_id), registration.to_json())
            pipe.execute()

    def get_model(self, app_id: str, model_name: str) -> ModelRecord | None:
        raw = self._redis.get(self.keys.model(app_id, model_name))
        return ModelRecord.from_json(raw) if isinstance(raw, bytes) else None

    def list_models(self, app_id: str) -> list[ModelRecord]:
        names = sorted(n.decode() for n in self._redis.smembers(self.keys.models(app_id)))
        if not names:
            return []
        raws = self._redis.mget([self.keys.model(app_id, name) for name in names])
        return [ModelRecord.from_json(raw) for raw in raws if raw is not None]

    def delete_model(self, app_id: str, model_name: str) -> None:
        variant_ids = [v.variant_id for v in self.list_variants(app_id, model_name)]
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.model(app_id, model_name))
            pipe.srem(self.keys.models(app_id), model_name)
            pipe.incr(self.keys.profiles_version(app_id))
            pipe.delete(self.keys.accuracy_index(app_id, model_name))
            if variant_ids:
                pipe.hdel(self.keys.variants(app_id), *variant_ids)
                pipe.zrem(self.keys.accuracy_index(app_id), *variant_ids)
                pipe.zrem(self.keys.latency_index(app_id), *variant_ids)
            pipe.execute()

    def put_registration(self, registration: Registration) -> None:
        self._redis.set(self.keys.registration(registration.registration_id), registration.to_json())

    def get_registration(self, registration_id: str) -> Registration | None:
        raw = self._redis.get(self.keys.registration(registration_id))
        return Registration.from_json(raw) if isinstance(raw, bytes) else None

    def publish_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        app_id = model.app_id
        with self._redis.pipeline(transaction=True) as pipe:
            if variants:
                pipe.hset(self.keys.variants(app_id), mapping={v.variant_id: v.to_json() for v in variants})
                accuracy: dict[str | bytes, float] = {v.variant_id: v.accuracy for v in variants}
                pipe.zadd(self.keys.accuracy_index(app_id), accuracy)
                pipe.zadd(self.keys.accuracy_index(app_id, model.model_name), accuracy)
                pipe.zadd(self.keys.latency_index(app_id), {v.variant_id: v.latency_ms(1) for v in variants})
            pipe.set(self.keys.model(app_id, model.model_name), model.to_json())
            pipe.set(self.keys.registration(registration.registration_id), registration.to_json())
            pipe.incr(self.keys.profiles_version(app_id))
            pipe.execute()

    # --- variants -------------------------------------------------------------------------------
    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]:
        if model_name is None:
            raws = self._redis.hvals(self.keys.variants(app_id))
        else:
            ids = self._redis.zrange(self.keys.accuracy_index(app_id, model_name), 0, -1)
            raws = self._redis.hmget(self.keys.variants(app_id), ids) if ids else []
        profiles = [VariantProfile.from_json(raw) for raw in raws if raw is not None]
        return sorted(profiles, key=lambda v: v.variant_id)

    def candidate_variants(
        self, app_id: str, min_accuracy: float, model_name: str | None = None
    ) -> list[VariantProfile]:
        index = self.keys.accuracy_index(app_id, model_name)
        ids = self._redis.zrangebyscore(index, min_accuracy, "+inf")
        if not ids:
            return []
        raws = self._redis.hmget(self.keys.variants(app_id), ids)
        return [VariantProfile.from_json(raw) for raw in raws if raw is not None]

    # --- live worker state ----------------------------------------------------------------------
    def put_worker_state(self, state: WorkerState) -> None:
        # One hash for all workers: selection reads the whole live state in a single round trip.
        # A worker that stops reporting is filtered out by its report time.
        self._redis.hset(self.keys.workers(), state.worker_id, state.to_json())

    def remove_worker(self, worker_id: str) -> None:
        self._redis.hdel(self.keys.workers(), worker_id)

    def add_load(self, counts: dict[str, int], second: int) -> None:
        if not counts:
            return
        key = self.keys.load(second)
        with self._redis.pipeline(transaction=True) as pipe:
            for group, count in counts.items():
                pipe.hincrby(key, group, count)
            pipe.expire(key, LOAD_RETENTION_S)
            pipe.execute()

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        last = int(now) - 1  # the current second is still being counted
        with self._redis.pipeline(transaction=False) as pipe:
            for second in range(last - window_s + 1, last + 1):
                pipe.hgetall(self.keys.load(second))
            buckets = pipe.execute()
        totals: dict[str, float] = {}
        for bucket in buckets:
            for group, count in bucket.items():
                totals[group.decode()] = totals.get(group.decode(), 0.0) + int(count)
        return {group: total / window_s for group, total in totals.items()}

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        return _live(self._redis.hvals(self.keys.workers()), pool)

    def profiles_version(self, app_id: str) -> int:
        raw = self._redis.get(self.keys.profiles_version(app_id))
        return int(raw) if raw is not None else 0

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.profiles_version(app_id))
            pipe.hvals(self.keys.workers())
            version, raws = pipe.execute()
        return (int(version) if version is not None else 0), _live(raws, None)

    def flush_namespace(self) -> None:
        """Delete every key under this store's prefix (tests and `modelless reset`)."""
        keys = list(self._redis.scan_iter(match=self.keys.pattern(), count=500))
        if keys:
            self._redis.delete(*keys)

    def close(self) -> None:
        self._redis.close()


def _live(raws: list[bytes], pool: str | None) -> list[WorkerState]:
    fresh_after = time.time() - WORKER_STALE_AFTER_S
    states = [WorkerState.from_json(raw) for raw in raws]
    live = [s for s in states if s.reported_at >= fresh_after and (pool is None or s.pool == pool)]
    return sorted(live, key=lambda w: (w.utilisation, w.worker_id))
