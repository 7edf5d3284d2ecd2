"""The scaling function's logic: read load and state, solve the variant mix, apply it.

Every tick: the recent query load per group (counted by the gateways) and the live workers
(their loaded instances) become a ``ScalingProblem``; the exact solver (greedy when it runs out
of time) gives the plan; the plan is applied through a pool provider. A pool's workers that
report to the metadata store are its ready ones; those the provider has asked for but that do
not report yet are starting: the plan's start-up bridge (``modelless.scaling.bridge``) says
what the Lambda tier takes until they, and the plan's new instances, serve. Scaling up happens at
once; scaling down waits until the plan has wanted fewer workers for a hold time of at least the
pool's variants' load time (INFaaS §4.2.2), so a dip in load does not throw away warm instances.
While workers move, queries keep flowing: selection skips workers that are gone and the
dispatcher spills what the pools cannot take to the Lambda tier.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from aws_lambda_powertools import Logger

from modelless.catalog import PoolKind, PoolSpec
from modelless.exceptions import StoreUnavailableError
from modelless.metadata.base import MetadataStore
from modelless.query_load import QueryGroup
from modelless.scaling.envelope import Provisioning, provision
from modelless.scaling.exact import solve_exact
from modelless.scaling.problem import (
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    lambda_choice,
    one_instance_per_worker,
    pool_from_spec,
    variant_from_profile,
)
from modelless.scaling.provider import PoolProvider
from modelless.scaling.warm_pool import LambdaWarmPool, WarmDemand, burst_rate, warm_containers
from modelless.tuning.capacity import TunedCapacity, reported_tuning, tuned_profile
from modelless.types import VariantProfile, WorkerState

logger = Logger(service="scaler", child=True)

Solver = Callable[[ScalingProblem, float], ScalingPlan]


@dataclass(frozen=True)
class ScalerConfig:
    window_s: int = 30  # the load a plan is made for: the mean rate over this many seconds
    slack: float = 0.2  # headroom over the measured load (INFaaS's slack threshold)
    # INFaaS's λ (1/s): the objective is a rate, a load a one-off cost, so a load's cost is
    # spread over the minute or so a plan holds (about the scale-down hold).
    load_cost_weight: float = 1.0 / 60.0
    time_limit_s: float = 1.0
    min_hold_s: float = 30.0  # scale-down hold, at least; longer for slow-loading variants
    min_workers: Mapping[str, int] = field(default_factory=dict)
    max_workers: Mapping[str, int] = field(default_factory=dict)  # the pools to manage, and their caps
    # modelless.worker.server holds one session per variant: a second copy on one worker adds nothing.
    one_instance_per_worker: bool = True
    worker_startup_s: float = 60.0  # an EC2 worker, from the Auto Scaling call to serving
    horizon_s: float = 60.0  # how long a plan holds (the bridge's one-off cost is spread over it)
    # Provision each group for its arrival envelope (modelless.scaling.envelope) over the last
    # envelope_history_s seconds, not for its mean alone; False: the mean (INFaaS).
    provision_for_envelope: bool = True
    envelope_history_s: int = 60
    # Lambda's account concurrency the online tier may hold (None: no limit in the program).
    lambda_concurrency: float | None = 1000.0
    # A Lambda container's start before the variant loads (an estimate for a Python function
    # that imports onnxruntime; the simulator passes what it measured): a group whose budget a
    # cold start does not fit cannot leave its bursts to Lambda (modelless.scaling.envelope).
    lambda_init_ms: float = 500.0


class ScaleDownHold:
    """Scale-down hysteresis, one pool at a time: fewer workers only once the plan has wanted
    fewer for ``hold_s`` without a break. Pure: the caller passes the clock."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def decide(self, pool: str, current: int, wanted: int, hold_s: float, now: float) -> int:
        if wanted >= current:
            self._since.pop(pool, None)
            return wanted
        first = self._since.setdefault(pool, now)
        if now - first < hold_s:
            return current
        del self._since[pool]  # done: a later wish for fewer starts its own hold
        return wanted

    def start(self, pool: str, now: float) -> None:
        """The plan wants fewer, but the caller keeps them for another reason: the hold's clock
        starts (or runs on) all the same."""
        self._since.setdefault(pool, now)


def awaited_groups(
    plan: ScalingPlan, problem: ScalingProblem, running: Mapping[str, Mapping[str, int]]
) -> dict[str, frozenset[str]]:
    """Group -> the pools where the plan puts instances of a variant that serves it but that
    are not running yet (they serve once loaded, and once their worker has started)."""
    by_id = problem.variant_by_id
    pools: dict[str, set[str]] = {}
    for (variant_id, pool), count in plan.instances.items():
        variant = by_id.get(variant_id)
        if variant is None or count <= running.get(pool, {}).get(variant_id, 0):
            continue
        for group in groups_served(variant):
            pools.setdefault(group, set()).add(pool)
    return {group: frozenset(where) for group, where in pools.items()}


def groups_served(variant: ScalingVariant) -> list[str]:
    """The groups an instance of ``variant`` can serve within their budgets."""
    return [group for group, q in variant.saturation_qps.items() if q > 0]


@dataclass(frozen=True)
class Snapshot:
    """What one tick sees: the program, the load it was made for, the profiles of its variants,
    and the instances running now per pool (variant id -> instances)."""

    problem: ScalingProblem
    load: dict[str, float]
    profiles: dict[str, VariantProfile]
    running: dict[str, dict[str, int]]
    provisioned: dict[str, Provisioning] = field(default_factory=dict)  # group -> its envelope
    floors: dict[str, float] = field(default_factory=dict)  # group -> its demand floor (QPS)
    # Lambda variant id -> containers to keep warm for the bursts a cold start cannot take
    # (modelless.scaling.warm_pool), and those variants' profiles
    lambda_warm: dict[str, int] = field(default_factory=dict)
    lambda_profiles: dict[str, VariantProfile] = field(default_factory=dict)


@dataclass(frozen=True)
class ScalingReport:
    plan: ScalingPlan
    load_qps: dict[str, float]  # group -> measured load
    workers: dict[str, int]  # pool -> workers asked for after this tick
    held: dict[str, tuple[int, int]]  # pool -> (kept, planned) where scale-down is on hold
    healed: dict[str, list[str]] = field(default_factory=dict)  # pool -> workers replaced
    provisioned_qps: dict[str, float] = field(default_factory=dict)  # group -> what it was planned for
    # pool -> variant -> instances assigned to the pool's workers (the plan's, held where a dip
    # would drop them)
    instances: dict[str, dict[str, int]] = field(default_factory=dict)
    floors_qps: dict[str, float] = field(default_factory=dict)  # group -> the demand floor it was given
    # group -> the rate its sub-second clumps read as, where they counted (modelless.scaling.envelope)
    burst_qps: dict[str, float] = field(default_factory=dict)
    # Lambda variant -> containers kept warm for the bursts a cold start cannot take
    lambda_warm: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        return {
            "solver": self.plan.solver,
            "status": self.plan.status.value,
            "solve_ms": round(self.plan.solve_seconds * 1000, 1),
            "cost_per_hour": round(self.plan.cost_per_second * 3600, 4),
            "load_qps": {g: round(q, 2) for g, q in self.load_qps.items()},
            "provisioned_qps": {g: round(q, 2) for g, q in self.provisioned_qps.items()},
            "floors_qps": {g: round(q, 2) for g, q in self.floors_qps.items()},
            "burst_qps": {g: round(q, 2) for g, q in self.burst_qps.items()},
            "workers": self.workers,
            "held": {p: {"kept": k, "planned": w} for p, (k, w) in self.held.items()},
            "healed": self.healed,
            "lambda_qps": {g: round(q, 2) for g, q in self.plan.lambda_qps.items()},
            "lambda_warm": dict(self.lambda_warm),
            "unmet": dict(self.plan.unmet),
            "gap": None if self.plan.gap is None else round(self.plan.gap, 6),
            "bridge": {
                "qps": {g: round(q, 2) for g, q in self.plan.bridge_qps.items()},
                "seconds": round(self.plan.bridge_s, 1),
                "cost": self.plan.bridge_cost,
            },
        }

    def published(self, at: float) -> dict[str, object]:
        """What the scaler records after each tick for the gateways' dashboard
        (``GET /v1/dashboard/state``): the summary, when it was made, and the plan's instances
        per variant and pool (the summary counts workers only)."""
        instances = [
            {"variant": variant, "pool": pool, "count": count}
            for (variant, pool), count in sorted(self.plan.instances.items())
        ]
        return {**self.summary(), "at": at, "instances": instances, "notes": list(self.plan.notes)}


def record_plan(store: MetadataStore, report: ScalingReport, at: float) -> None:
    """Record the tick's plan in the store (``ScalingReport.published``). A store that does not
    answer loses this record only: the plan is applied already, and the next tick records its own."""
    try:
        store.put_scaling_plan(json.dumps(report.published(at)))
    except StoreUnavailableError as error:  # the store logs the outage itself, once
        logger.debug("scaling plan not recorded", extra={"error": error.message})


@dataclass
class _PlannedGroups:
    """The program's groups, and what their Lambda variants need (``Scaler._scaling_groups``)."""

    groups: list[ScalingGroup] = field(default_factory=list)
    lambda_takes_bursts: dict[str, bool] = field(default_factory=dict)  # group -> a cold start fits
    warm_demands: list[WarmDemand] = field(default_factory=list)
    lambda_profiles: dict[str, VariantProfile] = field(default_factory=dict)  # those kept warm


def _what_runs(
    workers: Iterable[WorkerState],
) -> tuple[dict[str, int], dict[str, dict[str, int]], dict[str, int]]:
    """From the workers that report: instances per variant, instances per pool and variant, and
    the ready workers per pool."""
    running: dict[str, int] = defaultdict(int)
    running_in: dict[str, dict[str, int]] = defaultdict(dict)  # pool -> variant -> instances
    ready: dict[str, int] = defaultdict(int)  # pool -> workers that report: running
    for worker in workers:
        ready[worker.pool] += 1
        for instance in worker.instances:
            running[instance.variant_id] += 1
            in_pool = running_in[worker.pool]
            in_pool[instance.variant_id] = in_pool.get(instance.variant_id, 0) + 1
    return running, running_in, ready


def _eligible_profiles(
    groups: Mapping[str, tuple[QueryGroup, list[VariantProfile]]],
    scaling_groups: Sequence[ScalingGroup],
    tuned: Mapping[str, TunedCapacity],
    managed: Mapping[str, PoolSpec],
) -> dict[str, tuple[VariantProfile, list[ScalingGroup]]]:
    """Variant id -> its profile (tuned where its tuner reported) and the groups it may serve,
    for the variants of the managed pools."""
    by_id = {g.id: g for g in scaling_groups}
    eligible: dict[str, tuple[VariantProfile, list[ScalingGroup]]] = {}
    for key, (_, candidates) in groups.items():
        for profile in candidates:
            if profile.variant_id in tuned:
                profile = tuned_profile(profile, tuned[profile.variant_id])
            if profile.pool in managed:
                eligible.setdefault(profile.variant_id, (profile, []))[1].append(by_id[key])
    return eligible


def _scaling_variants(
    eligible: Mapping[str, tuple[VariantProfile, list[ScalingGroup]]],
    managed: Mapping[str, PoolSpec],
    running: Mapping[str, int],
    tuned: Mapping[str, TunedCapacity],
) -> list[ScalingVariant]:
    """The program's variants: those that serve some group within its budget."""
    variants: list[ScalingVariant] = []
    for profile, its_groups in eligible.values():
        variant = variant_from_profile(
            profile, managed[profile.pool], its_groups, running=running.get(profile.variant_id, 0)
        )
        if profile.variant_id in tuned:
            # Its configuration runs this many batches at once, each as slow as measured.
            concurrency = tuned[profile.variant_id].config.concurrency
            variant = replace(
                variant, saturation_qps={g: q * concurrency for g, q in variant.saturation_qps.items()}
            )
        if variant.saturation_qps:
            variants.append(variant)
    return variants


class Scaler:
    def __init__(
        self,
        store: MetadataStore,
        provider: PoolProvider,
        pools: Mapping[str, PoolSpec],
        config: ScalerConfig,
        solve: Solver = solve_exact,
        demand_floors: Callable[[float], Mapping[str, float]] | None = None,
        warm_pool: LambdaWarmPool | None = None,
    ) -> None:
        """``demand_floors``: per tick, query group key -> QPS the group is provisioned for at
        least, whatever its measured load (the pipelines' tuned stages: modelless.pipelines.autopilot).
        ``warm_pool``: told each tick which Lambda variants to keep how many containers warm
        for (``ScalingReport.lambda_warm``); None: the tick reports them only."""
        self._warm_pool = warm_pool
        self._store = store
        self._demand_floors = demand_floors
        self._provider = provider
        self._pools = pools
        self._config = config
        self._solve = solve
        self._hold = ScaleDownHold()

    def managed_pools(self) -> list[PoolSpec]:
        return [
            spec
            for name, spec in self._pools.items()
            if spec.kind is PoolKind.PROVISIONED and name in self._config.max_workers
        ]

    def build_problem(self, now: float) -> Snapshot:
        """The program for the load of the last window, with what it was built from."""
        load, series, peaks = self._measured_load(now)
        floors, demand = self._planned_demand(load, now)
        groups = {key: self._candidates(key) for key in demand}
        workers = self._store.list_workers()
        # What the workers' tuners reached (modelless.tuning): a tuned variant is planned with its
        # measured capacity under its configuration, not the registration-time profile.
        tuned = reported_tuning(workers)
        running, running_in, ready = _what_runs(workers)
        managed = {spec.name: spec for spec in self.managed_pools()}
        planned = self._scaling_groups(groups, demand, peaks)
        lambda_warm = warm_containers(planned.warm_demands, self._config.lambda_concurrency)
        eligible = _eligible_profiles(groups, planned.groups, tuned, managed)
        variants = _scaling_variants(eligible, managed, running, tuned)
        pools = self._scaling_pools(managed, ready)
        if self._config.one_instance_per_worker:
            pools, variants = one_instance_per_worker(pools, variants)
        problem = ScalingProblem(
            variants=variants,
            pools=pools,
            groups=planned.groups,
            slack=self._config.slack,
            load_cost_weight=self._config.load_cost_weight,
            horizon_s=self._config.horizon_s,
            lambda_concurrency=self._config.lambda_concurrency,
        )
        provisioned: dict[str, Provisioning] = {}
        if self._config.provision_for_envelope and planned.groups:
            problem, provisioned = self._for_envelope(problem, series, peaks, planned.lambda_takes_bursts)
        profiles = {variant.id: eligible[variant.id][0] for variant in variants}
        running_now = {pool: dict(v) for pool, v in running_in.items()}
        return Snapshot(
            problem, load, profiles, running_now, provisioned, floors, lambda_warm, planned.lambda_profiles
        )

    def _measured_load(
        self, now: float
    ) -> tuple[dict[str, float], dict[str, list[int]], dict[str, list[int]]]:
        """Each group's mean load over the window, and where the plan provisions for envelopes,
        its arrivals per second and its peaks over the envelope's history."""
        load = self._store.recent_load(self._config.window_s, now)
        series: dict[str, list[int]] = {}
        peaks: dict[str, list[int]] = {}
        if self._config.provision_for_envelope:
            # A group quiet over the window but not over the envelope's history is still planned
            # for (its envelope remembers the burst): its mean is 0.
            series = self._store.load_series(self._config.envelope_history_s, now)
            peaks = self._store.peak_series(self._config.envelope_history_s, now)
            for key in series:
                load.setdefault(key, 0.0)
        return load, series, peaks

    def _planned_demand(
        self, load: Mapping[str, float], now: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """The demand floors, and what each group is planned for: its measured load, raised to
        its floor where it has one."""
        floors = dict(self._demand_floors(now)) if self._demand_floors is not None else {}
        demand = dict(load)
        for key, qps in floors.items():
            demand[key] = max(demand.get(key, 0.0), qps)
        return floors, demand

    def _candidates(self, key: str) -> tuple[QueryGroup, list[VariantProfile]]:
        """The query group of ``key`` and the variants that may serve it."""
        group = QueryGroup.parse(key)
        return group, self._store.candidate_variants(group.app_id, group.min_accuracy, group.model_name)

    def _scaling_groups(
        self,
        groups: Mapping[str, tuple[QueryGroup, list[VariantProfile]]],
        demand: Mapping[str, float],
        peaks: Mapping[str, list[int]],
    ) -> _PlannedGroups:
        """The program's groups, each with Lambda's price where a Lambda variant meets its
        budget; whether a cold start fits its budget (its bursts may go to Lambda), and where it
        does not, the warm containers its bursts need."""
        planned = _PlannedGroups()
        for key, (group, candidates) in groups.items():
            on_lambda = [v for v in candidates if self._is_lambda(v.pool)]
            choice = lambda_choice(on_lambda, group.latency_ms)
            planned.lambda_takes_bursts[key] = any(
                self._config.lambda_init_ms + v.load_latency_ms + v.latency_ms(1) <= group.latency_ms
                for v in on_lambda
            )
            seconds = 0.0 if choice is None else choice.latency_ms(1) / 1000.0
            if choice is not None and not planned.lambda_takes_bursts[key]:
                # Only a warm container serves this group's queries on Lambda in time.
                rate = burst_rate(peaks.get(key, []), demand[key])
                planned.warm_demands.append(WarmDemand(choice.variant_id, choice.memory_mb, rate, seconds))
                planned.lambda_profiles[choice.variant_id] = choice
            planned.groups.append(
                ScalingGroup(
                    id=key,
                    load_qps=demand[key],
                    latency_budget_ms=group.latency_ms,
                    lambda_price_per_query=None if choice is None else choice.cost_per_query(1),
                    lambda_seconds_per_query=seconds,
                )
            )
        return planned

    def _scaling_pools(self, managed: Mapping[str, PoolSpec], ready: Mapping[str, int]) -> list[ScalingPool]:
        """The managed pools as the program sees them: their bounds, size and ready workers."""
        pools = []
        for spec in managed.values():
            size = self._provider.size(spec.name)
            pools.append(
                pool_from_spec(
                    spec,
                    min_workers=self._config.min_workers.get(spec.name, 0),
                    max_workers=self._config.max_workers[spec.name],
                    current_workers=size,
                    ready_workers=min(size, ready.get(spec.name, 0)),  # a draining one still reports
                    startup_s=self._config.worker_startup_s,
                )
            )
        return pools

    def _for_envelope(
        self,
        problem: ScalingProblem,
        series: Mapping[str, list[int]],
        peaks: Mapping[str, list[int]],
        lambda_takes_bursts: Mapping[str, bool],
    ) -> tuple[ScalingProblem, dict[str, Provisioning]]:
        """``problem`` with each group's load raised to its envelope (modelless.scaling.envelope),
        from ``series``: each group's arrivals per second over the envelope's history, and
        ``peaks``: its most arrivals in one slice of each of those seconds."""
        means = {group.id: problem.need(group) for group in problem.groups}
        cheapest: dict[str, float] = {}  # group -> $/s per QPS on its cheapest variant
        whole: dict[str, float] = {}  # group -> $/s of the fewest whole instances for its mean
        for variant in problem.variants:
            price = problem.instance_price(variant)
            for group_id, q in variant.saturation_qps.items():
                if q > 0 and problem.per_worker(variant) > 0:
                    cheapest[group_id] = min(cheapest.get(group_id, math.inf), price / q)
                    instances = max(1, math.ceil(means.get(group_id, 0.0) / q - 1e-9))
                    whole[group_id] = min(whole.get(group_id, math.inf), instances * price)
        concurrency = self._config.lambda_concurrency
        provisioned: dict[str, Provisioning] = {}
        groups = []
        for group in problem.groups:
            seconds = group.lambda_seconds_per_query
            per_query = group.lambda_price_per_query
            if per_query is not None and means[group.id] * per_query <= whole.get(group.id, math.inf):
                # Lambda is cheaper than a whole instance for the mean: bursts cost it no more
                # per query, so the envelope changes nothing (and must not price them as steady).
                groups.append(group)
                continue
            found = provision(
                series.get(group.id, []),
                group.load_qps,
                cheapest.get(group.id),
                group.lambda_price_per_query,
                lead_s=self._config.worker_startup_s,
                lambda_qps_limit=None if concurrency is None or seconds <= 0 else concurrency / seconds,
                peaks=peaks.get(group.id, []),
                lambda_takes_bursts=lambda_takes_bursts.get(group.id, True),
            )
            provisioned[group.id] = found
            groups.append(replace(group, load_qps=found.load_qps))
        return replace(problem, groups=groups), provisioned

    def tick(self, now: float | None = None) -> ScalingReport:
        now = time.time() if now is None else now
        snapshot = self.build_problem(now)
        problem = snapshot.problem
        plan = self._solve(problem, self._config.time_limit_s)
        workers: dict[str, int] = {}
        held: dict[str, tuple[int, int]] = {}
        healed: dict[str, list[str]] = {}
        instances: dict[str, dict[str, int]] = {}
        awaited = awaited_groups(plan, problem, snapshot.running)
        for pool in problem.pools:
            replaced = self._provider.heal(pool.name)
            if replaced:
                healed[pool.name] = replaced
            planned = {variant: n for (variant, where), n in plan.instances.items() if where == pool.name}
            instances[pool.name], handing_over = self._held_instances(
                pool.name, planned, snapshot, now, awaited
            )
            wanted = plan.workers.get(pool.name, 0)
            load_times = [v.load_time_ms / 1000 for v in problem.variants if v.pool == pool.name]
            hold_s = max([self._config.min_hold_s, *load_times])
            if handing_over and wanted < pool.current_workers:
                # The workers of instances kept for a hand-over stay too (the hold runs meanwhile).
                self._hold.start(pool.name, now)
                decided = pool.current_workers
            else:
                decided = self._hold.decide(pool.name, pool.current_workers, wanted, hold_s, now)
            if decided != wanted:
                held[pool.name] = (decided, wanted)
            workers[pool.name] = self._provider.scale(pool.name, decided)
            self._provider.assign(pool.name, instances[pool.name], snapshot.profiles)
        if self._warm_pool is not None:
            self._warm_pool.keep_warm(snapshot.lambda_warm, snapshot.lambda_profiles)
        provisioned = {g: p.load_qps for g, p in snapshot.provisioned.items()}
        bursts = {g: p.burst_qps for g, p in snapshot.provisioned.items() if p.burst_qps > 0}
        return ScalingReport(
            plan,
            snapshot.load,
            workers,
            held,
            healed,
            provisioned,
            instances,
            dict(snapshot.floors),
            bursts,
            dict(snapshot.lambda_warm),
        )

    def _held_instances(
        self,
        pool: str,
        planned: Mapping[str, int],
        snapshot: Snapshot,
        now: float,
        awaited: Mapping[str, frozenset[str]],
    ) -> tuple[dict[str, int], bool]:
        """The plan's instances, except that an instance the plan no longer wants is kept

        - for the hold time (at least its variant's load time, INFaaS §4.2.2): a dip in load must
          not throw away a warm instance that the next query would have to load again;
        - while it serves a group that the plan moves to new instances in another pool, until
          those run (make before break): they may wait for a worker's start-up, and a group
          that Lambda cannot serve in time has nothing else meanwhile.

        Also whether any instance is kept for such a hand-over (its worker must stay too)."""
        running = snapshot.running.get(pool, {})
        by_id = snapshot.problem.variant_by_id
        targets: dict[str, int] = {}
        handing_over = False
        for variant_id in sorted(planned.keys() | running.keys()):
            profile = snapshot.profiles.get(variant_id)
            load_s = profile.load_latency_ms / 1000 if profile is not None else 0.0
            hold_s = max(self._config.min_hold_s, load_s)
            current, wanted = running.get(variant_id, 0), planned.get(variant_id, 0)
            key = f"{pool}/{variant_id}"
            variant = by_id.get(variant_id)
            served = groups_served(variant) if variant is not None else []
            if wanted < current and any(awaited.get(group, frozenset()) - {pool} for group in served):
                self._hold.start(key, now)  # the hold runs meanwhile: once handed over, it may go
                targets[variant_id] = current
                handing_over = True
                continue
            targets[variant_id] = self._hold.decide(key, current, wanted, hold_s, now)
        return {variant_id: count for variant_id, count in targets.items() if count > 0}, handing_over

    def _is_lambda(self, pool: str) -> bool:
        spec = self._pools.get(pool)
        return spec is not None and spec.kind is PoolKind.LAMBDA
