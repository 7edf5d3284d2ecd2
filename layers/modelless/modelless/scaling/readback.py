"""Reading a solution of the exact solver's model back into a :class:`ScalingPlan`.

:func:`read_plan` reads the instances, workers and load split off a solution vector, checks the
workers against a first-fit packing (exact's module docstring, "Packing"): where that needs more
workers the plan takes them, and where the pool's limit forbids them the instances that do not
fit are dropped (their load to Lambda, or unmet); then the plan is priced with its bridge.
The first-fit packing goes by counts per variant and runs of identical workers, so reading a
plan back takes time in its distinct variants, not its instances.
"""

from __future__ import annotations

from typing import Any

from modelless.scaling.bridge import finish_plan
from modelless.scaling.exact_model import Model, Vector
from modelless.scaling.problem import (
    EPS,
    PlanStatus,
    ScalingPlan,
    ScalingProblem,
    ScalingVariant,
    first_fit_workers,
    pack_within,
)

SOLVER = "milp"


def read_plan(
    problem: ScalingProblem,
    model: Model,
    x: Vector,
    status: PlanStatus,
    started: float,
    notes: list[str],
    lower_bound: float | None,
    packed: frozenset[str] = frozenset(),
) -> ScalingPlan:
    """The plan of solution ``x`` of ``model``, its packing checked (except in the pools of
    ``packed``, whose packing the model made explicit); ``notes`` gets what the check changed."""
    instances, workers, lambda_qps, served, unmet = _read(problem, model, x)
    status = _pack(problem, instances, workers, lambda_qps, served, unmet, notes, status, packed)
    if unmet:
        status = PlanStatus.INFEASIBLE_PARTIAL
    return finish_plan(
        problem, instances, workers, lambda_qps, served, unmet, SOLVER, status, started, notes, lower_bound
    )


def _read(
    problem: ScalingProblem, model: Model, x: Vector
) -> tuple[
    dict[tuple[str, str], int],
    dict[str, int],
    dict[str, float],
    dict[tuple[str, str], float],
    dict[str, float],
]:
    """instances, workers, lambda QPS, served QPS and unmet QPS from a solution vector."""
    groups = problem.groups
    instances: dict[tuple[str, str], int] = {}
    served: dict[tuple[str, str], float] = {}
    lambda_qps: dict[str, float] = {}

    def add(mapping: dict[Any, float], key: Any, value: float) -> None:
        if value > EPS:
            mapping[key] = mapping.get(key, 0.0) + value

    for col, pattern in model.pattern_cols.items():
        if x[col] < 0.5:
            continue
        for vi in pattern.instances:
            variant = problem.variants[vi]
            key = (variant.id, variant.pool)
            instances[key] = instances.get(key, 0) + 1
        for (vi, gi), qps in pattern.served.items():
            add(served, (problem.variants[vi].id, groups[gi].id), qps)
        for gi, qps in pattern.to_lambda.items():
            add(lambda_qps, groups[gi].id, qps)
    for vi, col in model.n_cols.items():
        count = round(float(x[col]))
        if count > 0:
            variant = problem.variants[vi]
            key = (variant.id, variant.pool)
            instances[key] = instances.get(key, 0) + count
    for (vi, gi), col in model.y_cols.items():
        variant, group = problem.variants[vi], groups[gi]
        add(served, (variant.id, group.id), float(x[col]) * problem.need(group))
    for gi, col in model.l_cols.items():
        add(lambda_qps, groups[gi].id, float(x[col]) * problem.need(groups[gi]))
    unmet: dict[str, float] = {}
    for gi, col in model.u_cols.items():
        add(unmet, groups[gi].id, float(x[col]) * problem.need(groups[gi]))
    workers = {problem.pools[pi].name: round(float(x[col])) for pi, col in model.w_cols.items()}
    return instances, workers, lambda_qps, served, unmet


def _pack(
    problem: ScalingProblem,
    instances: dict[tuple[str, str], int],
    workers: dict[str, int],
    lambda_qps: dict[str, float],
    served: dict[tuple[str, str], float],
    unmet: dict[str, float],
    notes: list[str],
    status: PlanStatus,
    exact_pools: frozenset[str] = frozenset(),
) -> PlanStatus:
    """Check the worker counts against a first-fit packing (exact's module docstring), except in
    the ``exact_pools``, whose packing the model made explicit. An optimal plan whose packing
    needs more workers is optimal no longer: it says so, and becomes feasible."""
    by_id = problem.variant_by_id
    # One entry per instance, per pool: read off the plan, not off every variant of the problem
    # (first-fit orders its items itself).
    items_of: dict[str, list[ScalingVariant]] = {}
    for (variant_id, pool_name), count in instances.items():
        items_of.setdefault(pool_name, []).extend([by_id[variant_id]] * count)
    for pool in problem.pools:
        if pool.name in exact_pools:
            continue
        items = items_of.get(pool.name, [])
        packed = first_fit_workers(pool, items) if items else 0
        if packed is None or packed <= workers[pool.name]:
            continue
        if pool.max_workers is None or packed <= pool.max_workers:
            notes.append(f"{pool.name}: first-fit packing needs {packed} workers, not {workers[pool.name]}")
            workers[pool.name] = packed
        else:
            left_out = pack_within(pool, items, pool.max_workers)
            workers[pool.name] = pool.max_workers
            dropped: dict[str, int] = {}
            for variant in left_out:
                dropped[variant.id] = dropped.get(variant.id, 0) + 1
            for variant_id, count in dropped.items():
                _drop(problem, by_id[variant_id], count, instances, lambda_qps, served, unmet)
            notes.append(
                f"{pool.name}: {len(left_out)} instances do not fit {pool.max_workers} workers by "
                "first-fit packing; their load goes to Lambda or is unmet"
            )
        if status is PlanStatus.OPTIMAL:
            status = PlanStatus.FEASIBLE
    return status


def _drop(
    problem: ScalingProblem,
    variant: ScalingVariant,
    count: int,
    instances: dict[tuple[str, str], int],
    lambda_qps: dict[str, float],
    served: dict[tuple[str, str], float],
    unmet: dict[str, float],
) -> None:
    """Remove ``count`` instances of ``variant``; what they served goes to Lambda, within its
    concurrency limit, or is unmet."""
    key = (variant.id, variant.pool)
    before = instances.get(key, 0)
    after = before - count
    if after > 0:
        instances[key] = after
    else:
        instances.pop(key, None)
    groups = {g.id: g for g in problem.groups}
    used = sum(qps / variant.saturation_qps[g] for (v, g), qps in served.items() if v == variant.id)
    keep = 1.0 if used <= after + EPS else after / used
    for (v, group_id), qps in list(served.items()):
        if v != variant.id or keep >= 1.0:
            continue
        moved = qps * (1.0 - keep)
        if keep * qps > EPS:
            served[(v, group_id)] = keep * qps
        else:
            del served[(v, group_id)]
        to_lambda = 0.0
        if problem.lambda_price(groups[group_id]) is not None:
            to_lambda = moved
            seconds = groups[group_id].lambda_seconds_per_query
            if problem.lambda_concurrency is not None and seconds > 0:
                room = problem.lambda_concurrency - problem.lambda_concurrency_used(lambda_qps)
                to_lambda = min(moved, max(0.0, room) / seconds)
        if to_lambda > EPS:
            lambda_qps[group_id] = lambda_qps.get(group_id, 0.0) + to_lambda
        if moved - to_lambda > EPS:
            unmet[group_id] = unmet.get(group_id, 0.0) + moved - to_lambda
