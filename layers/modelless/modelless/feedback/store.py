"""What feedback keeps, per app: the recent queries (what each model answered, so that a label can
be matched to them), the feedback given, per-model outcomes, the app's selection policy and each
bandit policy's weights. Everything is keyed by app: a query id of another app is unknown here.

Bounded: a query record and its feedback expire after ``record_ttl_s`` (the in-memory backend
keeps at most ``MAX_QUERY_RECORDS`` per app besides); per model, the recent outcomes are a list
capped at ``RECENT_OUTCOMES``, beside a count and a sum.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from modelless.feedback.policy import Policy

# Feedback may come this long after its query; afterwards the query is unknown (404).
QUERY_RECORD_TTL_S = 3600.0
# The in-memory backend's bound on an app's records, whatever their age.
MAX_QUERY_RECORDS = 10_000
# A model's recent accuracy is over its last this many feedbacks.
RECENT_OUTCOMES = 100

WeightChange = Callable[[dict[str, float]], dict[str, float]]


@dataclass(frozen=True)
class QueryRecord:
    """One answered query as feedback needs it. ``answers``: each model that answered, its class
    per row (one model but for an Exp4 ensemble); ``predictions``: the reply's classes;
    ``probability``: for Exp3, the probability with which it chose its model; ``considered``: for
    Exp3 and Exp4, the eligible models it chose among."""

    query_id: str
    app_id: str
    policy: Policy
    answers: dict[str, list[int]]
    predictions: list[int]
    classes: int
    probability: float | None = None
    considered: list[str] = field(default_factory=list)  # the models the policy chose among

    @property
    def rows(self) -> int:
        return len(self.predictions)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> QueryRecord:
        data = json.loads(raw)
        return cls(
            query_id=str(data["query_id"]),
            app_id=str(data["app_id"]),
            policy=Policy(data["policy"]),
            answers={str(m): [int(c) for c in p] for m, p in data["answers"].items()},
            predictions=[int(c) for c in data["predictions"]],
            classes=int(data["classes"]),
            probability=None if data.get("probability") is None else float(data["probability"]),
            considered=[str(m) for m in data.get("considered", [])],
        )


@dataclass(frozen=True)
class ModelOutcomes:
    """A model's feedback so far: how many, the sum of their rewards, and the recent rewards
    (newest first, at most ``RECENT_OUTCOMES``)."""

    feedbacks: int
    reward_sum: float
    recent: tuple[float, ...]

    @property
    def accuracy(self) -> float | None:
        return self.reward_sum / self.feedbacks if self.feedbacks else None

    @property
    def recent_accuracy(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


class FeedbackStore(Protocol):
    def selection(self, app_id: str) -> Policy:
        """The app's selection policy (INFaaS when never set)."""

    def set_selection(self, app_id: str, policy: Policy) -> None: ...

    def selection_state(self, app_id: str) -> tuple[Policy, dict[str, float]]:
        """What a query of the app reads, in one round trip: its policy and that policy's
        log-weights (empty for INFaaS)."""

    def weights(self, app_id: str, policy: Policy) -> dict[str, float]: ...

    def update_weights(self, app_id: str, policy: Policy, change: WeightChange) -> dict[str, float]:
        """Replace the policy's weights with ``change(weights)``, atomically (concurrent feedback
        never loses an update); returns the new weights."""

    def put_query(self, record: QueryRecord, ttl_s: float) -> None: ...

    def get_query(self, app_id: str, query_id: str) -> QueryRecord | None:
        """The app's record of the query; None when unknown, expired, or another app's."""

    def claim_feedback(self, app_id: str, query_id: str, feedback: str, ttl_s: float) -> str | None:
        """Record ``feedback`` as the query's, unless it has one: None when this call recorded
        it, else the feedback recorded before (atomically: two concurrent feedbacks, one wins)."""

    def add_outcomes(self, app_id: str, rewards: dict[str, float]) -> None:
        """Count one feedback per model with its reward in [0, 1]."""

    def outcomes(self, app_id: str) -> dict[str, ModelOutcomes]: ...
