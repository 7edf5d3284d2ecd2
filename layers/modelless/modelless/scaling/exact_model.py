"""The exact solver's programs written as MILPs for HiGHS: :func:`build_model`.

One builder writes every model the solver solves (:mod:`modelless.scaling.exact`, module
docstring): the pattern program (a binary per pattern, one choice row per component), with
blocks (per-variant rows, switched on by ``m[c]``) for some components and stand-ins for the
others, and the compact program (every component's block on, no patterns: INFaaS's form). All
share the worker columns, the fluid resource rows, the dual feasible packing rows and Lambda's
concurrency row; explicit packing (:func:`_assign`) is added for the pools that need it. The
columns and rows are collected as sparse triplets: no dense matrix at any size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import coo_array

from modelless.scaling.deadline import CHECK_EVERY, Deadline
from modelless.scaling.patterns import Component, Pattern, stand_ins
from modelless.scaling.problem import (
    EPS,
    PACKING_KS,
    ScalingProblem,
    ScalingVariant,
    packing_share,
    packing_shares,
)

Vector = np.ndarray[Any, np.dtype[np.float64]]

# Blocks between two looks at the clock: a block writes a few rows per variant, far more than a
# pattern's column, so the clock is read more often than every CHECK_EVERY.
BLOCK_CHECK_EVERY = 16


class _Builder:
    """Collects columns and sparse rows (COO triplets) without a dense matrix anywhere."""

    def __init__(self) -> None:
        self.c: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []

    def column(self, cost: float, lower: float, upper: float, integer: bool) -> int:
        self.c.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(1 if integer else 0)
        return len(self.c) - 1

    def row(self, entries: Sequence[tuple[int, float]], lower: float, upper: float) -> int:
        index = len(self.row_lower)
        for col, value in entries:
            if value != 0.0:
                self.rows.append(index)
                self.cols.append(col)
                self.vals.append(value)
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        return index

    def add(self, row: int, col: int, value: float) -> None:
        if value != 0.0:
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(value)


@dataclass
class Model:
    """The MILP in scipy's matrix form, plus the maps needed to read a solution back."""

    c: Vector
    lower: Vector
    upper: Vector
    integrality: np.ndarray[Any, np.dtype[np.int8]]
    matrix: Any  # scipy sparse array (scipy is untyped)
    row_lower: Vector
    row_upper: Vector
    scale: float  # objective coefficients were divided by this
    w_cols: dict[int, int]  # pool index -> column of w[p]
    pattern_cols: dict[int, Pattern]  # column -> pattern
    n_cols: dict[int, int]  # variant index -> column of n[v] (blocks)
    y_cols: dict[tuple[int, int], int]  # (variant, group) -> column of z[v,g]
    l_cols: dict[int, int]  # group index -> column of l[g] (fraction of its need)
    u_cols: dict[int, int]  # group index -> column of u[g] (fraction of its need)
    stand_in_cols: dict[int, int]  # column -> component it stands in for
    m_cols: dict[int, int]  # component -> column of m[c], the switch of its block
    block_cols: dict[int, list[int]]  # component -> its block's n, z and l columns
    s_cols: dict[int, int]  # variant index -> column of s[v] (instances loaded past those running)
    capacity_rows: dict[tuple[int, str], int]  # (pool index, resource) -> row
    packing_rows: dict[tuple[int, str, int], int]  # (pool index, resource, k) -> row
    choice_rows: dict[int, int]  # component -> row of Σ patterns (+ m or stand-ins) = 1
    blocks: frozenset[int]


def worker_bound(problem: ScalingProblem, pi: int, usable: Sequence[int]) -> float:
    """w[p]'s upper bound: the pool's limit, or (WLOG) one worker per instance it could hold."""
    pool = problem.pools[pi]
    if pool.max_workers is not None:
        return float(pool.max_workers)
    needs = {g.id: problem.need(g) for g in problem.groups}
    variants = (problem.variants[vi] for vi in usable)
    most = sum(_instance_bound(v, needs) for v in variants if v.pool == pool.name)
    return float(max(pool.min_workers, most))


def _instance_bound(variant: ScalingVariant, needs: Mapping[str, float]) -> int:
    """Instances of ``variant`` that serve all of its groups' need alone: more serve nothing."""
    share = sum(needs[g] / q for g, q in variant.saturation_qps.items() if q > 0)
    return max(1, math.ceil(share - 1e-9))


def useful_packing_rows(
    problem: ScalingProblem, usable: Sequence[int], deadline: Deadline | None
) -> list[tuple[tuple[int, str], int]]:
    """The (pool, resource), k of the packing rows worth adding: those where some usable
    variant's u^(k) share exceeds its share (elsewhere the row is the fluid one, or looser)."""
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    shares: dict[tuple[int, str], list[float]] = {}
    for position, vi in enumerate(usable):
        if deadline is not None and position % CHECK_EVERY == 0:
            deadline.check()
        variant = problem.variants[vi]
        pi = pool_index[variant.pool]
        capacities = problem.pools[pi].capacity
        for resource, amount in variant.demand.items():
            capacity = capacities.get(resource, 0.0)
            if amount > 0 and capacity > 0:
                shares.setdefault((pi, resource), []).append(amount / capacity)
    found = []
    for key, values in shares.items():
        share = np.unique(np.asarray(values))
        for k in PACKING_KS:
            if np.any(packing_shares(share, k) > share + 1e-9):
                found.append((key, k))
    return sorted(found)


def build_model(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    blocks: frozenset[int],
    patterns: bool,
    with_stand_ins: bool = False,
    deadline: Deadline | None = None,
    packing: Sequence[tuple[tuple[int, str], int]] | None = None,
    slots: Mapping[int, int] | None = None,
) -> Model:
    """The program: patterns for every component (when ``patterns``), blocks for ``blocks``
    (switched by m[c] when there are patterns; always on when not), and for the components
    without a block, stand-ins for their blocks (when ``with_stand_ins``). ``packing``: the
    packing rows (:func:`useful_packing_rows`, read here when not given); ``slots``: pool index
    -> worker slots of explicit packing (:func:`_assign`)."""
    draft = _Draft(problem, usable)
    if packing is None:
        packing = useful_packing_rows(problem, usable, deadline)
    draft.add_packing_rows(packing)
    draft.add_lambda_row()
    if patterns:
        for ci, component in enumerate(components):
            if deadline is not None and ci % CHECK_EVERY == 0:
                deadline.check()
            draft.add_choice(ci, component, ci in blocks, with_stand_ins)
    for position, ci in enumerate(sorted(blocks)):
        if deadline is not None and position % BLOCK_CHECK_EVERY == 0:
            deadline.check()
        draft.add_block(ci, components[ci])
    if slots:
        _assign(draft.b, problem, draft.n_cols, draft.w_cols, slots)
    return draft.model(blocks)


class _Draft:
    """A model being written: its builder and the maps from the program's terms to its columns
    and rows, filled in the order :func:`build_model` calls the steps below (the order of the
    columns and rows is the model's, and HiGHS's search depends on it)."""

    def __init__(self, problem: ScalingProblem, usable: Sequence[int]) -> None:
        self.problem = problem
        self.b = b = _Builder()
        self.needs = [problem.need(g) for g in problem.groups]
        self.pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
        self.group_index = {g.id: gi for gi, g in enumerate(problem.groups)}
        self.need_of = {g.id: need for g, need in zip(problem.groups, self.needs, strict=True)}
        self.seconds = [g.lambda_seconds_per_query for g in problem.groups]
        prices = [pool.price_per_worker_second for pool in problem.pools if pool.price_per_worker_second > 0]
        # Objective coefficients in units of the cheapest worker: HiGHS's absolute gap tolerance
        # would otherwise end the search at a 1%-wide gap on prices of ~1e-5 $/s.
        self.scale = scale = min(prices) if prices else 1.0
        self.w_cols = {
            pi: b.column(
                pool.price_per_worker_second / scale,
                float(pool.min_workers),
                worker_bound(problem, pi, usable),
                True,
            )
            for pi, pool in enumerate(problem.pools)
        }
        self.capacity_rows: dict[tuple[int, str], int] = {}
        for pi, pool in enumerate(problem.pools):
            for resource, capacity in pool.capacity.items():
                if capacity > 0:
                    self.capacity_rows[(pi, resource)] = b.row([(self.w_cols[pi], -1.0)], -math.inf, 0.0)
        self.packing_rows: dict[tuple[int, str, int], int] = {}
        self.lambda_row: int | None = None
        self.pattern_cols: dict[int, Pattern] = {}
        self.stand_in_cols: dict[int, int] = {}
        self.choice_rows: dict[int, int] = {}
        self.m_cols: dict[int, int] = {}
        self.n_cols: dict[int, int] = {}
        self.y_cols: dict[tuple[int, int], int] = {}
        self.l_cols: dict[int, int] = {}
        self.u_cols: dict[int, int] = {}
        self.block_cols: dict[int, list[int]] = {}
        self.s_cols: dict[int, int] = {}

    def add_packing_rows(self, packing: Sequence[tuple[tuple[int, str], int]]) -> None:
        """Packing rows (dual feasible functions, exact's module docstring): Σ f_k(share)·n <= w
        per pool, resource and k, where some usable variant's f_k(share) exceeds its share."""
        for (pi, resource), k in packing:
            self.packing_rows[(pi, resource, k)] = self.b.row([(self.w_cols[pi], -1.0)], -math.inf, 0.0)

    def add_lambda_row(self) -> None:
        """Lambda's account concurrency: Σ QPS sent to Lambda x seconds an invocation runs <= limit."""
        concurrency = self.problem.lambda_concurrency
        if concurrency is not None and any(self.seconds):
            self.lambda_row = self.b.row([], -math.inf, concurrency)

    def use(self, col: int, variant: ScalingVariant, copies: int = 1) -> None:
        """``copies`` instances of ``variant`` per unit of ``col``, in its pool's resource and
        packing rows."""
        pi = self.pool_index[variant.pool]
        capacities = self.problem.pools[pi].capacity
        for resource, amount in variant.demand.items():
            if amount > 0:
                share = amount / capacities[resource]
                self.b.add(self.capacity_rows[(pi, resource)], col, copies * share)
                for k in PACKING_KS:
                    row = self.packing_rows.get((pi, resource, k))
                    if row is not None:
                        self.b.add(row, col, copies * packing_share(share, k))

    def add_choice(self, ci: int, component: Component, has_block: bool, with_stand_ins: bool) -> None:
        """Component ``ci``'s choice row: one of its patterns, or its block's switch m[c], or
        (``with_stand_ins``, no block) one of its stand-ins."""
        b = self.b
        choice = self.choice_rows[ci] = b.row([], 1.0, 1.0)
        weightless: dict[int, list[int]] = {}  # pool -> patterns whose variant demands nothing
        for pattern in component.patterns:
            self._add_pattern(choice, pattern, weightless)
        if has_block:
            self.m_cols[ci] = b.column(0.0, 0.0, 1.0, True)
            b.add(choice, self.m_cols[ci], 1.0)
        elif with_stand_ins:
            self._add_stand_ins(ci, component, choice, weightless)
        # An instance needs a worker: the resource rows and w's integrality say so, unless a
        # variant demands nothing (the row would tighten the LP, but it doubles HiGHS's time).
        for pi, cols in weightless.items():
            b.row([(col, 1.0) for col in cols] + [(self.w_cols[pi], -1.0)], -math.inf, 0.0)

    def _add_pattern(self, choice: int, pattern: Pattern, weightless: dict[int, list[int]]) -> None:
        """A pattern's binary: its cost, its Lambda concurrency, its instances' resources, and
        where it holds more copies of a variant than one worker may, ``copies <= k·w``."""
        b, problem = self.b, self.problem
        col = b.column(pattern.cost / self.scale, 0.0, 1.0, True)
        self.pattern_cols[col] = pattern
        b.add(choice, col, 1.0)
        if self.lambda_row is not None:
            seconds = self.seconds
            b.add(self.lambda_row, col, sum(qps * seconds[gi] for gi, qps in pattern.to_lambda.items()))
        for vi in set(pattern.instances):
            variant = problem.variants[vi]
            copies = pattern.instances.count(vi)
            self.use(col, variant, copies)
            if not any(amount > 0 for amount in variant.demand.values()):
                weightless.setdefault(self.pool_index[variant.pool], []).append(col)
            if copies > 1 and copies > problem.per_worker(variant):  # copies <= k·w
                per_worker = float(problem.per_worker(variant))
                w_col = self.w_cols[self.pool_index[variant.pool]]
                b.row([(col, float(copies)), (w_col, -per_worker)], -math.inf, 0.0)

    def _add_stand_ins(
        self, ci: int, component: Component, choice: int, weightless: dict[int, list[int]]
    ) -> None:
        """The component's stand-ins, a binary each: their cost and their least resources."""
        b = self.b
        for stand_in in stand_ins(self.problem, component, self.pool_index):
            col = b.column(stand_in.cost / self.scale, 0.0, 1.0, True)
            self.stand_in_cols[col] = ci
            b.add(choice, col, 1.0)
            for pi, usage in stand_in.usage.items():
                for resource, amount in usage.items():
                    b.add(self.capacity_rows[(pi, resource)], col, amount)
                if not usage:
                    weightless.setdefault(pi, []).append(col)

    def add_block(self, ci: int, component: Component) -> None:
        """Component ``ci``'s block (exact's module docstring): per variant its instances, their
        time shared among its groups, and per group its cover and count rows; switched by m[c]
        where the component also has patterns (always on where it has none)."""
        switch = self.m_cols.get(ci)  # None: the block is always on
        serving: dict[int, list[tuple[int, int, float]]] = {gi: [] for gi in component.groups}
        for vi in component.variants:
            self._add_block_variant(ci, vi, switch, serving)
        for gi in component.groups:
            self._add_block_group(ci, gi, switch, serving[gi])
        if switch is not None:  # the patterns hold up to ``most`` instances: the block, more
            more = float(component.most + 1)
            entries = [(self.n_cols[vi], 1.0) for vi in component.variants]
            self.b.row([*entries, (switch, -more)], 0.0, math.inf)

    def _add_block_variant(
        self, ci: int, vi: int, switch: int | None, serving: dict[int, list[tuple[int, int, float]]]
    ) -> None:
        """n[v] (with s[v] where instances of v run and loading one costs), its packing row where
        tighter than the resource rows, and z[v,g] for each group it serves: the share row and
        the linking rows. ``serving``: per group, (variant, z column, Q) of those that serve it."""
        b, problem, needs = self.b, self.problem, self.needs
        variant = problem.variants[vi]
        pi = self.pool_index[variant.pool]
        bound = float(_instance_bound(variant, self.need_of))
        load_cost = problem.load_cost(variant) / self.scale
        fresh_cost = load_cost if variant.running == 0 else 0.0
        self.n_cols[vi] = col = b.column(fresh_cost, 0.0, bound, True)
        self.block_cols.setdefault(ci, []).append(col)
        self.use(col, variant)
        if switch is not None:
            b.row([(col, 1.0), (switch, -bound)], -math.inf, 0.0)
        per_worker = problem.per_worker(variant)
        if per_worker < problem.fluid_per_worker(variant) - 1e-9:
            b.row([(col, 1.0), (self.w_cols[pi], -float(per_worker))], -math.inf, 0.0)
        if variant.running > 0 and load_cost > 0:
            self.s_cols[vi] = s_col = b.column(load_cost, 0.0, bound, False)
            b.row([(col, 1.0), (s_col, -1.0)], -math.inf, float(variant.running))
        share: list[tuple[int, float]] = []
        for group_id, q in variant.saturation_qps.items():
            gi = self.group_index[group_id]
            if q > 0 and needs[gi] > EPS:
                self.y_cols[(vi, gi)] = y = b.column(0.0, 0.0, 1.0, False)
                self.block_cols[ci].append(y)
                share.append((y, needs[gi] / q))
                serving[gi].append((vi, y, q))
                if needs[gi] < q:  # linking
                    b.row([(y, 1.0), (col, -1.0)], -math.inf, 0.0)
        b.row([*share, (col, -1.0)], -math.inf, 0.0)

    def _add_block_group(
        self, ci: int, gi: int, switch: int | None, serving: Sequence[tuple[int, int, float]]
    ) -> None:
        """Group ``gi``'s l[g] (where Lambda may serve it) and u[g], its cover row, and where
        Lambda may not serve it, its count row."""
        b, problem, need = self.b, self.problem, self.needs[gi]
        price = problem.lambda_price(problem.groups[gi])
        entries = [(y, 1.0) for _, y, _ in serving]
        if price is not None:
            self.l_cols[gi] = b.column(price * need / self.scale, 0.0, 1.0, False)
            self.block_cols.setdefault(ci, []).append(self.l_cols[gi])
            if self.lambda_row is not None:
                b.add(self.lambda_row, self.l_cols[gi], need * self.seconds[gi])
            entries.append((self.l_cols[gi], 1.0))
        self.u_cols[gi] = b.column(0.0, 0.0, 0.0, False)
        entries.append((self.u_cols[gi], 1.0))
        if switch is None:
            b.row(entries, 1.0, math.inf)
        else:
            b.row([*entries, (switch, -1.0)], 0.0, math.inf)
        # count: k-1 instances of the fastest leave at least r unmet.
        if price is None and serving:
            best = max(q for _, _, q in serving)
            least = math.ceil(need / best - 1e-9)
            remainder = need - (least - 1) * best
            count = [(self.n_cols[vi], 1.0) for vi, _, _ in serving]
            count.append((self.u_cols[gi], need / remainder))
            if switch is None:
                b.row(count, float(least), math.inf)
            else:
                b.row([*count, (switch, -float(least))], 0.0, math.inf)

    def model(self, blocks: frozenset[int]) -> Model:
        """The model written so far, in scipy's matrix form."""
        b = self.b
        shape = (len(b.row_lower), len(b.c))
        matrix = coo_array((b.vals, (b.rows, b.cols)), shape=shape).tocsr()
        return Model(
            c=np.asarray(b.c, dtype=np.float64),
            lower=np.asarray(b.lower, dtype=np.float64),
            upper=np.asarray(b.upper, dtype=np.float64),
            integrality=np.asarray(b.integer, dtype=np.int8),
            matrix=matrix,
            row_lower=np.asarray(b.row_lower, dtype=np.float64),
            row_upper=np.asarray(b.row_upper, dtype=np.float64),
            scale=self.scale,
            w_cols=self.w_cols,
            pattern_cols=self.pattern_cols,
            n_cols=self.n_cols,
            y_cols=self.y_cols,
            l_cols=self.l_cols,
            u_cols=self.u_cols,
            stand_in_cols=self.stand_in_cols,
            m_cols=self.m_cols,
            block_cols=self.block_cols,
            s_cols=self.s_cols,
            capacity_rows=self.capacity_rows,
            packing_rows=self.packing_rows,
            choice_rows=self.choice_rows,
            blocks=blocks,
        )


def _assign(
    b: _Builder,
    problem: ScalingProblem,
    n_cols: Mapping[int, int],
    w_cols: Mapping[int, int],
    slots: Mapping[int, int],
) -> None:
    """Explicit packing for the pools of ``slots`` (pool index -> worker slots): copies y[v,j] of
    each variant on each slot j, ``sum_j y[v,j] = n[v]``, every slot within a worker's capacity in
    every resource when it is on (o[j]), slots on in order, ``sum_j o[j] <= w[p]``. Exact: a plan
    of this model packs onto its workers (exact's module docstring)."""
    members: dict[int, list[int]] = {}
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    for vi in n_cols:
        members.setdefault(pool_index[problem.variants[vi].pool], []).append(vi)
    for pi, count in slots.items():
        pool = problem.pools[pi]
        variants = members.get(pi, [])
        limit = {vi: float(problem.per_worker(problem.variants[vi])) for vi in variants}
        on = [b.column(0.0, 0.0, 1.0, True) for _ in range(count)]
        copies = {vi: [b.column(0.0, 0.0, limit[vi], True) for _ in range(count)] for vi in variants}
        for vi, columns in copies.items():
            b.row([*((col, 1.0) for col in columns), (n_cols[vi], -1.0)], 0.0, 0.0)
        for j in range(count):
            for resource, capacity in pool.capacity.items():
                entries = [
                    (copies[vi][j], problem.variants[vi].demand.get(resource, 0.0))
                    for vi in variants
                    if problem.variants[vi].demand.get(resource, 0.0) > 0
                ]
                if entries:
                    b.row([*entries, (on[j], -capacity)], -math.inf, 0.0)
            for vi in variants:  # a copy needs its slot on (also where the variant demands nothing)
                b.row([(copies[vi][j], 1.0), (on[j], -limit[vi])], -math.inf, 0.0)
            if j:
                b.row([(on[j], 1.0), (on[j - 1], -1.0)], -math.inf, 0.0)
        b.row([*((col, 1.0) for col in on), (w_cols[pi], -1.0)], -math.inf, 0.0)
