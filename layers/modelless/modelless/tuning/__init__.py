"""SLO-aware parallelism tuning of a worker's variant instances (RRL, Qin et al. SC '19): see
``docs/TUNING.md``. ``base``: configurations, observations, the objective and the policy
Protocol; ``region``: RRL's region-based search; ``bandit``: the UCB1 baseline; ``live``: the
windows a worker feeds a policy; ``capacity``: what the scaler plans with once tuned."""

from __future__ import annotations

from collections.abc import Sequence

from modelless.tuning.bandit import UcbTuner
from modelless.tuning.base import ParallelConfig, TunerPolicy
from modelless.tuning.region import RegionTuner

POLICIES = ("region", "ucb")


def make_policy(name: str, space: Sequence[ParallelConfig], start: ParallelConfig) -> TunerPolicy:
    if name == "region":
        return RegionTuner(space, start)
    if name == "ucb":
        return UcbTuner(space, start)
    raise ValueError(f"unknown tuning policy {name!r}: one of {', '.join(POLICIES)}")
