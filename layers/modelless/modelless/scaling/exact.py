"""The variant-mix program solved exactly: MILPs and LPs for HiGHS through ``scipy.optimize``.

The program (docs/ARCHITECTURE.md §5, INFaaS §4.2.1, conventions in :mod:`modelless.scaling.problem`): integer
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
4. *The proof* (:func:`~modelless.scaling.bounds.certify`). The compact program (every
   component's block on, no patterns: INFaaS's form, :func:`solve_compact`) is a relaxation of
   every plan that packs: its rows are the fluid resource rows, the dual feasible packing rows
   and cuts that every packing satisfies.
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
``time_budget.CERTIFY_SHARE`` of the time limit kept for it; steps 2 and 3 stop that early. The
compact LP is looser than the pattern LP (its bound 4 % below the pattern LP's at 100 architectures of
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
dual feasible functions ``u^(k)`` (:func:`~modelless.scaling.problem.packing_share`):
``Σ u^(k)(share)·n <= w``, which every real packing satisfies (items over half a worker need one
each, ...). A plan is checked against a first-fit packing; where that needs more workers (or the
pool's limit forbids them), the program is solved again with *explicit packing* for those pools
(``exact_model._assign``: copies per worker slot, each slot within a worker's capacity), then
for any other pool whose plan does not pack, while that model stays small
(``MOST_ASSIGNMENT_COLUMNS``); its plan packs by construction. Beyond that, the plan takes the
workers first-fit needs (or drops what does not fit: its load goes to Lambda or is unmet) and is
called ``feasible``: its lower bound still holds. The first-fit packing goes by counts per
variant and runs of identical workers (:func:`~modelless.scaling.problem.first_fit_workers`), so
reading a plan back takes time in its distinct variants, not its instances (one instance at a
time, 10,000 took 44-58 s).

**The deadline** (:mod:`modelless.scaling.deadline`) is for the whole call. The long loops read
the clock. Every LP of step 1 is rounded into a plan
(:func:`~modelless.scaling.incumbent.rounded`: each component's likeliest choice; a chosen block
as if fully on, its instances rounded up; the fewest workers that hold them), so a plan exists
from the first LP on; the cheapest is the plan to beat, and with it *reduced-cost fixing*: an
integer column whose LP reduced cost exceeds the best plan's objective less the LP's bound is in
no cheaper plan, so it is fixed at 0, in the plan's MILP and in every later round. The search
stops early enough for its best plan to be read (packed, its bridge priced) by the deadline:
that reading's time is kept back as a share of the call's own scan of the variants
(``time_budget.FINISH_PER_SCAN``), so that a slower or busier machine keeps back more. Past the
deadline the call returns the best plan found so far, with the bound proven by then; where there
is none yet, the greedy's (under the same deadline), or the holding plan (what runs now stays,
Lambda takes the rest). Before the roundings took blocks, a 500-architecture call under 1 s
ended on the holding plan (its load unmet) in 3 seeded problems of 6, whenever the plan's MILP
ran past its limit: ``docs/bench/scaler.md``.

**The modules.** This one holds the search (steps 1 to 4) and the entry points,
:func:`solve_exact` and :func:`solve_compact`; the models are written by
:mod:`~modelless.scaling.exact_model`, solved by :mod:`~modelless.scaling.highs` (HiGHS within
its time limit), bounded and certified by :mod:`~modelless.scaling.bounds`, rounded into the
plan to beat by :mod:`~modelless.scaling.incumbent`, read back into a plan by
:mod:`~modelless.scaling.readback`; the components and patterns are
:mod:`~modelless.scaling.patterns`'s. The shares of the time limit each step may take are one
object per call, :class:`~modelless.scaling.time_budget.TimeBudget`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from modelless.scaling import highs, readback
from modelless.scaling.bounds import (
    MIP_GAP,
    block_bounds,
    block_pricing,
    certify,
    cutoff_for,
    fixed_by_reduced_cost,
    lagrangian_bound,
)
from modelless.scaling.bridge import finish_plan
from modelless.scaling.deadline import Deadline, OutOfTime, holding_plan, holding_reserve_s, without_gc_pauses
from modelless.scaling.exact_model import Model, Vector, build_model, useful_packing_rows, worker_bound
from modelless.scaling.greedy import solve_greedy
from modelless.scaling.highs import Attempt, Duals
from modelless.scaling.incumbent import Incumbent, offer_rounding
from modelless.scaling.patterns import Component, Prices, components_of, extend, usable_variants
from modelless.scaling.problem import EPS, PlanStatus, ScalingPlan, ScalingProblem
from modelless.scaling.readback import SOLVER
from modelless.scaling.time_budget import TimeBudget

MOST_INSTANCES = 4  # patterns hold up to this many instances; blocks and stand-ins, more
# A plan stopped by the deadline whose certified gap is above this is checked against the greedy's.
POOR_GAP = 0.05
# Explicit packing is added where the plan of the fluid and packing rows did not pack, while its
# model stays this small (copies columns: the usable variants of those pools times their slots).
MOST_ASSIGNMENT_COLUMNS = 4000


# ----------------------------------------------------------------------------- the pattern program


def solve_exact(problem: ScalingProblem, time_limit_s: float = 1.0) -> ScalingPlan:
    """The cheapest plan (docs/ARCHITECTURE.md §5). Never raises on an infeasible problem: it returns the plan
    that serves the most load, status ``infeasible_partial``, with ``unmet`` saying why.

    ``time_limit_s`` is a deadline for the whole call, at any size (see the module docstring):
    the plan is the best found by then, with the gap it has proven, or where none was found
    in time, the holding plan (:mod:`modelless.scaling.deadline`)."""
    with without_gc_pauses():
        return _solve_exact(problem, time_limit_s)


def _solve_exact(problem: ScalingProblem, time_limit_s: float) -> ScalingPlan:
    started = time.perf_counter()
    budget = TimeBudget.starting(problem, time_limit_s, started)
    if budget.too_large(len(problem.variants)):
        # Too large for the program to be built and solved in time: the greedy answers at once
        # (under the same deadline) rather than after the preparation has spent the time.
        count = len(problem.variants)
        why = f"{count:,} variants are too many to solve within the time limit of {time_limit_s:g} s"
        return _fallback(problem, budget, None, why)
    incumbent = Incumbent()
    try:
        return _solve(problem, budget, incumbent)
    except OutOfTime:
        why = f"milp: time limit of {time_limit_s:g} s reached"
        if incumbent.model is None or incumbent.x is None:
            return holding_plan(problem, SOLVER, started, f"{why} before any plan")
        scale = incumbent.model.scale
        bound = None if incumbent.lower == -math.inf else incumbent.lower * scale
        notes = [f"{why} before optimality was proven"]
        return readback.read_plan(
            problem, incumbent.model, incumbent.x, PlanStatus.TIME_LIMIT, started, notes, bound
        )


@dataclass
class _Search:
    """What the steps of one solve share: the problem as scanned (its usable variants, its
    components, the packing rows every model holds), the time budget, the best plan so far, and
    the pattern program's best bound (``hint``: it steers the search, whether another round may
    pay, and is never reported; the bound a plan reports comes from ``bounds.certify``)."""

    problem: ScalingProblem
    budget: TimeBudget
    usable: Sequence[int]
    components: list[Component]
    packing: list[tuple[tuple[int, str], int]]
    incumbent: Incumbent
    hint: float = -math.inf  # scaled units

    def build(self, blocks: frozenset[int], with_stand_ins: bool = False) -> Model:
        """The pattern program, with ``blocks`` (and stand-ins for the other components)."""
        return build_model(
            self.problem,
            self.components,
            self.usable,
            blocks,
            patterns=True,
            with_stand_ins=with_stand_ins,
            deadline=self.budget.deadline,
            packing=self.packing,
        )


def _solve(problem: ScalingProblem, budget: TimeBudget, incumbent: Incumbent) -> ScalingPlan:
    """Steps 1 to 4 of the module docstring, within ``budget``; the best plan goes to
    ``incumbent`` as it is found (the caller reads it where the deadline cuts this short)."""
    scanning = time.perf_counter()
    usable = usable_variants(problem, budget.deadline)
    # The deadline kept back the holding plan's time; reading a plan may need more.
    budget = budget.after_scan(problem, scanning)
    components = components_of(problem, usable, budget.deadline)
    packing = useful_packing_rows(problem, usable, budget.deadline)  # the same for every model below
    search = _Search(problem, budget, usable, components, packing, incumbent)
    forced = frozenset(ci for ci, component in enumerate(components) if not component.patterns)

    modelled = time.perf_counter()
    model = search.build(forced)
    if model.c.size == 0:  # no pool and no load: nothing to decide (HiGHS takes no empty LP)
        return finish_plan(problem, {}, {}, {}, {}, {}, SOLVER, PlanStatus.OPTIMAL, budget.started, (), 0.0)
    duals = highs.lp_duals(model, budget.lp_s())
    # What a proof round costs at least: its model (several times this one) and its LP.
    round_cost = budget.proof_round_s(modelled)
    model, duals, forced = _grow_while_paying(search, model, duals, forced)

    first = _plan_milp(search, model, duals)
    if first.status == highs.INFEASIBLE:
        return _packed(search, _complete(problem, components, usable, budget))
    if first.x is not None:
        incumbent.offer(model, first.x)
    if incumbent.model is None or incumbent.x is None:
        limited = first.status == highs.LIMIT
        why = f"time limit of {budget.time_limit_s:g} s reached" if limited else first.message
        return _fallback(problem, budget, None, why)
    best_value = float(incumbent.model.c @ incumbent.x)

    if not (first.status == highs.OPTIMAL and search.hint >= best_value * (1 - MIP_GAP)):
        _search_cheaper(search, forced, best_value, round_cost)
    return _proven_plan(search, model.scale)


def _grow_while_paying(
    search: _Search, model: Model, duals: Duals | None, forced: frozenset[int]
) -> tuple[Model, Duals | None, frozenset[int]]:
    """Step 1. What every plan costs at least, by LP duality; and where another instance may
    pay, patterns of one instance more (then the LP again), until none may or half the time is
    gone. Returns the last model, its LP's duals and the components that have their block."""
    problem, components, deadline = search.problem, search.components, search.budget.deadline
    # Anytime: every LP's rounding is a plan, should the deadline come before a better one
    # (before the pricing that certifies it: a plan without a bound beats none).
    offer_rounding(problem, model, duals, search.incumbent, deadline)
    pricing = block_pricing(problem, components, list(model.capacity_rows), deadline)
    while duals is not None:
        reduced = block_bounds(pricing, components, model, duals)
        search.hint = max(search.hint, lagrangian_bound(problem, components, duals, reduced, deadline))
        paying = [ci for ci, r in reduced.items() if r < 0]
        if not paying or search.budget.half_gone():  # else the plan first
            break
        forced = forced | _grow(problem, components, paying, deadline=deadline)
        model = search.build(forced)
        duals = highs.lp_duals(model, search.budget.lp_s())
        offer_rounding(problem, model, duals, search.incumbent, deadline)
    return model, duals, forced


def _plan_milp(search: _Search, model: Model, duals: Duals | None) -> Attempt:
    """Step 2. The plan: patterns, and blocks where a component has no pattern. With the best
    rounding as the plan to beat, reduced-cost fixing: a column whose LP reduced cost exceeds
    the rounding's objective less the LP's bound is in no solution cheaper than the rounding, so
    it is fixed at 0; the cheaper of HiGHS's optimum and the rounding is then this model's
    optimum. HiGHS is not told the rounding's objective as a cutoff here: on the benchmark's 500
    and 2,000 architectures that made it 1.4-2.5x slower to its optimum."""
    incumbent, budget = search.incumbent, search.budget
    if incumbent.model is not None and incumbent.x is not None and duals is not None:
        upper_bound = float(incumbent.model.c @ incumbent.x)
        fixed = fixed_by_reduced_cost(model, duals, upper_bound)
        plan_s = budget.plan_s(with_rounding=True)
        first = _abandonable(incumbent, lambda: highs.attempt(model, plan_s, fixed))
        if first.status == highs.INFEASIBLE:  # what fixing left holds nothing cheaper than the rounding
            first = Attempt(highs.OPTIMAL, None, None, upper_bound, first.message)
        return first
    plan_s = budget.plan_s(with_rounding=False)
    return _abandonable(incumbent, lambda: highs.attempt(model, plan_s))


def _search_cheaper(search: _Search, blocks: frozenset[int], best_value: float, round_cost: float) -> None:
    """Step 3. The search for a cheaper plan, while time is left for another round: stand-ins
    for the blocks, true blocks where picked. It ends where the pattern program's bounds say
    nothing is cheaper (a hint: step 4 proves it or finds the cheaper plan)."""
    try:  # HiGHS abandoned past its limit, or the deadline: the best plan so far goes to step 4
        while search.budget.search_left_s() > round_cost:
            grown = _search_round(search, blocks, best_value)
            if grown is None:
                return
            blocks, best_value = grown
    except OutOfTime:
        pass


def _search_round(
    search: _Search, blocks: frozenset[int], best_value: float
) -> tuple[frozenset[int], float] | None:
    """One round of step 3: the blocks and best objective for the next round, or None where the
    search ends (settled, or no time or answer for another round)."""
    problem, components, budget = search.problem, search.components, search.budget
    relaxed = search.build(blocks, with_stand_ins=True)
    # Its LP: a bound, and the duals that price the ways no plan cheaper than the best one
    # can hold (the stand-ins for them need no column: module docstring).
    lp = highs.lp_duals(relaxed, budget.lp_s())
    upper = relaxed.upper
    prices: Prices | None = None
    if lp is not None:  # a bound on every plan cheaper than the best (ways ruled out before)
        search.hint = max(search.hint, min(lp.bound, best_value))
        if search.hint >= best_value * (1 - MIP_GAP):
            return None
        prices = Prices(lp.capacity, lp.choice, relaxed.scale, best_value - lp.bound)
        # Every integer column, stand-ins included, that no plan cheaper than the best holds.
        upper = fixed_by_reduced_cost(relaxed, lp, best_value)
    result = highs.attempt(relaxed, budget.highs_s(budget.search_s()), upper, cutoff_for(best_value))
    if result.x is None or result.value is None:
        return None  # nothing cheaper than the best plan (status optimal), or nothing found in time
    picked = _stand_ins_used(relaxed, result.x)
    if not picked and result.value < best_value:
        best_value = result.value
        search.incumbent.offer(relaxed, result.x)
    if result.status != highs.OPTIMAL or not picked or not budget.extending_pays():
        return None  # stopped early, or no stand-in picked (settled), or no time to extend and solve again
    # Picked stand-ins: patterns of one instance more, or the true blocks. So do the components
    # whose stand-ins the duals did not rule out (they could be picked next: one at a time took
    # a MILP per component); their new patterns, only those the duals do not rule out either.
    chosen = set(picked)
    chosen |= {ci for col, ci in relaxed.stand_in_cols.items() if upper[col] > 0}
    return blocks | _grow(problem, components, chosen, prices, budget.deadline), best_value


def _proven_plan(search: _Search, scale: float) -> ScalingPlan:
    """Step 4. The proof: a bound from the compact program, a relaxation of every plan that
    packs; then the best plan read, packed, and where the deadline left it a poor gap, checked
    against the greedy's."""
    problem, budget, incumbent = search.problem, search.budget, search.incumbent
    proven = certify(problem, search.components, search.usable, search.packing, incumbent, budget)
    assert incumbent.model is not None and incumbent.x is not None  # the search had a plan
    status = PlanStatus.OPTIMAL if proven else PlanStatus.TIME_LIMIT
    why = f"milp: time limit of {budget.time_limit_s:g} s reached before optimality was proven"
    notes = [] if proven else [why]
    bound = None if incumbent.lower == -math.inf else incumbent.lower * scale
    plan = readback.read_plan(problem, incumbent.model, incumbent.x, status, budget.started, notes, bound)
    plan = _packed(search, plan)
    if plan.status is not PlanStatus.TIME_LIMIT or (plan.gap is not None and plan.gap <= POOR_GAP):
        return plan
    # HiGHS stopped with an incumbent that may be far from the optimum (on 500 architectures,
    # one seeded problem in three had one twice the optimum's cost): the greedy's plan, when
    # cheaper, found by the same deadline.
    gap = "none certified" if plan.gap is None else f"a certified gap of {plan.gap:.1%}"
    greedy = _fallback(problem, budget, bound, f"time limit of {budget.time_limit_s:g} s reached with {gap}")
    if greedy.objective < plan.objective and not greedy.unmet_qps:
        return greedy
    return replace(plan, solve_seconds=time.perf_counter() - budget.started)


def _abandonable(incumbent: Incumbent, call: Callable[[], Attempt]) -> Attempt:
    """``call``, or where HiGHS was abandoned past its limit, no answer: with a plan in hand the
    solve goes on to its proof with what time is left (without one, the holding plan)."""
    try:
        return call()
    except OutOfTime:
        if incumbent.model is None:
            raise
        return Attempt(highs.LIMIT, None, None, None, "HiGHS abandoned past its time limit")


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


def _stand_ins_used(model: Model, x: Vector) -> frozenset[int]:
    """Components whose stand-in for two or more instances the solution picked."""
    return frozenset(ci for col, ci in model.stand_in_cols.items() if x[col] > 0.5)


# ----------------------------------------------------------------------------- the compact program


def solve_compact(problem: ScalingProblem, time_limit_s: float = 1.0) -> ScalingPlan:
    """The program as INFaaS writes it: one compact block per component, no patterns. The
    reference the pattern program is checked against (tests, ``bench/scaler.py``); much
    slower beyond a few dozen architectures. ``time_limit_s`` is a deadline, as in solve_exact."""
    started = time.perf_counter()
    budget = TimeBudget.starting(problem, time_limit_s, started)
    try:
        usable = usable_variants(problem, budget.deadline)
        components = components_of(problem, usable, budget.deadline)
        return _complete(problem, components, usable, budget)
    except OutOfTime:
        return holding_plan(problem, SOLVER, started, f"milp: time limit of {time_limit_s:g} s reached")


def _complete(
    problem: ScalingProblem,
    components: Sequence[Component],
    usable: Sequence[int],
    budget: TimeBudget,
    slots: Mapping[int, int] | None = None,
) -> ScalingPlan:
    """Blocks for every component, no patterns: the program as INFaaS writes it. For problems
    the patterns cannot serve, and for partial plans when nothing can serve everything. With
    ``slots``, explicit packing for those pools (``exact_model._assign``)."""
    every = frozenset(range(len(components)))
    model = build_model(
        problem, components, usable, every, patterns=False, deadline=budget.deadline, slots=slots
    )
    packed = frozenset(problem.pools[pi].name for pi in slots or {})
    result = highs.attempt(model, budget.step_s())
    if result.status == highs.OPTIMAL and result.x is not None:
        lower = None if result.dual_bound is None else result.dual_bound * model.scale
        status = PlanStatus.OPTIMAL
        return readback.read_plan(problem, model, result.x, status, budget.started, [], lower, packed)
    if result.status != highs.INFEASIBLE:
        return _fallback(problem, budget, None, result.message)
    return _least_unmet(problem, model, budget, packed)


def _least_unmet(
    problem: ScalingProblem, model: Model, budget: TimeBudget, packed: frozenset[str]
) -> ScalingPlan:
    """The compact program when it is infeasible: the unmet columns freed, the least unmet load,
    then the cheapest plan that leaves no more than that unmet."""
    upper = model.upper.copy()
    unmet_mask = np.zeros_like(model.c)
    for gi, col in model.u_cols.items():
        upper[col] = 1.0
        unmet_mask[col] = problem.need(problem.groups[gi])
    least = highs.solve_milp(model, unmet_mask, upper, budget.step_s())
    if least.status != highs.OPTIMAL:
        why = f"infeasible, and the partial plan search stopped: {least.message}"
        return _fallback(problem, budget, None, why, PlanStatus.INFEASIBLE_PARTIAL)
    bound = float(least.fun) * (1 + 1e-9) + 1e-7
    cheapest = highs.solve_milp(model, model.c, upper, budget.step_s(), (unmet_mask, bound))
    partial = PlanStatus.INFEASIBLE_PARTIAL
    if cheapest.status == highs.OPTIMAL or (cheapest.status == highs.LIMIT and cheapest.x is not None):
        priced = cheapest.status == highs.OPTIMAL
        notes = [] if priced else ["time limit reached while pricing the partial plan"]
        return readback.read_plan(problem, model, cheapest.x, partial, budget.started, notes, None, packed)
    notes = ["partial plan not priced"]
    return readback.read_plan(problem, model, least.x, partial, budget.started, notes, None, packed)


def _packed(search: _Search, plan: ScalingPlan) -> ScalingPlan:
    """``plan``, or where reading it had to add workers or drop instances to pack it, the better
    of it and the program with explicit packing for those pools (``_packed_optimum``)."""
    if _failing_pools(search.problem, plan):
        return _packed_optimum(search.problem, search.components, search.usable, search.budget, plan)
    return plan


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
    budget: TimeBudget,
    plan: ScalingPlan,
) -> ScalingPlan:
    """The program with explicit packing (``exact_model._assign``) for the pools where ``plan``
    did not pack, then for any other pool whose plan does not, while the model stays small and
    time is left; the better of it and ``plan`` (less unmet, then cheaper). Worker slots per pool:
    as many as a plan no dearer than ``plan`` could pay for, within the pool's limit. A plan of
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
                affordable = int(worker_bound(problem, pi, usable))
            limit = affordable if pool.max_workers is None else min(pool.max_workers, affordable)
            slots[pi] = max(pool.min_workers, limit, 1)
        columns = sum(members[problem.pools[pi].name] * count for pi, count in slots.items())
        if columns > MOST_ASSIGNMENT_COLUMNS or budget.only_reserve_left():
            break
        found = _complete(problem, components, usable, budget, slots)
        if found.solver != SOLVER:
            break  # the MILP found nothing in time: that was the greedy's plan
        unmet, best_unmet = sum(found.unmet_qps.values()), sum(best.unmet_qps.values())
        if unmet < best_unmet - EPS or (unmet <= best_unmet + EPS and found.objective <= best.objective):
            best = found
        failing = _failing_pools(problem, found)
        if not failing:
            break
    return best


def _fallback(
    problem: ScalingProblem,
    budget: TimeBudget,
    lower_bound: float | None,
    why: str,
    status: PlanStatus = PlanStatus.TIME_LIMIT,
) -> ScalingPlan:
    """The greedy's plan when HiGHS found none in time, by the deadline (the holding plan when its
    first pass does not finish by then). Its improvement passes get what is left."""
    greedy = solve_greedy(
        problem,
        improve_budget_s=budget.fallback_improve_s(),
        deadline=Deadline(budget.at + holding_reserve_s(problem)),
    )
    if greedy.unmet_qps:
        status = PlanStatus.INFEASIBLE_PARTIAL
    return replace(
        greedy,
        status=status,
        solve_seconds=time.perf_counter() - budget.started,
        notes=(*greedy.notes, f"milp: {why}; plan from {greedy.solver}"),
        lower_bound=None if lower_bound is None else min(lower_bound, greedy.objective),
    )
