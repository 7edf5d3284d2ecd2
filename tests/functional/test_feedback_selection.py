"""Selection from feedback on real worker processes and a real Redis (Clipper §5): Exp4 ensembles
combine real models' answers and learn per member; Exp3 steers away from a model whose answers
are judged wrong within the documented bound; an ensemble answers at its deadline without its
straggler (a genuinely slow model) and names it; the Redis feedback store keeps apps apart,
claims feedback once, expires records and never loses a concurrent weight update."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.exceptions import ConflictError, NotFoundError
from modelless.feedback.factory import feedback_store_for
from modelless.feedback.memory import InMemoryFeedbackStore
from modelless.feedback.policy import Policy, exp3_probabilities
from modelless.feedback.redis import RedisFeedbackStore
from modelless.feedback.service import FeedbackService, GivenFeedback
from modelless.feedback.store import FeedbackStore, QueryRecord
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.selection import InfaasPolicy
from modelless.types import QueryTargets
from tests.functional.workers_kit import classes_of, publish_model, report_url_of, start_worker, worker_pool
from tests.models import digits, hidden_model, linear_model, slow_model
from tests.unit.test_feedback_policy import EXP3_BOUND, THRESHOLD
from tests.waiting import wait_for

APP = "feedback-app"


@dataclass
class Served:
    store: RedisMetadataStore
    repository: LocalModelRepository
    pool: LocalWorkerPool
    feedback: FeedbackService


@pytest.fixture
def served(tmp_path: Path, redis_store: RedisMetadataStore) -> Iterator[Served]:
    repository = LocalModelRepository(tmp_path / "repo")
    invoker = HttpWorkerInvoker()
    with worker_pool(str(tmp_path / "repo"), report_url_of(redis_store), tmp_path, slots=4) as pool:
        dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None)
        service = FeedbackService(feedback_store_for(redis_store), dispatcher, rng=random.Random(0))
        try:
            yield Served(redis_store, repository, pool, service)
        finally:
            service.close()
            invoker.close()


def queries(count: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    inputs, labels = digits()
    return np.ascontiguousarray(inputs[-400 + start :][:count]), labels[-400 + start :][:count]


def test_an_exp4_ensemble_of_real_models_answers_and_learns_per_member(served: Served) -> None:
    publish_model(served.store, served.repository, APP, "linear", linear_model(), accuracy=0.86, p99_ms=5.0)
    publish_model(served.store, served.repository, APP, "hidden", hidden_model(), accuracy=0.93, p99_ms=8.0)
    start_worker(served.pool, served.store)
    served.feedback.set_selection(APP, Policy.EXP4)
    inputs, labels = queries(8)

    answer = served.feedback.answer(QueryTargets(APP, min_accuracy=0.8, batch=8), inputs)

    assert answer.policy is Policy.EXP4 and answer.ensemble is not None
    assert sorted(answer.ensemble.members) == ["hidden", "linear"] and answer.ensemble.missing == []
    direct = {"linear": classes_of(linear_model(), inputs), "hidden": classes_of(hidden_model(), inputs)}
    record = served.feedback.store.get_query(APP, answer.result.query_id)
    assert record is not None and record.answers == direct  # what each real model answered
    for row, predicted in enumerate(answer.predictions):
        share = sum(w for m, w in answer.ensemble.weights.items() if direct[m][row] == predicted)
        assert answer.ensemble.confidence[row] == pytest.approx(share, abs=1e-5)
    # Kept for a bounded time only.
    key = served.store.keys.feedback_query(APP, answer.result.query_id)
    assert 0 < served.store._redis.pttl(key) <= 3600 * 1000

    receipt = served.feedback.feedback(APP, answer.result.query_id, GivenFeedback(labels=labels.tolist()))

    accuracy = {m: float(np.mean(np.array(c) == labels)) for m, c in direct.items()}
    assert receipt.rewards == pytest.approx(accuracy)
    weights = served.feedback.store.weights(APP, Policy.EXP4)
    raw = {m: -0.3 * (1 - a) for m, a in accuracy.items()}
    assert weights == pytest.approx({m: v - max(raw.values()) for m, v in raw.items()})
    stats = served.feedback.outcomes(APP)
    assert {m: s.feedbacks for m, s in stats.items()} == {"linear": 1, "hidden": 1}
    again = served.feedback.feedback(APP, answer.result.query_id, GivenFeedback(labels=labels.tolist()))
    assert again.duplicate and served.feedback.store.weights(APP, Policy.EXP4) == weights
    with pytest.raises(ConflictError):
        served.feedback.feedback(APP, answer.result.query_id, GivenFeedback(reward=1.0))
    with pytest.raises(NotFoundError):  # another app never sees this query
        served.feedback.feedback("other-app", answer.result.query_id, GivenFeedback(reward=1.0))


def test_exp3_on_real_workers_stops_choosing_a_model_judged_wrong_within_the_bound(served: Served) -> None:
    """Every answer of "linear" is fed back as wrong, every answer of "hidden" as right: within
    EXP3_BOUND feedbacks on linear, its probability is under THRESHOLD, and Exp3 sends the
    queries to hidden from then on (but for its exploration)."""
    publish_model(served.store, served.repository, APP, "linear", linear_model(), accuracy=0.86, p99_ms=5.0)
    publish_model(served.store, served.repository, APP, "hidden", hidden_model(), accuracy=0.93, p99_ms=8.0)
    start_worker(served.pool, served.store)
    served.feedback.set_selection(APP, Policy.EXP3)
    inputs, _ = queries(60)
    chosen: list[str] = []
    linear_feedbacks_until_low: int | None = None

    for row in range(60):
        answer = served.feedback.answer(
            QueryTargets(APP, latency_ms=2000, min_accuracy=0.8), inputs[row : row + 1]
        )
        assert answer.policy is Policy.EXP3 and answer.probability is not None
        model = answer.result.decision.variant.model_name
        chosen.append(model)
        reward = 0.0 if model == "linear" else 1.0
        served.feedback.feedback(APP, answer.result.query_id, GivenFeedback(reward=reward))
        weights = served.feedback.store.weights(APP, Policy.EXP3)
        low = exp3_probabilities(weights, ["hidden", "linear"], 0.1)["linear"] < THRESHOLD
        if low and linear_feedbacks_until_low is None:
            linear_feedbacks_until_low = chosen.count("linear")

    assert linear_feedbacks_until_low is not None and linear_feedbacks_until_low <= EXP3_BOUND
    assert Counter(chosen[-20:])["hidden"] >= 15


def test_an_ensemble_answers_at_its_deadline_without_its_straggler_and_names_it(served: Served) -> None:
    """ "slow" claims a 5 ms profile but takes hundreds of ms a row: at a 150 ms target the
    ensemble answers with the two quick members and lists slow as missing; slow's answer, when
    it comes, counts for nothing (no feedback reaches it)."""
    publish_model(served.store, served.repository, APP, "linear", linear_model(), accuracy=0.86, p99_ms=5.0)
    publish_model(served.store, served.repository, APP, "hidden", hidden_model(), accuracy=0.93, p99_ms=8.0)
    publish_model(served.store, served.repository, APP, "slow", slow_model(), accuracy=0.9, p99_ms=5.0)
    start_worker(served.pool, served.store)
    served.feedback.set_selection(APP, Policy.EXP4)
    inputs, labels = queries(2)
    # Without a latency target the ensemble waits for every member: all three load and answer.
    warm = served.feedback.answer(QueryTargets(APP, min_accuracy=0.8), inputs[:1])
    assert warm.ensemble is not None and sorted(warm.ensemble.members) == ["hidden", "linear", "slow"]

    answer = served.feedback.answer(QueryTargets(APP, latency_ms=150, min_accuracy=0.8), inputs[1:])

    assert answer.ensemble is not None
    assert answer.ensemble.missing == ["slow"] or (
        # A machine so loaded that no member made the deadline: the first to answer is the reply.
        "slow" in answer.ensemble.missing and len(answer.ensemble.members) == 1
    )
    assert "slow" not in answer.ensemble.members and "slow" not in answer.ensemble.weights
    receipt = served.feedback.feedback(APP, answer.result.query_id, GivenFeedback(labels=[int(labels[1])]))
    assert "slow" not in receipt.rewards and set(receipt.rewards) == set(answer.ensemble.members)


# --- the stores' contract, Redis and in memory ------------------------------------------------


@pytest.fixture(params=["redis", "memory"])
def feedback_store(request: pytest.FixtureRequest, redis_store: RedisMetadataStore) -> FeedbackStore:
    if request.param == "redis":
        return RedisFeedbackStore(redis_store)
    return InMemoryFeedbackStore()


def test_stores_keep_apps_apart_and_claim_feedback_once(feedback_store: FeedbackStore) -> None:
    feedback_store.put_query(
        QueryRecord("q", "one", Policy.EXP4, {"a": [1], "b": [2]}, [1], 10, None, ["a", "b"]), 60
    )
    feedback_store.set_selection("one", Policy.EXP4)

    assert feedback_store.get_query("two", "q") is None
    assert feedback_store.get_query("one", "q") == QueryRecord(
        "q", "one", Policy.EXP4, {"a": [1], "b": [2]}, [1], 10, None, ["a", "b"]
    )
    assert feedback_store.selection("two") is Policy.INFAAS
    assert feedback_store.selection_state("one") == (Policy.EXP4, {})
    assert feedback_store.claim_feedback("one", "q", "first", 60) is None
    assert feedback_store.claim_feedback("one", "q", "second", 60) == "first"
    feedback_store.add_outcomes("one", {"a": 1.0, "b": 0.0})
    feedback_store.add_outcomes("one", {"a": 0.5})
    outcomes = feedback_store.outcomes("one")
    assert outcomes["a"].feedbacks == 2 and outcomes["a"].accuracy == pytest.approx(0.75)
    assert outcomes["b"].recent == (0.0,)
    assert feedback_store.outcomes("two") == {}


def test_redis_records_expire(redis_store: RedisMetadataStore) -> None:
    store = RedisFeedbackStore(redis_store)
    store.put_query(QueryRecord("q", "one", Policy.INFAAS, {"a": [1]}, [1], 10), ttl_s=0.2)

    wait_for(lambda: store.get_query("one", "q") is None, 5.0, "the record's expiry")


def test_concurrent_weight_updates_are_never_lost(feedback_store: FeedbackStore) -> None:
    start = threading.Barrier(8)

    def lower_a() -> None:
        start.wait()
        for _ in range(5):
            feedback_store.update_weights(
                "one", Policy.EXP4, lambda w: {"b": 0.0, **w, "a": w.get("a", 0.0) - 0.01}
            )

    threads = [threading.Thread(target=lower_a) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert not any(thread.is_alive() for thread in threads)
    assert feedback_store.weights("one", Policy.EXP4) == {"a": pytest.approx(-0.4), "b": 0.0}
    assert feedback_store.weights("two", Policy.EXP4) == {}
