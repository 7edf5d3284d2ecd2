"""What the exact solver's LP duals prove: lower bounds, reduced-cost fixing, and the proof.

Two kinds of bound live here (exact's module docstring). The pattern program's, which only
steer the search: :func:`block_bounds` (``rho[c]``: whether a way of serving a component with
more instances than its patterns hold may pay) and :func:`lagrangian_bound`. And the one a plan
reports: :func:`certify`, from the compact program, a relaxation of every plan that packs.
:func:`fixed_by_reduced_cost` keeps every MILP small: a column whose LP reduced cost rules it
out of every plan cheaper than the best one is fixed at 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import coo_array

from modelless.scaling import highs
from modelless.scaling.deadline import CHECK_EVERY, Deadline, OutOfTime
from modelless.scaling.exact_model import Model, Vector, build_model
from modelless.scaling.highs import Duals
from modelless.scaling.incumbent import Incumbent
from modelless.scaling.patterns import Component, stand_ins, within
from modelless.scaling.problem import ScalingProblem
from modelless.scaling.time_budget import TimeBudget

MIP_GAP = 1e-4  # HiGHS's default relative gap: what "optimal" means here
CUTOFF_SLACK = 1e-9  # a proof round's cutoff: the best plan's objective, and rounding room


def cutoff_for(best: float) -> float:
    """The cutoff a MILP told to look for a plan cheaper than ``best`` (scaled units) gets."""
    return best * (1 + CUTOFF_SLACK) + CUTOFF_SLACK


@dataclass(frozen=True)
class BlockPricing:
    """What ``block_bounds`` reads of the problem, as arrays, once per solve (the components'
    variants and groups do not change between its rounds; their patterns do)."""

    capacity_keys: list[tuple[int, str]]  # (pool index, resource): the columns of ``share``
    share: Any  # sparse (variant position x capacity key): an instance's share of a worker
    fresh_cost: Vector  # per variant position: its load cost where none runs (unscaled)
    variant_component: np.ndarray[Any, np.dtype[np.int64]]  # per variant position
    pair_variant: np.ndarray[Any, np.dtype[np.int64]]  # per (variant, group) it serves: the variant
    pair_group: np.ndarray[Any, np.dtype[np.int64]]  # ... its group's position
    pair_rate: Vector  # ... its saturation rate
    group_component: np.ndarray[Any, np.dtype[np.int64]]  # per group position
    group_need: Vector
    group_lambda: Vector  # per group position: Lambda's price per query, inf where it may not


def block_pricing(
    problem: ScalingProblem,
    components: Sequence[Component],
    capacity_keys: Sequence[tuple[int, str]],
    deadline: Deadline | None = None,
) -> BlockPricing:
    """The problem's components as the flat arrays :func:`block_bounds` prices each round."""
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    key_column = {key: k for k, key in enumerate(capacity_keys)}
    share_rows: list[int] = []
    share_cols: list[int] = []
    share_vals: list[float] = []
    fresh: list[float] = []
    variant_component: list[int] = []
    pair_variant: list[int] = []
    pair_group: list[int] = []
    pair_rate: list[float] = []
    group_component: list[int] = []
    group_need: list[float] = []
    group_lambda: list[float] = []
    for ci, component in enumerate(components):
        if deadline is not None and ci % CHECK_EVERY == 0:
            deadline.check()
        position_of: dict[str, int] = {}  # group id -> its position
        for gi in component.groups:
            group = problem.groups[gi]
            position_of[group.id] = len(group_component)
            group_component.append(ci)
            group_need.append(problem.need(group))
            price = problem.lambda_price(group)
            group_lambda.append(math.inf if price is None else price)
        for vi in component.variants:
            variant = problem.variants[vi]
            pi = pool_index[variant.pool]
            position = len(variant_component)
            variant_component.append(ci)
            fresh.append(problem.load_cost(variant) if variant.running == 0 else 0.0)
            for resource, amount in variant.demand.items():
                column = key_column.get((pi, resource))
                if amount > 0 and column is not None:
                    share_rows.append(position)
                    share_cols.append(column)
                    share_vals.append(amount / problem.pools[pi].capacity[resource])
            for group_id, q in variant.saturation_qps.items():
                if q > 0 and group_id in position_of:
                    pair_variant.append(position)
                    pair_group.append(position_of[group_id])
                    pair_rate.append(q)
    share = coo_array(
        (share_vals, (share_rows, share_cols)), shape=(len(variant_component), len(capacity_keys))
    ).tocsr()
    return BlockPricing(
        capacity_keys=list(capacity_keys),
        share=share,
        fresh_cost=np.asarray(fresh, dtype=np.float64),
        variant_component=np.asarray(variant_component, dtype=np.int64),
        pair_variant=np.asarray(pair_variant, dtype=np.int64),
        pair_group=np.asarray(pair_group, dtype=np.int64),
        pair_rate=np.asarray(pair_rate, dtype=np.float64),
        group_component=np.asarray(group_component, dtype=np.int64),
        group_need=np.asarray(group_need, dtype=np.float64),
        group_lambda=np.asarray(group_lambda, dtype=np.float64),
    )


def block_bounds(
    pricing: BlockPricing, components: Sequence[Component], model: Model, duals: Duals
) -> dict[int, float]:
    """rho[c] for each component without a block: a lower bound on the reduced cost of any way of
    serving it with more instances than its patterns hold (exact's module docstring), scaled units.

    Those instances at the duals' prices (at least ``most + 1`` of them, at the cheapest
    variant's price, plus the Lambda money of the groups no variant serves); and each group's
    need served at its cheapest rate (an instance's time is paid once, whichever groups share
    it), or left to Lambda; less c's dual."""
    count = len(components)
    pi_vector = np.asarray([duals.capacity.get(key, 0.0) for key in pricing.capacity_keys], dtype=np.float64)
    price = pricing.share @ pi_vector + pricing.fresh_cost / model.scale
    cheapest = np.full(count, math.inf)
    np.minimum.at(cheapest, pricing.variant_component, price)
    cheapest[np.isinf(cheapest)] = 0.0  # no variant: min(..., default=0.0)
    best_rate = np.full(pricing.group_need.size, math.inf)
    np.minimum.at(best_rate, pricing.pair_group, price[pricing.pair_variant] / pricing.pair_rate)
    lambda_rate = pricing.group_lambda / model.scale
    served = np.isfinite(best_rate)
    unavoidable_per_group = np.where(
        served, 0.0, np.where(np.isfinite(lambda_rate), lambda_rate, 0.0) * pricing.group_need
    )
    covering_per_group = pricing.group_need * np.minimum(best_rate, lambda_rate)
    covering = np.zeros(count)
    np.add.at(covering, pricing.group_component, covering_per_group)
    unavoidable = np.zeros(count)
    np.add.at(unavoidable, pricing.group_component, unavoidable_per_group)
    more = np.asarray([component.most + 1 for component in components], dtype=np.float64)
    least = np.maximum(more * cheapest + unavoidable, covering)
    return {
        ci: float(least[ci]) - duals.choice[ci]
        for ci in range(count)
        if ci not in model.blocks and ci in duals.choice
    }


def lagrangian_bound(
    problem: ScalingProblem,
    components: Sequence[Component],
    duals: Duals,
    reduced: Mapping[int, float],
    deadline: Deadline | None = None,
) -> float:
    """What every plan costs at least (exact's module docstring, step 1), scaled units: where
    ``rho`` is negative, the least reduced cost of the component's stand-ins bounds its ways too,
    often more tightly (every way of it is at least as dear as one of its stand-ins)."""
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    bound = duals.bound
    for position, (ci, rho) in enumerate(reduced.items()):
        if deadline is not None and position % CHECK_EVERY == 0:
            deadline.check()
        if rho >= 0:
            continue
        standing = (
            stand_in.cost / duals.scale
            + sum(
                duals.capacity.get((pi, r), 0.0) * amount
                for pi, usage in stand_in.usage.items()
                for r, amount in usage.items()
            )
            for stand_in in stand_ins(problem, components[ci], pool_index)
        )
        bound += min(0.0, max(rho, min(standing, default=math.inf) - duals.choice[ci]))
    return bound


def fixed_by_reduced_cost(model: Model, duals: Duals, upper_bound: float) -> Vector:
    """``model.upper`` with every column at 0 whose LP reduced cost exceeds ``upper_bound`` less
    the LP's bound (scaled units): a solution using one costs at least the bound plus its
    reduced cost, more than the plan already in hand. Integer columns whose lower bound is 0
    only: a solution that uses one uses a whole unit of it."""
    room = upper_bound - duals.bound
    upper = model.upper.copy()
    integer = model.integrality == 1  # a continuous column may be used a little, for less
    fix = integer & (model.lower == 0.0) & (duals.reduced > within(room))
    upper[fix] = 0.0
    return upper


def certify(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    packing: Sequence[tuple[tuple[int, str], int]],
    incumbent: Incumbent,
    budget: TimeBudget,
) -> bool:
    """Whether the incumbent is optimal, proven by the *compact* program (every component's
    block on, no patterns: :func:`~modelless.scaling.exact.solve_compact`'s model), and
    ``incumbent.lower`` set to the bound proven. Of the models here only the compact one is a
    relaxation of the program as it stands: its rows are the fluid resource rows, the dual
    feasible packing rows, the per-worker copy limits and cuts that every plan that packs
    satisfies, while the pattern program, even with its stand-ins, holds only the ways of serving
    a component that it enumerated (issue 32: a model whose tight group needs instances and whose
    lax group splits between their spare time and Lambda had its bound equal to a plan 26-50 %
    dearer than the optimum).

    The compact LP's Lagrangian bound first (computed from its duals and the column bounds, so
    that it holds whatever HiGHS's tolerances); where that does not meet the incumbent, the
    compact MILP with the time left, told the incumbent's objective as its cutoff and with the
    columns fixed that the LP's reduced costs rule out: HiGHS's dual bound, a plan cheaper than
    the incumbent (it becomes the incumbent), or the proof that none is. A deadline that comes
    first leaves what was proven by then."""
    assert incumbent.model is not None and incumbent.x is not None
    best = float(incumbent.model.c @ incumbent.x)

    def proven() -> bool:
        return incumbent.lower >= best * (1 - MIP_GAP) - CUTOFF_SLACK

    try:
        every = frozenset(range(len(components)))
        model = build_model(
            problem, components, usable, every, patterns=False, deadline=budget.deadline, packing=packing
        )
        duals = highs.lp_duals(model, budget.lp_s())
        if duals is None:
            return False
        incumbent.lower = max(incumbent.lower, min(duals.bound, best))
        if proven():
            return True
        upper = fixed_by_reduced_cost(model, duals, best)
        result = highs.attempt(model, budget.highs_s(budget.step_s()), upper, cutoff_for(best))
    except OutOfTime:
        return proven()
    if result.x is not None and result.value is not None and result.value < best:
        incumbent.offer(model, result.x)
        best = result.value
    if result.dual_bound is not None:
        incumbent.lower = max(incumbent.lower, min(result.dual_bound, best))
    if result.status == highs.OPTIMAL:  # the search ended: nothing cheaper than ``best``
        incumbent.lower = max(incumbent.lower, best)
    return proven()
