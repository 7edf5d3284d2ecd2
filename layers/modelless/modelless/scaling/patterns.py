"""A component's ways of being served, for the exact solver (:mod:`modelless.scaling.exact`).

The groups of the variant-mix program are coupled only through the pools. Groups linked by a
variant that may serve both (an app's or a model's groups) form a *component*, and a
component's share of a plan is a *pattern*: which instances serve it (a multiset of its
variants, empty for Lambda alone), how their time is split among its groups (where it saves the
most Lambda money) and what is left to Lambda. A pattern's cost and resource use are constants.
This module finds the variants worth a column, the components, their patterns of one, two or
more instances (the undominated ones), and the *stand-ins*: columns that relax every way of
serving a component with more instances than its patterns hold.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from modelless.scaling.deadline import CHECK_EVERY, Deadline
from modelless.scaling.problem import EPS, PACKING_KS, ScalingProblem, packing_shares

MOST_SETS = 5000  # a component with more ways to pick its instances gets its block instead
MOST_PRICED_SETS = 50000  # the same, where duals rule most of them out before their split
STAND_IN_INSTANCES = 6  # a stand-in counts at most this many instances
# In the split of a few instances' time, a group Lambda may not serve weighs this much more, per
# QPS, than the dearest Lambda query: covering it comes first.
MUST_COVER_WEIGHT = 1000.0


@dataclass
class Pattern:
    """A way to serve a component with a few instances: ``instances`` (variant indices, one entry
    per instance; empty: Lambda alone) and the rest left to Lambda."""

    component: int
    instances: tuple[int, ...]
    cost: float  # Lambda for what the instances leave, plus their load cost (unscaled)
    served: dict[tuple[int, int], float]  # (variant, group) -> QPS its instances serve
    to_lambda: dict[int, float]  # group index -> QPS left to Lambda


@dataclass
class Component:
    groups: list[int]  # group indices with load
    variants: list[int]  # usable variant indices that serve any of them
    patterns: list[Pattern] = field(default_factory=list)
    most: int = 1  # patterns hold up to this many instances; blocks and stand-ins start above
    stand_ins: dict[int, list[StandIn]] = field(default_factory=dict)  # by ``most``: computed once


def usable_variants(problem: ScalingProblem, deadline: Deadline | None = None) -> list[int]:
    """Indices of the variants worth a column: they fit a worker, serve a group with load, and
    no other variant of their pool dominates them.

    ``u`` dominates ``v`` when it sits in the same pool, needs no more of any resource, serves
    every group ``v`` serves at least as fast, costs no more to load, and ``v`` has no instance
    running (a running one may be worth keeping for the load-cost term). Any plan using ``v``
    can then use ``u`` instead at no extra cost, so dropping ``v`` keeps an optimum: in place,
    copy for copy, when neither has a ``max_per_worker``; with one, a copy of ``v`` can only
    move to a worker that holds fewer copies of ``u``, so ``v`` goes only when one instance of
    ``u`` can carry the whole need of every group ``u`` serves (then every worker that holds
    ``v`` can hold ``u`` instead, and one ``u`` then takes the load of all of them).
    """
    groups = problem.groups
    needs = [problem.need(g) for g in groups]
    loaded = {g.id: gi for gi, g in enumerate(groups) if needs[gi] > EPS}
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    # One scan of the variants (the only per-variant Python loop) into flat columns: per
    # candidate its groups with load and their rates, its demand, its load cost and flags.
    candidates: list[int] = []
    serving: dict[tuple[int, int], list[int]] = {}  # (pool, group) -> candidates serving it
    keys: dict[tuple[int, int], None] = {}  # (pool, first group) of a candidate not running
    served_groups: list[int] = []
    served_rates: list[float] = []
    served_counts: list[int] = []
    resources: list[str] = []
    amounts: list[float] = []
    resource_counts: list[int] = []
    costs: list[float] = []
    limited: list[bool] = []
    idle: list[bool] = []
    for start in range(0, len(problem.variants), CHECK_EVERY):
        if deadline is not None:
            deadline.check()
        facts = problem.remember_facts(start, start + CHECK_EVERY)
        for offset, (variant, _, copies, load_cost) in enumerate(facts):
            served = [(loaded[g], q) for g, q in variant.saturation_qps.items() if q > 0 and g in loaded]
            if copies == 0 or not served:
                continue
            position = len(candidates)
            candidates.append(start + offset)
            pi = pool_index[variant.pool]
            for gi, q in served:
                serving.setdefault((pi, gi), []).append(position)
                served_groups.append(gi)
                served_rates.append(q)
            served_counts.append(len(served))
            if variant.running == 0:
                keys[(pi, served[0][0])] = None
            resources.extend(variant.demand)
            amounts.extend(variant.demand.values())
            resource_counts.append(len(variant.demand))
            costs.append(load_cost)
            limited.append(variant.max_per_worker is not None)
            idle.append(variant.running == 0)
    if deadline is not None:
        deadline.check()
    columns = (served_groups, served_rates, served_counts)
    table = _CandidateTable(needs, columns, (resources, amounts, resource_counts), costs, limited)
    lost = np.zeros(len(candidates), dtype=bool)
    idle_now = np.asarray(idle, dtype=bool)
    by_width: dict[int, list[tuple[int, int]]] = {}
    for key in keys:
        by_width.setdefault(len(serving[key]), []).append(key)
    for width, same_width in by_width.items():
        per_chunk = max(1, DOMINANCE_CELLS // (width * width * table.depth * table.depth))
        for begin in range(0, len(same_width), per_chunk):
            if deadline is not None:
                deadline.check()
            chunk = same_width[begin : begin + per_chunk]
            members = np.array([serving[key] for key in chunk], dtype=np.int64)
            first_group = np.array([key[1] for key in chunk], dtype=np.int64)
            gone = table.dominated(members)
            # A candidate is decided in its own key: (its pool, its first group), and only idle.
            own = (table.first_group[members] == first_group[:, None]) & idle_now[members]
            lost[members[gone & own]] = True
    return [vi for vi, dropped in zip(candidates, lost.tolist(), strict=True) if not dropped]


# Cells (keys x members x members x group slots x group slots) per dominance chunk: memory bound.
DOMINANCE_CELLS = 1 << 22


def _ragged(counts: Sequence[int]) -> tuple[Any, Any]:
    """Row and slot of each entry of a flat column whose rows hold ``counts`` entries."""
    sizes = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(sizes.size), sizes)
    starts = np.cumsum(sizes) - sizes
    return rows, np.arange(rows.size) - np.repeat(starts, sizes)


class _CandidateTable:
    """The candidates of :func:`usable_variants` as arrays, for their dominance in numpy: per
    candidate its groups and rates (padded slots: group -1, rate 0), its demand per resource
    (0 where it names none), its load cost, whether it has a ``max_per_worker``, and whether one
    instance carries the whole need of every group it serves."""

    def __init__(
        self,
        needs: Sequence[float],  # per group index: the QPS to provision for
        served: tuple[Sequence[int], Sequence[float], Sequence[int]],
        demand: tuple[Sequence[str], Sequence[float], Sequence[int]],
        costs: Sequence[float],
        limited: Sequence[bool],
    ) -> None:
        served_groups, served_rates, served_counts = served
        count = len(served_counts)
        self.depth = max(served_counts, default=1)
        rows, slots = _ragged(served_counts)
        group_of = np.asarray(served_groups, dtype=np.int64)
        rate_of = np.asarray(served_rates, dtype=float)
        self.group = np.full((count, self.depth), -1, dtype=np.int64)
        self.group[rows, slots] = group_of
        self.rate = np.zeros((count, self.depth))
        self.rate[rows, slots] = rate_of
        self.first_group = self.group[:, 0]
        need_of = np.asarray(needs, dtype=float)[group_of]
        time_used = np.bincount(rows, weights=need_of / rate_of, minlength=count)
        self.carries = time_used <= 1.0 + 1e-9
        names, amounts, counts = demand
        column: dict[str, int] = {}
        columns = [column.setdefault(name, len(column)) for name in names]
        self.demand = np.zeros((count, max(1, len(column))))
        self.demand[_ragged(counts)[0], columns] = amounts
        self.cost = np.asarray(costs, dtype=float)
        self.limited = np.asarray(limited, dtype=bool)

    def dominated(self, members: Any) -> Any:
        """``members[k]``: candidates of one pool serving one group. Which of them another member
        dominates (``usable_variants``); of identical ones the first stays. ``beats[k, i, j]``:
        member i of list k dominates member j."""
        cost, limited, carries = self.cost[members], self.limited[members], self.carries[members]
        demand, group, rate = self.demand[members], self.group[members], self.rate[members]
        beats = (cost[:, :, None] <= cost[:, None, :]) & (
            (~limited[:, :, None] & ~limited[:, None, :]) | carries[:, :, None]
        )
        beats &= np.all(demand[:, :, None, :] <= demand[:, None, :, :], axis=3)
        # i's rate at each of j's groups (0 where i does not serve it), against j's own.
        same = (group[:, :, None, :, None] == group[:, None, :, None, :]) & (group[:, None, :, None, :] >= 0)
        rate_at = (same * rate[:, :, None, :, None]).sum(axis=3)
        beats &= np.all(rate_at >= rate[:, None, :, :], axis=3)
        width = members.shape[1]
        index = np.arange(width)
        beats[:, index, index] = False
        earlier = index[:, None] < index[None, :]
        return (beats & (earlier[None, :, :] | ~np.transpose(beats, (0, 2, 1)))).any(axis=1)


def components_of(
    problem: ScalingProblem, usable: Sequence[int], deadline: Deadline | None = None
) -> list[Component]:
    """Groups with load, linked by the variants that may serve them (union-find)."""
    index = {g.id: gi for gi, g in enumerate(problem.groups)}
    loaded = [gi for gi, g in enumerate(problem.groups) if problem.need(g) > EPS]
    parent = {gi: gi for gi in loaded}

    def root(gi: int) -> int:
        while parent[gi] != gi:
            parent[gi] = parent[parent[gi]]
            gi = parent[gi]
        return gi

    served_by: dict[int, list[int]] = {}
    for position, vi in enumerate(usable):
        if deadline is not None and position % CHECK_EVERY == 0:
            deadline.check()
        rates = problem.variants[vi].saturation_qps.items()
        groups = [index[g] for g, q in rates if q > 0 and index[g] in parent]
        served_by[vi] = groups
        for other in groups[1:]:
            parent[root(other)] = root(groups[0])
    members: dict[int, Component] = {}
    for gi in loaded:
        members.setdefault(root(gi), Component([], [])).groups.append(gi)
    for vi in usable:
        if served_by[vi]:
            members[root(served_by[vi][0])].variants.append(vi)
    components = list(members.values())
    for ci, component in enumerate(components):
        if deadline is not None and ci % CHECK_EVERY == 0:
            deadline.check()
        component.patterns = single_patterns(problem, ci, component)
    return components


def single_patterns(problem: ScalingProblem, ci: int, component: Component) -> list[Pattern]:
    groups = problem.groups
    needs = {gi: problem.need(groups[gi]) for gi in component.groups}
    prices = {gi: problem.lambda_price(groups[gi]) for gi in component.groups}
    found: list[Pattern] = []
    if all(price is not None for price in prices.values()):
        lambda_cost = sum((prices[gi] or 0.0) * needs[gi] for gi in component.groups)
        found.append(Pattern(ci, (), lambda_cost, {}, dict(needs)))
    for vi in component.variants:
        pattern = one_instance(problem, ci, vi, needs, prices)
        if pattern is not None:
            found.append(pattern)
    return found


def one_instance(
    problem: ScalingProblem,
    ci: int,
    vi: int,
    needs: Mapping[int, float],
    prices: Mapping[int, float | None],
) -> Pattern | None:
    """One instance of variant ``vi`` for the component, its time where it saves the most: the
    groups Lambda may not serve first (all of them, or no pattern), then by Lambda money per
    unit of the instance's time. A fractional knapsack: the greedy order is exact."""
    variant = problem.variants[vi]
    groups = problem.groups
    time_left = 1.0
    served: dict[tuple[int, int], float] = {}
    to_lambda: dict[int, float] = {}
    cost = 0.0
    takers: list[tuple[float, int, float]] = []
    for gi, need in needs.items():
        q = variant.saturation_qps.get(groups[gi].id, 0.0)
        price = prices[gi]
        if price is None:
            if q <= 0:
                return None
            time_left -= need / q
            served[(vi, gi)] = need
        elif q <= 0:
            to_lambda[gi] = need
            cost += price * need
        else:
            takers.append((price * q, gi, q))
    if time_left < -1e-9:
        return None
    for _, gi, q in sorted(takers, key=lambda t: (-t[0], t[1])):
        take = min(needs[gi], max(time_left, 0.0) * q)
        time_left -= take / q
        if take > 0:
            served[(vi, gi)] = take
        if needs[gi] - take > 0:
            to_lambda[gi] = needs[gi] - take
            cost += (prices[gi] or 0.0) * (needs[gi] - take)
    if variant.running == 0:
        cost += problem.load_cost(variant)
    return Pattern(ci, (vi,), cost, served, to_lambda)


@dataclass
class StandIn:
    """A relaxation of every way to serve a component with more instances than its patterns
    hold (k or more), in exactly the pools of a set T. Such a way holds k instances (all of T's
    pools among them when T has at most k) whose pools are one of the multisets below; each
    instance counts with the least of every resource an instance of the component uses in its
    pool and the least load cost there; the groups no variant in T may serve go to Lambda (no
    stand-in where such a group cannot). Any way to serve the component is then at least as
    dear as one of its stand-ins, in every resource and in cost."""

    usage: dict[int, dict[str, float]]  # pool index -> resource -> share of a worker
    cost: float


def stand_ins(problem: ScalingProblem, component: Component, pool_index: Mapping[str, int]) -> list[StandIn]:
    """The component's stand-ins for its ways of more than ``most`` instances (class StandIn)."""
    found = component.stand_ins.get(component.most)
    if found is None:
        found = component.stand_ins[component.most] = _stand_ins(problem, component, pool_index)
    return found


def _stand_ins(problem: ScalingProblem, component: Component, pool_index: Mapping[str, int]) -> list[StandIn]:
    least: dict[int, dict[str, float]] = {}  # pool -> resource -> least share of a worker
    load: dict[int, float] = {}  # pool -> least load cost of an instance there
    reach: dict[int, set[int]] = {}  # pool -> groups some variant there may serve
    fastest: dict[tuple[int, int], float] = {}  # (pool, group) -> the fastest Q there
    groups = problem.groups
    for vi in component.variants:
        variant = problem.variants[vi]
        pi = pool_index[variant.pool]
        pool = problem.pools[pi]
        shares = {r: variant.demand.get(r, 0.0) / cap for r, cap in pool.capacity.items() if cap > 0}
        if pi in least:
            least[pi] = {r: min(value, shares[r]) for r, value in least[pi].items()}
        else:
            least[pi] = shares
        fresh = problem.load_cost(variant) if variant.running == 0 else 0.0
        load[pi] = min(load.get(pi, math.inf), fresh)
        reach.setdefault(pi, set()).update(
            gi for gi in component.groups if variant.saturation_qps.get(groups[gi].id, 0.0) > 0
        )
        for gi in component.groups:
            q = variant.saturation_qps.get(groups[gi].id, 0.0)
            fastest[(pi, gi)] = max(fastest.get((pi, gi), 0.0), q)
    pools = sorted(least)
    more = component.most + 1
    must = [gi for gi in component.groups if problem.lambda_price(groups[gi]) is None]
    found: list[StandIn] = []
    for size in range(1, len(pools) + 1):
        for support in itertools.combinations(pools, size):
            reached = set().union(*(reach[pi] for pi in support))
            unavoidable = 0.0
            for gi in component.groups:
                if gi not in reached:
                    price = problem.lambda_price(groups[gi])
                    need = problem.need(groups[gi])
                    unavoidable = math.inf if price is None else unavoidable + price * need
            if unavoidable == math.inf:
                continue
            # Instances the groups Lambda may not serve need, at the fastest rate in the support.
            busy = 0.0
            for gi in must:
                best = max(fastest.get((pi, gi), 0.0) for pi in support)
                if best > 0:
                    busy += problem.need(groups[gi]) / best
            count = min(STAND_IN_INSTANCES, max(more, size, math.ceil(busy - 1e-9)))
            for extra in itertools.combinations_with_replacement(support, max(0, count - size)):
                shape = support + extra
                usage = {
                    pi: {r: shape.count(pi) * share for r, share in least[pi].items() if share > 0}
                    for pi in support
                }
                found.append(StandIn(usage, unavoidable + sum(load[pi] for pi in shape)))
    return found


@dataclass(frozen=True)
class Prices:
    """An LP's duals, to price a way of serving a component: its reduced cost is its cost plus
    its resources at ``capacity`` less its component's ``choice`` dual, in the model's scaled
    units. A way whose reduced cost exceeds ``slack`` (the best plan's objective less the LP's
    Lagrangian bound) is in no plan cheaper than the best one (module docstring of exact)."""

    capacity: Mapping[tuple[int, str], float]  # per (pool index, resource), per share of a worker
    choice: Mapping[int, float]  # per component
    scale: float  # objective units: a cost in dollars per second is divided by this
    slack: float


def k_instances(
    problem: ScalingProblem, components: Mapping[int, Component], k: int, prices: Prices | None = None
) -> dict[int, list[Pattern]]:
    """Every way to serve each component with k instances (of one variant or several), their
    time split where it saves the most Lambda money, the rest left to Lambda, that no pattern of
    the component dominates; sets that cannot cover a group Lambda may not serve are left out,
    and with ``prices``, sets whose reduced cost exceeds the slack. Built with numpy, a set per
    row (thousands per component are common). The split: in closed form where a component has
    one or two groups (:func:`_split_two`), else one LP for all the sets (each set's block of it
    is its own, scaled per component, which changes no block's optimum)."""
    found: dict[int, list[Pattern]] = {ci: [] for ci in components}
    parts = [
        sets
        for ci, component in components.items()
        if (sets := _k_sets(problem, component, ci, k, prices)) is not None
    ]
    _split_by_lp([part for part in parts if len(part.groups) > 2])
    for part in parts:
        if part.served is None:
            part.served = _split_two(part.rates, part.needs, part.weight)
        found[part.component] = part.patterns(problem, components[part.component], prices)
    return found


@dataclass
class _Sets:
    """One component's k-instance sets (a row each, variant indices sorted) and their split."""

    component: int
    variants: Any  # (sets, k) variant indices
    groups: list[int]
    needs: Any  # per position in ``groups``
    prices: list[float | None]  # Lambda's, per position in ``groups``
    weight: Any  # what a QPS served is worth, per position in ``groups`` (module docstring)
    rates: Any  # (sets, k, groups): Q of each instance
    served: Any = None  # (sets, k, groups): QPS each instance serves

    def patterns(self, problem: ScalingProblem, component: Component, prices: Prices | None) -> list[Pattern]:
        served = self.served
        variants = self.variants
        k = variants.shape[1]
        covered = served.sum(axis=1)
        must = np.array([price is None for price in self.prices], dtype=bool)
        keep = ~((covered < self.needs * (1 - 1e-7) - EPS) & must).any(axis=1)
        left = np.maximum(self.needs - covered, 0.0)
        left[left <= EPS] = 0.0
        cost = left @ np.array([price or 0.0 for price in self.prices])
        # The load cost of each copy beyond those running (rows are sorted: copies are runs).
        copy = np.ones_like(variants)
        for j in range(1, k):
            copy[:, j] = np.where(variants[:, j] == variants[:, j - 1], copy[:, j - 1] + 1, 1)
        distinct, local = np.unique(variants, return_inverse=True)
        local = local.reshape(variants.shape)
        load_cost = np.array([problem.load_cost(problem.variants[vi]) for vi in distinct])
        running = np.array([problem.variants[vi].running for vi in distinct])
        cost += np.where(copy > running[local], load_cost[local], 0.0).sum(axis=1)
        table = _set_table(problem, variants, cost, left @ _lambda_seconds(problem, self.groups))
        if prices is not None:
            keep &= _reduced(table, problem, prices, self.component) <= within(prices.slack)
        candidates = np.flatnonzero(keep)
        if not len(candidates):
            return []
        existing = _pattern_table(problem, component.patterns)
        mask = _undominated(np.vstack([existing, table[candidates]]))
        # The component's patterns that a new set dominates go (any plan can swap it in).
        component.patterns = [p for p, kept in zip(component.patterns, mask, strict=False) if kept]
        found = []
        for row in candidates[mask[len(existing) :]]:
            split: dict[tuple[int, int], float] = {}
            for j, position in zip(*np.nonzero(served[row] > EPS), strict=True):
                key = (int(variants[row, j]), self.groups[position])
                split[key] = split.get(key, 0.0) + float(served[row, j, position])
            to_lambda = {gi: float(left[row, p]) for p, gi in enumerate(self.groups) if left[row, p] > 0}
            instances = tuple(int(vi) for vi in variants[row])
            found.append(Pattern(self.component, instances, float(cost[row]), split, to_lambda))
        return found


def _k_sets(
    problem: ScalingProblem, component: Component, ci: int, k: int, prices: Prices | None
) -> _Sets | None:
    groups = problem.groups
    lambda_prices = [problem.lambda_price(groups[gi]) for gi in component.groups]
    needs = np.array([problem.need(groups[gi]) for gi in component.groups])
    dearest = max((p for p in lambda_prices if p is not None), default=0.0) or 1.0
    weight = np.array([MUST_COVER_WEIGHT * dearest if p is None else p for p in lambda_prices])
    # A variant one instance of which serves the whole component: any set holding it does
    # worse than that instance alone (more resources, no less cost), so no set holds it.
    alone = {p.instances[0] for p in component.patterns if len(p.instances) == 1 and not p.to_lambda}
    useful = np.array([vi for vi in component.variants if vi not in alone], dtype=np.int64)
    if not len(useful):
        return None
    rates = np.array(
        [
            [problem.variants[vi].saturation_qps.get(groups[gi].id, 0.0) for gi in component.groups]
            for vi in useful
        ]
    )
    local = np.array(list(itertools.combinations_with_replacement(range(len(useful)), k)), dtype=np.int64)
    if prices is not None:
        # A lower bound on each set's reduced cost: its instances at the duals' prices (load cost
        # only where nothing of the variant runs), and the Lambda money for what their rates
        # could not serve even if every instance served that group alone.
        fresh = np.array(
            [
                problem.load_cost(problem.variants[vi]) if problem.variants[vi].running == 0 else 0.0
                for vi in useful
            ]
        )
        price = _instance_prices(problem, useful, prices) + fresh / prices.scale
        short = np.maximum(needs - rates[local].sum(axis=1), 0.0)
        must = np.array([p is None for p in lambda_prices], dtype=bool)
        feasible = ~((short > EPS) & must).any(axis=1)
        lambda_cost = short @ np.array([p or 0.0 for p in lambda_prices]) / prices.scale
        bound = price[local].sum(axis=1) + lambda_cost - prices.choice[ci]
        local = local[feasible & (bound <= within(prices.slack))]
        if not len(local):
            return None
    return _Sets(ci, useful[local], list(component.groups), needs, lambda_prices, weight, rates[local])


def _split_two(rates: Any, needs: Any, weight: Any) -> Any:
    """The split of each set's instances between (at most) two groups that maximises the worth
    of what they serve, in closed form. By an exchange argument, some best split has the
    instances with the higher ratio ``Q1 / Q2`` serve group 1 and the others group 2, one
    instance at most shared: the worth is concave in where that boundary lies, so its maximum is
    at an instance's edge or where a group's need is met, and all those points are tried.
    ``rates``: (sets, k, groups) Q per instance; returns the QPS per instance and group."""
    count, k, width = rates.shape
    if width == 1:
        before = np.cumsum(rates[:, :, 0], axis=1) - rates[:, :, 0]
        return np.clip(needs[0] - before, 0.0, rates[:, :, 0])[:, :, None]
    q1, q2 = rates[:, :, 0], rates[:, :, 1]
    order = np.argsort(-np.arctan2(q1, q2), axis=1, kind="stable")
    s1 = np.take_along_axis(q1, order, axis=1)
    s2 = np.take_along_axis(q2, order, axis=1)
    c1 = np.concatenate([np.zeros((count, 1)), np.cumsum(s1, axis=1)], axis=1)  # (sets, k + 1)
    c2 = np.concatenate([np.zeros((count, 1)), np.cumsum(s2, axis=1)], axis=1)
    total2 = c2[:, -1:]
    # Candidate boundaries: (instance, fraction of it serving group 1).
    edges = np.arange(k + 1)
    j_edge = np.broadcast_to(edges, (count, k + 1))
    f_edge = np.zeros((count, k + 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        f_meet1 = (needs[0] - c1[:, :k]) / s1  # group 1's need met inside instance j
        f_meet2 = (total2 - needs[1] - c2[:, :k]) / s2  # group 2's need met (from the end)
    inner = np.broadcast_to(np.arange(k), (count, k))
    j_all = np.concatenate([j_edge, inner, inner], axis=1)
    f_all = np.concatenate([f_edge, f_meet1, f_meet2], axis=1)
    valid = np.isfinite(f_all) & (f_all >= 0.0) & (f_all <= 1.0)
    f_all = np.where(valid, f_all, 0.0)
    j_safe = np.minimum(j_all, k - 1)
    at_edge = j_all >= k
    part1 = np.where(at_edge, 0.0, f_all * np.take_along_axis(s1, j_safe, axis=1))
    part2 = np.where(at_edge, 0.0, f_all * np.take_along_axis(s2, j_safe, axis=1))
    served1 = np.take_along_axis(c1, j_all, axis=1) + part1
    served2 = total2 - (np.take_along_axis(c2, j_all, axis=1) + part2)
    worth = weight[0] * np.minimum(served1, needs[0]) + weight[1] * np.minimum(served2, needs[1])
    best = np.argmax(np.where(valid, worth, -np.inf), axis=1)
    j_best = j_all[np.arange(count), best][:, None]
    f_best = f_all[np.arange(count), best][:, None]
    share1 = np.where(edges[None, :k] < j_best, 1.0, np.where(edges[None, :k] == j_best, f_best, 0.0))
    give1 = share1 * s1
    give2 = (1.0 - share1) * s2
    give1 = np.clip(needs[0] - (np.cumsum(give1, axis=1) - give1), 0.0, give1)
    give2 = np.clip(needs[1] - (np.cumsum(give2, axis=1) - give2), 0.0, give2)
    served = np.zeros((count, k, 2))
    np.put_along_axis(served[:, :, 0], order, give1, axis=1)
    np.put_along_axis(served[:, :, 1], order, give2, axis=1)
    return served


def _split_by_lp(parts: Sequence[_Sets]) -> None:
    """The split of every set of ``parts`` by one LP (any number of groups): per set, an
    instance's time is at most 1 and a group gets at most its need."""
    if not parts:
        return
    rows: list[Any] = []
    cols: list[Any] = []
    vals: list[Any] = []
    objective: list[Any] = []
    limits: list[Any] = []
    entries: list[tuple[_Sets, Any, Any, Any, int]] = []
    row_offset = col_offset = 0
    for part in parts:
        count, k, width = part.rates.shape
        scale = float((part.weight[None, None, :] * part.rates).max()) or 1.0
        set_of, j, group = np.nonzero(part.rates > 0)
        q = part.rates[set_of, j, group]
        column = np.arange(len(q)) + col_offset
        time_row = row_offset + set_of * k + j
        group_row = row_offset + count * k + set_of * width + group
        rows += [time_row, group_row]
        cols += [column, column]
        vals += [np.ones(len(q)), q]
        objective.append(-part.weight[group] * q / scale)
        limits += [np.ones(count * k), np.tile(part.needs, count)]
        entries.append((part, set_of, j, group, col_offset))
        row_offset += count * k + count * width
        col_offset += len(q)
    matrix = coo_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row_offset, col_offset)
    ).tocsr()
    result = linprog(
        np.concatenate(objective), A_ub=matrix, b_ub=np.concatenate(limits), bounds=(0, None), method="highs"
    )
    x = np.zeros(col_offset) if result.status != 0 else np.asarray(result.x, dtype=np.float64)
    for part, set_of, j, group, offset in entries:
        served = np.zeros(part.rates.shape)
        q = part.rates[set_of, j, group]
        served[set_of, j, group] = x[offset : offset + len(q)] * q
        part.served = served


def within(slack: float) -> float:
    """``slack`` with room for rounding: a way at the slack exactly is kept."""
    return slack + 1e-9 * (1.0 + abs(slack))


def extend(
    problem: ScalingProblem,
    components: Sequence[Component],
    chosen: Iterable[int],
    prices: Prices | None = None,
    deadline: Deadline | None = None,
) -> set[int]:
    """Patterns of one instance more for the ``chosen`` components (the undominated ones; with
    ``prices``, those whose reduced cost is within the slack). Returns the components with too
    many variants for that (more sets than ``MOST_SETS``): they need their block instead."""
    too_many: set[int] = set()
    by_size: dict[int, dict[int, Component]] = {}
    for ci in chosen:
        component = components[ci]
        k = component.most + 1
        if math.comb(len(component.variants) + k - 1, k) > (
            MOST_SETS if prices is None else MOST_PRICED_SETS
        ):
            too_many.add(ci)
        else:
            by_size.setdefault(k, {})[ci] = component
    for k, wanted in by_size.items():
        if deadline is not None:
            deadline.check()
        for ci, patterns in k_instances(problem, wanted, k, prices).items():
            component = components[ci]
            component.patterns = component.patterns + patterns  # the old ones pruned by k_instances
            component.most = k
    return too_many


# ----------------------------------------------------------------------------- dominance


def _resource_keys(problem: ScalingProblem) -> list[tuple[int, str]]:
    """The (pool index, resource) columns of a pattern's table, in the problem's order."""
    return [(pi, r) for pi, pool in enumerate(problem.pools) for r in pool.capacity]


def _variant_usage(problem: ScalingProblem, variants: Any) -> Any:
    """Per variant (rows), its share of a worker per (pool, resource) of ``_resource_keys``."""
    keys = _resource_keys(problem)
    column = {key: i for i, key in enumerate(keys)}
    pools = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    usage = np.zeros((len(variants), len(keys)))
    for row, vi in enumerate(variants):
        variant = problem.variants[int(vi)]
        pi = pools[variant.pool]
        for resource, amount in variant.demand.items():
            capacity = problem.pools[pi].capacity.get(resource, 0.0)
            if amount > 0 and capacity > 0:
                usage[row, column[(pi, resource)]] = amount / capacity
    return usage


def _instance_prices(problem: ScalingProblem, variants: Any, prices: Prices) -> Any:
    """Each variant's instance at the duals' resource prices (scaled units)."""
    keys = _resource_keys(problem)
    pi_vector = np.array([prices.capacity.get(key, 0.0) for key in keys])
    return np.asarray(_variant_usage(problem, variants) @ pi_vector, dtype=np.float64)


def _lambda_seconds(problem: ScalingProblem, groups: Sequence[int]) -> Any:
    """Per group of ``groups``, the Lambda concurrency one QPS of it holds where the program
    limits Lambda's concurrency (zeros where it does not: the column then decides nothing)."""
    if problem.lambda_concurrency is None:
        return np.zeros(len(groups))
    return np.array([problem.groups[gi].lambda_seconds_per_query for gi in groups])


def _set_table(problem: ScalingProblem, variants: Any, cost: Any, lambda_use: Any) -> Any:
    """The dominance table of sets of instances (a row each, variant indices, sorted): their
    resource shares per (pool, resource), the workers their copies need per pool, the Lambda
    concurrency they leave held (``lambda_use``), their cost."""
    count, k = variants.shape
    keys = _resource_keys(problem)
    distinct, local = np.unique(variants, return_inverse=True)
    local = local.reshape(variants.shape)
    usage = _variant_usage(problem, distinct)
    pools = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    pool_of = np.array([pools[problem.variants[int(vi)].pool] for vi in distinct], dtype=np.int64)
    per_worker = np.array([max(1, problem.per_worker(problem.variants[int(vi)])) for vi in distinct])
    # Per (pool, resource): the fluid share, then the dual feasible functions' shares, one
    # column per k: a set that dominates another must use no more of any row a model holds, the
    # packing rows included. On aggregate shares alone, three instances of 0.55 of a worker
    # "dominated" two of 0.55 and two of 0.34 (less in all), though they need three workers
    # where the four pack into two: the optimum was dropped and its bound was wrong (issue 32).
    width = len(keys) * (1 + len(PACKING_KS))
    table = np.zeros((count, width + len(problem.pools) + 2))
    if k:
        table[:, : len(keys)] = usage[local].sum(axis=1)
        for position, kk in enumerate(PACKING_KS, start=1):
            shares = packing_shares(usage, kk)[local].sum(axis=1)
            table[:, position * len(keys) : (position + 1) * len(keys)] = shares
    table[:, -2] = lambda_use
    rows = np.arange(count)
    for j in range(k):
        copies = (local == local[:, j : j + 1]).sum(axis=1)
        workers = np.ceil(copies / per_worker[local[:, j]])
        np.maximum.at(table, (rows, width + pool_of[local[:, j]]), workers)
    table[:, -1] = cost
    return table


def _pattern_table(problem: ScalingProblem, patterns: Sequence[Pattern]) -> Any:
    """``_set_table`` of patterns of any sizes."""
    keys = _resource_keys(problem)
    table = np.zeros((len(patterns), len(keys) * (1 + len(PACKING_KS)) + len(problem.pools) + 2))
    by_size: dict[int, list[int]] = {}
    for row, pattern in enumerate(patterns):
        by_size.setdefault(len(pattern.instances), []).append(row)
    for size, rows in by_size.items():
        variants = np.array([patterns[row].instances for row in rows], dtype=np.int64).reshape(
            len(rows), size
        )
        cost = np.array([patterns[row].cost for row in rows])
        lambda_use = np.array(
            [
                sum(
                    qps * problem.groups[gi].lambda_seconds_per_query
                    for gi, qps in patterns[row].to_lambda.items()
                )
                if problem.lambda_concurrency is not None
                else 0.0
                for row in rows
            ]
        )
        table[rows] = _set_table(problem, np.sort(variants, axis=1), cost, lambda_use)
    return table


def _reduced(table: Any, problem: ScalingProblem, prices: Prices, ci: int) -> Any:
    """Reduced costs of the rows of a dominance table (scaled units)."""
    keys = _resource_keys(problem)
    pi_vector = np.array([prices.capacity.get(key, 0.0) for key in keys])
    return table[:, : len(keys)] @ pi_vector + table[:, -1] / prices.scale - prices.choice[ci]


def _undominated(table: Any, block: int = 128) -> Any:
    """Which rows no other row dominates: no more in every column (cost, each resource, workers
    per pool); of equal rows, the first. Rows go cheapest first, a block at a time: a row goes
    when a row kept before its block, or another of its block, dominates it (dominance is
    transitive, so a row that goes for one that goes too is dominated by a kept one)."""
    count = len(table)
    keep = np.zeros(count, dtype=bool)
    if not count:
        return keep
    view = table[:, np.flatnonzero(table.any(axis=0))]
    tolerance = 1e-12 * (1.0 + np.abs(view))
    order = np.lexsort((np.arange(count), view[:, -1])) if view.shape[1] else np.arange(count)
    kept = np.zeros((0, view.shape[1]))
    for start in range(0, count, block):
        rows = order[start : start + block]
        candidates, room = view[rows], view[rows] + tolerance[rows]
        alive = ~np.all(kept[:, None, :] <= room[None, :, :], axis=2).any(axis=0)
        # Within the block: i beats j when no more everywhere, unless they are equal and j
        # comes first (by index, as the whole table is ordered).
        no_more = np.all(candidates[:, None, :] <= room[None, :, :], axis=2)  # [i, j]: i <= j
        first = rows[:, None] < rows[None, :]
        beats = no_more & (first | ~no_more.T)
        np.fill_diagonal(beats, False)
        alive &= ~(beats & alive[:, None]).any(axis=0)
        keep[rows[alive]] = True
        kept = np.vstack([kept, candidates[alive]])
    return keep


def undominated(problem: ScalingProblem, patterns: list[Pattern]) -> list[Pattern]:
    """The patterns no other pattern of the list beats: one that costs no more, uses no more of
    any pool's resources and needs no more workers for its copies of one variant dominates
    (any plan can swap it in). Ties keep the first."""
    if len(patterns) < 2:
        return patterns
    mask = _undominated(_pattern_table(problem, patterns))
    return [pattern for pattern, kept in zip(patterns, mask, strict=True) if kept]
