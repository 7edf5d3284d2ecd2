"""Online model selection from feedback (Clipper §5): Exp3 picks one model per query, Exp4 asks
several and combines their answers. Pure functions over explicit state, no I/O, no clock.

The state of a policy is one log-weight per model of an app (``LogWeights``; a model without one
counts as 0, the best: a newly registered model is tried). After every update the weights are
renormalised so that the best is 0, and none is kept below ``-floor``: a model can never sink so
far that it takes more than a bounded number of feedbacks to come back, and a model that was best
for a long time drops below the others within a bounded number of errors once its answers go wrong
(``feedbacks_to_downweight``: the bound, what docs/QUERIES.md quotes).

Losses are in [0, 1]: 1 - the reward, or the fraction of a batch's rows a model got wrong.

- Exp3 (Auer et al. 2002; Clipper §5.1): the probability of model i among the eligible ones is
  (1 - gamma) * w_i / sum(w) + gamma / K; only the chosen model's loss is seen, so its update is
  importance-weighted: log w_i -= eta * loss / p_i.
- Exp4 (Clipper §5.2): every member answers; each member's loss is seen, log w_i -= eta * loss_i.
  The ensemble's answer per row is the weighted vote of the members' classes, and its confidence
  the weight share of the members that voted for the winning class.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

LogWeights = Mapping[str, float]


class Policy(StrEnum):
    """An app's selection policy: INFaaS's getVariant (the default), Exp3 or Exp4."""

    INFAAS = "infaas"
    EXP3 = "exp3"
    EXP4 = "exp4"


@dataclass(frozen=True)
class BanditParams:
    """``gamma``: Exp3's exploration share; ``learning_rate``: eta; ``floor``: how far below the
    best a log-weight may sink (e^-floor of the best's weight); ``ensemble_size``: Exp4's members
    at most (the heaviest eligible models)."""

    gamma: float = 0.1
    learning_rate: float = 0.3
    floor: float = 3.0
    ensemble_size: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1 or self.learning_rate <= 0 or self.floor <= 0 or self.ensemble_size < 1:
            raise ValueError(f"bandit parameters out of range: {self}")


DEFAULT_PARAMS = BanditParams()


def normalised(log_weights: LogWeights, floor: float) -> dict[str, float]:
    """The weights shifted so that the best is 0, none below ``-floor``."""
    if not log_weights:
        return {}
    best = max(log_weights.values())
    return {model: max(-floor, value - best) for model, value in log_weights.items()}


def shares(log_weights: LogWeights, models: Sequence[str]) -> dict[str, float]:
    """Each of ``models``' share of their total weight (absent ones count as the best, 0)."""
    if not models:
        return {}
    raw = {model: log_weights.get(model, 0.0) for model in models}
    top = max(raw.values())
    weights = {model: math.exp(value - top) for model, value in raw.items()}
    total = sum(weights.values())
    return {model: weight / total for model, weight in weights.items()}


def exp3_probabilities(log_weights: LogWeights, eligible: Sequence[str], gamma: float) -> dict[str, float]:
    """Exp3's distribution over the ``eligible`` models (those that can meet the query's targets)."""
    share = shares(log_weights, eligible)
    k = len(eligible)
    return {model: (1 - gamma) * share[model] + gamma / k for model in eligible}


def exp3_choose(probabilities: Mapping[str, float], rng: random.Random) -> str:
    """One model drawn from ``probabilities`` (in a stable order, so that a seeded ``rng``
    draws the same model every run)."""
    models = sorted(probabilities)
    if not models:
        raise ValueError("no model to choose from")
    draw = rng.random() * sum(probabilities.values())
    for model in models:
        draw -= probabilities[model]
        if draw < 0:
            return model
    return models[-1]


def exp3_update(
    log_weights: LogWeights,
    model: str,
    loss: float,
    probability: float,
    params: BanditParams,
    considered: Sequence[str] = (),
) -> dict[str, float]:
    """After feedback on a query Exp3 sent to ``model`` with ``probability``: the importance-
    weighted loss lowers its weight; the rest are only renormalised. ``considered``: the models
    the query chose among (those without a weight yet get the best, 0, before renormalising)."""
    _check_loss(loss)
    if not 0 < probability <= 1:
        raise ValueError(f"probability must be in (0, 1], got {probability}")
    updated = _with(log_weights, considered)
    updated[model] = updated.get(model, 0.0) - params.learning_rate * loss / probability
    return normalised(updated, params.floor)


def exp4_update(
    log_weights: LogWeights, losses: Mapping[str, float], params: BanditParams, considered: Sequence[str] = ()
) -> dict[str, float]:
    """After feedback on an ensemble query: each member's own loss lowers its own weight
    (``considered``: as for ``exp3_update``)."""
    updated = _with(log_weights, considered)
    for model, loss in losses.items():
        _check_loss(loss)
        updated[model] = updated.get(model, 0.0) - params.learning_rate * loss
    return normalised(updated, params.floor)


def ensemble_members(log_weights: LogWeights, eligible: Sequence[str], size: int) -> list[str]:
    """Exp4's members: the ``size`` heaviest eligible models (ties by name)."""
    return sorted(eligible, key=lambda model: (-log_weights.get(model, 0.0), model))[:size]


@dataclass(frozen=True)
class Combined:
    """An ensemble's answer: per row, the weighted vote share of every class (``votes``,
    [rows, classes]), the winning class and its share (the confidence)."""

    votes: np.ndarray
    predictions: list[int]
    confidence: list[float]


def combine(predictions: Mapping[str, Sequence[int]], weights: Mapping[str, float], classes: int) -> Combined:
    """The weighted vote of the members that answered (``predictions``: their class per row;
    ``weights``: their shares, renormalised over those that answered). Ties go to the lower class."""
    if not predictions:
        raise ValueError("no member answered")
    rows = {len(p) for p in predictions.values()}
    if len(rows) != 1:
        raise ValueError(f"members answered different numbers of rows: {sorted(rows)}")
    total = sum(weights[model] for model in predictions)
    votes = np.zeros((rows.pop(), classes), dtype=np.float64)
    for model, classes_of_rows in predictions.items():
        share = weights[model] / total if total > 0 else 1 / len(predictions)
        for row, predicted in enumerate(classes_of_rows):
            votes[row, predicted] += share
    winners = votes.argmax(axis=1)
    return Combined(
        votes=votes,
        predictions=[int(c) for c in winners],
        confidence=[float(votes[row, c]) for row, c in enumerate(winners)],
    )


def loss_of(predicted: Sequence[int], labels: Sequence[int]) -> float:
    """The fraction of rows a model got wrong."""
    if len(predicted) != len(labels) or not labels:
        raise ValueError(f"{len(predicted)} predictions for {len(labels)} labels")
    return sum(p != label for p, label in zip(predicted, labels, strict=True)) / len(labels)


def feedbacks_to_downweight(params: BanditParams, models: int, threshold: float, policy: Policy) -> int:
    """The bound: how many feedbacks with loss 1 at most take a model from the best weight, every
    other model at the floor (the worst case), to a selection probability (Exp3) or weight share
    (Exp4) under ``threshold``. Exp3's update is taken at probability 1 (its slowest descent: a
    lower probability divides the loss by less than 1)."""
    if models < 2:
        raise ValueError("down-weighting needs another model to fall behind")
    others = {f"other-{i}": -params.floor for i in range(models - 1)}
    weights: dict[str, float] = {"degraded": 0.0, **others}
    everyone = sorted(weights)
    for feedbacks in range(1, 10_000):
        if policy is Policy.EXP3:
            weights = exp3_update(weights, "degraded", 1.0, 1.0, params)
            level = exp3_probabilities(weights, everyone, params.gamma)["degraded"]
        else:
            weights = exp4_update(weights, {"degraded": 1.0}, params)
            level = shares(weights, everyone)["degraded"]
        if level < threshold:
            return feedbacks
    raise ValueError(f"a model never falls under {threshold} with {params}")


def _with(log_weights: LogWeights, models: Sequence[str]) -> dict[str, float]:
    """The weights, with the best (0) for each of ``models`` that has none yet: what the
    distribution that chose among them took them for."""
    return {**dict.fromkeys(models, 0.0), **log_weights}


def _check_loss(loss: float) -> None:
    if not 0 <= loss <= 1:
        raise ValueError(f"a loss must be in [0, 1], got {loss}")
