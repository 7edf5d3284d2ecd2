"""The variant-mix program solved exactly: MILPs and LPs for HiGHS through ``scipy.optimize``.

The program (DESIGN §5, INFaaS §4.2.1, conventions in :mod:`modelless.scaling.problem`): integer
instances ``n[v]`` of each variant on its pool, integer workers ``w[p]``, load left to Lambda;
minimise ``Σ price[p]·w[p] + Σ lambda_price[g]·l[g] + Σ λ·C[v]·T_load[v]·(new instances of v)``
subject to covering each group's need, an instance's time shared among the groups it serves,
``Σ R[v,r]·n[v] <= cap[p,r]·w[p]`` per pool and resource, ``n[v] <= k[v]·w[p]`` (k: copies per
worker, 1 for the project's workers), and the pools' bounds.

**Components and patterns** (:mod:`modelless.scaling.patterns`). The groups are coupled only
through the pools. Groups linked by a variant that may serve both (an app's or a model's groups)
form a *component*, and a component's share of a plan is a *pattern*: which instances serve it
(a multiset of its variants, empty for Lambda alone), how their time is split among its groups
(where it saves the most Lambda money: an LP, a fractional knapsack for one instance) and what
is left to Lambda. A pattern's cost and resource use are constants, so the program becomes: one
binary per pattern, ``Σ patterns of c = 1`` for every component c, the resource rows, integer
workers. Its LP relaxation is the convex hull of each component's choices, much tighter than
the program written per variant (INFaaS's form, :func:`solve_compact`): at 100 architectures
of ``bench/scaler.py`` the LP bound is 1-2 % below the optimum instead of 3 %, and HiGHS
solves it in a fraction of a second where the compact program took 10-30 s. Patterns dominated
by another of their component (no cheaper, no fewer resources, no fewer workers needed) are
dropped: any plan can swap them out.

Patterns hold one instance at first (up to ``MOST_INSTANCES`` where more may pay), and a plan
may need more. The pattern program is a *restriction* of the program: it holds only the ways of
serving a component that it enumerated, and its bounds (below) steer the search, never a claim.
Every bound a plan reports, and so every ``optimal``, comes from step 4: the compact program.

1. *LP duality, to steer.* The pattern LP gives a price per unit of each pool resource (π) and
   per component (its choice row's dual). A way to serve c with more instances than its patterns
   hold is priced at ``rho[c]``: those instances at the dual prices (at least ``most + 1`` of
   them, and at least each group's need at its cheapest rate), less c's dual. Where ``rho[c] <
   0`` (another instance may pay), c gets its patterns of one instance more, and the LP is solved
   again, until no ``rho`` is negative (or half the time is gone).
2. *The plan.* The pattern MILP, with the time left, and the best rounding of step 1's LPs as
   the plan to beat (each LP's solution rounded, blocks included: below); the cheaper wins.
3. *The search for a cheaper plan.* The same MILP with *stand-ins*: for each component, a few
   columns meant to stand for every way to serve it with more instances than its patterns hold
   (per set of pools: the least resources and load cost such a way can use, the Lambda it cannot
   avoid). Where its optimum picks a stand-in, the component gets patterns of one instance more
   (up to ``MOST_INSTANCES``; so do the components whose stand-ins the duals do not rule out),
   then its *block*: the per-variant rows below, switched on by a binary ``m[c]`` in its choice
   row; and it is solved again. It stops where its bounds say nothing is cheaper.
4. *The proof* (:func:`_certify`). The compact program (every component's block on, no patterns:
   INFaaS's form, :func:`solve_compact`) is a relaxation of every plan that packs: its rows are
   the fluid resource rows, the dual feasible packing rows and cuts that every packing satisfies.
   Its LP's Lagrangian bound (computed from the duals and the column bounds, so that it holds
   whatever HiGHS's tolerances) first; where that does not meet the best plan, its MILP with the
   time left, told the best plan's objective as its cutoff and with the columns fixed that the
   LP's reduced costs rule out: HiGHS's dual bound, a cheaper plan (it becomes the best), or the
   proof that none is. Issue 32 found why the pattern program's own bounds could not be reported:
   on one model with a group Lambda may not serve and one it may, 22-23 % of random problems had
   a plan one instance dearer than the optimum called optimal, with a "bound" equal to its cost.
   (Patterns were pruned by dominance on aggregate shares, which a set that packs worse can win;
   dominance now compares the packing rows too, :func:`~modelless.scaling.patterns._set_table`.)

The plan's ``lower_bound`` is step 4's bound; its status is ``optimal`` once that bound meets its
objective (within HiGHS's 0.01 % gap), ``time_limit`` when the deadline came first. Step 4 has
``CERTIFY_SHARE`` of the time limit kept for it; steps 2 and 3 stop that early. The compact LP is
looser than the pattern LP (its bound 4 % below the pattern LP's at 100 architectures of
``bench/scaler.py``, 12 % at 500; one seed each), so beyond a few dozen architectures a plan's
certified gap is wider than its true gap, and at 2,000 the compact LP alone takes about 4 s: a
1 s call there has no certified gap.

*Reduced-cost fixing* keeps the MILPs small: an integer column whose LP reduced cost exceeds the
best plan's objective less the LP's bound is in no plan of that model cheaper than the best, so
it is fixed at 0. Step 3 also prunes, by the same duals, the ways of one instance more that it
enumerates (their bound is checked before their split: their instances at the duals' prices and
the Lambda money their rates cannot save); step 4 does not depend on any of it.

A component's block (z are fractions of a group's need, so the rows are well scaled):

- cover:   ``Σ_v z[v,g] + l[g] + u[g] >= m[c]``                    for every group g of c;
- share:   ``Σ_g (need[g]/Q[v,g])·z[v,g] <= n[v]``                  for every variant v of c;
- packing: ``n[v] <= k[v]·w[p(v)]`` where tighter than the resource rows;
- loading: ``n[v] - s[v] <= running[v]`` (its cost on s; on n when nothing of v runs);
- linking: ``z[v,g] <= n[v]`` where one instance serves all of g (a group that needs less than an
  instance still needs a whole one: facility location);
- count:   ``Σ_v n[v] + (need/r)·u[g] >= ceil(need/max Q)·m[c]`` for groups Lambda may not serve;
- more instances than the patterns: ``Σ_v n[v] >= (most + 1)·m[c]``, and ``n[v] <= N[v]·m[c]``,
  N[v] the instances that serve all of c's groups alone (more would serve nothing).

The unmet columns ``u`` are fixed to 0; when the program is infeasible (not enough capacity
anywhere, no Lambda) it is solved again with blocks only (every component, ``m = 1``: the
compact program), the unmet columns freed, lexicographically: first the least total unmet QPS,
then the cheapest plan that leaves no more than that unmet.

**Packing.** The aggregate resource rows count a worker's resources as if instances could be
cut. Every model also has, per pool and resource where they bind, rows from Fekete and Schepers'
dual feasible functions ``u^(k)`` (:func:`packing_share`): ``Σ u^(k)(share)·n <= w``, which every
real packing satisfies (items over half a worker need one each, ...). A plan is checked against
a first-fit packing; where that needs more workers (or the pool's limit forbids them), the
program is solved again with *explicit packing* for those pools (:func:`_assign`: copies per
worker slot, each slot within a worker's capacity), then for any other pool whose plan does not
pack, while that model stays small (``MOST_ASSIGNMENT_COLUMNS``); its plan packs by
construction. Beyond that, the plan takes the workers first-fit needs (or drops what does not
fit: its load goes to Lambda or is unmet) and is called ``feasible``: its lower bound still holds.
The first-fit packing goes by counts per variant and runs of identical workers
(:func:`~modelless.scaling.problem.first_fit_workers`), so reading a plan back takes time in its
distinct variants, not its instances (one instance at a time, 10,000 took 44-58 s).

**The deadline** (:mod:`modelless.scaling.deadline`) is for the whole call. The long loops read
the clock. Every LP of step 1 is rounded into a plan (:func:`_rounded`: each component's
likeliest choice; a chosen block as if fully on, its instances rounded up; the fewest workers
that hold them), so a plan exists from the first LP on; the cheapest is the plan to beat, and
with it *reduced-cost fixing*: an integer column whose LP reduced cost exceeds the best plan's
objective less the LP's bound is in no cheaper plan, so it is fixed at 0, in the plan's MILP and
in every later round. The search stops early enough for its best plan to be read (packed, its
bridge priced) by the deadline: that reading's time is kept back as a share of the call's own
scan of the variants (``FINISH_PER_SCAN``), so that a slower or busier machine keeps back more.
Past the deadline the call returns the best plan found so far, with the
bound proven by then; where there is none yet, the greedy's (under the same deadline), or the
holding plan (what runs now stays, Lambda takes the rest). Before the roundings took blocks, a
500-architecture call under 1 s ended on the holding plan (its load unmet) in 3 seeded problems
of 6, whenever the plan's MILP ran past its limit: ``docs/bench/scaler.md``.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_array, vstack

from modelless.scaling.bridge import finish_plan
from modelless.scaling.deadline import (
    CHECK_EVERY,
    STOP_SLACK_S,
    Deadline,
    OutOfTime,
    holding_plan,
    holding_reserve_s,
    without_gc_pauses,
)
from modelless.scaling.greedy import solve_greedy
from modelless.scaling.patterns import (
    PACKING_KS,
    Component,
    Pattern,
    Prices,
    components_of,
    extend,
    packing_share,
    packing_shares,
    stand_ins,
    usable_variants,
    within,
)
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
LP_SHARE = 0.25  # of the time limit, at most, for each of step 1's LPs
MOST_INSTANCES = 4  # patterns hold up to this many instances; blocks and stand-ins, more
PLAN_SHARE = 0.6  # of the time limit, at most, for step 2 (the plan)
RESERVE_SHARE = 0.1  # of the time limit, kept for reading the plan (packing, bridge)
# Reading the best plan into a ScalingPlan (its packing, its bridge) comes after the search has
# stopped, at the deadline: the search stops this long before it, measured as a share of the
# time the scan of the variants took in the same call, so that a slower or busier machine keeps
# back more. Measured on a 2-core Intel Xeon VM: the reading took 0.17-0.38 of the scan at 50
# to 500 architectures (its fixed few ms are more at 10, within the deadline's slack); with no
# reserve for it, 1 s calls at 500 took up to 1.15 s there.
FINISH_PER_SCAN = 0.4
EXTEND_SHARE = 0.2  # of the time limit, at least, left for another round of the proof
# Of what is left for a proof's MILP, what HiGHS is told it may take: it reads the clock between
# the phases of its search, and one phase can take a few tenths of a second on 500 architectures.
# (So is the plan's MILP: it has the best rounding, so one abandoned is a plan the worse, no more.)
HIGHS_SHARE = 0.6
PROOF_COST = 4.0  # a proof round's model and LP, over the first model's and LP's time
FALLBACK_SHARE = 0.15  # of the time limit, at most, for the greedy's improvement passes
MIP_GAP = 1e-4  # HiGHS's default relative gap: what "optimal" means here
# A plan stopped by the deadline whose certified gap is above this is checked against the greedy's.
POOR_GAP = 0.05
CUTOFF_SLACK = 1e-9  # a proof round's cutoff: the best plan's objective, and rounding room
CERTIFY_SHARE = 0.25  # of the time limit, kept from the search for the proof (``_certify``)

# HiGHS status codes as scipy reports them.
_OPTIMAL, _LIMIT, _INFEASIBLE = 0, 1, 2

Vector = np.ndarray[Any, np.dtype[np.float64]]


# ----------------------------------------------------------------------------- the model


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
class _Model:
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


def _worker_bound(problem: ScalingProblem, pi: int, usable: Sequence[int]) -> float:
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



def _useful_packing_rows(
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


def _build(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    blocks: frozenset[int],
    patterns: bool,
    with_stand_ins: bool = False,
    deadline: Deadline | None = None,
    packing: Sequence[tuple[tuple[int, str], int]] | None = None,
    slots: Mapping[int, int] | None = None,
) -> _Model:
    """The program: patterns for every component (when ``patterns``), blocks for ``blocks``
    (switched by m[c] when there are patterns; always on when not), and for the components
    without a block, stand-ins for their blocks (when ``with_stand_ins``)."""
    b = _Builder()
    groups = problem.groups
    needs = [problem.need(g) for g in groups]
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    prices = [pool.price_per_worker_second for pool in problem.pools if pool.price_per_worker_second > 0]
    # Objective coefficients in units of the cheapest worker: HiGHS's absolute gap tolerance
    # would otherwise end the search at a 1%-wide gap on prices of ~1e-5 $/s.
    scale = min(prices) if prices else 1.0

    w_cols = {
        pi: b.column(
            pool.price_per_worker_second / scale,
            float(pool.min_workers),
            _worker_bound(problem, pi, usable),
            True,
        )
        for pi, pool in enumerate(problem.pools)
    }
    capacity_rows: dict[tuple[int, str], int] = {}
    for pi, pool in enumerate(problem.pools):
        for resource, capacity in pool.capacity.items():
            if capacity > 0:
                capacity_rows[(pi, resource)] = b.row([(w_cols[pi], -1.0)], -math.inf, 0.0)

    # Packing rows (dual feasible functions, module docstring): Σ f_k(share)·n <= w per pool,
    # resource and k, where some usable variant's f_k(share) exceeds its share.
    packing_rows: dict[tuple[int, str, int], int] = {}
    if packing is None:
        packing = _useful_packing_rows(problem, usable, deadline)
    for (pi, resource), k in packing:
        packing_rows[(pi, resource, k)] = b.row([(w_cols[pi], -1.0)], -math.inf, 0.0)

    def use(col: int, variant: ScalingVariant, copies: int = 1) -> None:
        pi = pool_index[variant.pool]
        for resource, amount in variant.demand.items():
            if amount > 0:
                share = amount / problem.pools[pi].capacity[resource]
                b.add(capacity_rows[(pi, resource)], col, copies * share)
                for k in PACKING_KS:
                    row = packing_rows.get((pi, resource, k))
                    if row is not None:
                        b.add(row, col, copies * packing_share(share, k))

    # Lambda's account concurrency: Σ QPS sent to Lambda x seconds an invocation runs <= limit.
    seconds = [g.lambda_seconds_per_query for g in groups]
    lambda_row: int | None = None
    if problem.lambda_concurrency is not None and any(seconds):
        lambda_row = b.row([], -math.inf, problem.lambda_concurrency)

    pattern_cols: dict[int, Pattern] = {}
    stand_in_cols: dict[int, int] = {}
    choice_rows: dict[int, int] = {}
    m_cols: dict[int, int] = {}
    if patterns:
        for ci, component in enumerate(components):
            if deadline is not None and ci % CHECK_EVERY == 0:
                deadline.check()
            choice = choice_rows[ci] = b.row([], 1.0, 1.0)
            weightless: dict[int, list[int]] = {}  # pool -> patterns whose variant demands nothing
            for pattern in component.patterns:
                col = b.column(pattern.cost / scale, 0.0, 1.0, True)
                pattern_cols[col] = pattern
                b.add(choice, col, 1.0)
                if lambda_row is not None:
                    b.add(lambda_row, col, sum(qps * seconds[gi] for gi, qps in pattern.to_lambda.items()))
                for vi in set(pattern.instances):
                    variant = problem.variants[vi]
                    copies = pattern.instances.count(vi)
                    use(col, variant, copies)
                    if not any(amount > 0 for amount in variant.demand.values()):
                        weightless.setdefault(pool_index[variant.pool], []).append(col)
                    if copies > 1 and copies > problem.per_worker(variant):  # copies <= k·w
                        per_worker = float(problem.per_worker(variant))
                        w_col = w_cols[pool_index[variant.pool]]
                        b.row([(col, float(copies)), (w_col, -per_worker)], -math.inf, 0.0)
            if ci in blocks:
                m_cols[ci] = b.column(0.0, 0.0, 1.0, True)
                b.add(choice, m_cols[ci], 1.0)
            elif with_stand_ins:
                for stand_in in stand_ins(problem, component, pool_index):
                    col = b.column(stand_in.cost / scale, 0.0, 1.0, True)
                    stand_in_cols[col] = ci
                    b.add(choice, col, 1.0)
                    for pi, usage in stand_in.usage.items():
                        for resource, amount in usage.items():
                            b.add(capacity_rows[(pi, resource)], col, amount)
                        if not usage:
                            weightless.setdefault(pi, []).append(col)
            # An instance needs a worker: the resource rows and w's integrality say so, unless a
            # variant demands nothing (the row would tighten the LP, but it doubles HiGHS's time).
            for pi, cols in weightless.items():
                b.row([(col, 1.0) for col in cols] + [(w_cols[pi], -1.0)], -math.inf, 0.0)

    n_cols: dict[int, int] = {}
    y_cols: dict[tuple[int, int], int] = {}
    l_cols: dict[int, int] = {}
    u_cols: dict[int, int] = {}
    block_cols: dict[int, list[int]] = {}
    s_cols: dict[int, int] = {}
    group_index = {g.id: gi for gi, g in enumerate(groups)}
    need_of = {g.id: need for g, need in zip(groups, needs, strict=True)}
    for position, ci in enumerate(sorted(blocks)):
        if deadline is not None and position % 16 == 0:
            deadline.check()
        component = components[ci]
        switch = m_cols.get(ci)  # None: the block is always on
        serving: dict[int, list[tuple[int, int, float]]] = {gi: [] for gi in component.groups}
        for vi in component.variants:
            variant = problem.variants[vi]
            pi = pool_index[variant.pool]
            bound = float(_instance_bound(variant, need_of))
            load_cost = problem.load_cost(variant) / scale
            fresh_cost = load_cost if variant.running == 0 else 0.0
            n_cols[vi] = col = b.column(fresh_cost, 0.0, bound, True)
            block_cols.setdefault(ci, []).append(col)
            use(col, variant)
            if switch is not None:
                b.row([(col, 1.0), (switch, -bound)], -math.inf, 0.0)
            per_worker = problem.per_worker(variant)
            if per_worker < problem.fluid_per_worker(variant) - 1e-9:
                b.row([(col, 1.0), (w_cols[pi], -float(per_worker))], -math.inf, 0.0)
            if variant.running > 0 and load_cost > 0:
                s_cols[vi] = s_col = b.column(load_cost, 0.0, bound, False)
                b.row([(col, 1.0), (s_col, -1.0)], -math.inf, float(variant.running))
            share: list[tuple[int, float]] = []
            for group_id, q in variant.saturation_qps.items():
                gi = group_index[group_id]
                if q > 0 and needs[gi] > EPS:
                    y_cols[(vi, gi)] = y = b.column(0.0, 0.0, 1.0, False)
                    block_cols[ci].append(y)
                    share.append((y, needs[gi] / q))
                    serving[gi].append((vi, y, q))
                    if needs[gi] < q:  # linking
                        b.row([(y, 1.0), (col, -1.0)], -math.inf, 0.0)
            b.row([*share, (col, -1.0)], -math.inf, 0.0)
        for gi in component.groups:
            price = problem.lambda_price(groups[gi])
            entries = [(y, 1.0) for _, y, _ in serving[gi]]
            if price is not None:
                l_cols[gi] = b.column(price * needs[gi] / scale, 0.0, 1.0, False)
                block_cols.setdefault(ci, []).append(l_cols[gi])
                if lambda_row is not None:
                    b.add(lambda_row, l_cols[gi], needs[gi] * seconds[gi])
                entries.append((l_cols[gi], 1.0))
            u_cols[gi] = b.column(0.0, 0.0, 0.0, False)
            entries.append((u_cols[gi], 1.0))
            if switch is None:
                b.row(entries, 1.0, math.inf)
            else:
                b.row([*entries, (switch, -1.0)], 0.0, math.inf)
            # count: k-1 instances of the fastest leave at least r unmet.
            if price is None and serving[gi]:
                best = max(q for _, _, q in serving[gi])
                least = math.ceil(needs[gi] / best - 1e-9)
                remainder = needs[gi] - (least - 1) * best
                count = [(n_cols[vi], 1.0) for vi, _, _ in serving[gi]]
                count.append((u_cols[gi], needs[gi] / remainder))
                if switch is None:
                    b.row(count, float(least), math.inf)
                else:
                    b.row([*count, (switch, -float(least))], 0.0, math.inf)
        if switch is not None:  # the patterns hold up to ``most`` instances: the block, more
            more = float(component.most + 1)
            b.row([(n_cols[vi], 1.0) for vi in component.variants] + [(switch, -more)], 0.0, math.inf)

    if slots:
        _assign(b, problem, n_cols, w_cols, slots)

    shape = (len(b.row_lower), len(b.c))
    matrix = coo_array((b.vals, (b.rows, b.cols)), shape=shape).tocsr()
    return _Model(
        c=np.asarray(b.c, dtype=np.float64),
        lower=np.asarray(b.lower, dtype=np.float64),
        upper=np.asarray(b.upper, dtype=np.float64),
        integrality=np.asarray(b.integer, dtype=np.int8),
        matrix=matrix,
        row_lower=np.asarray(b.row_lower, dtype=np.float64),
        row_upper=np.asarray(b.row_upper, dtype=np.float64),
        scale=scale,
        w_cols=w_cols,
        pattern_cols=pattern_cols,
        n_cols=n_cols,
        y_cols=y_cols,
        l_cols=l_cols,
        u_cols=u_cols,
        stand_in_cols=stand_in_cols,
        m_cols=m_cols,
        block_cols=block_cols,
        s_cols=s_cols,
        capacity_rows=capacity_rows,
        packing_rows=packing_rows,
        choice_rows=choice_rows,
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
    of this model packs onto its workers (module docstring)."""
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


# ----------------------------------------------------------------------------- solving


def _milp(
    model: _Model,
    c: Vector,
    upper: Vector,
    time_limit_s: float,
    extra_row: tuple[Vector, float] | None = None,
    cutoff: float | None = None,
) -> Any:
    """HiGHS on the model. ``cutoff``: HiGHS's ``objective_bound``, so that it prunes every node
    that cannot beat it (a proof round knows the best plan's objective: it needs no solution
    that is not cheaper). What it returns above the cutoff only says that none is below it."""
    constraints = []
    if model.matrix.shape[0]:
        constraints.append(LinearConstraint(model.matrix, model.row_lower, model.row_upper))
    if extra_row is not None:
        coefficients, bound = extra_row
        constraints.append(LinearConstraint(coefficients.reshape(1, -1), -np.inf, bound))
    options: dict[str, Any] = {"time_limit": max(time_limit_s, 0.01), "disp": False}
    if cutoff is None:
        return _highs_within(
            time_limit_s,
            lambda: milp(
                c,
                integrality=model.integrality,
                bounds=Bounds(model.lower, upper),
                constraints=constraints,
                options=options,
            ),
        )

    def bounded() -> Any:
        with warnings.catch_warnings():  # scipy passes the option to HiGHS, and warns that it does
            warnings.filterwarnings("ignore", message="Unrecognized options", category=RuntimeWarning)
            return milp(
                c,
                integrality=model.integrality,
                bounds=Bounds(model.lower, upper),
                constraints=constraints,
                options={**options, "objective_bound": cutoff},
            )

    return _highs_within(time_limit_s, bounded)


# HiGHS checks its time limit in most of its phases, not all: at 500 architectures a MILP asked
# to stop after 0.35 s once ran 2.1 s, and one asked for 0.08 s commonly answers after 0.17 s
# (bench/scaler.py). A call runs in a thread of its own (HiGHS releases the GIL), and is abandoned
# when it has not answered this long after its limit: the solve goes on without it (OutOfTime),
# and the thread ends when HiGHS does (its answer unread). The grace is kept back from every
# deadline (``deadline.STOP_SLACK_S``), so that an abandoned call still ends the solve in time.
HIGHS_GRACE_S = STOP_SLACK_S
# An abandoned call still runs HiGHS: the process waits for it at exit (up to this long), since a
# daemon thread still inside HiGHS when Python finalises aborts the process ("terminate called
# without an active exception", exit 134) where a one-shot CLI or benchmark ends right after one.
ABANDONED_WAIT_S = 60.0
_abandoned: set[threading.Thread] = set()


@atexit.register
def _wait_for_abandoned_calls() -> None:
    deadline = time.monotonic() + ABANDONED_WAIT_S
    for thread in list(_abandoned):
        thread.join(max(0.0, deadline - time.monotonic()))


def _highs_within(time_limit_s: float, call: Callable[[], Any]) -> Any:
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # handed to the caller's thread
            failure.append(error)

    worker = threading.Thread(target=run, name="highs", daemon=True)
    worker.start()
    worker.join(max(time_limit_s, 0.01) + HIGHS_GRACE_S)
    if worker.is_alive():
        _abandoned.add(worker)
        _abandoned.difference_update([thread for thread in _abandoned if not thread.is_alive()])
        raise OutOfTime
    if failure:
        raise failure[0]
    return outcome[0]


@dataclass
class _Duals:
    bound: float  # the LP's Lagrangian bound, scaled units
    capacity: dict[tuple[int, str], float]  # π >= 0 per (pool, resource) row
    choice: dict[int, float]  # per component, its choice row's dual
    x: Vector  # the LP's solution
    reduced: Vector  # its reduced costs
    scale: float  # the model's objective scale


def _lp_duals(model: _Model, time_limit_s: float) -> _Duals | None:
    """The LP relaxation's duals, and the Lagrangian bound they prove (computed here from the
    duals and the column bounds, so that it holds whatever HiGHS's own tolerances)."""
    matrix = model.matrix
    equal = model.row_lower == model.row_upper
    upper_rows = np.isfinite(model.row_upper) & ~equal
    lower_rows = np.isfinite(model.row_lower) & ~equal
    a_ub = vstack([matrix[np.flatnonzero(upper_rows)], -matrix[np.flatnonzero(lower_rows)]]).tocsr()
    b_ub = np.concatenate([model.row_upper[upper_rows], -model.row_lower[lower_rows]])
    a_eq = matrix[np.flatnonzero(equal)]
    b_eq = model.row_lower[equal]
    result = _highs_within(
        time_limit_s,
        lambda: linprog(
            model.c,
            A_ub=a_ub if a_ub.shape[0] else None,
            b_ub=b_ub if a_ub.shape[0] else None,
            A_eq=a_eq if a_eq.shape[0] else None,
            b_eq=b_eq if a_eq.shape[0] else None,
            bounds=np.column_stack([model.lower, model.upper]),
            method="highs",
            options={"time_limit": max(time_limit_s, 0.01)},
        ),
    )
    if result.status != 0:
        return None
    y_ub = np.zeros(0)
    if a_ub.shape[0]:  # a <= row's multiplier is never positive (rounding aside)
        y_ub = np.minimum(np.asarray(result.ineqlin.marginals, dtype=np.float64), 0.0)
    y_eq = np.asarray(result.eqlin.marginals, dtype=np.float64) if a_eq.shape[0] else np.zeros(0)
    reduced = model.c.copy()
    if a_ub.shape[0]:
        reduced -= a_ub.T @ y_ub
    if a_eq.shape[0]:
        reduced -= a_eq.T @ y_eq
    bound = float(b_ub @ y_ub + b_eq @ y_eq)
    bound += float(np.sum(np.where(reduced >= 0, reduced * model.lower, reduced * model.upper)))
    price = np.zeros(matrix.shape[0])
    price[np.flatnonzero(upper_rows)] = -y_ub[: int(upper_rows.sum())]
    price[np.flatnonzero(equal)] = y_eq
    return _Duals(
        bound=bound,
        capacity={key: float(price[row]) for key, row in model.capacity_rows.items()},
        choice={ci: float(price[row]) for ci, row in model.choice_rows.items()},
        x=np.asarray(result.x, dtype=np.float64),
        reduced=reduced,
        scale=model.scale,
    )


def _rounded(problem: ScalingProblem, model: _Model, lp_x: Vector) -> Vector | None:
    """A plan from the LP's solution: each component's likeliest choice (a pattern, or its block),
    and the workers that hold them (in aggregate: the plan's packing is checked later). None
    where it breaks a row (a pool over its limit, Lambda over its concurrency, ...). The first
    plan of the anytime solve, and a safety net for a MILP stopped early with a poor incumbent.

    A chosen block takes the LP's solution divided by its switch ``m[c]`` (the block as if fully
    on), instances rounded up: every row of the block still holds (its rows are homogeneous in
    ``m``, and more instances only loosen them; fractions of a need are capped at the whole)."""
    x = np.zeros_like(model.c)
    best: dict[int, tuple[float, int]] = {}
    choices = [(col, pattern.component) for col, pattern in model.pattern_cols.items()]
    choices += [(col, ci) for ci, col in model.m_cols.items()]
    for col, ci in choices:
        if ci not in best or lp_x[col] > best[ci][0]:
            best[ci] = (float(lp_x[col]), col)
    for _, col in best.values():
        x[col] = 1.0
    for ci in model.blocks:
        switch = model.m_cols.get(ci)
        on = 1.0 if switch is None else float(lp_x[switch])
        if switch is not None and (best[ci][1] != switch or on <= EPS):
            continue  # a pattern serves it: the block stays off
        # The block's columns (instances, fractions of needs, Lambda's), as if m were 1.
        for col in model.block_cols.get(ci, ()):
            value = max(float(lp_x[col]), 0.0) / on
            whole = bool(model.integrality[col])
            x[col] = math.ceil(value - 1e-9) if whole else min(value, float(model.upper[col]))
    return _with_workers(problem, model, x)


def _with_workers(problem: ScalingProblem, model: _Model, x: Vector) -> Vector | None:
    """``x`` (its choices and instances set) with the fewest workers every row allows, its load
    columns set where they are free; None where a row then breaks."""
    matrix = model.matrix
    for vi, col in model.n_cols.items():  # instances loaded afresh, past those running
        s_col = model.s_cols.get(vi)
        if s_col is not None:
            x[s_col] = max(0.0, x[col] - problem.variants[vi].running)
    x[list(model.w_cols.values())] = 0.0
    usage = matrix @ x
    for pi, col in model.w_cols.items():
        entries = matrix[:, [col]].tocoo()
        need = float(problem.pools[pi].min_workers)
        for row, coefficient in zip(entries.row, entries.data, strict=True):
            if coefficient < 0 and np.isfinite(model.row_upper[row]):
                need = max(need, math.ceil((usage[row] - model.row_upper[row]) / -coefficient - 1e-9))
        if need > model.upper[col]:
            return None
        x[col] = need
    rows = matrix @ x
    if np.any(rows < model.row_lower - 1e-7) or np.any(rows > model.row_upper + 1e-7):
        return None  # e.g. two copies of a variant that one worker cannot hold
    if np.any(x < model.lower - 1e-9) or np.any(x > model.upper + 1e-9):
        return None
    return x


@dataclass(frozen=True)
class _BlockPricing:
    """What ``_block_bounds`` reads of the problem, as arrays, once per solve (the components'
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


def _block_pricing(
    problem: ScalingProblem,
    components: Sequence[Component],
    capacity_keys: Sequence[tuple[int, str]],
    deadline: Deadline | None = None,
) -> _BlockPricing:
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
    return _BlockPricing(
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


def _block_bounds(
    pricing: _BlockPricing, components: Sequence[Component], model: _Model, duals: _Duals
) -> dict[int, float]:
    """rho[c] for each component without a block: a lower bound on the reduced cost of any way of
    serving it with more instances than its patterns hold (module docstring), scaled units.

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


def _lagrangian_bound(
    problem: ScalingProblem,
    components: Sequence[Component],
    duals: _Duals,
    reduced: Mapping[int, float],
    deadline: Deadline | None = None,
) -> float:
    """What every plan costs at least (module docstring, step 1), scaled units: where ``rho`` is
    negative, the least reduced cost of the component's stand-ins bounds its ways too, often
    more tightly (every way of it is at least as dear as one of its stand-ins)."""
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


@dataclass
class _Attempt:
    """One MILP's outcome in scaled units: status, solution and HiGHS's dual bound."""

    status: int
    x: Vector | None
    value: float | None
    dual_bound: float | None
    message: str


def _attempt(
    model: _Model, time_limit_s: float, upper: Vector | None = None, cutoff: float | None = None
) -> _Attempt:
    """One MILP. With a ``cutoff``, a solution above it (or none at all, once the search is
    done) proves only that nothing is cheaper than the cutoff: it comes back as no solution,
    with the cutoff as the bound."""
    result = _milp(model, model.c, model.upper if upper is None else upper, time_limit_s, cutoff=cutoff)
    x = None if result.x is None else np.asarray(result.x, dtype=np.float64)
    value = None if result.fun is None else float(result.fun)
    dual = getattr(result, "mip_dual_bound", None)
    if result.status == _OPTIMAL and value is not None:
        dual = value if dual is None else min(float(dual), value)
    if cutoff is not None:
        done = result.status in (_OPTIMAL, _INFEASIBLE)
        if value is not None and value > cutoff:
            x = value = None
        if done and x is None:
            return _Attempt(_OPTIMAL, None, None, cutoff, str(result.message))
        if dual is not None:
            dual = min(float(dual), cutoff)
    return _Attempt(result.status, x, value, None if dual is None else float(dual), str(result.message))


# What reading the variants and building the program take per variant (about 15 µs on the
# benchmark machine, ``bench/scaler.py``); where that would be over this share of the time limit,
# the greedy answers instead (what the exact solver would return is the holding plan).
PREPARE_S_PER_VARIANT = 15e-6
PREPARE_SHARE = 0.5


@dataclass
class _Incumbent:
    """The best plan found so far, as a solution of a model, and the best lower bound."""

    model: _Model | None = None
    x: Vector | None = None
    lower: float = -math.inf  # scaled units

    def offer(self, model: _Model, x: Vector) -> None:
        """Keep ``x`` where it is cheaper than the plan kept (every model has the same scale)."""
        if self.model is None or self.x is None or float(model.c @ x) < float(self.model.c @ self.x):
            self.model, self.x = model, x


def _offer_rounding(
    problem: ScalingProblem, model: _Model, duals: _Duals | None, incumbent: _Incumbent, deadline: Deadline
) -> None:
    if duals is not None:
        rounded = _rounded(problem, model, duals.x)
        if rounded is not None:
            incumbent.offer(model, _filled(model, rounded, deadline))


FILL_CHECK_EVERY = 64  # moves between two looks at the clock


def _filled(model: _Model, x: Vector, deadline: Deadline | None = None) -> Vector:
    """``x`` with the room its workers leave put to use: a component moves to a cheaper pattern
    (more instances, less Lambda) wherever that breaks no row with the workers ``x`` already
    pays for, the largest saving first. A rounding pays for whole workers its LP used only part
    of; on the benchmark's 500 architectures this takes 0.5-1 point off its gap, in about 10 ms."""
    x = x.copy()
    columns = model.matrix.tocsc()
    starts, indices, values = columns.indptr, columns.indices, columns.data
    rows = model.matrix @ x
    lowest, highest = model.row_lower - 1e-9, model.row_upper + 1e-9
    chosen: dict[int, int] = {}
    for col, pattern in model.pattern_cols.items():
        if x[col] > 0.5:
            chosen[pattern.component] = col
    moves = sorted(
        (float(model.c[col] - model.c[chosen[pattern.component]]), col, pattern.component)
        for col, pattern in model.pattern_cols.items()
        if pattern.component in chosen and model.c[col] < model.c[chosen[pattern.component]] - EPS
    )
    for tried, (_, col, component) in enumerate(moves):
        if deadline is not None and tried % FILL_CHECK_EVERY == 0 and deadline.passed():
            break  # every move kept the plan valid: it is filled as far as the time allowed
        current = chosen[component]
        if model.c[col] >= model.c[current] - EPS:
            continue  # it has moved to a pattern at least as cheap already
        touched = np.concatenate(
            [indices[starts[col] : starts[col + 1]], indices[starts[current] : starts[current + 1]]]
        )
        change = np.concatenate(
            [values[starts[col] : starts[col + 1]], -values[starts[current] : starts[current + 1]]]
        )
        unique, position = np.unique(touched, return_inverse=True)
        moved = rows[unique] + np.bincount(position, weights=change, minlength=unique.size)
        if np.all(moved <= highest[unique]) and np.all(moved >= lowest[unique]):
            rows[unique] = moved
            x[current], x[col] = 0.0, 1.0
            chosen[component] = col
    return x


def solve_exact(problem: ScalingProblem, time_limit_s: float = 1.0) -> ScalingPlan:
    """The cheapest plan (DESIGN §5). Never raises on an infeasible problem: it returns the plan
    that serves the most load, status ``infeasible_partial``, with ``unmet`` saying why.

    ``time_limit_s`` is a deadline for the whole call, at any size (see the module docstring):
    the plan is the best found by then, with the gap it has proven, or where none was found
    in time, the holding plan (:mod:`modelless.scaling.deadline`)."""
    with without_gc_pauses():
        return _solve_exact(problem, time_limit_s)


def _solve_exact(problem: ScalingProblem, time_limit_s: float) -> ScalingPlan:
    started = time.perf_counter()
    if PREPARE_S_PER_VARIANT * len(problem.variants) > PREPARE_SHARE * time_limit_s:
        # Too large for the program to be built and solved in time: the greedy answers at once
        # (under the same deadline) rather than after the preparation has spent the time.
        count = len(problem.variants)
        why = f"{count:,} variants are too many to solve within the time limit of {time_limit_s:g} s"
        hard_at = started + time_limit_s - holding_reserve_s(problem)
        return _fallback(problem, started, hard_at, time_limit_s, None, why)
    hard = Deadline(started + time_limit_s - holding_reserve_s(problem))
    incumbent = _Incumbent()
    try:
        return _solve(problem, time_limit_s, started, hard, incumbent)
    except OutOfTime:
        why = f"milp: time limit of {time_limit_s:g} s reached"
        if incumbent.model is None or incumbent.x is None:
            return holding_plan(problem, SOLVER, started, f"{why} before any plan")
        scale = incumbent.model.scale
        bound = None if incumbent.lower == -math.inf else incumbent.lower * scale
        notes = [f"{why} before optimality was proven"]
        return _plan(problem, incumbent.model, incumbent.x, PlanStatus.TIME_LIMIT, started, notes, bound)


def _solve(
    problem: ScalingProblem, time_limit_s: float, started: float, hard: Deadline, incumbent: _Incumbent
) -> ScalingPlan:
    deadline = hard.at

    def left() -> float:
        return _until(deadline, time_limit_s)

    def search_end() -> float:  # steps 2 and 3 leave the proof (step 4) its share
        return deadline - (RESERVE_SHARE + CERTIFY_SHARE) * time_limit_s

    def search_left() -> float:
        return max(0.01, search_end() - time.perf_counter())

    scanning = time.perf_counter()
    usable = usable_variants(problem, hard)
    # The deadline kept back the holding plan's time; reading a plan may need more.
    hard = hard.keeping_back(FINISH_PER_SCAN, scanning, holding_reserve_s(problem) - STOP_SLACK_S)
    deadline = hard.at
    components = components_of(problem, usable, hard)
    packing = _useful_packing_rows(problem, usable, hard)  # the same for every model below
    forced = frozenset(ci for ci, component in enumerate(components) if not component.patterns)

    # 1. What every plan costs at least, by LP duality; and where another instance may pay,
    #    patterns of one instance more (then the LP again), until none may.
    modelled = time.perf_counter()
    model = _build(problem, components, usable, forced, patterns=True, deadline=hard, packing=packing)
    if model.c.size == 0:  # no pool and no load: nothing to decide (HiGHS takes no empty LP)
        return finish_plan(problem, {}, {}, {}, {}, {}, SOLVER, PlanStatus.OPTIMAL, started, (), 0.0)
    duals = _lp_duals(model, min(left(), LP_SHARE * time_limit_s))
    # What a proof round costs at least: its model (several times this one) and its LP.
    round_cost = PROOF_COST * (time.perf_counter() - modelled)
    # What the pattern program's bounds say (``hint``) steers the search only: whether another
    # round may pay. The bound a plan reports comes from the compact program (``_certify``).
    hint = -math.inf
    # Anytime: every LP's rounding is a plan, should the deadline come before a better one
    # (before the pricing that certifies it: a plan without a bound beats none).
    _offer_rounding(problem, model, duals, incumbent, hard)
    pricing = _block_pricing(problem, components, list(model.capacity_rows), hard)
    while duals is not None:
        reduced = _block_bounds(pricing, components, model, duals)
        hint = max(hint, _lagrangian_bound(problem, components, duals, reduced, hard))
        paying = [ci for ci, r in reduced.items() if r < 0]
        if not paying or deadline - time.perf_counter() < time_limit_s / 2:  # else the plan first
            break
        forced = forced | _grow(problem, components, paying, deadline=hard)
        model = _build(problem, components, usable, forced, patterns=True, deadline=hard, packing=packing)
        duals = _lp_duals(model, min(left(), LP_SHARE * time_limit_s))
        _offer_rounding(problem, model, duals, incumbent, hard)

    # 2. The plan: patterns, and blocks where a component has no pattern. With the best rounding
    #    as the plan to beat, reduced-cost fixing: a column whose LP reduced cost exceeds the
    #    rounding's objective less the LP's bound is in no solution cheaper than the rounding,
    #    so it is fixed at 0; the cheaper of HiGHS's optimum and the rounding is then this
    #    model's optimum. HiGHS is not told the rounding's objective as a cutoff here: on the
    #    benchmark's 500 and 2,000 architectures that made it 1.4-2.5x slower to its optimum.
    if incumbent.model is not None and incumbent.x is not None and duals is not None:
        upper_bound = float(incumbent.model.c @ incumbent.x)
        fixed = _fixed_by_reduced_cost(model, duals, upper_bound)
        plan_s = HIGHS_SHARE * min(search_left(), PLAN_SHARE * time_limit_s)
        first = _abandonable(incumbent, lambda: _attempt(model, plan_s, fixed))
        if first.status == _INFEASIBLE:  # what fixing left holds nothing cheaper than the rounding
            first = _Attempt(_OPTIMAL, None, None, upper_bound, first.message)
    else:
        plan_s = min(search_left(), PLAN_SHARE * time_limit_s)
        first = _abandonable(incumbent, lambda: _attempt(model, plan_s))
    if first.status == _INFEASIBLE:
        partial = _complete(problem, components, usable, started, deadline, time_limit_s)
        if _failing_pools(problem, partial):
            partial = _packed_optimum(problem, components, usable, started, deadline, time_limit_s, partial)
        return partial
    if first.x is not None:
        incumbent.offer(model, first.x)
    if incumbent.model is None or incumbent.x is None:
        why = f"time limit of {time_limit_s:g} s reached" if first.status == _LIMIT else first.message
        return _fallback(problem, started, deadline, time_limit_s, None, why)
    best_value = float(incumbent.model.c @ incumbent.x)

    # 3. The search for a cheaper plan, while time is left: stand-ins for the blocks, true blocks
    #    where picked. It ends where the pattern program's bounds say nothing is cheaper (a hint:
    #    step 4 proves it or finds the cheaper plan).
    blocks = forced
    settled = first.status == _OPTIMAL and hint >= best_value * (1 - MIP_GAP)
    try:  # HiGHS abandoned past its limit, or the deadline: the best plan so far goes to step 4
        while not settled and search_end() - time.perf_counter() > round_cost:
            relaxed = _build(
                problem,
                components,
                usable,
                blocks,
                patterns=True,
                with_stand_ins=True,
                deadline=hard,
                packing=packing,
            )
            # Its LP: a bound, and the duals that price the ways no plan cheaper than the best one
            # can hold (the stand-ins for them need no column: module docstring).
            lp = _lp_duals(relaxed, min(left(), LP_SHARE * time_limit_s))
            upper = relaxed.upper
            prices: Prices | None = None
            if lp is not None:  # a bound on every plan cheaper than the best (ways ruled out before)
                hint = max(hint, min(lp.bound, best_value))
                if hint >= best_value * (1 - MIP_GAP):
                    settled = True
                    break
                prices = Prices(lp.capacity, lp.choice, relaxed.scale, best_value - lp.bound)
                # Every integer column, stand-ins included, that no plan cheaper than the best holds.
                upper = _fixed_by_reduced_cost(relaxed, lp, best_value)
            cutoff = best_value * (1 + CUTOFF_SLACK) + CUTOFF_SLACK
            result = _attempt(relaxed, HIGHS_SHARE * search_left(), upper, cutoff)
            if result.status == _OPTIMAL and result.x is None:  # nothing cheaper than the best plan
                settled = True
                break
            if result.x is None or result.value is None:
                break
            picked = _stand_ins_used(relaxed, result.x)
            if not picked and result.value < best_value:
                best_value = result.value
                incumbent.offer(relaxed, result.x)
            if result.status != _OPTIMAL:
                break
            if not picked:
                settled = True
                break
            if search_end() - time.perf_counter() < EXTEND_SHARE * time_limit_s:
                break  # no time to extend the patterns and solve again
            # Picked stand-ins: patterns of one instance more, or the true blocks. So do the
            # components whose stand-ins the duals did not rule out (they could be picked next:
            # one at a time took a MILP per component); their new patterns, only those the duals
            # do not rule out either.
            chosen = set(picked)
            chosen |= {ci for col, ci in relaxed.stand_in_cols.items() if upper[col] > 0}
            blocks = blocks | _grow(problem, components, chosen, prices, hard)
    except OutOfTime:
        pass

    # 4. The proof: a bound from the compact program, a relaxation of every plan that packs.
    proven = _certify(problem, components, usable, packing, incumbent, hard, time_limit_s)
    best_model, best_x = incumbent.model, incumbent.x
    status = PlanStatus.OPTIMAL if proven else PlanStatus.TIME_LIMIT
    notes = [] if proven else [f"milp: time limit of {time_limit_s:g} s reached before optimality was proven"]
    bound = None if incumbent.lower == -math.inf else incumbent.lower * model.scale
    plan = _plan(problem, best_model, best_x, status, started, notes, bound)
    if _failing_pools(problem, plan):
        plan = _packed_optimum(problem, components, usable, started, deadline, time_limit_s, plan)
    if plan.status is not PlanStatus.TIME_LIMIT or (plan.gap is not None and plan.gap <= POOR_GAP):
        return plan
    # HiGHS stopped with an incumbent that may be far from the optimum (on 500 architectures,
    # one seeded problem in three had one twice the optimum's cost): the greedy's plan, when
    # cheaper, found by the same deadline.
    gap = "none certified" if plan.gap is None else f"a certified gap of {plan.gap:.1%}"
    why = f"time limit of {time_limit_s:g} s reached with {gap}"
    greedy = _fallback(problem, started, deadline, time_limit_s, bound, why)
    if greedy.objective < plan.objective and not greedy.unmet_qps:
        return greedy
    return replace(plan, solve_seconds=time.perf_counter() - started)


def _abandonable(incumbent: _Incumbent, call: Callable[[], _Attempt]) -> _Attempt:
    """``call``, or where HiGHS was abandoned past its limit, no answer: with a plan in hand the
    solve goes on to its proof with what time is left (without one, the holding plan)."""
    try:
        return call()
    except OutOfTime:
        if incumbent.model is None:
            raise
        return _Attempt(_LIMIT, None, None, None, "HiGHS abandoned past its time limit")


def _certify(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    packing: Sequence[tuple[tuple[int, str], int]],
    incumbent: _Incumbent,
    hard: Deadline,
    time_limit_s: float,
) -> bool:
    """Whether the incumbent is optimal, proven by the *compact* program (every component's
    block on, no patterns: :func:`solve_compact`'s model), and ``incumbent.lower`` set to the
    bound proven. Of the models here only the compact one is a relaxation of the program as it
    stands: its rows are the fluid resource rows, the dual feasible packing rows, the per-worker
    copy limits and cuts that every plan that packs satisfies, while the pattern program, even
    with its stand-ins, holds only the ways of serving a component that it enumerated (issue 32:
    a model whose tight group needs instances and whose lax group splits between their spare
    time and Lambda had its bound equal to a plan 26-50 % dearer than the optimum).

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
        model = _build(problem, components, usable, every, patterns=False, deadline=hard, packing=packing)
        duals = _lp_duals(model, min(_until(hard.at, time_limit_s), LP_SHARE * time_limit_s))
        if duals is None:
            return False
        incumbent.lower = max(incumbent.lower, min(duals.bound, best))
        if proven():
            return True
        upper = _fixed_by_reduced_cost(model, duals, best)
        cutoff = best * (1 + CUTOFF_SLACK) + CUTOFF_SLACK
        result = _attempt(model, HIGHS_SHARE * _until(hard.at, time_limit_s), upper, cutoff)
    except OutOfTime:
        return proven()
    if result.x is not None and result.value is not None and result.value < best:
        incumbent.offer(model, result.x)
        best = result.value
    if result.dual_bound is not None:
        incumbent.lower = max(incumbent.lower, min(result.dual_bound, best))
    if result.status == _OPTIMAL:  # the search ended: nothing cheaper than ``best``
        incumbent.lower = max(incumbent.lower, best)
    return proven()


# Explicit packing is added where the plan of the fluid and packing rows did not pack, while its
# model stays this small (copies columns: the usable variants of those pools times their slots).
MOST_ASSIGNMENT_COLUMNS = 4000


def _failing_pools(problem: ScalingProblem, plan: ScalingPlan) -> set[int]:
    """Pools where reading ``plan`` had to add workers or drop instances to pack it (its notes)."""
    pool_index = {pool.name: pi for pi, pool in enumerate(problem.pools)}
    failing = set()
    for note in plan.notes:
        name = note.split(":", 1)[0]
        if name in pool_index and ("first-fit packing" in note or "do not fit" in note):
            failing.add(pool_index[name])
    return failing


def _packed_optimum(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    started: float,
    deadline: float,
    time_limit_s: float,
    plan: ScalingPlan,
) -> ScalingPlan:
    """The program with explicit packing (``_assign``) for the pools where ``plan`` did not
    pack, then for any other pool whose plan does not, while the model stays small and time is
    left; the better of it and ``plan`` (less unmet, then cheaper). Worker slots per pool: as
    many as a plan no dearer than ``plan`` could pay for, within the pool's limit. A plan of
    such a model is optimal for the program: every plan that packs is a plan of it."""
    members = Counter(problem.variants[vi].pool for vi in usable)
    failing = _failing_pools(problem, plan)
    slots: dict[int, int] = {}
    best = plan
    while failing - set(slots):
        for pi in failing:
            pool = problem.pools[pi]
            if pool.price_per_worker_second > 0:
                affordable = math.floor(best.objective / pool.price_per_worker_second + 1e-9)
            else:
                affordable = int(_worker_bound(problem, pi, usable))
            limit = affordable if pool.max_workers is None else min(pool.max_workers, affordable)
            slots[pi] = max(pool.min_workers, limit, 1)
        columns = sum(members[problem.pools[pi].name] * count for pi, count in slots.items())
        if columns > MOST_ASSIGNMENT_COLUMNS or deadline - time.perf_counter() < RESERVE_SHARE * time_limit_s:
            break
        found = _complete(problem, components, usable, started, deadline, time_limit_s, slots)
        if found.solver != SOLVER:
            break  # the MILP found nothing in time: that was the greedy's plan
        unmet, best_unmet = sum(found.unmet_qps.values()), sum(best.unmet_qps.values())
        if unmet < best_unmet - EPS or (unmet <= best_unmet + EPS and found.objective <= best.objective):
            best = found
        failing = _failing_pools(problem, found)
        if not failing:
            break
    return best


def _fixed_by_reduced_cost(model: _Model, duals: _Duals, upper_bound: float) -> Vector:
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


def _grow(
    problem: ScalingProblem,
    components: Sequence[Component],
    chosen: Iterable[int],
    prices: Prices | None = None,
    deadline: Deadline | None = None,
) -> set[int]:
    """Patterns of one instance more for the ``chosen`` components (with ``prices``, those the
    duals do not rule out); returns those that get their block instead (``MOST_INSTANCES``
    reached, or too many ways to pick the instances)."""
    full = {ci for ci in chosen if components[ci].most >= MOST_INSTANCES}
    return full | extend(problem, components, [ci for ci in chosen if ci not in full], prices, deadline)


def _stand_ins_used(model: _Model, x: Vector) -> frozenset[int]:
    """Components whose stand-in for two or more instances the solution picked."""
    return frozenset(ci for col, ci in model.stand_in_cols.items() if x[col] > 0.5)


def _until(deadline: float, time_limit_s: float) -> float:
    """What one step may take: what is left before the deadline, less the reserve."""
    return max(0.01, deadline - RESERVE_SHARE * time_limit_s - time.perf_counter())


def solve_compact(problem: ScalingProblem, time_limit_s: float = 1.0) -> ScalingPlan:
    """The program as INFaaS writes it: one compact block per component, no patterns. The
    reference the pattern program is checked against (tests, ``bench/scaler.py``); much
    slower beyond a few dozen architectures. ``time_limit_s`` is a deadline, as in solve_exact."""
    started = time.perf_counter()
    hard = Deadline(started + time_limit_s - holding_reserve_s(problem))
    try:
        usable = usable_variants(problem, hard)
        components = components_of(problem, usable, hard)
        return _complete(problem, components, usable, started, hard.at, time_limit_s)
    except OutOfTime:
        return holding_plan(problem, SOLVER, started, f"milp: time limit of {time_limit_s:g} s reached")


def _complete(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    started: float,
    deadline: float,
    time_limit_s: float,
    slots: Mapping[int, int] | None = None,
) -> ScalingPlan:
    """Blocks for every component, no patterns: the program as INFaaS writes it. For problems
    the patterns cannot serve, and for partial plans when nothing can serve everything. With
    ``slots``, explicit packing for those pools (``_assign``)."""
    model = _build(
        problem,
        components,
        usable,
        frozenset(range(len(components))),
        patterns=False,
        deadline=Deadline(deadline),
        slots=slots,
    )
    packed = frozenset(problem.pools[pi].name for pi in slots or {})
    result = _attempt(model, _until(deadline, time_limit_s))
    if result.status == _OPTIMAL and result.x is not None:
        lower = None if result.dual_bound is None else result.dual_bound * model.scale
        return _plan(problem, model, result.x, PlanStatus.OPTIMAL, started, [], lower, packed)
    if result.status != _INFEASIBLE:
        return _fallback(problem, started, deadline, time_limit_s, None, result.message)

    # Infeasible: free the unmet columns, find the least unmet load, then the cheapest plan that
    # leaves no more than that unmet.
    upper = model.upper.copy()
    unmet_mask = np.zeros_like(model.c)
    for gi, col in model.u_cols.items():
        upper[col] = 1.0
        unmet_mask[col] = problem.need(problem.groups[gi])
    least = _milp(model, unmet_mask, upper, _until(deadline, time_limit_s))
    if least.status != _OPTIMAL:
        return _fallback(
            problem,
            started,
            deadline,
            time_limit_s,
            None,
            f"infeasible, and the partial plan search stopped: {least.message}",
            PlanStatus.INFEASIBLE_PARTIAL,
        )
    bound = float(least.fun) * (1 + 1e-9) + 1e-7
    cheapest = _milp(model, model.c, upper, _until(deadline, time_limit_s), (unmet_mask, bound))
    if cheapest.status == _OPTIMAL or (cheapest.status == _LIMIT and cheapest.x is not None):
        notes = [] if cheapest.status == _OPTIMAL else ["time limit reached while pricing the partial plan"]
        return _plan(problem, model, cheapest.x, PlanStatus.INFEASIBLE_PARTIAL, started, notes, None, packed)
    notes = ["partial plan not priced"]
    return _plan(problem, model, least.x, PlanStatus.INFEASIBLE_PARTIAL, started, notes, None, packed)


# ----------------------------------------------------------------------------- reading a plan


def _read(
    problem: ScalingProblem, model: _Model, x: Vector
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


def _plan(
    problem: ScalingProblem,
    model: _Model,
    x: Vector,
    status: PlanStatus,
    started: float,
    notes: list[str],
    lower_bound: float | None,
    packed: frozenset[str] = frozenset(),
) -> ScalingPlan:
    instances, workers, lambda_qps, served, unmet = _read(problem, model, x)
    status = _pack(problem, instances, workers, lambda_qps, served, unmet, notes, status, packed)
    if unmet:
        status = PlanStatus.INFEASIBLE_PARTIAL
    return finish_plan(
        problem, instances, workers, lambda_qps, served, unmet, SOLVER, status, started, notes, lower_bound
    )


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
    """Check the worker counts against a first-fit packing (module docstring), except in the
    ``exact_pools``, whose packing the model made explicit. An optimal plan whose packing needs
    more workers is optimal no longer: it says so, and becomes feasible."""
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


def _fallback(
    problem: ScalingProblem,
    started: float,
    deadline: float,
    time_limit_s: float,
    lower_bound: float | None,
    why: str,
    status: PlanStatus = PlanStatus.TIME_LIMIT,
) -> ScalingPlan:
    """The greedy's plan when HiGHS found none in time, by the deadline (the holding plan when its
    first pass does not finish by then). Its improvement passes get what is left."""
    budget = max(0.0, deadline - time.perf_counter())
    greedy = solve_greedy(
        problem,
        improve_budget_s=min(budget, FALLBACK_SHARE * time_limit_s),
        deadline=Deadline(deadline + holding_reserve_s(problem)),
    )
    if greedy.unmet_qps:
        status = PlanStatus.INFEASIBLE_PARTIAL
    return replace(
        greedy,
        status=status,
        solve_seconds=time.perf_counter() - started,
        notes=(*greedy.notes, f"milp: {why}; plan from {greedy.solver}"),
        lower_bound=None if lower_bound is None else min(lower_bound, greedy.objective),
    )
