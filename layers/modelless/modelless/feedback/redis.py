"""Redis feedback store, in the metadata store's Redis and namespace (``KeySpace``): what one
gateway records, every gateway of the deployment can match feedback to and learn from.

Query records and feedback are strings with a TTL; a policy's weights a hash, updated in an
optimistic transaction (WATCH/MULTI) so that concurrent feedback never loses an update; per-model
outcomes a hash of counters and a capped list. Unreachable Redis: ``StoreUnavailableError``, as
from the metadata store (the same outage tracker)."""

from __future__ import annotations

from typing import Any, ClassVar

import redis

from modelless.feedback.policy import Policy
from modelless.feedback.store import RECENT_OUTCOMES, ModelOutcomes, QueryRecord, WeightChange
from modelless.metadata.keys import KeySpace
from modelless.metadata.redis import RedisMetadataStore, _ms, _translating_outages


@_translating_outages
class RedisFeedbackStore:
    kind: ClassVar[str] = "redis"

    def __init__(self, metadata: RedisMetadataStore) -> None:
        self._redis: redis.Redis = metadata._redis  # type: ignore[type-arg]
        self._outage = metadata._outage  # an outage of the one Redis is one outage
        self.keys: KeySpace = metadata.keys

    def selection(self, app_id: str) -> Policy:
        raw = self._redis.get(self.keys.feedback_selection(app_id))
        return Policy(raw.decode()) if isinstance(raw, bytes) else Policy.INFAAS

    def set_selection(self, app_id: str, policy: Policy) -> None:
        self._redis.set(self.keys.feedback_selection(app_id), policy.value)

    def selection_state(self, app_id: str) -> tuple[Policy, dict[str, float]]:
        # One round trip: the policy, and every bandit policy's weights (there are two).
        bandits = (Policy.EXP3, Policy.EXP4)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.feedback_selection(app_id))
            for policy in bandits:
                pipe.hgetall(self.keys.feedback_weights(app_id, policy.value))
            raw, *weights = pipe.execute()
        policy = Policy(raw.decode()) if isinstance(raw, bytes) else Policy.INFAAS
        by_policy = dict(zip(bandits, weights, strict=True))
        return policy, _floats(by_policy.get(policy, {}))

    def weights(self, app_id: str, policy: Policy) -> dict[str, float]:
        return _floats(self._redis.hgetall(self.keys.feedback_weights(app_id, policy.value)))

    def update_weights(self, app_id: str, policy: Policy, change: WeightChange) -> dict[str, float]:
        key = self.keys.feedback_weights(app_id, policy.value)
        updated: dict[str, float] = {}

        def apply(pipe: Any) -> None:
            current = _floats(pipe.hgetall(key))
            updated.clear()
            updated.update(change(current))
            pipe.multi()
            pipe.delete(key)
            if updated:
                pipe.hset(key, mapping={model: repr(value) for model, value in updated.items()})

        self._redis.transaction(apply, key)  # type: ignore[no-untyped-call]
        return dict(updated)

    def put_query(self, record: QueryRecord, ttl_s: float) -> None:
        self._redis.set(
            self.keys.feedback_query(record.app_id, record.query_id), record.to_json(), px=_ms(ttl_s)
        )

    def get_query(self, app_id: str, query_id: str) -> QueryRecord | None:
        raw = self._redis.get(self.keys.feedback_query(app_id, query_id))
        return QueryRecord.from_json(raw) if isinstance(raw, bytes) else None

    def claim_feedback(self, app_id: str, query_id: str, feedback: str, ttl_s: float) -> str | None:
        key = self.keys.feedback_given(app_id, query_id)
        held = self._redis.eval(_CLAIM, 1, key, feedback, _ms(ttl_s))  # type: ignore[no-untyped-call]
        return held.decode() if isinstance(held, bytes) else None

    def add_outcomes(self, app_id: str, rewards: dict[str, float]) -> None:
        counters = self.keys.feedback_outcomes(app_id)
        with self._redis.pipeline(transaction=True) as pipe:
            for model, reward in rewards.items():
                pipe.hincrby(counters, f"{model}:count", 1)
                pipe.hincrbyfloat(counters, f"{model}:reward", reward)
                recent = self.keys.feedback_recent(app_id, model)
                pipe.lpush(recent, repr(reward))
                pipe.ltrim(recent, 0, RECENT_OUTCOMES - 1)
            pipe.execute()

    def outcomes(self, app_id: str) -> dict[str, ModelOutcomes]:
        counters = {
            k.decode(): v.decode()
            for k, v in self._redis.hgetall(self.keys.feedback_outcomes(app_id)).items()
        }
        models = sorted({field.rsplit(":", 1)[0] for field in counters})
        with self._redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.lrange(self.keys.feedback_recent(app_id, model), 0, -1)
            recents = pipe.execute()
        return {
            model: ModelOutcomes(
                int(counters.get(f"{model}:count", 0)),
                float(counters.get(f"{model}:reward", 0.0)),
                tuple(float(r) for r in recent),
            )
            for model, recent in zip(models, recents, strict=True)
        }


def _floats(raw: dict[bytes, bytes]) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in raw.items()}


# KEYS: the query's feedback; ARGV: the feedback, its ttl (ms). Written when none is (nil back);
# else the one written before, untouched.
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""
