"""Redis pipeline store, in the metadata store's Redis and namespace: a hash of specs per app,
and a hash of branch counters per pipeline (HINCRBY: concurrent gateways never lose a count).
Unreachable Redis: ``StoreUnavailableError``, as from the metadata store."""

from __future__ import annotations

from typing import ClassVar

import redis

from modelless.metadata.keys import KeySpace
from modelless.metadata.redis import RedisMetadataStore, _translating_outages
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.store import BranchCount


@_translating_outages
class RedisPipelineStore:
    kind: ClassVar[str] = "redis"

    def __init__(self, metadata: RedisMetadataStore) -> None:
        self._redis: redis.Redis = metadata._redis  # type: ignore[type-arg]
        self._outage = metadata._outage  # an outage of the one Redis is one outage
        self.keys: KeySpace = metadata.keys

    def create(self, app_id: str, spec: PipelineSpec) -> bool:
        return bool(self._redis.hsetnx(self.keys.pipelines(app_id), spec.name, spec.model_dump_json()))

    def get(self, app_id: str, name: str) -> PipelineSpec | None:
        raw = self._redis.hget(self.keys.pipelines(app_id), name)
        return PipelineSpec.model_validate_json(raw) if isinstance(raw, bytes) else None

    def list(self, app_id: str) -> list[PipelineSpec]:
        raw = self._redis.hgetall(self.keys.pipelines(app_id))
        return [PipelineSpec.model_validate_json(raw[name]) for name in sorted(raw)]

    def delete(self, app_id: str, name: str) -> bool:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.pipelines(app_id), name)
            pipe.delete(self.keys.pipeline_branches(app_id, name))
            deleted, _ = pipe.execute()
        return bool(deleted)

    def count_branches(self, app_id: str, name: str, taken: dict[str, bool]) -> None:
        self.add_branch_counts(app_id, name, {edge: (1, int(was)) for edge, was in taken.items()})

    def add_branch_counts(self, app_id: str, name: str, counts: dict[str, tuple[int, int]]) -> None:
        if not counts:
            return
        key = self.keys.pipeline_branches(app_id, name)
        with self._redis.pipeline(transaction=True) as pipe:
            for edge, (seen, taken) in counts.items():
                pipe.hincrby(key, f"{edge}:seen", seen)
                pipe.hincrby(key, f"{edge}:taken", taken)
            pipe.execute()

    def branches(self, app_id: str, name: str) -> dict[str, BranchCount]:
        counters = {
            k.decode(): int(v)
            for k, v in self._redis.hgetall(self.keys.pipeline_branches(app_id, name)).items()
        }
        edges = sorted({field.rsplit(":", 1)[0] for field in counters})
        return {e: BranchCount(counters.get(f"{e}:seen", 0), counters.get(f"{e}:taken", 0)) for e in edges}
