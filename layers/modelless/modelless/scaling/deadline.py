"""A solve's deadline, and the plan a solver gives when it reaches it with nothing better.

A scaler tick must never overrun (issue 14): the exact solver's time limit is a deadline for
the whole call, at any size. The long loops of the solvers (reading variants, building
patterns, the greedy's passes) ask :meth:`Deadline.check` every so often; past the deadline it
raises :class:`OutOfTime`, and the solver returns the best plan it has found so far, or when it
has none, :func:`holding_plan`: what runs now keeps running, and Lambda takes what it cannot
serve. Reading that plan is linear in the problem's size, so every solver keeps back the time it
takes (:func:`holding_reserve_s`) when it sets its own deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from modelless.scaling.bridge import finish_plan, split_now
from modelless.scaling.problem import EPS, PlanStatus, ScalingPlan, ScalingProblem

# Seconds per variant and per group that building the holding plan takes at most (measured:
# about 0.3 µs per variant and 4 µs per group on the 2-core benchmark machine; 4 times that for a busy one).
HOLD_S_PER_VARIANT = 3e-6
HOLD_S_PER_GROUP = 20e-6
HOLD_S_FIXED = 0.005
CHECK_EVERY = 256  # loop iterations between two looks at the clock


class OutOfTime(Exception):
    """The solve reached its deadline: the caller returns what it has."""


@dataclass(frozen=True)
class Deadline:
    """A moment on ``time.perf_counter``'s clock."""

    at: float

    @classmethod
    def after(cls, seconds: float, start: float | None = None) -> Deadline:
        return cls((time.perf_counter() if start is None else start) + seconds)

    def left(self) -> float:
        return self.at - time.perf_counter()

    def passed(self) -> bool:
        return time.perf_counter() >= self.at

    def check(self) -> None:
        """Raise :class:`OutOfTime` once the deadline has passed."""
        if time.perf_counter() >= self.at:
            raise OutOfTime

    def earlier_by(self, seconds: float) -> Deadline:
        return Deadline(self.at - seconds)


def holding_reserve_s(problem: ScalingProblem) -> float:
    """What :func:`holding_plan` may take on ``problem``: kept back from every solver's deadline."""
    return HOLD_S_FIXED + HOLD_S_PER_VARIANT * len(problem.variants) + HOLD_S_PER_GROUP * len(problem.groups)


def holding_plan(problem: ScalingProblem, solver: str, started: float, why: str) -> ScalingPlan:
    """The plan when a solver reached its deadline with none: the instances and workers running
    now stay (within the pools' bounds), serve what they can of their groups, and Lambda takes the
    rest where it may; what it may not is reported unmet, with ``why``. Its status is
    ``time_limit``, or ``infeasible_partial`` where load is unmet."""
    instances = {(v.id, v.pool): v.running for v in problem.variants if v.running > 0}
    workers: dict[str, int] = {}
    for pool in problem.pools:
        keep = pool.current_workers
        if pool.max_workers is not None:
            keep = min(keep, pool.max_workers)
        workers[pool.name] = max(pool.min_workers, keep)
    served = split_now(problem)  # what the running instances can take, within their time
    covered: dict[str, float] = {}
    for (_, group_id), qps in served.items():
        covered[group_id] = covered.get(group_id, 0.0) + qps
    lambda_qps: dict[str, float] = {}
    unmet: dict[str, float] = {}
    for group in problem.groups:
        rest = problem.need(group) - covered.get(group.id, 0.0)
        if rest <= EPS:
            continue
        if problem.lambda_price(group) is not None:
            lambda_qps[group.id] = rest
        else:
            unmet[group.id] = rest
    status = PlanStatus.INFEASIBLE_PARTIAL if unmet else PlanStatus.TIME_LIMIT
    notes = (f"{why}; holding plan: what runs now stays, Lambda takes the rest",)
    # No bridge: the plan starts nothing (what runs now is all it has).
    return finish_plan(
        problem,
        instances,
        workers,
        lambda_qps,
        served,
        unmet,
        solver,
        status,
        started,
        notes,
        None,
        bridge=False,
    )
