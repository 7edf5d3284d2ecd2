"""The greedy heuristic (INFaaS §4.2.2), adapted to the whole decision.

INFaaS's Model-Autoscaler compares, for the load it must absorb, replicating the running
variant against upgrading or downgrading to another, and picks the cheapest by the ILP's own
objective. Here the same idea runs over every group at once, in milliseconds:

1. Groups go strictest budget first (fewest variants qualify for them; the fast instances they
   get often have room left for laxer groups), larger load first within a budget.
2. A group first takes spare capacity on instances already placed for earlier groups (free).
3. Then it adds instances one at a time. While the load left would fill a whole instance, it
   adds the variant with the lowest cost per served QPS (instance price, plus the load-cost term
   when the instance has to be loaded, over Q[v, g]). For the last partial instance's worth it
   adds the variant that covers the remainder most cheaply: a slow cheap variant can beat one
   more fast expensive one (INFaaS Table 3: 1000 QPS is 1 C + 2 B, not 2 C).
   Lambda takes over as soon as it is cheaper per QPS, or for the remainder, cheaper in total.
4. Instances go into workers first-fit; a variant whose pool is at its ``max_workers`` and
   full is skipped. What nothing can take goes to Lambda when allowed, else is reported unmet.

It is the fallback when the MILP misses its time limit and the baseline it is measured
against (``bench/scaler.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from modelless.scaling.bridge import finish_plan, with_bridge
from modelless.scaling.deadline import (
    CHECK_EVERY,
    Deadline,
    OutOfTime,
    holding_plan,
    holding_reserve_s,
    without_gc_pauses,
)
from modelless.scaling.problem import (
    EPS,
    PlanStatus,
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    first_fit_workers,
)

SOLVER = "greedy"


class _Pool:
    """A pool being filled: the free room of each worker, first fit.

    Rooms only ever shrink (and a worker's copies of a variant only grow) and new ones are
    appended, so the first room a given variant fits never moves left: a per-variant cursor
    makes first fit amortised linear.
    """

    def __init__(self, pool: ScalingPool, cap: int | None) -> None:
        self.pool = pool
        self.cap = cap  # max workers in this pass (the pool's own max, or lower while improving)
        self.rooms: list[dict[str, float]] = []
        self.copies: list[dict[str, int]] = []  # per worker: variant id -> copies it holds
        self.placed: list[ScalingVariant] = []
        self._cursor: dict[str, int] = {}

    def _fits(self, variant: ScalingVariant, index: int) -> bool:
        room = self.rooms[index]
        limit = variant.max_per_worker
        if limit is not None and self.copies[index].get(variant.id, 0) >= limit:
            return False
        return all(variant.demand.get(r, 0.0) <= room[r] + 1e-9 for r in room)

    def open_room(self, variant: ScalingVariant) -> int | None:
        """The first open worker ``variant`` fits in, or None."""
        index = self._cursor.get(variant.id, 0)
        while index < len(self.rooms) and not self._fits(variant, index):
            index += 1
        self._cursor[variant.id] = index
        return index if index < len(self.rooms) else None

    def can_add(self, variant: ScalingVariant) -> bool:
        if self.cap is None or len(self.rooms) < self.cap:
            return True  # a new worker is always possible (the variant fits one: checked before)
        return self.open_room(variant) is not None

    def add(self, variant: ScalingVariant) -> None:
        self.placed.append(variant)
        index = self.open_room(variant)
        if index is None:
            self.rooms.append(dict(self.pool.capacity))
            self.copies.append({})
            index = len(self.rooms) - 1
        room = self.rooms[index]
        for resource in room:
            room[resource] -= variant.demand.get(resource, 0.0)
        self.copies[index][variant.id] = self.copies[index].get(variant.id, 0) + 1

    def workers(self) -> int:
        # First fit in arrival order, or first fit decreasing over the same instances, whichever
        # is tighter; never below the pool's minimum.
        packed = first_fit_workers(self.pool, self.placed)
        used = len(self.rooms) if packed is None else min(len(self.rooms), packed)
        return max(self.pool.min_workers, used)


# What one greedy pass takes per variant, at least, before it places anything (its reading of the
# variants: about 2.5 µs on the 2-core benchmark machine, ``bench/scaler.py``): a deadline closer
# than that gives way to the holding plan at once rather than after spending its time.
GREEDY_S_PER_VARIANT = 2.5e-6
# What a pass does after its placing, and the bridge after the last pass, over the time its
# reading of the variants took: 0.19-0.31 of a first (cold) reading at 100 to 2,000
# architectures on a 2-core Intel Xeon VM; later passes read faster, and the few ms more they
# leave (and small problems' fixed few ms) are within the deadline's slack (STOP_SLACK_S, kept
# for a HiGHS call the greedy does not make).
FINISH_PER_READ = 0.3


def _group_order(problem: ScalingProblem) -> list[ScalingGroup]:
    return sorted(problem.groups, key=lambda g: (g.latency_budget_ms, -problem.need(g), g.id))


def solve_greedy(
    problem: ScalingProblem,
    improve_trials: int = 8,
    improve_budget_s: float | None = None,
    deadline: Deadline | None = None,
) -> ScalingPlan:
    """A plan for ``problem`` by the greedy above. Never raises on infeasible problems.

    Then up to ``improve_trials`` improvement passes: cap the priciest pool that has workers at
    one worker fewer and run the greedy again, keeping the result when it costs no more and
    leaves no more load unmet. Marginal-cost first fit fills open workers but never closes one;
    this lets instances move to room left in other pools (ties are kept, so a pool can be
    emptied one worker at a time). ``improve_budget_s`` stops starting passes after that long
    (the MILP's fallback has already spent its time); without it the result is deterministic.
    With a ``deadline`` the call returns by it (less the time to read the plan): a first pass
    that does not finish gives way to the holding plan (:mod:`modelless.scaling.deadline`), an
    improvement pass that does not finish to the best plan so far.
    """
    if deadline is None:
        return _solve_greedy(problem, improve_trials, improve_budget_s, None)
    with without_gc_pauses():  # a collection's pause would outlast the deadline
        return _solve_greedy(problem, improve_trials, improve_budget_s, deadline)


def _solve_greedy(
    problem: ScalingProblem, improve_trials: int, improve_budget_s: float | None, deadline: Deadline | None
) -> ScalingPlan:
    started = time.perf_counter()
    hard = None if deadline is None else deadline.earlier_by(holding_reserve_s(problem))
    caps: dict[str, int | None] = {pool.name: pool.max_workers for pool in problem.pools}
    try:
        best = _greedy_pass(problem, caps, hard)
    except OutOfTime:
        return holding_plan(problem, SOLVER, started, "greedy: deadline reached in its first pass")
    trials = 0
    blocked: set[str] = set()
    while trials < improve_trials:
        if improve_budget_s is not None and time.perf_counter() - started > improve_budget_s:
            break
        open_pools = [
            pool
            for pool in problem.pools
            if pool.name not in blocked and best.workers[pool.name] > pool.min_workers
        ]
        if not open_pools:
            break
        pool = max(open_pools, key=lambda p: (p.price_per_worker_second, p.name))
        trial_caps = {**caps, pool.name: best.workers[pool.name] - 1}
        try:
            trial = _greedy_pass(problem, trial_caps, hard)
        except OutOfTime:
            break
        trials += 1
        unmet, trial_unmet = sum(best.unmet_qps.values()), sum(trial.unmet_qps.values())
        if trial.objective <= best.objective * (1 + 1e-12) and trial_unmet <= unmet + EPS:
            best, caps = trial, trial_caps
        else:
            blocked.add(pool.name)
    return replace(with_bridge(problem, best), solve_seconds=time.perf_counter() - started)


def _greedy_pass(
    problem: ScalingProblem, caps: Mapping[str, int | None], deadline: Deadline | None = None
) -> ScalingPlan:
    """One pass of the greedy (module docstring), with the pools capped at ``caps``: the groups
    in order, each served by spare capacity, then by instances added one at a time, then by
    Lambda; what is left is unmet. Raises :class:`OutOfTime` past the ``deadline``."""
    if deadline is not None and GREEDY_S_PER_VARIANT * len(problem.variants) > deadline.left():
        raise OutOfTime  # its first reading of the variants alone would run past the deadline
    state = _Pass(problem, caps)
    reading = time.perf_counter()
    state.read_variants(deadline)
    if deadline is not None:
        # What comes after the placing (the plan read off the counts, its costs, and after the
        # last pass the bridge) reads no clock: it is kept back from the placing, a share of this
        # reading of the variants, so that a slower or busier machine keeps back more.
        deadline = deadline.keeping_back(FINISH_PER_READ, reading)
    order = _group_order(problem)
    state.rate_groups(order)
    for group in order:
        if deadline is not None:
            deadline.check()
        state.serve_group(group, deadline)
    return state.plan()


class _Pass:
    """The state of one greedy pass: the pools being filled, the instances placed and the load
    they carry, what each group got (instances, Lambda, unmet) and what is left of Lambda's
    concurrency."""

    def __init__(self, problem: ScalingProblem, caps: Mapping[str, int | None]) -> None:
        self.problem = problem
        self.pools = {pool.name: _Pool(pool, caps[pool.name]) for pool in problem.pools}
        self.count: dict[str, int] = {v.id: 0 for v in problem.variants}
        self.placed: dict[str, ScalingVariant] = {}  # the variants with an instance in the plan
        # instances' worth of load placed
        self.used: dict[str, float] = {v.id: 0.0 for v in problem.variants}
        self.price: dict[str, float] = {}
        self.load_cost: dict[str, float] = {}
        self.eligible_for: dict[str, list[ScalingVariant]] = {}  # group -> variants that may serve it
        self.served: dict[tuple[str, str], float] = {}
        self.lambda_qps: dict[str, float] = {}
        self.unmet_qps: dict[str, float] = {}
        # Lambda's account concurrency left (inf: no limit), in executions.
        self.lambda_room = math.inf if problem.lambda_concurrency is None else problem.lambda_concurrency
        self.pending: dict[str, float] = {}  # groups not yet served, with their need
        # What serving a group alone would cost per QPS (cheapest whole-instance cover, or Lambda):
        # the value of leftover capacity that a group still to come can use.
        self.rate: dict[str, float] = {}

    def read_variants(self, deadline: Deadline | None) -> None:
        """Each variant's instance price and load cost, and the groups it may serve."""
        problem, price, load_cost, eligible_for = self.problem, self.price, self.load_cost, self.eligible_for
        for position, variant in enumerate(problem.variants):
            if deadline is not None and position % CHECK_EVERY == 0:
                deadline.check()
            price[variant.id] = problem.instance_price(variant)
            load_cost[variant.id] = problem.load_cost(variant)
            if problem.per_worker(variant) > 0:
                for group_id, q in variant.saturation_qps.items():
                    if q > 0:
                        eligible_for.setdefault(group_id, []).append(variant)

    def rate_groups(self, order: Sequence[ScalingGroup]) -> None:
        """Every group's need (all pending), and its stand-alone rate where it has load."""
        problem = self.problem
        self.pending = pending = {g.id: problem.need(g) for g in order}
        for group in order:
            need = pending[group.id]
            if need <= EPS:
                continue
            options = [
                math.ceil(need / v.saturation_qps[group.id] - 1e-9) * self.price[v.id]
                for v in self.eligible_for.get(group.id, [])
            ]
            lambda_price = problem.lambda_price(group)
            if lambda_price is not None:
                options.append(lambda_price * need)
            self.rate[group.id] = min(options) / need if options else 0.0

    def unit_cost(self, variant: ScalingVariant) -> float:
        """What one more instance costs: its share of a worker (the dominant resource's), plus
        loading it unless an instance is already running idle.

        The share, not the marginal cost: counting room in open workers as free made the greedy
        fill it with slow variants and need more workers later (a 36% gap at 50 architectures
        against 11% with the share, on bench_scaler's instances).
        """
        fresh = self.count[variant.id] >= variant.running
        return self.price[variant.id] + (self.load_cost[variant.id] if fresh else 0.0)

    def serve(self, variant: ScalingVariant, group: ScalingGroup, instances: float) -> float:
        """``instances`` instances' worth of ``variant``'s time to ``group``: the QPS served."""
        q = variant.saturation_qps[group.id]
        self.used[variant.id] += instances
        key = (variant.id, group.id)
        self.served[key] = self.served.get(key, 0.0) + instances * q
        return instances * q

    def lambda_seconds(self, group: ScalingGroup) -> float:
        return group.lambda_seconds_per_query if self.problem.lambda_concurrency is not None else 0.0

    def credit(self, variant: ScalingVariant, spare: float, current: str) -> float:
        """What ``spare`` instances' worth of v saves groups still to come: their QPS it could
        take, at their stand-alone rate, best-paying first, each bit of spare used once."""
        saved = 0.0
        rate, pending = self.rate, self.pending
        takers = [(rate[g], g, q) for g, q in variant.saturation_qps.items() if g != current and g in rate]
        for value, group_id, q in sorted(takers, reverse=True):
            if spare <= EPS:
                break
            taken = min(spare * q, pending.get(group_id, 0.0))
            saved += taken * value
            spare -= taken / q
        return saved

    def serve_group(self, group: ScalingGroup, deadline: Deadline | None) -> None:
        """Serve ``group``: spare capacity first, then new instances, then Lambda; the rest unmet."""
        need = self.pending.pop(group.id)
        if need <= EPS:
            return
        eligible = self.eligible_for.get(group.id, [])
        # Spare capacity first: instances placed for earlier groups, time-shared.
        for variant in sorted(eligible, key=lambda v: -v.saturation_qps[group.id]):
            spare = self.count[variant.id] - self.used[variant.id]
            if spare > EPS and need > EPS:
                need -= self.serve(variant, group, min(spare, need / variant.saturation_qps[group.id]))
        lambda_price = self.problem.lambda_price(group)
        seconds = self.lambda_seconds(group)
        need = self._add_instances(group, need, eligible, lambda_price, seconds, deadline)
        if need > EPS and lambda_price is not None:
            taken = need if seconds <= 0 else min(need, max(0.0, self.lambda_room) / seconds)
            if taken > EPS:
                self.lambda_qps[group.id] = taken
                self.lambda_room -= taken * seconds
                need -= taken
        if need > EPS:
            self.unmet_qps[group.id] = need

    def _add_instances(
        self,
        group: ScalingGroup,
        need: float,
        eligible: Sequence[ScalingVariant],
        lambda_price: float | None,
        seconds: float,
        deadline: Deadline | None,
    ) -> float:
        """Instances for ``group``, one at a time, while some pool can take one and Lambda is not
        cheaper; returns the need left."""
        while need > EPS:
            if deadline is not None:
                deadline.check()
            candidates = [v for v in eligible if self.pools[v.pool].can_add(v)]
            if not candidates:
                break
            choice = self._next_instance(group, need, candidates, lambda_price, seconds)
            if choice is None:
                break  # Lambda is cheaper: it takes the rest
            self.pools[choice.pool].add(choice)
            self.count[choice.id] += 1
            self.placed[choice.id] = choice
            need -= self.serve(choice, group, min(1.0, need / choice.saturation_qps[group.id]))
        return need

    def _next_instance(
        self,
        group: ScalingGroup,
        need: float,
        candidates: Sequence[ScalingVariant],
        lambda_price: float | None,
        seconds: float,
    ) -> ScalingVariant | None:
        """The variant of the next instance for ``group`` (module docstring, 3.), or None where
        Lambda is cheaper than any."""
        costs = {v.id: self.unit_cost(v) for v in candidates}

        def per_qps(v: ScalingVariant) -> tuple[float, float, str]:
            q = v.saturation_qps[group.id]
            return costs[v.id] / q, -q, v.id

        fits = need * seconds <= self.lambda_room + 1e-12  # Lambda's concurrency takes the rest
        best = min(candidates, key=per_qps)
        if need >= best.saturation_qps[group.id]:
            if lambda_price is not None and fits and lambda_price <= per_qps(best)[0]:
                return None  # Lambda is cheaper per query than any instance: it takes the rest
            return best

        def cover(v: ScalingVariant) -> tuple[float, float, str]:
            # Cheapest cover of the remainder, less what its leftover capacity saves the groups
            # still to come (one instance serving a tight and a lax group beats one for each),
            # then the fastest.
            q = v.saturation_qps[group.id]
            instances = math.ceil(need / q - 1e-9)
            saved = self.credit(v, instances - need / q, group.id)
            return instances * costs[v.id] - saved, -q, v.id

        choice = min(candidates, key=cover)
        if lambda_price is not None and fits and lambda_price * need <= cover(choice)[0]:
            return None
        return choice

    def plan(self) -> ScalingPlan:
        """The pass's plan, read off the counts (not a scan of every variant), without a bridge."""
        instances = {(v.id, v.pool): self.count[v.id] for v in self.placed.values()}
        workers = {name: pool.workers() for name, pool in self.pools.items()}
        status = PlanStatus.INFEASIBLE_PARTIAL if self.unmet_qps else PlanStatus.FEASIBLE
        started = time.perf_counter()
        return finish_plan(
            self.problem, instances, workers, self.lambda_qps, self.served, self.unmet_qps, SOLVER, status,
            started, (), None, bridge=False,
        )  # fmt: skip
