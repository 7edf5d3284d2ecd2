"""In-memory feedback store: one process's gateway (the embedded default) and unit tests."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from modelless.feedback.policy import Policy
from modelless.feedback.store import (
    MAX_QUERY_RECORDS,
    RECENT_OUTCOMES,
    ModelOutcomes,
    QueryRecord,
    WeightChange,
)


class InMemoryFeedbackStore:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_records: int = MAX_QUERY_RECORDS
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock  # records and feedback expire on it
        self._max_records = max_records
        self._selection: dict[str, Policy] = {}
        self._weights: dict[tuple[str, Policy], dict[str, float]] = {}
        # Per app, query id -> (record, feedback given or None, expiry), oldest first.
        self._queries: dict[str, OrderedDict[str, tuple[QueryRecord, str | None, float]]] = {}
        self._counts: dict[tuple[str, str], tuple[int, float]] = {}
        self._recent: dict[tuple[str, str], deque[float]] = {}

    def selection(self, app_id: str) -> Policy:
        return self._selection.get(app_id, Policy.INFAAS)

    def set_selection(self, app_id: str, policy: Policy) -> None:
        with self._lock:
            self._selection[app_id] = policy

    def selection_state(self, app_id: str) -> tuple[Policy, dict[str, float]]:
        with self._lock:
            policy = self._selection.get(app_id, Policy.INFAAS)
            return policy, dict(self._weights.get((app_id, policy), {}))

    def weights(self, app_id: str, policy: Policy) -> dict[str, float]:
        with self._lock:
            return dict(self._weights.get((app_id, policy), {}))

    def update_weights(self, app_id: str, policy: Policy, change: WeightChange) -> dict[str, float]:
        with self._lock:
            updated = change(dict(self._weights.get((app_id, policy), {})))
            self._weights[(app_id, policy)] = dict(updated)
            return dict(updated)

    def put_query(self, record: QueryRecord, ttl_s: float) -> None:
        with self._lock:
            queries = self._queries.setdefault(record.app_id, OrderedDict())
            queries[record.query_id] = (record, None, self._clock() + ttl_s)
            queries.move_to_end(record.query_id)
            self._expire(queries)

    def get_query(self, app_id: str, query_id: str) -> QueryRecord | None:
        with self._lock:
            entry = self._queries.get(app_id, OrderedDict()).get(query_id)
            return entry[0] if entry is not None and entry[2] > self._clock() else None

    def claim_feedback(self, app_id: str, query_id: str, feedback: str, ttl_s: float) -> str | None:
        with self._lock:
            queries = self._queries.get(app_id, OrderedDict())
            entry = queries.get(query_id)
            if entry is None or entry[2] <= self._clock():
                # The record went meanwhile: the feedback is kept as given, with nothing to match.
                return None
            record, given, expiry = entry
            if given is not None:
                return given
            queries[query_id] = (record, feedback, max(expiry, self._clock() + ttl_s))
            return None

    def add_outcomes(self, app_id: str, rewards: dict[str, float]) -> None:
        with self._lock:
            for model, reward in rewards.items():
                count, total = self._counts.get((app_id, model), (0, 0.0))
                self._counts[(app_id, model)] = (count + 1, total + reward)
                self._recent.setdefault((app_id, model), deque(maxlen=RECENT_OUTCOMES)).appendleft(reward)

    def outcomes(self, app_id: str) -> dict[str, ModelOutcomes]:
        with self._lock:
            return {
                model: ModelOutcomes(count, total, tuple(self._recent.get((app, model), ())))
                for (app, model), (count, total) in self._counts.items()
                if app == app_id
            }

    def _expire(self, queries: OrderedDict[str, tuple[QueryRecord, str | None, float]]) -> None:
        now = self._clock()
        while queries and (len(queries) > self._max_records or next(iter(queries.values()))[2] <= now):
            queries.popitem(last=False)
