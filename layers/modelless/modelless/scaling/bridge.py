"""The start-up bridge: what the Lambda tier takes while a plan's new capacity starts.

A plan (:class:`~modelless.scaling.problem.ScalingPlan`) is a steady state. Its new instances
and new workers are not there yet: a new instance serves after its variant's load time, and one
that needs a worker the pool does not have running yet serves after the worker's start-up too.
Until then, the instances running now serve what they can and the rest of the load goes to the
Lambda tier at its per-request price (the dispatcher spills there when no instance has room).

Every plan says how much that is, as two phases of one horizon:

- now: the instances running now (``ScalingVariant.running``, on workers that report) take
  what they can of each group's need, their time split among the groups by an LP: first the
  groups Lambda may not serve, then the most Lambda money saved;
- steady: the plan's own split.

``bridge_qps[g]`` is the load of g that goes to Lambda (or waits) now beyond the plan's own
Lambda and unmet share; it lasts ``bridge_s``: the longest delay of the plan's new instances that
serve g, that is the variant's load time, plus the pool's ``startup_s`` when the plan asks for
more workers than the pool has ready (``ScalingPool.ready_workers``: running, not merely
requested). Taking all of a pool's new instances to wait for a worker when the pool grows is
conservative: some may fit on a ready worker. ``bridge_cost`` prices it in dollars at Lambda's
per-query price; spread over the plan's horizon it is ``bridge_cost / horizon_s`` per second.

It is reported, not minimised again: what runs now is the same for every plan, and what differs
between plans, the delay of their new instances, is what the program's load-cost term (INFaaS's
``λ · C · T_load``) already prices. Groups that Lambda may not serve wait for the start-up: the
plan's notes say so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from modelless.scaling.problem import (
    EPS,
    PlanStatus,
    ScalingPlan,
    ScalingProblem,
    explain_unmet,
    plan_costs,
)

# A group Lambda may not serve weighs this much more, per QPS, than the dearest Lambda query.
UNSERVABLE_WEIGHT = 1000.0


@dataclass(frozen=True)
class Bridge:
    qps: dict[str, float]  # group -> QPS on Lambda (or waiting) until the plan's capacity serves
    seconds: float  # how long the longest of it lasts
    cost: float  # dollars, one-off, at Lambda's per-query price
    notes: tuple[str, ...]


def capacity_now(problem: ScalingProblem) -> dict[str, float]:
    """Group -> QPS the instances running now can serve, their time split by an LP (above)."""
    served: dict[str, float] = {}
    for (_, group), qps in split_now(problem).items():
        served[group] = served.get(group, 0.0) + qps
    return served


def split_now(problem: ScalingProblem) -> dict[tuple[str, str], float]:
    """(variant id, group) -> QPS the instances running now serve, by the LP of
    :func:`capacity_now`: no group gets more than its need, no instance more than its time."""
    needs = {g.id: problem.need(g) for g in problem.groups}
    prices = [problem.lambda_price(g) for g in problem.groups]
    dearest = max((p for p in prices if p is not None), default=1.0) or 1.0
    weight = {
        g.id: (price if price is not None else UNSERVABLE_WEIGHT * dearest)
        for g, price in zip(problem.groups, prices, strict=True)
    }
    columns: list[tuple[int, str, float]] = []  # (variant row, group, Q)
    owners: list[str] = []  # the variant id of each column
    limits: list[float] = []
    for variant in problem.running_variants:  # one scan of the variants, kept by the problem
        pairs = [(g, q) for g, q in variant.saturation_qps.items() if q > 0 and needs.get(g, 0.0) > EPS]
        if not pairs:
            continue
        row = len(limits)
        limits.append(float(variant.running))
        columns.extend((row, g, q) for g, q in pairs)
        owners.extend(variant.id for _ in pairs)
    if not columns:
        return {}
    group_rows = {g: len(limits) + i for i, g in enumerate(sorted({g for _, g, _ in columns}))}
    rows, cols, vals = [], [], []
    for col, (row, group, q) in enumerate(columns):
        rows += [row, group_rows[group]]
        cols += [col, col]
        vals += [1.0, q]  # share of the running instances; QPS of the group served
    bounds = limits + [needs[g] for g in group_rows]
    matrix = coo_array((vals, (rows, cols)), shape=(len(bounds), len(columns))).tocsr()
    scale = max(weight[g] * q for _, g, q in columns)
    result = linprog(
        -np.array([weight[g] * q / scale for _, g, q in columns]),
        A_ub=matrix,
        b_ub=np.array(bounds),
        bounds=(0, None),
        method="highs",
    )
    if result.status != 0:  # never expected: x = 0 is feasible and the LP is bounded
        return {}
    split: dict[tuple[str, str], float] = {}
    for value, (_, group, q), owner in zip(result.x, columns, owners, strict=True):
        if value * q > EPS:
            split[(owner, group)] = split.get((owner, group), 0.0) + float(value) * q
    return split


def start_up_bridge(
    problem: ScalingProblem,
    instances: Mapping[tuple[str, str], int],
    workers: Mapping[str, int],
    served: Mapping[tuple[str, str], float],
    lambda_qps: Mapping[str, float],
    unmet_qps: Mapping[str, float],
) -> Bridge:
    """The bridge of a plan given by its parts (see the module docstring)."""
    now = capacity_now(problem)
    pools = {pool.name: pool for pool in problem.pools}
    by_id = problem.variant_by_id
    delay: dict[str, float] = {}  # group -> longest delay of the new instances serving it
    for (variant_id, group_id), qps in served.items():
        variant = by_id[variant_id]
        if qps <= EPS or instances.get((variant_id, variant.pool), 0) <= variant.running:
            continue
        pool = pools[variant.pool]
        wait = variant.load_time_ms / 1000.0
        if workers.get(pool.name, 0) > pool.ready:
            wait += pool.startup_s
        delay[group_id] = max(delay.get(group_id, 0.0), wait)
    bridge: dict[str, float] = {}
    cost = 0.0
    seconds = 0.0
    waiting: list[str] = []  # groups Lambda may not serve, with a bridge
    for group in problem.groups:
        steady_elsewhere = lambda_qps.get(group.id, 0.0) + unmet_qps.get(group.id, 0.0)
        qps = problem.need(group) - now.get(group.id, 0.0) - steady_elsewhere
        wait = delay.get(group.id, 0.0)
        if qps <= EPS or wait <= 0:
            continue
        bridge[group.id] = qps
        seconds = max(seconds, wait)
        price = problem.lambda_price(group)
        if price is None:
            waiting.append(group.id)
        else:
            cost += price * qps * wait
    notes: tuple[str, ...] = ()
    if waiting:
        total = sum(bridge[g] for g in waiting)
        named = ", ".join(waiting[:3]) + (f" and {len(waiting) - 3} more" if len(waiting) > 3 else "")
        notes = (
            f"bridge: {total:.4g} QPS of {named}, which Lambda may not serve, wait for the start-up "
            f"(up to {max(delay[g] for g in waiting):.3g} s)",
        )
    return Bridge(bridge, seconds, cost, notes)


def finish_plan(
    problem: ScalingProblem,
    instances: dict[tuple[str, str], int],
    workers: dict[str, int],
    lambda_qps: dict[str, float],
    served: dict[tuple[str, str], float],
    unmet: dict[str, float],
    solver: str,
    status: PlanStatus,
    started: float,
    notes: Sequence[str],
    lower_bound: float | None,
    bridge: bool = True,
) -> ScalingPlan:
    """A plan from its parts: its costs, why load is unmet, and (``bridge``) its start-up bridge."""
    cost, objective = plan_costs(problem, instances, workers, lambda_qps)
    plan = ScalingPlan(
        instances=instances,
        workers=workers,
        lambda_qps=lambda_qps,
        served=served,
        cost_per_second=cost,
        objective=objective,
        solver=solver,
        status=status,
        solve_seconds=time.perf_counter() - started,
        unmet_qps=unmet,
        unmet=explain_unmet(problem, unmet, workers),
        notes=tuple(notes),
        lower_bound=None if lower_bound is None else min(lower_bound, objective),
    )
    return with_bridge(problem, plan) if bridge else plan


def with_bridge(problem: ScalingProblem, plan: ScalingPlan) -> ScalingPlan:
    """``plan`` with its start-up bridge."""
    found = start_up_bridge(
        problem, plan.instances, plan.workers, plan.served, plan.lambda_qps, plan.unmet_qps
    )
    return replace(
        plan,
        bridge_qps=found.qps,
        bridge_s=found.seconds,
        bridge_cost=found.cost,
        notes=(*plan.notes, *found.notes),
    )
