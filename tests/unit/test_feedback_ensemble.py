"""The Exp4 ensemble's deadline in FeedbackService, on a stand-in dispatcher whose members answer
when the test lets them: members late at the deadline are left out and named; with none in time,
the first to answer is the reply; with every member failed, the first member's error. (On real
workers: tests/functional/test_feedback_selection.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Set
from typing import Any

import numpy as np
import pytest

from modelless.dispatch.router import QueryResult
from modelless.exceptions import QueryFailedError
from modelless.feedback.memory import InMemoryFeedbackStore
from modelless.feedback.policy import Policy
from modelless.feedback.service import STRAGGLER_MARGIN, FeedbackService
from modelless.types import Decision, InstanceState, QueryTargets, Tier
from tests.unit.dispatch_kit import make_variant

MODELS = ("a", "b", "c")


class Members:
    """A stand-in Dispatcher: each model answers its class (a -> 1, b -> 2, c -> 1) once its
    gate is open (open from the start unless the test holds it), or fails when told to."""

    def __init__(self, held: Set[str] = frozenset(), failing: Set[str] = frozenset()) -> None:
        self.gates = {m: threading.Event() for m in MODELS}
        for model in MODELS:
            if model not in held:
                self.gates[model].set()
        self.failing = failing
        self.variants = {m: make_variant(f"app/{m}/fp32/cpu", model=m, p99=1.0) for m in MODELS}
        self.live_view = self
        self.profiles = self

    def view(self, app_id: str, refresh: bool = False) -> tuple[int, list[Any], bool]:
        return 1, [], True

    def candidates(self, targets: QueryTargets, version: int) -> list[Any]:
        return list(self.variants.values())

    def online_query(
        self, targets: QueryTargets, inputs: np.ndarray, correlation_id: str, decode_ms: Any, received: Any
    ) -> QueryResult:
        model = targets.model_name
        assert model is not None
        assert self.gates[model].wait(30), "the test never let the member answer"
        if model in self.failing:
            raise QueryFailedError(f"{model} failed")
        outputs = np.zeros((len(inputs), 10))
        outputs[:, {"a": 1, "b": 2, "c": 1}[model]] = 1.0
        decision = Decision(self.variants[model], Tier.WORKER, "w1", InstanceState.ACTIVE, 1.0, "test")
        return QueryResult(
            outputs, decision, Tier.WORKER, "w1", {"total_ms": 1.0}, False, False, correlation_id
        )


def service_over(members: Members) -> FeedbackService:
    store = InMemoryFeedbackStore()
    store.set_selection("app", Policy.EXP4)
    return FeedbackService(store, members)  # type: ignore[arg-type]


def test_a_member_late_at_the_deadline_is_left_out_and_named() -> None:
    members = Members(held={"c"})
    service = service_over(members)
    try:
        received = time.perf_counter()
        answer = service.answer(
            QueryTargets("app", latency_ms=50.0), np.zeros((2, 4)), "q1", received=received
        )
        answered_after = time.perf_counter() - received
    finally:
        members.gates["c"].set()
        service.close()

    assert answer.ensemble is not None
    assert answer.ensemble.members == ["a", "b"] and answer.ensemble.missing == ["c"]
    assert answered_after >= 0.05 * (1 - STRAGGLER_MARGIN)  # it waited for c until its deadline
    assert answer.ensemble.weights == {"a": 0.5, "b": 0.5}
    # Each answering member's own result (what the gateway's per-variant metrics record).
    assert [r.decision.variant.model_name for r in answer.served] == ["a", "b"]
    assert answer.predictions == [1, 1]  # a tie between a (1) and b (2) goes to the lower class
    record = service.store.get_query("app", "q1")
    assert record is not None and set(record.answers) == {"a", "b"} and record.considered == list(MODELS)


def test_with_no_member_in_time_the_first_to_answer_is_the_reply() -> None:
    members = Members(held={"a", "b", "c"})
    service = service_over(members)
    opener = threading.Timer(0.1, members.gates["b"].set)  # b answers after the 20 ms deadline
    opener.start()
    try:
        answer = service.answer(QueryTargets("app", latency_ms=20.0), np.zeros((1, 4)), "q2")
    finally:
        opener.join()
        members.gates["a"].set()
        members.gates["c"].set()
        service.close()

    assert answer.ensemble is not None
    assert answer.ensemble.members == ["b"] and sorted(answer.ensemble.missing) == ["a", "c"]
    assert answer.predictions == [2] and answer.ensemble.confidence == [1.0]


def test_with_every_member_failed_the_query_fails_as_the_first_member_did() -> None:
    service = service_over(Members(failing=set(MODELS)))
    try:
        with pytest.raises(QueryFailedError, match="a failed"):
            service.answer(QueryTargets("app", latency_ms=50.0), np.zeros((1, 4)), "q3")
    finally:
        service.close()
    assert service.store.get_query("app", "q3") is None  # nothing answered: nothing to give feedback on


def test_a_failed_member_is_missing_and_the_others_answer() -> None:
    service = service_over(Members(failing={"b"}))
    try:
        answer = service.answer(QueryTargets("app"), np.zeros((1, 4)), "q4")  # no target: waits for all
    finally:
        service.close()

    assert answer.ensemble is not None
    assert answer.ensemble.members == ["a", "c"] and answer.ensemble.missing == ["b"]
    assert answer.predictions == [1] and answer.ensemble.confidence == [1.0]
