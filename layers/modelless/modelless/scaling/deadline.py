"""A solve's deadline, and the plan a solver gives when it reaches it with nothing better.

A scaler tick must never overrun (issue 14): the exact solver's time limit is a deadline for
the whole call, at any size. The long loops of the solvers (reading variants, building
patterns, the greedy's passes) ask :meth:`Deadline.check` every so often; past the deadline it
raises :class:`OutOfTime`, and the solver returns the best plan it has found so far, or when it
has none, :func:`holding_plan`: what runs now keeps running, and Lambda takes what it cannot
serve. That plan reads only the variants that run now (one scan of the list finds them) and the
groups, so every solver keeps back the little time it takes (:func:`holding_reserve_s`) when it
sets its own deadline, at any size.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from modelless.scaling.bridge import finish_plan
from modelless.scaling.problem import EPS, PlanStatus, ScalingPlan, ScalingProblem

# Seconds per variant and per group that building the holding plan takes at most: one scan of
# the variants for those that run, then a few dictionary reads per group (about 0.05 µs per
# variant and 3 µs per group on the 2-core benchmark machine, 30,000 architectures; 4 times that
# for a busy one). The variants that run are few (a pool's workers hold them), and read in full.
HOLD_S_PER_VARIANT = 0.2e-6
HOLD_S_PER_GROUP = 12e-6
HOLD_S_PER_RUNNING = 50e-6
HOLD_S_FIXED = 0.005
# A solver asked to stop by a time (HiGHS's time_limit) stops a little after it: up to 0.1 s was
# measured at 500 architectures (bench/scaler.py), and a call that runs on past this is abandoned
# (``highs.HIGHS_GRACE_S``). Kept back from the deadline with the holding plan's time.
STOP_SLACK_S = 0.08
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

    def keeping_back(self, share: float, since: float, already_s: float = 0.0) -> Deadline:
        """Earlier by ``share`` of the time since ``since`` (a scan of the problem this call has
        just made, on this machine, at its load), less the ``already_s`` kept back: what a solver
        does after its deadline (reading its plan) costs a share of such a scan, so a slower or
        busier machine keeps back more."""
        return self.earlier_by(max(0.0, share * (time.perf_counter() - since) - already_s))


@contextlib.contextmanager
def without_gc_pauses() -> Iterator[None]:
    """No cyclic garbage collection within a deadline's solve: a full collection over a large
    problem's objects (hundreds of thousands of variants) stops the process for up to a second,
    which no check of the clock can cut short (measured at 500 architectures: a 1 s call once took
    2.1 s). Reference counting still frees what the solve drops; the collector runs after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def holding_reserve_s(problem: ScalingProblem) -> float:
    """What :func:`holding_plan` may take on ``problem``: kept back from every solver's deadline."""
    return (
        STOP_SLACK_S
        + HOLD_S_FIXED
        + HOLD_S_PER_VARIANT * len(problem.variants)
        + HOLD_S_PER_GROUP * len(problem.groups)
        + HOLD_S_PER_RUNNING * len(problem.running_variants)
    )


def split_greedily(problem: ScalingProblem, needs: dict[str, float]) -> dict[tuple[str, str], float]:
    """(variant id, group) -> QPS the instances running now serve: each variant's instances give
    their time to its groups, first those Lambda may not serve (nothing else would), then the
    tightest budgets, no group more than its need. Not the
    most they could serve (``bridge.split_now``'s LP finds that), but one pass over what runs,
    for a plan that must be read within what is left of a deadline. ``needs``: per group, its need."""
    order = {g.id: (problem.lambda_price(g) is not None, g.latency_budget_ms) for g in problem.groups}
    left = dict(needs)
    split: dict[tuple[str, str], float] = {}
    for variant in problem.variants:
        time_left = float(variant.running)  # instances' worth of time, as the LP counts it
        served = sorted(
            ((g, q) for g, q in variant.saturation_qps.items() if q > 0 and left.get(g, 0.0) > EPS),
            key=lambda pair: order[pair[0]],
        )
        for group_id, q in served:
            if time_left <= EPS:
                break
            qps = min(left[group_id], time_left * q)
            split[(variant.id, group_id)] = qps
            left[group_id] -= qps
            time_left -= qps / q
    return split


def holding_plan(problem: ScalingProblem, solver: str, started: float, why: str) -> ScalingPlan:
    """The plan when a solver reached its deadline with none: the instances and workers running
    now stay (within the pools' bounds), serve what they can of their groups, and Lambda takes the
    rest where it may; what it may not is reported unmet, with ``why``. Its status is
    ``time_limit``, or ``infeasible_partial`` where load is unmet.

    It starts nothing, so only the variants that run now matter: the plan is read from the
    problem narrowed to them (its costs, what they serve), whatever the problem's size."""
    held = replace(problem, variants=problem.running_variants)
    instances = {(v.id, v.pool): v.running for v in held.variants}
    workers: dict[str, int] = {}
    for pool in problem.pools:
        keep = pool.current_workers
        if pool.max_workers is not None:
            keep = min(keep, pool.max_workers)
        workers[pool.name] = max(pool.min_workers, keep)
    needs = {g.id: problem.need(g) for g in problem.groups}
    served = split_greedily(held, needs)  # what the running instances can take, within their time
    covered: dict[str, float] = {}
    for (_, group_id), qps in served.items():
        covered[group_id] = covered.get(group_id, 0.0) + qps
    lambda_qps: dict[str, float] = {}
    unmet: dict[str, float] = {}
    for group in problem.groups:
        rest = needs[group.id] - covered.get(group.id, 0.0)
        if rest <= EPS:
            continue
        if problem.lambda_price(group) is not None:
            lambda_qps[group.id] = rest
        else:
            unmet[group.id] = rest
    status = PlanStatus.INFEASIBLE_PARTIAL if unmet else PlanStatus.TIME_LIMIT
    notes = (f"{why}; holding plan: what runs now stays, Lambda takes the rest",)
    # No bridge: the plan starts nothing (what runs now is all it has).
    plan = finish_plan(
        held,
        instances,
        workers,
        lambda_qps,
        served,
        {},
        solver,
        status,
        started,
        notes,
        None,
        bridge=False,
    )
    # Why load is unmet: the narrowed problem cannot say which pools could have served it, and
    # the whole one would take a scan per group; what is true of every unmet group here is this.
    because = (
        f"QPS cannot be served: the instances running now do not take it, {why} before new ones "
        "could be planned, and "
        + ("the Lambda fallback is disabled" if not problem.lambda_allowed else "it has no Lambda variant")
    )  # (a group Lambda may serve is never unmet here)
    reasons = {group_id: f"{qps:.4g} of {needs[group_id]:.4g} {because}" for group_id, qps in unmet.items()}
    return replace(plan, unmet_qps=unmet, unmet=reasons, solve_seconds=time.perf_counter() - started)
