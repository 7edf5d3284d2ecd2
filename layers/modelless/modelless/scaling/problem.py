"""The variant-mix program's inputs and answer (docs/ARCHITECTURE.md §5, INFaaS §4.2.1), as plain values.

Everything here is a pure function of explicit inputs: the scaler gathers profiles, measured
load and pool state, builds a :class:`ScalingProblem`, and hands it to
:func:`~modelless.scaling.exact.solve_exact` or :func:`~modelless.scaling.greedy.solve_greedy`.
Neither solver reads a store or the clock of the system it scales.

Conventions shared by both solvers (so their plans are comparable):

- A variant runs in exactly one pool (profiles are per pool), so "instances of v on p" is
  ``instances[(v.id, v.pool)]``.
- One instance of ``v`` can serve several groups by time sharing: serving ``x`` QPS of group
  ``g`` takes ``x / Q[v, g]`` of the instance. The fractions over the groups an instance serves
  add up to at most 1, so an instance's capacity is never counted twice (Q differs per group
  because each group's latency budget allows a different batch size).
- Worker capacity is checked per resource in aggregate (INFaaS constraint 3), tightened by
  "a worker holds at most k copies of v" per variant (k from its resources, or its own
  ``max_per_worker``: the project's workers hold one session per variant); the plan's worker
  counts are then checked against a real first-fit packing (:func:`first_fit_workers`).
- The objective is INFaaS's: hardware price, plus Lambda's per-query price for load left to the
  Lambda tier, plus ``λ · price(v) · T_load(v)`` for every instance that has to be loaded.

The start-up bridge (:mod:`modelless.scaling.bridge`): a plan is a steady state; until its new
instances and workers serve, what runs now serves what it can and Lambda takes the rest. Every
plan says how much, for how long and at what price.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from modelless.catalog import PoolKind, PoolSpec
from modelless.types import VariantProfile

VCPU = "vcpu"
MEMORY_MB = "memory_mb"
DEVICE_SLOTS = "device_slots"  # accelerator pools: instances that may share the device

# Memory an instance holds beyond its model's measured peak: the serving process, the
# onnxruntime session and its arenas. An estimate; the profiler measures only the model.
BASE_INSTANCE_MEMORY_MB = 200.0

EPS = 1e-6  # QPS and instance fractions below this are rounding noise from the solver


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"  # exact solver, proven optimal (within HiGHS's default 1e-4 relative gap)
    FEASIBLE = "feasible"  # serves all load; not proven optimal (``lower_bound`` bounds the gap)
    TIME_LIMIT = "time_limit"  # the exact solver's deadline came before its proof (see lower_bound)
    INFEASIBLE_PARTIAL = "infeasible_partial"  # some load cannot be served anywhere; see unmet
    ERROR = "error"  # the solver failed for another reason; the plan is greedy's


@dataclass(frozen=True)
class ScalingVariant:
    """A variant as the program sees it.

    ``saturation_qps`` maps each group the variant may serve (same app or model, accuracy high
    enough: the caller decides) to Q[v, g], one instance's throughput within that group's
    latency budget (see :func:`saturation_for_budget`). Groups it cannot meet are left out.
    ``demand`` is R[v, type] per resource, in the units of the pool's ``capacity``.
    """

    id: str
    pool: str
    saturation_qps: Mapping[str, float]
    demand: Mapping[str, float]
    model: str = ""
    load_time_ms: float = 0.0
    running: int = 0  # instances loaded now: keeping them costs no load time
    max_per_worker: int | None = None  # copies one worker may hold (None: as many as fit)


@dataclass(frozen=True)
class ScalingPool:
    """A pool of identical provisioned workers (an Auto Scaling group)."""

    name: str
    price_per_worker_second: float
    capacity: Mapping[str, float]  # per worker, per resource
    min_workers: int = 0
    max_workers: int | None = None  # None: no limit
    current_workers: int = 0  # workers the pool has or is bringing up (the scaler's diff)
    ready_workers: int | None = None  # of those, running now (None: all of them)
    startup_s: float = 0.0  # from asking for a worker to its serving: the bridge's delay

    @property
    def ready(self) -> int:
        return self.current_workers if self.ready_workers is None else self.ready_workers


@dataclass(frozen=True)
class ScalingGroup:
    """Queries the same variants can serve: L[g] and its latency budget (see
    modelless.query_load)."""

    id: str
    load_qps: float
    latency_budget_ms: float
    lambda_price_per_query: float | None = None  # None: the Lambda tier cannot serve this group
    # How long a Lambda invocation of this group runs (its cheapest Lambda variant's p99 at batch
    # one): what one QPS of it holds of the account's concurrency, in executions.
    lambda_seconds_per_query: float = 0.0


@dataclass(frozen=True)
class ScalingProblem:
    variants: Sequence[ScalingVariant]
    pools: Sequence[ScalingPool]
    groups: Sequence[ScalingGroup]
    slack: float = 0.0  # headroom: provision for L[g]·(1 + slack)
    load_cost_weight: float = 0.0  # INFaaS's λ (1/s): weight of loading time vs hardware cost
    lambda_allowed: bool = True
    horizon_s: float = 60.0  # how long a plan holds: one-off costs (the bridge) are spread over it
    # Lambda's account concurrency left to the online tier (None: no limit): the program keeps
    # Σ lambda QPS x lambda_seconds_per_query within it (AWS's default account limit is 1,000).
    lambda_concurrency: float | None = None

    def __post_init__(self) -> None:
        pools = {pool.name for pool in self.pools}
        groups = {group.id for group in self.groups}
        if len(pools) != len(self.pools) or len(groups) != len(self.groups):
            raise ValueError("pool names and group ids must be unique")
        if len({variant.id for variant in self.variants}) != len(self.variants):
            raise ValueError("variant ids must be unique")
        for variant in self.variants:
            if variant.pool not in pools:
                raise ValueError(f"variant {variant.id} names unknown pool {variant.pool}")
            unknown = set(variant.saturation_qps) - groups
            if unknown:
                raise ValueError(f"variant {variant.id} names unknown groups {sorted(unknown)}")
        if self.slack < 0 or self.load_cost_weight < 0:
            raise ValueError("slack and load_cost_weight must be non-negative")
        if self.horizon_s <= 0:
            raise ValueError("horizon_s must be positive")
        if self.lambda_concurrency is not None and self.lambda_concurrency < 0:
            raise ValueError("lambda_concurrency must be non-negative")
        if any(group.lambda_seconds_per_query < 0 for group in self.groups):
            raise ValueError("lambda_seconds_per_query must be non-negative")
        for variant in self.variants:
            if variant.max_per_worker is not None and variant.max_per_worker < 0:
                raise ValueError(f"variant {variant.id}: max_per_worker must be non-negative")

    @cached_property
    def running_variants(self) -> list[ScalingVariant]:
        """The variants with instances running now (one scan, kept: a deadline's reserve and
        the holding plan both ask)."""
        return [v for v in self.variants if v.running > 0]

    @cached_property
    def variant_by_id(self) -> dict[str, ScalingVariant]:
        """Variant id -> variant (built once per problem: reading a plan asks for it, and a scan
        of every variant per read would cost a large problem's deadline its margin)."""
        return {variant.id: variant for variant in self.variants}

    @cached_property
    def _pools_by_name(self) -> dict[str, ScalingPool]:
        return {pool.name: pool for pool in self.pools}

    @cached_property
    def _memo(self) -> dict[int, tuple[ScalingVariant, float, int, float]]:
        """Per variant, by identity: (it, instance_price, per_worker, load_cost), filled as they
        are asked for (the solvers ask thousands of times; filling it all at once would not
        respect a deadline). The entry holds its variant, so no other object takes its identity."""
        return {}

    def _facts(self, variant: ScalingVariant) -> tuple[ScalingVariant, float, int, float]:
        found = self._memo.get(id(variant))
        if found is not None and found[0] is variant:
            return found
        facts = _variant_facts(self._pools_by_name[variant.pool], variant, self.load_cost_weight)
        self._memo[id(variant)] = facts
        return facts

    def remember_facts(self, start: int, stop: int) -> list[tuple[ScalingVariant, float, int, float]]:
        """The facts of ``variants[start:stop]`` (as :meth:`instance_price`, :meth:`per_worker`
        and :meth:`load_cost` read them), kept for those methods: one tight scan, for a solver
        that reads every variant (callers slice it to look at their deadline between slices)."""
        return [self._facts(variant) for variant in self.variants[start:stop]]

    def pool(self, name: str) -> ScalingPool:
        return self._pools_by_name[name]

    def need(self, group: ScalingGroup) -> float:
        """The QPS to provision for: measured load plus the slack headroom."""
        return max(0.0, group.load_qps) * (1.0 + self.slack)

    def lambda_concurrency_used(self, lambda_qps: Mapping[str, float]) -> float:
        """Lambda executions that ``lambda_qps`` (group -> QPS) holds at once, on average."""
        seconds = {group.id: group.lambda_seconds_per_query for group in self.groups}
        return sum(qps * seconds.get(group_id, 0.0) for group_id, qps in lambda_qps.items())

    def lambda_price(self, group: ScalingGroup) -> float | None:
        """Lambda's price per query for ``group``, or None when Lambda may not serve it."""
        return group.lambda_price_per_query if self.lambda_allowed else None

    def instance_price(self, variant: ScalingVariant) -> float:
        """The share of a worker's price one instance holds: its dominant resource's share.

        Used by the greedy to rank variants and by the load-cost term (INFaaS's C_ij); the exact
        solver pays for whole workers.
        """
        return self._facts(variant)[1]

    def load_cost(self, variant: ScalingVariant) -> float:
        """What loading one new instance of ``variant`` adds to the objective: λ·C·T_load."""
        return self._facts(variant)[3]

    def per_worker(self, variant: ScalingVariant) -> int:
        """How many instances of ``variant`` alone fit in one worker of its pool (0: none), at
        most its ``max_per_worker``."""
        return self._facts(variant)[2]

    def fluid_per_worker(self, variant: ScalingVariant) -> float:
        """Copies of ``variant`` a worker's resources hold counted fractionally (inf: no demand)."""
        share = _share(self.pool(variant.pool), variant)
        return math.inf if share == 0 else 1.0 / share


def _variant_facts(
    pool: ScalingPool, variant: ScalingVariant, load_cost_weight: float
) -> tuple[ScalingVariant, float, int, float]:
    """(variant, instance price, whole copies per worker, load cost): what the solvers ask."""
    share = _share(pool, variant)
    price = pool.price_per_worker_second * share
    copies = _whole_copies(share, variant.max_per_worker)
    return (variant, price, copies, load_cost_weight * price * variant.load_time_ms / 1000.0)


def _share(pool: ScalingPool, variant: ScalingVariant) -> float:
    """The dominant resource's share of a worker of ``pool`` one instance takes."""
    share = 0.0
    for resource, amount in variant.demand.items():
        if amount > 0:
            capacity = pool.capacity.get(resource, 0.0)
            share = max(share, amount / capacity if capacity > 0 else math.inf)
    return share


def _whole_copies(share: float, max_per_worker: int | None) -> int:
    """Whole copies a worker holds of an instance taking ``share`` of it, at most ``max_per_worker``."""
    if share == math.inf:
        whole = 0
    elif share == 0:
        whole = 1_000_000  # it demands nothing
    else:
        whole = math.floor(1.0 / share + 1e-9)
    return whole if max_per_worker is None else min(whole, max_per_worker)


@dataclass(frozen=True)
class ScalingPlan:
    """A solver's answer. Zero entries are left out of the mappings."""

    instances: Mapping[tuple[str, str], int]  # (variant id, pool) -> instances
    workers: Mapping[str, int]  # pool -> workers (every pool is listed)
    lambda_qps: Mapping[str, float]  # group -> QPS left to the Lambda tier
    served: Mapping[tuple[str, str], float]  # (variant id, group) -> QPS the variant's instances serve
    cost_per_second: float  # what the plan pays: workers plus Lambda queries
    objective: float  # cost_per_second plus the load-cost term (what the solvers minimise)
    solver: str  # "milp" | "greedy"
    status: PlanStatus
    solve_seconds: float
    unmet_qps: Mapping[str, float] = field(default_factory=dict)  # group -> QPS nobody serves
    unmet: Mapping[str, str] = field(default_factory=dict)  # group -> why, in words
    notes: tuple[str, ...] = ()
    # A proven lower bound on the objective of every plan of the program (None: none known).
    lower_bound: float | None = None
    # The start-up bridge (module docstring): group -> QPS the instances running now cannot take,
    # for bridge_s seconds, at a one-off bridge_cost in dollars where Lambda takes it.
    bridge_qps: Mapping[str, float] = field(default_factory=dict)
    bridge_s: float = 0.0
    bridge_cost: float = 0.0

    def instances_of(self, variant_id: str) -> int:
        return sum(count for (variant, _), count in self.instances.items() if variant == variant_id)

    @property
    def total_instances(self) -> int:
        return sum(self.instances.values())

    @property
    def gap(self) -> float | None:
        """How far the objective may be above the optimum, relative to the objective (proven)."""
        if self.lower_bound is None:
            return None
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.lower_bound) / self.objective)


# ----------------------------------------------------------------------------- building inputs


# The p99 of a queue's wait over its mean, were the wait exponential (its heavy-traffic shape).
WAIT_P99_OVER_MEAN = math.log(100)


def saturation_for_budget(profile: VariantProfile, budget_ms: float) -> float:
    """Q[v, g]: the load one instance can take with its queries' p99 within ``budget_ms``: the
    best over its batch sizes of :func:`batch_rate`.

    An instance is never planned at saturation: arrivals are random, so a queue forms, and a
    query waits for the runs ahead of it. The load is held to the utilisation ``rho`` at which
    the wait's p99 still fits what the budget leaves after the query's own run. A run of ``b``
    queries (S: its median, p99(b) its tail) is the unit of service; the wait of an M/D/1 queue
    has mean ``rho * S / (2 (1 - rho))`` (the run in progress included), and taking its tail as
    exponential, ``p99(b) + ln(100) * rho * S / (2 (1 - rho)) <= budget`` gives
    ``rho <= k / (1 + k)`` with ``k = 2 (budget - p99(b)) / (ln(100) * S)``; the instance then
    answers ``rho * b / S`` queries per second, never more than ``b / p99(b)``.

    A batch larger than one is used only where ``2 · p99(b) <= budget`` (the budget/2 rule): the
    workers' batcher never runs a batch longer than half the tightest budget it serves
    (``modelless.serving.batching``), so that a tight query arriving during a batch still makes it.
    A variant whose p99 alone fills the budget gets nothing: no load would meet it reliably.
    Returns 0 when nothing fits.
    """
    best = 0.0
    for batch, latency in profile.latency_p99_ms.items():
        if latency <= 0 or (batch > 1 and 2.0 * latency > budget_ms):
            continue
        best = max(best, batch_rate(batch, profile.median_ms(batch), latency, budget_ms))
    return best


def batch_rate(batch: int, median_ms: float, p99_ms: float, budget_ms: float) -> float:
    """Queries per second one instance takes in runs of ``batch`` within ``budget_ms``, its
    queue's wait included (see :func:`saturation_for_budget`)."""
    if p99_ms > budget_ms or median_ms <= 0:
        return 0.0
    k = 2.0 * (budget_ms - p99_ms) / (WAIT_P99_OVER_MEAN * median_ms)
    return batch * min(1000.0 / p99_ms, k / (1.0 + k) * 1000.0 / median_ms)


def batch_one_rate(median_ms: float, p99_ms: float, budget_ms: float) -> float:
    """Queries per second one instance takes one at a time within ``budget_ms``."""
    return batch_rate(1, median_ms, p99_ms, budget_ms)


def pool_from_spec(
    spec: PoolSpec,
    *,
    min_workers: int = 0,
    max_workers: int | None = None,
    current_workers: int = 0,
    ready_workers: int | None = None,
    startup_s: float = 0.0,
) -> ScalingPool:
    """A provisioned pool of the catalog as the program sees it. Lambda is not a pool here: it is
    the per-group ``lambda_price_per_query`` fallback, with no capacity to provision."""
    if spec.kind is PoolKind.LAMBDA:
        raise ValueError("the Lambda tier is modelled per group (lambda_price_per_query), not as a pool")
    capacity: dict[str, float] = {
        VCPU: float(spec.vcpus_per_worker),
        MEMORY_MB: float(spec.memory_mb_per_worker),
    }
    if spec.device == "cpu":
        price = spec.price_per_vcpu_second * spec.vcpus_per_worker
    else:
        price = spec.price_per_device_second
        capacity[DEVICE_SLOTS] = float(spec.instances_per_device)
    return ScalingPool(
        spec.name, price, capacity, min_workers, max_workers, current_workers, ready_workers, startup_s
    )


def resource_demand(
    profile: VariantProfile, spec: PoolSpec, base_memory_mb: float = BASE_INSTANCE_MEMORY_MB
) -> dict[str, float]:
    """R[v, type]: the instance's threads as vCPUs, its peak memory plus the process's base, and
    on accelerator pools one of the device's instance slots."""
    demand = {VCPU: float(profile.threads), MEMORY_MB: float(profile.peak_memory_mb) + base_memory_mb}
    if spec.device != "cpu":
        demand[DEVICE_SLOTS] = 1.0
    return demand


def variant_from_profile(
    profile: VariantProfile,
    spec: PoolSpec,
    groups: Iterable[ScalingGroup],
    *,
    running: int = 0,
    base_memory_mb: float = BASE_INSTANCE_MEMORY_MB,
) -> ScalingVariant:
    """A profiled variant, for the ``groups`` the caller found it eligible for (model, accuracy).

    Groups whose budget no batch size fits are dropped: the variant cannot serve them.
    """
    saturation = {}
    for group in groups:
        qps = saturation_for_budget(profile, group.latency_budget_ms)
        if qps > 0:
            saturation[group.id] = qps
    return ScalingVariant(
        id=profile.variant_id,
        pool=spec.name,
        saturation_qps=saturation,
        demand=resource_demand(profile, spec, base_memory_mb),
        model=profile.model_name,
        load_time_ms=profile.load_latency_ms,
        running=running,
    )


def one_instance_per_worker(
    pools: Sequence[ScalingPool], variants: Sequence[ScalingVariant]
) -> tuple[list[ScalingPool], list[ScalingVariant]]:
    """The same pools and variants, with workers that hold at most one instance of each variant.

    The project's worker server keeps one onnxruntime session per variant, so a second copy on
    the same worker would add nothing: each variant gets ``max_per_worker = 1``, which both
    solvers and the packing check respect (the program's row ``n[v] <= w[p]``).
    """
    return list(pools), [replace(v, max_per_worker=1) for v in variants]


def lambda_price_per_query(lambda_profiles: Iterable[VariantProfile], budget_ms: float) -> float | None:
    """The cheapest Lambda variant's price per query at batch one within ``budget_ms``, or None.

    Lambda runs one query per invocation, so batch one is the only batch that matters there.
    """
    option = lambda_option(lambda_profiles, budget_ms)
    return None if option is None else option[0]


def lambda_choice(lambda_profiles: Iterable[VariantProfile], budget_ms: float) -> VariantProfile | None:
    """The cheapest Lambda variant at batch one within ``budget_ms`` (then the quicker), or None
    when none meets it: what a group's queries run on the Lambda tier."""
    options = [
        (p.cost_per_query(1), p.latency_ms(1), p.variant_id, p)
        for p in lambda_profiles
        if p.latency_ms(1) <= budget_ms
    ]
    return min(options, key=lambda o: o[:3])[3] if options else None


def lambda_option(lambda_profiles: Iterable[VariantProfile], budget_ms: float) -> tuple[float, float] | None:
    """(price per query, seconds an invocation runs) of ``lambda_choice``, or None."""
    chosen = lambda_choice(lambda_profiles, budget_ms)
    return None if chosen is None else (chosen.cost_per_query(1), chosen.latency_ms(1) / 1000.0)


# ----------------------------------------------------------------------------- plan arithmetic


def first_fit_workers(pool: ScalingPool, items: Sequence[ScalingVariant]) -> int | None:
    """Workers a first-fit-decreasing packing of ``items`` (one entry per instance) needs, or
    None if one cannot fit a worker at all.

    Items go in order of their copies per ``max_per_worker`` (most first: they need the most
    distinct workers), then of their dominant share, largest first; each goes to the first worker
    with room in every resource and fewer than its ``max_per_worker`` copies.
    """
    used, left_out = _first_fit(pool, items, None)
    return None if left_out else used


def pack_within(pool: ScalingPool, items: Sequence[ScalingVariant], workers: int) -> list[ScalingVariant]:
    """The items a first-fit-decreasing packing into at most ``workers`` workers leaves out."""
    return _first_fit(pool, items, workers)[1]


def _first_fit(
    pool: ScalingPool, items: Sequence[ScalingVariant], most: int | None
) -> tuple[int, list[ScalingVariant]]:
    """First fit decreasing of ``items`` (one entry per instance), by counts: the copies of one
    variant go in one step per run of identical workers, so that its time grows with the
    distinct variants and the runs they leave, not with the instances (30,000 copies of one
    variant took minutes one by one). It places every copy where the one-by-one first fit would:
    a worker that cannot take another copy of a variant never can later (its room only shrinks),
    so the copies fill the first workers with room in order, each as many as fit."""
    resources = list(pool.capacity)
    counts: dict[str, int] = {}
    variants: dict[str, ScalingVariant] = {}
    for variant in items:
        counts[variant.id] = counts.get(variant.id, 0) + 1
        variants.setdefault(variant.id, variant)

    def share(variant: ScalingVariant) -> float:
        return max(
            (variant.demand.get(r, 0.0) / pool.capacity[r] for r in resources if pool.capacity[r] > 0),
            default=0,
        )

    def spread(variant: ScalingVariant) -> float:
        # The variants with the most copies per their per-worker limit go first (they need the
        # most distinct workers), then the largest first.
        return counts[variant.id] / variant.max_per_worker if variant.max_per_worker else 0.0

    capacity = [pool.capacity[r] for r in resources]
    runs: list[_Run] = []
    used = 0
    left_out: list[ScalingVariant] = []
    for variant in sorted(variants.values(), key=lambda v: (-spread(v), -share(v), v.id)):
        wanted = counts[variant.id]
        limit = math.inf if variant.max_per_worker is None else variant.max_per_worker
        if limit < 1 or any(
            amount > pool.capacity.get(r, 0.0) + 1e-9 for r, amount in variant.demand.items() if amount > 0
        ):
            left_out.extend([variant] * wanted)
            continue
        demand = [variant.demand.get(r, 0.0) for r in resources]
        position = 0
        while wanted and position < len(runs):
            run = runs[position]
            fits = min(limit - run.held.get(variant.id, 0), _copies_within(run.room, demand))
            if fits >= 1:
                wanted = _fill(runs, position, variant.id, demand, int(min(fits, wanted)), wanted)
            position += 1
        if wanted:
            per_new = min(limit, _copies_within(capacity, demand))
            per_new = int(min(per_new, wanted))
            opened = -(-wanted // per_new)
            if most is not None and used + opened > most:
                opened = max(0, most - used)
            placed = min(wanted, opened * per_new)
            if opened:
                runs.append(_Run(opened, list(capacity), {}))
                used += opened
                _fill(runs, len(runs) - 1, variant.id, demand, per_new, placed)
            left_out.extend([variant] * (wanted - placed))
    return used, left_out


@dataclass
class _Run:
    """Workers in a row that hold the same: how many, each one's room per resource, its copies."""

    workers: int
    room: list[float]
    held: dict[str, int]


def _copies_within(room: Sequence[float], demand: Sequence[float]) -> float:
    """Copies of ``demand`` that fit ``room`` in every resource (inf where it demands nothing)."""
    fits = math.inf
    for left, amount in zip(room, demand, strict=True):
        if amount > 0:
            fits = min(fits, math.floor((left + 1e-9) / amount))
    return max(fits, 0)


def _fill(
    runs: list[_Run], position: int, variant_id: str, demand: Sequence[float], each: int, copies: int
) -> int:
    """Put ``copies`` of a variant into the run at ``position``, ``each`` per worker from its
    first (the last one filled may take fewer): the run splits into the workers filled, the one
    filled in part and those left as they were. Returns the copies that did not fit."""
    run = runs[position]
    if run.workers == 1:  # the common case: one worker filled in place, no copies of its state
        taken = min(each, copies)
        for index, amount in enumerate(demand):
            run.room[index] -= taken * amount
        run.held[variant_id] = run.held.get(variant_id, 0) + taken
        return copies - taken
    full = min(run.workers, copies // each)
    part = copies - full * each if full < run.workers else 0
    pieces: list[_Run] = []
    for workers, taken in ((full, each), (1 if part else 0, part)):
        if workers:
            room = [left - taken * amount for left, amount in zip(run.room, demand, strict=True)]
            held = dict(run.held)
            held[variant_id] = held.get(variant_id, 0) + taken
            pieces.append(_Run(workers, room, held))
    rest = run.workers - full - (1 if part else 0)
    if rest:
        pieces.append(_Run(rest, run.room, run.held))
    runs[position : position + 1] = pieces
    return copies - full * each - part


# The rows every packing satisfies (the exact solver's models and its patterns' dominance read them).


def packing_share(share: float, k: int) -> float:
    """Fekete and Schepers' dual feasible function u^(k) of an item's share of a worker: items
    that fit one worker together have u^(k) shares adding up to at most 1, so ``Σ u^(k)(share)·n
    <= w`` holds for every plan that packs (a valid row, tighter than the fluid ``Σ share·n <= w``
    for items above 1/(k+1) of a worker: with k = 1, two items over half a worker need two)."""
    scaled = (k + 1) * share
    whole = round(scaled)
    if abs(scaled - whole) <= 1e-9:
        return share
    return math.floor(scaled) / k


PACKING_KS = (1, 2, 3)


def packing_shares(shares: Any, k: int) -> Any:
    """:func:`packing_share` of every entry of an array of shares."""
    scaled = (k + 1) * shares
    whole = np.abs(scaled - np.round(scaled)) <= 1e-9
    return np.where(whole, shares, np.floor(scaled) / k)


def plan_costs(
    problem: ScalingProblem,
    instances: Mapping[tuple[str, str], int],
    workers: Mapping[str, int],
    lambda_qps: Mapping[str, float],
) -> tuple[float, float]:
    """(cost per second, objective) of a plan: the one formula both solvers are judged by."""
    by_id = problem.variant_by_id
    groups = {group.id: group for group in problem.groups}
    cost = sum(pool.price_per_worker_second * workers.get(pool.name, 0) for pool in problem.pools)
    for group_id, qps in lambda_qps.items():
        price = problem.lambda_price(groups[group_id])
        cost += (price or 0.0) * qps
    load = 0.0
    for (variant_id, _), count in instances.items():
        variant = by_id[variant_id]
        load += problem.load_cost(variant) * max(0, count - variant.running)
    return cost, cost + load


def explain_unmet(
    problem: ScalingProblem, unmet: Mapping[str, float], workers: Mapping[str, int]
) -> dict[str, str]:
    """Group -> why its ``unmet`` QPS has nowhere to go, for an operator to read (one pass over
    the variants for all groups: a plan may leave thousands unmet)."""
    if not unmet:
        return {}
    pools_of: dict[str, set[str]] = {group_id: set() for group_id in unmet}
    for variant in problem.variants:
        for group_id, q in variant.saturation_qps.items():
            if q > 0 and group_id in pools_of:
                pools_of[group_id].add(variant.pool)
    groups = {g.id: g for g in problem.groups}
    return {
        group_id: _why_unmet(problem, groups[group_id], qps, sorted(pools_of[group_id]), workers)
        for group_id, qps in unmet.items()
    }


def _why_unmet(
    problem: ScalingProblem,
    group: ScalingGroup,
    unmet_qps: float,
    pools: list[str],
    workers: Mapping[str, int],
) -> str:
    need = problem.need(group)
    head = f"{unmet_qps:.4g} of {need:.4g} QPS cannot be served"
    reasons: list[str] = []
    if not pools:
        reasons.append(f"no variant meets its {group.latency_budget_ms:g} ms budget on any pool")
    else:
        full = []
        for name in pools:
            pool = problem.pool(name)
            if pool.max_workers is not None and workers.get(name, 0) >= pool.max_workers:
                full.append(f"{name} {workers.get(name, 0)}/{pool.max_workers}")
        if full:
            reasons.append("pools at their worker limit: " + ", ".join(full))
        else:
            reasons.append("eligible pools: " + ", ".join(pools))
    if not problem.lambda_allowed:
        reasons.append("Lambda fallback disabled")
    elif group.lambda_price_per_query is None:
        reasons.append("no Lambda variant for this group")
    elif problem.lambda_concurrency is not None:
        reasons.append(f"Lambda's concurrency ({problem.lambda_concurrency:g}) is taken")
    return f"{head}: " + "; ".join(reasons)


def problem_q(variant: ScalingVariant, group_id: str) -> float:
    """Q[v, g], 0 where v may not serve g."""
    return variant.saturation_qps.get(group_id, 0.0)


def violations(problem: ScalingProblem, plan: ScalingPlan, tolerance: float = 1e-6) -> list[str]:
    """Every way ``plan`` breaks the program's constraints (empty: it is a valid plan).

    Load counts as covered when served, left to Lambda, or reported unmet.
    """
    found: list[str] = []
    by_id = problem.variant_by_id
    used: dict[str, float] = {}
    covered: dict[str, float] = {}
    for (variant_id, group_id), qps in plan.served.items():
        q = problem_q(by_id[variant_id], group_id)
        if q <= 0:
            found.append(f"{variant_id} serves {group_id}, which it cannot")
            continue
        used[variant_id] = used.get(variant_id, 0.0) + qps / q
        covered[group_id] = covered.get(group_id, 0.0) + qps
    for variant in problem.variants:
        count = plan.instances.get((variant.id, variant.pool), 0)
        if used.get(variant.id, 0.0) > count + tolerance:
            found.append(f"{variant.id}: {used[variant.id]:.4f} instances' worth of load on {count}")
    for group in problem.groups:
        if group.id in plan.lambda_qps and problem.lambda_price(group) is None:
            found.append(f"{group.id} sent to Lambda, which may not serve it")
        total = (
            covered.get(group.id, 0.0)
            + plan.lambda_qps.get(group.id, 0.0)
            + plan.unmet_qps.get(group.id, 0.0)
        )
        if total < problem.need(group) * (1 - tolerance) - tolerance:
            found.append(f"{group.id}: {total:.4f} of {problem.need(group):.4f} QPS covered")
    if problem.lambda_concurrency is not None:
        held = problem.lambda_concurrency_used(plan.lambda_qps)
        if held > problem.lambda_concurrency * (1 + tolerance) + tolerance:
            found.append(
                f"Lambda: {held:.4g} concurrent executions > the limit of {problem.lambda_concurrency:g}"
            )
    for pool in problem.pools:
        workers = plan.workers.get(pool.name, 0)
        if workers < pool.min_workers or (pool.max_workers is not None and workers > pool.max_workers):
            found.append(f"{pool.name}: {workers} workers outside [{pool.min_workers}, {pool.max_workers}]")
        members = [v for v in problem.variants if v.pool == pool.name]
        for resource, capacity in pool.capacity.items():
            total = sum(v.demand.get(resource, 0.0) * plan.instances.get((v.id, v.pool), 0) for v in members)
            if total > capacity * workers + tolerance:
                found.append(f"{pool.name}: {resource} {total:g} > {capacity:g} x {workers} workers")
        for v in members:
            count = plan.instances.get((v.id, v.pool), 0)
            if count and count > problem.per_worker(v) * workers:
                found.append(f"{v.id}: {count} instances do not fit {workers} workers")
    return found
