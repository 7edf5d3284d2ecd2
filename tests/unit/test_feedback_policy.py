"""Exp3 and Exp4 (modelless.feedback.policy): their distributions, updates and bounds, on explicit
weights and a seeded RNG; the feedback stores' bounds and app isolation; matching feedback to a
query's answers (``rewards_of``); which models a query's targets make eligible."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from modelless.exceptions import InvalidInputError
from modelless.feedback.memory import InMemoryFeedbackStore
from modelless.feedback.policy import (
    DEFAULT_PARAMS,
    BanditParams,
    Policy,
    combine,
    ensemble_members,
    exp3_choose,
    exp3_probabilities,
    exp3_update,
    exp4_update,
    feedbacks_to_downweight,
    loss_of,
    normalised,
    shares,
)
from modelless.feedback.service import GivenFeedback, rewards_of
from modelless.feedback.store import RECENT_OUTCOMES, QueryRecord

PARAMS = BanditParams(gamma=0.1, learning_rate=0.3, floor=3.0, ensemble_size=3)
# What docs/QUERIES.md states: with these parameters, a model that was the best and now answers
# wrong every time falls under this probability (Exp3) or weight share (Exp4) within this many
# feedbacks, whatever the history before (two models, the other at the floor: the worst case).
THRESHOLD = 0.2
EXP3_BOUND = 16
EXP4_BOUND = 15


# --- Exp3 -------------------------------------------------------------------------------------


def test_exp3_probabilities_mix_the_weights_with_uniform_exploration() -> None:
    weights = {"a": 0.0, "b": -math.log(3)}  # a weighs three times b

    probabilities = exp3_probabilities(weights, ["a", "b"], gamma=0.2)

    assert probabilities["a"] == pytest.approx(0.8 * 0.75 + 0.1)
    assert probabilities["b"] == pytest.approx(0.8 * 0.25 + 0.1)
    assert sum(probabilities.values()) == pytest.approx(1.0)


def test_exp3_gives_an_unweighted_model_the_best_weight_and_ignores_ineligible_ones() -> None:
    weights = {"a": 0.0, "b": -3.0, "slow": 0.0}

    probabilities = exp3_probabilities(weights, ["a", "b", "new"], gamma=0.1)

    assert set(probabilities) == {"a", "b", "new"}  # "slow" cannot meet the targets: never drawn
    assert probabilities["new"] == pytest.approx(probabilities["a"])
    assert probabilities["b"] < probabilities["a"]


def test_exp3_choose_draws_by_the_probabilities_and_is_reproducible() -> None:
    probabilities = {"a": 0.7, "b": 0.2, "c": 0.1}

    def sequence(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [exp3_choose(probabilities, rng) for _ in range(5000)]

    many = Counter(sequence(5))

    assert sequence(1) == sequence(1)  # one seed, one sequence of draws
    assert many["a"] / 5000 == pytest.approx(0.7, abs=0.03)
    assert many["c"] / 5000 == pytest.approx(0.1, abs=0.02)


def test_exp3_update_is_importance_weighted_and_touches_only_the_chosen_model() -> None:
    weights = {"a": 0.0, "b": 0.0}

    sure = exp3_update(weights, "a", loss=1.0, probability=1.0, params=PARAMS)
    rare = exp3_update(weights, "a", loss=1.0, probability=0.25, params=PARAMS)
    right = exp3_update(weights, "a", loss=0.0, probability=0.5, params=PARAMS)

    assert sure == {"a": pytest.approx(-0.3), "b": 0.0}
    assert rare == {"a": pytest.approx(-1.2), "b": 0.0}  # seen a quarter of the time: 4x the step
    assert right == weights


def test_weights_are_renormalised_to_the_best_and_floored() -> None:
    assert normalised({"a": 5.0, "b": 2.0, "c": -10.0}, floor=3.0) == {"a": 0.0, "b": -3.0, "c": -3.0}
    # The best one losing: the other becomes the best (0), the loser is below it.
    updated = exp3_update({"a": 0.0, "b": -0.1}, "a", loss=1.0, probability=0.5, params=PARAMS)
    assert updated == {"a": pytest.approx(-0.5), "b": 0.0}
    # However many losses, never below the floor: a model can always come back.
    weights: dict[str, float] = {"a": 0.0, "b": 0.0}
    for _ in range(1000):
        weights = exp3_update(weights, "a", 1.0, 0.05, PARAMS)
    assert weights == {"a": -3.0, "b": 0.0}


@pytest.mark.parametrize("bad", [-0.1, 1.1, math.nan])
def test_losses_and_probabilities_out_of_range_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        exp3_update({}, "a", bad, 0.5, PARAMS)
    with pytest.raises(ValueError):
        exp4_update({}, {"a": bad}, PARAMS)
    with pytest.raises(ValueError):
        exp3_update({}, "a", 0.5, 0.0, PARAMS)


def test_bandit_parameters_are_checked() -> None:
    for params in ({"gamma": 0.0}, {"learning_rate": 0.0}, {"floor": -1.0}, {"ensemble_size": 0}):
        with pytest.raises(ValueError):
            BanditParams(**params)  # type: ignore[arg-type]


def test_exp3_steers_to_the_better_model_on_a_seeded_run() -> None:
    """A simulated app: model "good" is right 95 % of the time, "bad" 60 %. After a few hundred
    feedbacks Exp3 sends most queries to "good"."""
    rng, truth = random.Random(3), random.Random(4)
    accuracy = {"good": 0.95, "bad": 0.6}
    weights: dict[str, float] = {}
    chosen: list[str] = []
    for _ in range(400):
        probabilities = exp3_probabilities(weights, ["bad", "good"], PARAMS.gamma)
        model = exp3_choose(probabilities, rng)
        loss = 0.0 if truth.random() < accuracy[model] else 1.0
        weights = exp3_update(weights, model, loss, probabilities[model], PARAMS)
        chosen.append(model)

    assert Counter(chosen[-100:])["good"] >= 80
    assert exp3_probabilities(weights, ["bad", "good"], PARAMS.gamma)["good"] > 0.85


# --- bounded down-weighting -------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "bound"), [(Policy.EXP3, EXP3_BOUND), (Policy.EXP4, EXP4_BOUND)])
def test_the_documented_down_weighting_bound(policy: Policy, bound: int) -> None:
    assert feedbacks_to_downweight(PARAMS, models=2, threshold=THRESHOLD, policy=policy) == bound
    # More models: the degraded one falls behind sooner, never later.
    assert feedbacks_to_downweight(PARAMS, models=4, threshold=THRESHOLD, policy=policy) <= bound


def test_a_long_time_best_model_that_degrades_falls_under_the_threshold_within_the_bound() -> None:
    """History: 2000 feedbacks in which "a" was always right and "b" always wrong (b at the
    floor). Then "a" is wrong every time: within EXP3_BOUND feedbacks its probability is under
    THRESHOLD, whatever probability it was chosen with (the importance weight only speeds it)."""
    weights: dict[str, float] = {}
    for _ in range(2000):
        weights = exp4_update(weights, {"a": 0.0, "b": 1.0}, PARAMS)
    exp3_weights = dict(weights)
    for _ in range(EXP3_BOUND):
        p = exp3_probabilities(exp3_weights, ["a", "b"], PARAMS.gamma)["a"]
        exp3_weights = exp3_update(exp3_weights, "a", 1.0, p, PARAMS)
    assert exp3_probabilities(exp3_weights, ["a", "b"], PARAMS.gamma)["a"] < THRESHOLD
    for _ in range(EXP4_BOUND):
        weights = exp4_update(weights, {"a": 1.0, "b": 0.0}, PARAMS)
    assert shares(weights, ["a", "b"])["a"] < THRESHOLD


def test_the_defaults_are_the_documented_parameters() -> None:
    assert DEFAULT_PARAMS == PARAMS


# --- Exp4 -------------------------------------------------------------------------------------


def test_exp4_updates_every_member_by_its_own_loss() -> None:
    updated = exp4_update({"a": 0.0, "b": 0.0, "c": -1.0}, {"a": 0.0, "b": 1.0, "c": 0.5}, PARAMS)

    assert updated == {"a": 0.0, "b": pytest.approx(-0.3), "c": pytest.approx(-1.15)}


def test_ensemble_members_are_the_heaviest_eligible_models() -> None:
    weights = {"a": -2.0, "b": 0.0, "c": -1.0, "d": 0.0}

    assert ensemble_members(weights, ["a", "b", "c", "e"], size=3) == ["b", "e", "c"]
    assert ensemble_members(weights, ["a"], size=3) == ["a"]


def test_combine_is_a_weighted_vote_with_the_winning_share_as_confidence() -> None:
    predictions = {"a": [1, 2], "b": [1, 3], "c": [4, 3]}
    weights = {"a": 0.4, "b": 0.35, "c": 0.25}

    combined = combine(predictions, weights, classes=5)

    assert combined.predictions == [1, 3]  # row 2: b and c outweigh a
    assert combined.confidence == [pytest.approx(0.75), pytest.approx(0.6)]
    tie = combine({"a": [2], "b": [1]}, {"a": 0.5, "b": 0.5}, classes=3)
    assert tie.predictions == [1]  # a tie goes to the lower class
    np.testing.assert_allclose(combined.votes.sum(axis=1), [1.0, 1.0])
    # Members that did not answer: the shares of those that did are renormalised.
    alone = combine({"c": [4, 3]}, weights, classes=5)
    assert alone.predictions == [4, 3] and alone.confidence == [pytest.approx(1.0)] * 2


def test_combine_refuses_members_that_disagree_on_the_rows() -> None:
    with pytest.raises(ValueError):
        combine({"a": [1], "b": [1, 2]}, {"a": 1.0, "b": 1.0}, classes=3)
    with pytest.raises(ValueError):
        combine({}, {}, classes=3)


# --- matching feedback to answers -------------------------------------------------------------


def record(
    answers: dict[str, list[int]], predictions: list[int], policy: Policy = Policy.EXP4
) -> QueryRecord:
    return QueryRecord("q1", "app", policy, answers, predictions, classes=10)


def test_labels_reward_each_model_by_the_rows_it_got_right() -> None:
    answered = record({"a": [1, 2, 3, 4], "b": [1, 0, 0, 4]}, [1, 2, 3, 4])

    assert rewards_of(answered, GivenFeedback(labels=[1, 2, 3, 5])) == {"a": 0.75, "b": 0.25}
    assert rewards_of(record({"a": [7, 7]}, [7, 7]), GivenFeedback(labels=[7])) == {"a": 1.0}


def test_a_reward_goes_to_the_models_that_answered_as_the_reply() -> None:
    answered = record({"a": [1], "b": [2], "c": [1]}, [1])

    assert rewards_of(answered, GivenFeedback(reward=0.25)) == {"a": 0.25, "c": 0.25}


@pytest.mark.parametrize("labels", [[1, 2], [], [10], [-1]])
def test_labels_that_do_not_fit_the_query_are_refused(labels: list[int]) -> None:
    with pytest.raises(InvalidInputError):
        rewards_of(record({"a": [1, 2, 3]}, [1, 2, 3]), GivenFeedback(labels=labels))


def test_loss_of_counts_wrong_rows() -> None:
    assert loss_of([1, 2, 3, 4], [1, 2, 0, 0]) == 0.5
    with pytest.raises(ValueError):
        loss_of([1], [1, 2])


# --- the in-memory store: bounded, per app ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_query_records_expire_and_are_capped_per_app() -> None:
    clock = Clock()
    store = InMemoryFeedbackStore(clock, max_records=3)
    for index in range(5):
        store.put_query(QueryRecord(f"q{index}", "app", Policy.INFAAS, {"a": [1]}, [1], 10), ttl_s=60)

    assert store.get_query("app", "q0") is None and store.get_query("app", "q1") is None
    assert store.get_query("app", "q4") is not None
    clock.now = 61
    assert store.get_query("app", "q4") is None


def test_apps_never_see_each_others_queries_weights_or_outcomes() -> None:
    store = InMemoryFeedbackStore(Clock())
    store.put_query(QueryRecord("shared-id", "one", Policy.EXP3, {"a": [1]}, [1], 10, 0.5), ttl_s=60)
    store.set_selection("one", Policy.EXP3)
    store.update_weights("one", Policy.EXP3, lambda w: {"a": -1.0})
    store.add_outcomes("one", {"a": 1.0})

    assert store.get_query("two", "shared-id") is None
    assert store.claim_feedback("two", "shared-id", "{}", 60) is None
    assert store.get_query("one", "shared-id") is not None
    assert store.selection_state("two") == (Policy.INFAAS, {})
    assert store.selection_state("one") == (Policy.EXP3, {"a": -1.0})
    assert store.outcomes("two") == {}


def test_feedback_is_claimed_once_and_recent_outcomes_are_capped() -> None:
    store = InMemoryFeedbackStore(Clock())
    store.put_query(QueryRecord("q", "app", Policy.INFAAS, {"a": [1]}, [1], 10), ttl_s=60)

    assert store.claim_feedback("app", "q", '{"labels": [1]}', 60) is None
    assert store.claim_feedback("app", "q", '{"labels": [2]}', 60) == '{"labels": [1]}'
    for index in range(RECENT_OUTCOMES + 20):
        store.add_outcomes("app", {"a": float(index % 2)})
    outcomes = store.outcomes("app")["a"]
    assert outcomes.feedbacks == RECENT_OUTCOMES + 20
    assert len(outcomes.recent) == RECENT_OUTCOMES
    assert outcomes.recent_accuracy == pytest.approx(0.5)
