"""Independent reference solvers for the scaler's variant-mix program (test code only).

The program (:mod:`modelless.scaling.problem`): integer instances ``n[v]`` of each variant on its
pool, integer workers ``w[p]`` within the pool's limits, load split among the instances (one
instance time-shares: ``Σ_g x[v,g] / Q[v,g] <= n[v]``), Lambda (where the group may use it) and
what nobody serves. The references pack *integrally*: every worker holds a multiset of instances
whose demand fits its capacity in every resource, with at most ``max_per_worker`` copies of a
variant. (The project's exact solver models the workers by fluid resource rows, a relaxation, and
checks its plans against a first-fit packing afterwards: these references are what it is judged
by.) Lexicographic: first the least total unmet QPS, then the least objective
``Σ price·w + Σ lambda_price·l + Σ load_cost(v)·max(0, n[v] - running[v])``.

Nothing here calls the project's solvers, its packing (``first_fit_workers``, ``per_worker``) or
its cost function: only the problem's definitions (``need``, ``lambda_price``, ``load_cost``).

- :func:`brute_force`: every instance vector up to the instances that serve all of a variant's
  groups alone, the fewest workers that pack it (exact search), the split by an LP (scipy).
- :func:`compact_cbc`: a MILP with explicit workers (``y[v,j]`` copies of v on worker slot j),
  solved by CBC through PuLP: another formulation and another solver than the project's.
- :func:`packs`: whether a plan's instances really fit its workers.
- :func:`random_problem`: random instances shaped to find the relaxation's blind spots.
- :func:`problem_to_json` / :func:`problem_from_json`: failing instances, saved and reloaded.
"""

from __future__ import annotations

import itertools
import math
import random
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import pulp
from scipy.optimize import linprog

from modelless.scaling.problem import (
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
)
from sim.problems import make_problem

# A worker's resource holds items whose demands add up to its capacity and this much more:
# float sums of shares such as 3 x 1/3 land a rounding error above it.
FIT_TOLERANCE = 1e-9
# Exact-search nodes before a packing question goes to CBC instead.
SEARCH_NODES = 200_000
# The brute force refuses problems with more instance vectors than this.
MOST_COMBINATIONS = 60_000
UNLIMITED = 1 << 30  # copies per worker of a variant that demands nothing and has no limit
# What counts as equal when a plan is judged against a reference (tests and bench/scaler_check.py).
BOUND_REL = 1e-6  # a lower bound may exceed the optimum by this much (rounding)
OPTIMAL_REL = 1e-4  # HiGHS's relative gap: a plan called optimal may be this much above the optimum
UNMET_REL = 1e-6  # unmet QPS: relative, and absolute below 1 QPS
ABSOLUTE = 1e-9  # $/s, beside the relative tolerances


class ReferenceTooLarge(ValueError):
    """The problem is too large for the brute force."""


@dataclass(frozen=True)
class Reference:
    """A reference solver's answer: the lexicographic optimum and one plan that reaches it."""

    objective: float  # the least objective among plans that leave ``unmet_qps`` unmet
    unmet_qps: float  # the least total unmet QPS of any plan
    instances: dict[str, int]  # variant id -> n[v] of an optimal plan
    workers: dict[str, int]  # pool -> w[p] of that plan
    proven: bool  # False: the solver stopped at its time limit (objective is only an upper bound)
    method: str
    lambda_qps: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the problem's numbers


def saturation(variant: ScalingVariant, group_id: str) -> float:
    """Q[v, g], 0 where v may not serve g."""
    q = variant.saturation_qps.get(group_id, 0.0)
    return q if q > 0 else 0.0


def _room(capacity: float) -> float:
    return capacity + FIT_TOLERANCE * max(1.0, abs(capacity))


def copies_alone(pool: ScalingPool, variant: ScalingVariant) -> int:
    """Copies of ``variant`` one worker of ``pool`` holds when it holds nothing else."""
    most = UNLIMITED if variant.max_per_worker is None else variant.max_per_worker
    for resource, amount in variant.demand.items():
        if amount > 0:
            most = min(most, math.floor(_room(pool.capacity.get(resource, 0.0)) / amount))
    return max(0, most)


def instance_bound(problem: ScalingProblem, variant: ScalingVariant) -> int:
    """Instances of ``variant`` that serve all of its groups' need alone (more serve nothing;
    dropping them never costs more), 0 where it fits no worker or serves no load."""
    if copies_alone(problem.pool(variant.pool), variant) < 1:
        return 0
    share = 0.0
    for group in problem.groups:
        q = saturation(variant, group.id)
        if q > 0:
            share += problem.need(group) / q
    return max(0, math.ceil(share - 1e-9))


# ----------------------------------------------------------------------------- packing


class _Undecided(Exception):
    """The exact search ran out of nodes."""


class PoolPacking:
    """Exact packing of instances of ``variants`` (all of one pool) into that pool's workers."""

    def __init__(self, pool: ScalingPool, variants: Sequence[ScalingVariant]) -> None:
        self.pool = pool
        self.variants = list(variants)
        self.resources = sorted({r for v in variants for r, amount in v.demand.items() if amount > 0})
        self.room = [_room(pool.capacity.get(r, 0.0)) for r in self.resources]
        self.demands = [[v.demand.get(r, 0.0) for r in self.resources] for v in variants]
        self.most = [UNLIMITED if v.max_per_worker is None else v.max_per_worker for v in variants]
        self.alone = [copies_alone(pool, v) for v in variants]
        self._least: dict[tuple[int, ...], int | None] = {}

    def _share(self, index: int) -> float:
        return max(
            (d / room for d, room in zip(self.demands[index], self.room, strict=True) if room > 0),
            default=0.0,
        )

    def _items(self, counts: Sequence[int]) -> list[int]:
        """One entry per instance, largest dominant share first, a variant's copies together."""
        order = sorted(range(len(counts)), key=lambda i: (-self._share(i), i))
        return [i for i in order for _ in range(counts[i])]

    def first_fit(self, counts: Sequence[int]) -> int | None:
        """Workers a first-fit-decreasing packing uses (None: an instance fits no worker)."""
        free: list[list[float]] = []
        held: list[list[int]] = []
        for i in self._items(counts):
            if self.alone[i] < 1:
                return None
            for room, copies in zip(free, held, strict=True):
                if copies[i] < self.most[i] and all(
                    d <= r for d, r in zip(self.demands[i], room, strict=True)
                ):
                    break
            else:
                free.append(list(self.room))
                held.append([0] * len(self.variants))
                room, copies = free[-1], held[-1]
            for k, d in enumerate(self.demands[i]):
                room[k] -= d
            copies[i] += 1
        return len(free)

    def lower_bound(self, counts: Sequence[int]) -> int:
        """Workers every packing needs: the fluid bound per resource, the per-worker copies."""
        least = 0
        for k, room in enumerate(self.room):
            total = sum(self.demands[i][k] * c for i, c in enumerate(counts))
            if total > 0:
                least = max(least, math.ceil(total / room - 1e-9))
        for i, c in enumerate(counts):
            if c > 0:
                least = max(least, math.ceil(c / max(1, self.alone[i])))
        return least

    def fits(self, counts: Sequence[int], workers: int, nodes: int = SEARCH_NODES) -> bool:
        """Whether ``counts`` (instances per variant) pack into ``workers`` workers: first fit,
        then an exact search, then (should the search run out of nodes) CBC."""
        if any(c > 0 and self.alone[i] < 1 for i, c in enumerate(counts)):
            return False
        if sum(counts) == 0:
            return True
        if self.lower_bound(counts) > workers:
            return False
        packed = self.first_fit(counts)
        if packed is not None and packed <= workers:
            return True
        try:
            return self._search(counts, workers, nodes)
        except _Undecided:
            return self._cbc_fits(counts, workers)

    def least_workers(self, counts: Sequence[int]) -> int | None:
        """The fewest workers ``counts`` pack into (None: an instance fits no worker)."""
        key = tuple(counts)
        if key in self._least:
            return self._least[key]
        found: int | None
        upper = self.first_fit(counts)
        if upper is None:
            found = None
        else:
            found = upper
            for workers in range(self.lower_bound(counts), upper):
                if self.fits(counts, workers):
                    found = workers
                    break
        self._least[key] = found
        return found

    def _search(self, counts: Sequence[int], workers: int, nodes: int) -> bool:
        items = self._items(counts)
        width = len(self.resources)
        # What the items from position i on demand in all, per resource (pruning).
        tail = [[0.0] * width for _ in range(len(items) + 1)]
        for position in range(len(items) - 1, -1, -1):
            demand = self.demands[items[position]]
            tail[position] = [tail[position + 1][k] + demand[k] for k in range(width)]
        free = [list(self.room) for _ in range(workers)]
        held = [[0] * len(self.variants) for _ in range(workers)]
        left = [nodes]

        def place(position: int, opened: int, start: int) -> bool:
            left[0] -= 1
            if left[0] < 0:
                raise _Undecided
            if position == len(items):
                return True
            for k in range(width):
                if tail[position][k] > sum(room[k] for room in free) + 1e-9:
                    return False
            item = items[position]
            demand = self.demands[item]
            # A variant's copies go to workers in order (they are interchangeable); a worker that
            # looks exactly like one tried already is no other choice.
            first = start if position > 0 and items[position - 1] == item else 0
            seen: set[tuple[tuple[float, ...], tuple[int, ...]]] = set()
            for b in range(first, min(opened + 1, workers)):
                room, copies = free[b], held[b]
                if copies[item] >= self.most[item]:
                    continue
                if any(d > r for d, r in zip(demand, room, strict=True)):
                    continue
                state = (tuple(room), tuple(copies))
                if state in seen:
                    continue
                seen.add(state)
                for k in range(width):
                    room[k] -= demand[k]
                copies[item] += 1
                fitted = place(position + 1, max(opened, b + 1), b)
                for k in range(width):
                    room[k] += demand[k]
                copies[item] -= 1
                if fitted:
                    return True
            return False

        return place(0, 0, 0)

    def _cbc_fits(self, counts: Sequence[int], workers: int) -> bool:
        """The packing as a feasibility MILP, for the cases the exact search cannot settle."""
        model = pulp.LpProblem("packing", pulp.LpMinimize)
        y = {
            (i, j): _variable(model, f"y_{i}_{j}", 0, min(c, self.most[i]), "Integer")
            for i, c in enumerate(counts)
            if c > 0
            for j in range(workers)
        }
        model += pulp.lpSum([])
        for i, c in enumerate(counts):
            if c > 0:
                model += pulp.lpSum(y[i, j] for j in range(workers)) == c
        for j in range(workers):
            for k, room in enumerate(self.room):
                terms = [self.demands[i][k] * y[i, j] for i, c in enumerate(counts) if c > 0]
                model += pulp.lpSum(terms) <= room
        model.solve(_cbc_solver(time_limit_s=120.0))
        if model.status == pulp.LpStatusOptimal:
            return True
        if model.status == pulp.LpStatusInfeasible:
            return False
        raise RuntimeError(f"CBC could not settle a packing question: {pulp.LpStatus[model.status]}")


def packs(problem: ScalingProblem, plan: ScalingPlan) -> list[str]:
    """Why ``plan.instances`` do not fit ``plan.workers`` (empty: they fit every pool)."""
    found: list[str] = []
    pools = {pool.name for pool in problem.pools}
    variants = {v.id: v for v in problem.variants}
    for (variant_id, pool_name), count in plan.instances.items():
        variant = variants.get(variant_id)
        if count > 0 and (variant is None or variant.pool != pool_name or pool_name not in pools):
            found.append(f"{count} instances of {variant_id} on {pool_name}, which does not run it")
    for pool in problem.pools:
        members = [v for v in problem.variants if v.pool == pool.name]
        counts = [plan.instances.get((v.id, v.pool), 0) for v in members]
        workers = plan.workers.get(pool.name, 0)
        if any(counts) and not PoolPacking(pool, members).fits(counts, workers):
            held = ", ".join(f"{v.id} x{c}" for v, c in zip(members, counts, strict=True) if c)
            found.append(f"{pool.name}: {held} do not pack into {workers} workers")
    return found


# ----------------------------------------------------------------------------- the split (an LP)


@dataclass(frozen=True)
class Split:
    """Given the instances: the least unmet QPS, and the cheapest Lambda that leaves no more."""

    unmet_qps: float
    lambda_cost: float
    lambda_qps: dict[str, float]


class SplitLP:
    """The load's split among given instances, Lambda and unmet, for one problem.

    Columns: x[v,g] (QPS), l[g] (QPS, where Lambda may take g), u[g] (QPS unmet). Rows:
    ``Σ_g x[v,g]/Q[v,g] <= n[v]``, ``-(Σ_v x[v,g] + l[g] + u[g]) <= -need[g]``, Lambda's
    concurrency. Lexicographic: least Σ u, then least Lambda money with Σ u no more."""

    def __init__(self, problem: ScalingProblem) -> None:
        self.problem = problem
        groups = [g for g in problem.groups if problem.need(g) > 0]
        self.groups = groups
        self.variants = [v for v in problem.variants if any(saturation(v, g.id) > 0 for g in groups)]
        self.total_need = sum(problem.need(g) for g in groups)
        columns: list[tuple[str, int, int]] = []  # (kind, variant index, group index)
        for vi, v in enumerate(self.variants):
            for gi, g in enumerate(groups):
                if saturation(v, g.id) > 0:
                    columns.append(("x", vi, gi))
        self.prices = [problem.lambda_price(g) for g in groups]
        for gi, price in enumerate(self.prices):
            if price is not None:
                columns.append(("l", -1, gi))
        for gi in range(len(groups)):
            columns.append(("u", -1, gi))
        self.columns = columns
        width = len(columns)
        rows: list[list[float]] = []
        rhs: list[float] = []
        for vi, v in enumerate(self.variants):
            row = [0.0] * width
            for c, (kind, cvi, gi) in enumerate(columns):
                if kind == "x" and cvi == vi:
                    row[c] = 1.0 / saturation(v, groups[gi].id)
            rows.append(row)
            rhs.append(0.0)  # n[v], set per call
        for gi, g in enumerate(groups):
            row = [0.0] * width
            for c, (_, _, cgi) in enumerate(columns):
                if cgi == gi:
                    row[c] = -1.0
            rows.append(row)
            rhs.append(-problem.need(g))
        self.limited = problem.lambda_concurrency is not None and any(
            g.lambda_seconds_per_query > 0 for g in groups
        )
        if self.limited:
            row = [0.0] * width
            for c, (kind, _, gi) in enumerate(columns):
                if kind == "l":
                    row[c] = groups[gi].lambda_seconds_per_query
            rows.append(row)
            rhs.append(float(problem.lambda_concurrency or 0.0))
        self.unmet_row = [1.0 if kind == "u" else 0.0 for kind, _, _ in columns]
        self.a_ub = np.asarray(rows, dtype=np.float64).reshape(len(rows), width)
        self.b_ub = np.asarray(rhs, dtype=np.float64)
        # Lambda money, in units of the dearest Lambda price (HiGHS's tolerances are absolute).
        known = [p for p in self.prices if p is not None and p > 0]
        self.money_scale = max(known) if known else 1.0
        self.money = np.asarray(
            [(self.prices[gi] or 0.0) / self.money_scale if kind == "l" else 0.0 for kind, _, gi in columns],
            dtype=np.float64,
        )
        # Without groups Lambda may not take and without a concurrency limit, nothing is unmet.
        self.unmet_possible = self.limited or any(p is None for p in self.prices)

    def _solve(
        self,
        c: Sequence[float] | np.ndarray[Any, Any],
        b_ub: np.ndarray[Any, Any],
        extra: tuple[list[float], float] | None = None,
    ) -> Any:
        a_ub = self.a_ub
        if extra is not None:
            a_ub = np.vstack([a_ub, np.asarray(extra[0], dtype=np.float64)])
            b_ub = np.concatenate([b_ub, [extra[1]]])
        result = linprog(
            np.asarray(c, dtype=np.float64),
            A_ub=a_ub if a_ub.shape[0] else None,
            b_ub=b_ub if a_ub.shape[0] else None,
            bounds=(0, None),
            method="highs",
        )
        if result.status != 0:
            raise RuntimeError(f"the split LP failed: {result.message}")
        return result

    def _rhs(self, instances: Mapping[str, int]) -> np.ndarray[Any, Any]:
        b_ub = self.b_ub.copy()
        for vi, v in enumerate(self.variants):
            b_ub[vi] = float(instances.get(v.id, 0))
        return b_ub

    def least_unmet(self, instances: Mapping[str, int]) -> float:
        if not self.columns or not self.unmet_possible:
            return 0.0
        result = self._solve(self.unmet_row, self._rhs(instances))
        return max(0.0, float(result.fun))

    def unmet_tolerance(self) -> float:
        return 1e-9 * max(1.0, self.total_need)

    def split(self, instances: Mapping[str, int], unmet_at_most: float) -> Split:
        """The cheapest Lambda that leaves at most ``unmet_at_most`` (plus rounding) unmet."""
        if not self.columns:
            return Split(0.0, 0.0, {})
        b_ub = self._rhs(instances)
        extra = None
        if self.unmet_possible:
            extra = (self.unmet_row, unmet_at_most + self.unmet_tolerance())
        else:  # nothing is ever unmet: keep it so (u is free to the money objective)
            extra = (self.unmet_row, 0.0)
        result = self._solve(self.money, b_ub, extra)
        x = np.asarray(result.x, dtype=np.float64)
        lambda_qps: dict[str, float] = {}
        cost = 0.0
        unmet = 0.0
        for c, (kind, _, gi) in enumerate(self.columns):
            if kind == "l" and x[c] > 0:
                lambda_qps[self.groups[gi].id] = float(x[c])
                cost += float(x[c]) * (self.prices[gi] or 0.0)
            elif kind == "u":
                unmet += max(0.0, float(x[c]))
        return Split(unmet, cost, lambda_qps)


def fixed_cost(problem: ScalingProblem, instances: Mapping[str, int], workers: Mapping[str, int]) -> float:
    """Workers plus the load cost of the instances not running yet."""
    cost = sum(pool.price_per_worker_second * workers.get(pool.name, 0) for pool in problem.pools)
    for v in problem.variants:
        cost += problem.load_cost(v) * max(0, instances.get(v.id, 0) - v.running)
    return cost


# ----------------------------------------------------------------------------- brute force


def brute_force(problem: ScalingProblem, most_combinations: int = MOST_COMBINATIONS) -> Reference:
    """The lexicographic optimum by enumeration (tiny problems: a few variants, small needs).

    Every vector n with ``n[v] <= instance_bound(v)``; per pool, the fewest workers that pack its
    share of n (exact), raised to the pool's minimum, refused above its maximum; the split by
    :class:`SplitLP`. Raises :class:`ReferenceTooLarge` beyond ``most_combinations`` vectors."""
    splitter = SplitLP(problem)
    per_pool: list[list[tuple[dict[str, int], int]]] = []  # per pool: (its counts, workers)
    combinations = 1
    for pool in problem.pools:
        members = [v for v in problem.variants if v.pool == pool.name]
        bounds = [instance_bound(problem, v) for v in members]
        size = math.prod(b + 1 for b in bounds)
        combinations *= size
        if combinations > most_combinations:
            raise ReferenceTooLarge(f"more than {most_combinations} instance vectors")
        packing = PoolPacking(pool, members)
        options: list[tuple[dict[str, int], int]] = []
        for counts in itertools.product(*(range(b + 1) for b in bounds)):
            least = packing.least_workers(counts)
            if least is None:
                continue
            needed = max(pool.min_workers, least)
            if pool.max_workers is not None and needed > pool.max_workers:
                continue
            options.append(({v.id: c for v, c in zip(members, counts, strict=True) if c}, needed))
        if not options:  # not even the empty pool fits its limits (min > max): no plan at all
            raise ValueError(f"pool {pool.name}: no worker count within its limits")
        per_pool.append(options)

    candidates: list[tuple[float, dict[str, int], dict[str, int]]] = []
    feasible: set[tuple[tuple[str, int], ...]] = set()
    for choice in itertools.product(*per_pool):
        instances: dict[str, int] = {}
        workers: dict[str, int] = {}
        for pool, (held, count) in zip(problem.pools, choice, strict=True):
            instances.update(held)
            workers[pool.name] = count
        candidates.append((fixed_cost(problem, instances, workers), instances, workers))
        feasible.add(tuple(sorted(instances.items())))

    # The least unmet: unmet never grows with more instances, so the maximal vectors suffice.
    least_unmet = 0.0
    if splitter.unmet_possible:
        least_unmet = math.inf
        for _, instances, _ in candidates:
            grown = (
                tuple(sorted({**instances, v.id: instances.get(v.id, 0) + 1}.items()))
                for v in problem.variants
            )
            if any(vector in feasible for vector in grown):
                continue
            least_unmet = min(least_unmet, splitter.least_unmet(instances))

    # The cheapest among them: by fixed cost first, stopping where it alone costs more.
    candidates.sort(key=lambda entry: entry[0])
    best: tuple[float, dict[str, int], dict[str, int], Split] | None = None
    for fixed, instances, workers in candidates:
        if best is not None and fixed >= best[0]:
            break
        if (
            splitter.unmet_possible
            and splitter.least_unmet(instances) > least_unmet + splitter.unmet_tolerance()
        ):
            continue
        split = splitter.split(instances, least_unmet)
        total = fixed + split.lambda_cost
        if best is None or total < best[0]:
            best = (total, instances, workers, split)
    if best is None:
        raise RuntimeError("brute force found no plan")
    total, instances, workers, split = best
    return Reference(
        objective=total,
        unmet_qps=least_unmet,
        instances=dict(instances),
        workers=dict(workers),
        proven=True,
        method="brute_force",
        lambda_qps=split.lambda_qps,
    )


# ----------------------------------------------------------------------------- CBC, explicit workers


def worker_slots(problem: ScalingProblem, pool: ScalingPool, budget: float | None = None) -> int:
    """Workers the compact MILP models for ``pool``: its maximum, or (no fewer than its minimum)
    the workers first fit packs every useful instance into; an optimal plan holds no more
    instances than that (:func:`instance_bound`), and a subset of a packing packs as well.
    ``budget``: what some plan with the least unmet costs; an optimal plan costs no more, so
    its workers here cost no more than that less the other pools' minimums."""
    members = [v for v in problem.variants if v.pool == pool.name]
    counts = [instance_bound(problem, v) for v in members]
    packed = PoolPacking(pool, members).first_fit(counts) or 0
    slots = max(pool.min_workers, packed)
    if budget is not None and pool.price_per_worker_second > 0:
        others = sum(p.price_per_worker_second * p.min_workers for p in problem.pools if p is not pool)
        affordable = math.floor((budget - others) / pool.price_per_worker_second + 1e-9)
        slots = min(slots, max(pool.min_workers, affordable))
    if pool.max_workers is not None:
        slots = min(slots, pool.max_workers)
    return slots


def compact_cbc(problem: ScalingProblem, time_limit_s: float = 60.0) -> Reference:
    """The lexicographic optimum by a MILP with explicit workers, solved by CBC (through PuLP).

    Per pool p, slots j < S_p with ``on[p,j]`` binary (``on[p,j] >= on[p,j+1]``, the first
    ``min_workers`` on), ``y[v,j]`` integer copies of v on slot j (at most ``max_per_worker``,
    none on a slot that is off), ``Σ_v R[v,r]·y[v,j] <= cap[p,r]``; ``n[v] = Σ_j y[v,j]``. The
    split in fractions of each group's need. First the least unmet, then the least objective
    with no more unmet; the answer's numbers are recomputed from its n and w (:class:`SplitLP`)."""
    splitter = SplitLP(problem)
    needs = {g.id: problem.need(g) for g in problem.groups}
    prices = [p.price_per_worker_second for p in problem.pools if p.price_per_worker_second > 0]
    scale = min(prices) if prices else 1.0  # the objective in units of the cheapest worker

    # Where nothing need be unmet (Lambda takes every group), Lambda alone, on the pools' minimum
    # workers, is a plan: what it costs bounds the optimum's workers (worker_slots).
    budget = None
    if not splitter.unmet_possible:
        minimum = {pool.name: pool.min_workers for pool in problem.pools}
        budget = fixed_cost(problem, {}, minimum) + splitter.split({}, 0.0).lambda_cost

    model = pulp.LpProblem("variant_mix", pulp.LpMinimize)
    on: dict[tuple[int, int], pulp.LpVariable] = {}
    n: dict[int, pulp.LpAffineExpression] = {}
    worker_cost: list[pulp.LpAffineExpression] = []
    for pi, pool in enumerate(problem.pools):
        slots = worker_slots(problem, pool, budget)
        if slots < pool.min_workers:
            raise ValueError(f"pool {pool.name}: no worker count within its limits")
        members = [
            (vi, v)
            for vi, v in enumerate(problem.variants)
            if v.pool == pool.name and instance_bound(problem, v) > 0
        ]
        for j in range(slots):
            on[pi, j] = _variable(model, f"on_{pi}_{j}", 1 if j < pool.min_workers else 0, 1, "Integer")
            if j > 0:
                model += on[pi, j - 1] >= on[pi, j]
        worker_cost.append(pulp.lpSum(pool.price_per_worker_second / scale * on[pi, j] for j in range(slots)))
        copies: dict[tuple[int, int], pulp.LpVariable] = {}
        for vi, v in members:
            most = min(copies_alone(pool, v), instance_bound(problem, v))
            for j in range(slots):
                copies[vi, j] = _variable(model, f"y_{vi}_{j}", 0, most, "Integer")
                model += copies[vi, j] <= most * on[pi, j]
            n[vi] = pulp.lpSum(copies[vi, j] for j in range(slots))
        for resource in sorted({r for _, v in members for r, a in v.demand.items() if a > 0}):
            room = _room(pool.capacity.get(resource, 0.0))
            for j in range(slots):
                usage = [
                    v.demand.get(resource, 0.0) * copies[vi, j]
                    for vi, v in members
                    if v.demand.get(resource, 0.0) > 0
                ]
                model += pulp.lpSum(usage) <= room * on[pi, j]
        # Symmetry: the workers in order of how much they hold (any packing can be so ordered).
        weight = {
            vi: 1.0 + sum(a / _room(pool.capacity.get(r, 0.0)) for r, a in v.demand.items() if a > 0)
            for vi, v in members
        }
        for j in range(1, slots):
            model += pulp.lpSum(weight[vi] * copies[vi, j - 1] for vi, _ in members) >= pulp.lpSum(
                weight[vi] * copies[vi, j] for vi, _ in members
            )

    load_cost: list[pulp.LpAffineExpression] = []
    for vi, v in enumerate(problem.variants):
        cost = problem.load_cost(v) / scale
        if vi in n and cost > 0:
            fresh = _variable(model, f"s_{vi}", 0, None)
            model += fresh >= n[vi] - v.running
            load_cost.append(cost * fresh)

    # The split, in fractions of each group's need (rows of similar scale).
    served: dict[int, list[pulp.LpVariable]] = {gi: [] for gi in range(len(problem.groups))}
    time_shares: dict[int, list[pulp.LpAffineExpression]] = {}
    for vi, v in enumerate(problem.variants):
        if vi not in n:
            continue
        for gi, g in enumerate(problem.groups):
            q = saturation(v, g.id)
            if q > 0 and needs[g.id] > 0:
                z = _variable(model, f"z_{vi}_{gi}", 0, 1)
                served[gi].append(z)
                time_shares.setdefault(vi, []).append(needs[g.id] / q * z)
    for vi, shares in time_shares.items():
        model += pulp.lpSum(shares) <= n[vi]
    lambda_money: list[pulp.LpAffineExpression] = []
    concurrency: list[pulp.LpAffineExpression] = []
    unmet: list[pulp.LpAffineExpression] = []
    for gi, g in enumerate(problem.groups):
        need = needs[g.id]
        if need <= 0:
            continue
        terms: list[pulp.LpVariable] = list(served[gi])
        price = problem.lambda_price(g)
        if price is not None:
            lam = _variable(model, f"l_{gi}", 0, 1)
            terms.append(lam)
            lambda_money.append(price * need / scale * lam)
            concurrency.append(need * g.lambda_seconds_per_query * lam)
        left = _variable(model, f"u_{gi}", 0, 1)
        terms.append(left)
        unmet.append(need * left)
        model += pulp.lpSum(terms) >= 1
    if problem.lambda_concurrency is not None and concurrency:
        model += pulp.lpSum(concurrency) <= problem.lambda_concurrency
    unmet_total = pulp.lpSum(unmet)

    started = time.perf_counter()
    proven = True
    if splitter.unmet_possible and unmet:
        model.setObjective(unmet_total / max(1.0, splitter.total_need))
        status = _cbc(model, time_limit_s)
        proven = proven and status == "optimal"
        least = float(pulp.value(unmet_total) or 0.0)
        model += unmet_total <= least + 1e-7 * max(1.0, splitter.total_need)
    elif unmet:
        model += unmet_total <= 0
    model.setObjective(pulp.lpSum([*worker_cost, *load_cost, *lambda_money]))
    status = _cbc(model, max(1.0, time_limit_s - (time.perf_counter() - started)))
    proven = proven and status == "optimal"

    instances: dict[str, int] = {}
    for vi, expression in n.items():
        count = round(float(pulp.value(expression) or 0.0))
        if count > 0:
            instances[problem.variants[vi].id] = count
    workers = {
        pool.name: sum(round(float(on[pi, j].value() or 0.0)) for (p, j) in on if p == pi)
        for pi, pool in enumerate(problem.pools)
    }
    least_unmet = splitter.least_unmet(instances)
    split = splitter.split(instances, least_unmet)
    return Reference(
        objective=fixed_cost(problem, instances, workers) + split.lambda_cost,
        unmet_qps=least_unmet,
        instances=instances,
        workers=workers,
        proven=proven,
        method="compact_cbc",
        lambda_qps=split.lambda_qps,
    )


def _cbc(model: pulp.LpProblem, time_limit_s: float) -> str:
    """Solves ``model`` with CBC: "optimal" (proven), "feasible" (stopped with a solution)."""
    model.solve(_cbc_solver(time_limit_s, gap=1e-9))
    if model.status == pulp.LpStatusOptimal and model.sol_status == pulp.LpSolutionOptimal:
        return "optimal"
    if model.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "feasible"
    raise RuntimeError(f"CBC found no solution: {pulp.LpStatus[model.status]}")


# ----------------------------------------------------------------------------- random instances

# Per-worker capacities of the resources a random pool may have.
RESOURCES = {"vcpu": 4.0, "memory_mb": 8192.0, "device_slots": 4.0}
# An instance's share of a worker, per resource: shares just above a half or a third waste a
# worker's rest whatever the fluid rows say (0.6 + 0.5 > 1; three of 0.34 need two workers).
SHARES = (0.6, 0.5, 0.51, 0.34, 1 / 3, 0.25, 0.45, 0.7, 0.2, 1.0, 0.15, 0.4)
# A group's need over one server's Q: just above or below a whole number of instances.
NEED_RATIOS = (1.01, 2.97, 0.33, 0.99, 1.5, 2.0, 0.5, 3.01, 1.0, 1.34)
# Q[v, g] over the group's base rate: variants differ per group.
Q_FACTORS = (0.5, 0.75, 1.0, 1.3, 2.0)
# (pools, groups, variants) at most, and the most a group's need is multiplied by, per size.
SIZES = {"tiny": (2, 3, 4, 1), "small": (3, 4, 6, 1), "medium": (3, 5, 8, 8)}
TINY_COMBINATIONS = 4_000  # instance vectors a "tiny" problem may have (the brute force's work)


def case_problem(case: str) -> ScalingProblem:
    """The problem a case name stands for: ``tiny:SEED`` and ``small:SEED`` (:func:`random_problem`),
    ``mp1:SEED`` and ``mp2:SEED`` (``sim.problems.make_problem`` with 1 and 2 architectures), and
    ``SHAPE:SEED`` for the shapes of ``tests/scaling_shapes.py`` (the oracle test's)."""
    source, _, seed_text = case.partition(":")
    seed = int(seed_text)
    if source in SIZES:
        return random_problem(seed, source)
    if source in ("mp1", "mp2"):
        return make_problem(int(source[2:]), seed)
    from tests.scaling_shapes import SHAPES, shaped_problem  # (it draws with this module's helpers)

    if source in SHAPES:
        return shaped_problem(source, seed)
    raise ValueError(f"unknown source {source!r} (tiny, small, medium, mp1, mp2, {', '.join(SHAPES)})")


def combinations(problem: ScalingProblem) -> int:
    """Instance vectors :func:`brute_force` enumerates for ``problem``."""
    return math.prod(instance_bound(problem, v) + 1 for v in problem.variants)


def random_problem(seed: int, size: str = "small") -> ScalingProblem:
    """A random problem, the same for the same arguments. ``size``: "tiny" (the brute force
    solves it in about a second), "small" (up to 3 pools, 4 groups, 6 variants) or "medium" (up
    to 3 pools, 5 groups, 8 variants, needs up to 8 times larger: dozens of instances)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}")
    problem: ScalingProblem | None = None
    for attempt in range(100):
        problem = _draw(random.Random(f"scaler-check/{size}/{seed}/{attempt}"), *SIZES[size])
        if size != "tiny" or combinations(problem) <= TINY_COMBINATIONS:
            return problem
    raise RuntimeError(f"no tiny problem drawn for seed {seed}")


def _draw(
    rng: random.Random, most_pools: int, most_groups: int, most_variants: int, most_times: int
) -> ScalingProblem:
    pools: list[ScalingPool] = []
    for index in range(rng.randint(1, most_pools)):
        resources = rng.sample(sorted(RESOURCES), rng.randint(1, 3))
        capacity = {r: RESOURCES[r] * rng.choice((1.0, 2.0)) for r in resources}
        least = rng.choice((0, 0, 0, 1, 2))
        most = None if rng.random() < 0.5 else least + rng.randint(0, 3)
        price = rng.choice((1.0, 2.0, 3.0, 5.0)) * 1e-4
        pools.append(ScalingPool(f"p{index}", price, capacity, least, most))
    cheapest = min(pool.price_per_worker_second for pool in pools)
    group_ids = [f"g{index}" for index in range(rng.randint(1, most_groups))]
    base = {g: rng.choice((10.0, 25.0, 40.0, 100.0)) * rng.uniform(0.8, 1.25) for g in group_ids}

    variants: list[ScalingVariant] = []
    for index in range(rng.randint(1, most_variants)):
        pool = rng.choice(pools)
        serves = [g for g in group_ids if rng.random() < 0.6] or [rng.choice(group_ids)]
        demand: dict[str, float] = {}
        if rng.random() >= 0.03:  # now and then a variant that demands nothing
            for resource, amount in pool.capacity.items():
                if rng.random() < 0.85:
                    demand[resource] = amount * rng.choice(SHARES)
            if not demand:
                resource = rng.choice(sorted(pool.capacity))
                demand[resource] = pool.capacity[resource] * rng.choice(SHARES)
        variants.append(
            ScalingVariant(
                id=f"v{index}",
                pool=pool.name,
                saturation_qps={g: base[g] * rng.choice(Q_FACTORS) for g in serves},
                demand=demand,
                load_time_ms=rng.choice((0.0, 500.0, 2000.0, 10000.0)),
                running=rng.choice((0, 0, 0, 1, 2)),
                max_per_worker=rng.choice((None, None, 1, 1, 2)),
            )
        )

    slack = rng.choice((0.0, 0.0, 0.1))
    groups: list[ScalingGroup] = []
    for g in group_ids:
        servers = [v for v in variants if g in v.saturation_qps]
        if rng.random() < 0.15:
            need = 0.0
        elif servers:
            need = rng.choice(NEED_RATIOS) * rng.choice(servers).saturation_qps[g]
        else:
            need = rng.choice(NEED_RATIOS) * base[g]
        if most_times > 1:  # (no draw at the other sizes: their seeds keep their problems)
            need *= rng.randint(1, most_times)
        lambda_price = None
        if rng.random() >= 0.35:  # Lambda at about what a worker costs per query, cheaper or dearer
            lambda_price = cheapest / base[g] * rng.choice((0.3, 0.8, 1.2, 3.0))
        groups.append(
            ScalingGroup(
                id=g,
                load_qps=need / (1.0 + slack),
                latency_budget_ms=100.0,
                lambda_price_per_query=lambda_price,
                lambda_seconds_per_query=rng.choice((0.05, 0.2)),
            )
        )
    concurrency = None
    if rng.random() < 0.15:
        held = sum(
            g.load_qps * (1 + slack) * g.lambda_seconds_per_query
            for g in groups
            if g.lambda_price_per_query is not None
        )
        concurrency = held * rng.uniform(0.2, 1.0)
    return ScalingProblem(
        variants=variants,
        pools=pools,
        groups=groups,
        slack=slack,
        load_cost_weight=rng.choice((0.0, 0.0, 0.01, 0.5, 5.0)),
        lambda_allowed=rng.random() < 0.9,
        lambda_concurrency=concurrency,
    )


# ----------------------------------------------------------------------------- JSON


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclass_fields(obj)}


def problem_to_json(problem: ScalingProblem) -> dict[str, Any]:
    """``problem`` as JSON-able values (every field of the problem and its parts)."""
    found = _fields(problem)
    found["variants"] = [_fields(v) for v in problem.variants]
    found["pools"] = [_fields(p) for p in problem.pools]
    found["groups"] = [_fields(g) for g in problem.groups]
    return found


def problem_from_json(data: Mapping[str, Any]) -> ScalingProblem:
    """The problem :func:`problem_to_json` wrote."""
    rest = {k: v for k, v in data.items() if k not in ("variants", "pools", "groups")}
    return ScalingProblem(
        variants=[ScalingVariant(**v) for v in data["variants"]],
        pools=[ScalingPool(**p) for p in data["pools"]],
        groups=[ScalingGroup(**g) for g in data["groups"]],
        **rest,
    )


def _variable(
    model: pulp.LpProblem, name: str, low: float | None, high: float | None, kind: str = "Continuous"
) -> pulp.LpVariable:
    """A variable of ``model`` (PuLP 3.3 attaches it to its model; older ones have no way to)."""
    if hasattr(model, "add_variable"):
        return model.add_variable(name, low, high, cat=kind)
    return pulp.LpVariable(name, low, high, cat=kind)


def _cbc_solver(time_limit_s: float, gap: float | None = None) -> Any:
    """CBC as PuLP bundles it (PuLP 3.x says the bundle goes in 4.0: constraints.txt pins 3.3).

    Its primal heuristics are off: on tests' instance tiny:530 (stage 1, an objective on
    continuous columns only) the bundled CBC 2.10.3 took the feasibility pump's first solution
    (1/3 unmet) as proven optimal after 0 nodes, where 0 was feasible; its branch and bound
    alone finds 0. Its integer preprocessing is off too: on the oracle test's several_pools seed 18
    (tests/unit/test_scaling_oracle.py) it cut off the optimum (two instances on two workers, which
    the brute force and the project's solver found) and proved a plan 7.5 % dearer optimal. The
    brute force checks CBC on every tiny instance."""
    options: dict[str, Any] = {
        "msg": False,
        "timeLimit": time_limit_s,
        "threads": 1,
        "options": ["heuristicsOnOff off", "preprocess off"],
    }
    if gap is not None:
        options.update(gapRel=gap, gapAbs=gap)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)
        return pulp.PULP_CBC_CMD(**options)
