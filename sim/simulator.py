"""A discrete-event simulator of the whole system, running the project's own policy code.

What is simulated (time is a number, not the clock): query arrivals, worker start-up, variant
loads, per-instance queues served in batches at profiled latencies, the Lambda tier's containers
with cold starts, keep-warm and a concurrency limit, the workers' monitoring reports, and the
scaler's period. What is *not* simulated but run as is: selection (``InfaasPolicy.get_variant``
and ``warmup``, on the per-target candidate lists the gateway's ``ProfileCache`` caches, with
the gateway's own queries in flight laid over the reports by ``live_view.with_in_flight``), the
instance state machine (``WorkerMonitor``), the batch-size controller (``AimdController``), the
query-load counting (``QueryLoadCounter``/``group_of``) and the scaler (``Scaler.tick`` with the exact
program or the greedy), each fed the simulated state through the interfaces it uses in
production (a metadata store, a pool provider).

A worker holds as many instances as the catalog gives its pool (``worker_slots``: a CPU worker
one per vCPU, an accelerator worker ``instances_per_device``), as the scaler plans with.

Service times are drawn from a log-normal with the profile's p50 and p99 at the batch size, so
a variant's simulated tail is its profiled tail. A query's latency is what the project's latency
budget covers (README "What the targets mean"): its wait in the instance's queue, the instance's
load or the Lambda container's cold start when it waits for one, and the inference. The
gateway's own overhead (HTTP, selection) is not part of it; the live validation measures it apart.

Two bills, applied to every system alike:

- ``cost``, INFaaS's (§6.2): each second, every instance on a running worker costs its memory
  footprint (the profile's peak plus the serving process's base, as the scaler counts it) times
  its hardware's normalised price per GB·s (CPU 0.031, Inferentia 0.190, GPU 0.498). The Lambda
  tier costs its GB·s (memory size x billed duration, rounded up to 1 ms, cold start included)
  and its request fee, in the same units: Lambda's list prices over a CPU worker's list price
  per GB·s, times 0.031.
- ``aws_cost``, what AWS charges, in dollars: every worker, whole, at its list price (the
  catalog's: c5.large, g4dn.xlarge, inf1.xlarge) from the Auto Scaling call until it leaves, and
  the Lambda tier at Lambda's list prices.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, Protocol

from modelless.catalog import (
    CPU_POOL,
    DEFAULT_POOLS,
    LAMBDA_MB_PER_VCPU,
    LAMBDA_PRICE_PER_GB_SECOND,
    LAMBDA_PRICE_PER_REQUEST,
    PoolKind,
    PoolSpec,
)
from modelless.dispatch.live_view import with_in_flight
from modelless.dispatch.profiles import ProfileCache
from modelless.exceptions import TargetsUnreachableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.provider import DRAIN_WAIT_S
from modelless.query_load import QueryGroup, QueryLoadCounter, group_of
from modelless.scaling.controller import Scaler, ScalerConfig, Solver
from modelless.scaling.exact import solve_exact
from modelless.scaling.problem import MEMORY_MB, ScalingPlan, ScalingProblem, resource_demand
from modelless.selection import InfaasPolicy, needs_warming
from modelless.serving.batching import (
    AimdController,
    BudgetCaps,
    EstimateFn,
    RecentTightestBudget,
    batch_limit,
    max_limit_for,
    profile_estimate,
)
from modelless.serving.monitoring import WorkerMonitor
from modelless.types import (
    InstanceState,
    InstanceStats,
    LambdaTierState,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
    Tier,
    VariantProfile,
    WorkerState,
)
from modelless.worker import DRAINED_REFUSAL_S

# INFaaS §6.2's normalised prices per GB·s of an instance's memory footprint.
PRICE_PER_GB_SECOND = {"cpu": 0.031, "cuda": 0.498, "neuron": 0.190}
# Lambda's list prices, in dollars (the AWS bill).
LAMBDA_DOLLARS_PER_GB_SECOND = LAMBDA_PRICE_PER_GB_SECOND
LAMBDA_DOLLARS_PER_REQUEST = LAMBDA_PRICE_PER_REQUEST
# Lambda in the same units: its list price per GB·s over a CPU worker's (c5.large: $0.085/h for
# 4 GiB), times the CPU unit price; the request fee likewise.
_CPU_DOLLARS_PER_GB_SECOND = (
    CPU_POOL.price_per_vcpu_second * CPU_POOL.vcpus_per_worker / (CPU_POOL.memory_mb_per_worker / 1024)
)
LAMBDA_PRICE_UNITS = PRICE_PER_GB_SECOND["cpu"] * LAMBDA_PRICE_PER_GB_SECOND / _CPU_DOLLARS_PER_GB_SECOND
LAMBDA_REQUEST_UNITS = PRICE_PER_GB_SECOND["cpu"] * LAMBDA_PRICE_PER_REQUEST / _CPU_DOLLARS_PER_GB_SECOND
LAMBDA_BILLING_MS = 1.0  # Lambda bills duration in 1 ms steps
Z99 = 2.3263  # the standard normal's 99th percentile
# HiGHS's time limit is wall-clock: a plan cut short by it depends on how busy the machine is.
# In the simulator the exact program gets this much instead, which the zoo's programs (a few
# dozen variants) never come near, so every tick's plan is HiGHS's optimum: deterministic.
SIM_EXACT_TIME_LIMIT_S = 60.0
MAX_NOTES = 20


@dataclass(frozen=True)
class SimConfig:
    lambda_init_ms: float  # a Lambda container's start before the model loads: pass a measured one
    worker_startup_s: float = 30.0  # a worker from the Auto Scaling call to serving (INFaaS §6.3.1: ~30 s)
    lambda_keep_warm_s: float = 600.0  # how long Lambda keeps an idle container
    lambda_concurrency: int = 1000  # Lambda's default account concurrency
    report_period_s: float = 1.0  # the workers' monitoring reports
    scaler_period_s: float = 5.0  # the scaling function's schedule
    seed: int = 0


@dataclass(frozen=True)
class HostCalibration:
    """What serving on one particular host adds to the isolated profiles, measured there: each
    query's inference time over its variant's profiled median (co-located processes slow
    inference down; keyed by tier and model, ``worker`` or ``lambda``, or by tier alone as the
    fallback), and its wait before its queue (the hand-off to the instance's thread; by tier).
    The simulator then draws a query's service time as the profiled median times a measured
    ratio, and adds a measured hand-off to its latency."""

    inference_ratio: Mapping[tuple[str, str], Sequence[float]]
    handoff_ms: Mapping[str, Sequence[float]]

    def ratios(self, tier: str, model: str) -> Sequence[float]:
        return self.inference_ratio.get((tier, model)) or self.inference_ratio.get((tier, ""), ())


class Arrival(NamedTuple):
    """A query as the workload sends it: when, its (model-less) targets, the SLO it is judged
    by, and the architecture a developer who must name a model would have named (baselines)."""

    at: float
    targets: QueryTargets
    slo_ms: float
    model: str


class Query:
    __slots__ = ("arrived", "done", "extra_ms", "failed", "measured", "model", "slo_ms", "targets")

    def __init__(self, arrival: Arrival, measured: bool) -> None:
        self.arrived = arrival.at
        self.targets = arrival.targets
        self.slo_ms = arrival.slo_ms
        self.model = arrival.model
        self.measured = measured
        self.done: float | None = None
        self.failed = False
        self.extra_ms = 0.0  # a calibrated hand-off (HostCalibration), counted in its latency


class FastProfile(VariantProfile):
    """A profile with its latency lookups tabulated: they sit on the simulator's hot path (the
    monitor looks one up per query it judges in every report). Same fields, same answers."""

    _p99: list[float]
    _p50: list[float]
    _max: int

    def latency_ms(self, batch: int) -> float:
        if 0 <= batch < len(self._p99):
            return self._p99[batch]
        return super().latency_ms(batch)

    def median_ms(self, batch: int) -> float:
        if 0 <= batch < len(self._p50):
            return self._p50[batch]
        return super().median_ms(batch)

    @property
    def max_batch(self) -> int:
        return self._max


def fast(profile: VariantProfile) -> FastProfile:
    if isinstance(profile, FastProfile):
        return profile
    tabulated = FastProfile(**{f.name: getattr(profile, f.name) for f in fields(profile)})
    largest = profile.max_batch
    object.__setattr__(tabulated, "_max", largest)
    object.__setattr__(tabulated, "_p99", [profile.latency_ms(max(1, b)) for b in range(largest + 1)])
    object.__setattr__(tabulated, "_p50", [profile.median_ms(max(1, b)) for b in range(largest + 1)])
    return tabulated


@dataclass
class Instance:
    variant: VariantProfile
    worker: Worker
    ready_at: float
    aimd: AimdController
    memory_gb: float  # its footprint, as billed
    key: str  # its key in its worker's instances: the variant id, or "id#n" for a baseline's n-th copy
    estimate: EstimateFn  # the batcher's expected latency of a batch (profile_estimate)
    caps: BudgetCaps  # the batcher's recent-budget cap, tabulated
    recent: RecentTightestBudget = field(default_factory=RecentTightestBudget)
    queue: deque[Query] = field(default_factory=deque)
    busy: bool = False
    draining: bool = False  # unloaded busy: takes no new queries, goes once its queue is done
    reserve: bool = False  # its slot is for another variant: once gone, not loaded back on demand


@dataclass
class Worker:
    id: str
    pool: PoolSpec
    ready_at: float
    monitor: WorkerMonitor
    instances: dict[str, Instance] = field(default_factory=dict)
    # Variants drained for another (``reserve``) -> until when a query for them is refused
    # rather than loading them back on demand (modelless.worker's DRAINED_REFUSAL_S).
    refused_until: dict[str, float] = field(default_factory=dict)
    draining: bool = False
    monitored: bool = True  # False: a baseline's, whose routing reads no reports

    @property
    def slots(self) -> int:
        return self.monitor.slots


@dataclass
class Container:
    """A Lambda container of one memory size (in AWS one function per size, as the project
    deploys it): it keeps the variants it has loaded (the cpu_worker function's model cache) and
    runs one query at a time."""

    memory_mb: int
    variants: set[str]
    ready_at: float
    busy_until: float
    last_used: float


@dataclass
class Second:
    arrivals: int = 0
    served: int = 0
    violations: int = 0
    cost: float = 0.0  # INFaaS's bill: instances by their memory, Lambda by GB·s and requests
    aws_cost: float = 0.0  # AWS's bill, in dollars: whole workers and Lambda at list prices
    lambda_served: int = 0
    instances: dict[str, int] = field(default_factory=dict)  # pool -> instances on running workers


@dataclass
class SimResult:
    system: str
    seconds: list[Second]
    latencies_ms: array[float]
    queries: int
    violations: int
    failed: int
    total_cost: float
    total_aws_cost: float
    simulated_s: float  # warm-up included
    events: int
    notes: list[str] = field(default_factory=list)
    # (architecture, "refused" | "late" | "unanswered") -> violations
    violations_by: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def violation_ratio(self) -> float:
        return self.violations / self.queries if self.queries else 0.0

    @property
    def p99_ms(self) -> float:
        return percentile_of(self.latencies_ms, 99.0)

    @property
    def lambda_served(self) -> int:
        return sum(s.lambda_served for s in self.seconds)


def percentile_of(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (as bench.report's); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class System(Protocol):
    """A serving system under simulation: where each query goes, and what it does each period."""

    name: str

    def start(self, sim: Simulation) -> None: ...

    def route(self, sim: Simulation, query: Query) -> None: ...

    def tick(self, sim: Simulation) -> None: ...


def worker_slots(pool: PoolSpec) -> int:
    """Instances one worker of ``pool`` holds, as the catalog sizes it (and the scaler plans):
    an accelerator's ``instances_per_device``, else one per vCPU."""
    if pool.device != "cpu":
        return pool.instances_per_device
    return pool.vcpus_per_worker


def instance_memory_gb(variant: VariantProfile, pool: PoolSpec) -> float:
    """An instance's memory footprint: what the scaler counts it to hold (``resource_demand``)."""
    return resource_demand(variant, pool)[MEMORY_MB] / 1024


def instance_key(variant: VariantProfile, copy: int = 0) -> str:
    """Where a worker keeps an instance: its variant's id; a baseline's further copies "id#n"."""
    return variant.variant_id if copy == 0 else f"{variant.variant_id}#{copy}"


def worker_dollars_per_second(pool: PoolSpec) -> float:
    """A whole worker of ``pool`` per second at AWS's list price (the catalog's instance type;
    priced by name, whatever prices the pool was given for a policy to weigh)."""
    listed = DEFAULT_POOLS.get(pool.name, pool)
    if listed.device == "cpu":
        return listed.price_per_vcpu_second * listed.vcpus_per_worker
    return listed.price_per_device_second


class Simulation:
    """The event loop and the simulated hardware every system runs on."""

    def __init__(
        self,
        profiles: Sequence[VariantProfile],
        pools: Mapping[str, PoolSpec],
        config: SimConfig,
        duration_s: float,
        warmup_s: float = 0.0,
        calibration: HostCalibration | None = None,
    ) -> None:
        """Simulate ``warmup_s + duration_s`` seconds; measure the last ``duration_s`` (a system
        starts the measured part in the state the workload's start brought it to). ``pools``:
        the catalog the systems see (their prices are what the policies weigh)."""
        self.profiles: list[VariantProfile] = [fast(p) for p in profiles]
        self._by_id = {p.variant_id: p for p in self.profiles}
        self.pools = dict(pools)
        self.config = config
        self.calibration = calibration
        self.warmup_s = warmup_s
        self.duration_s = warmup_s + duration_s
        self.now = 0.0
        self.rng = random.Random(config.seed)
        self.workers: dict[str, Worker] = {}
        self.containers: dict[int, list[Container]] = {}  # memory size -> its Lambda containers
        self.container_count = 0
        self.seconds = [Second() for _ in range(math.ceil(duration_s) + 1)]
        self._unmeasured = Second()  # what happens during the warm-up goes here, unreported
        self.notes: list[str] = []
        self.latencies_ms: array[float] = array("d")
        self.measured_queries = 0
        self.failed = 0
        self.violations_by: dict[tuple[str, str], int] = {}  # (architecture, refused | late) -> count
        self.outstanding = 0  # measured queries not answered yet
        self.events = 0
        self._events: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._sequence = itertools.count()
        self._worker_ids = itertools.count()
        self._states: list[WorkerState] = []
        self._view: list[WorkerState] | None = None  # what selection sees, until something changes
        self._in_flight: dict[tuple[str, str], int] = {}  # (worker, variant) -> queries there
        self._overlaid: list[WorkerState] | None = None  # the view with the in-flight laid over
        self._lambda_view: tuple[WorkerState | None] | None = None  # the Lambda tier, as seen
        self._service: dict[tuple[str, int], tuple[float, float]] = {}  # (variant, rows) -> (median, sigma)

    # --- the event loop ---------------------------------------------------------------------

    def at(self, when: float, action: Callable[[Any], None], argument: Any = None) -> None:
        heapq.heappush(self._events, (when, next(self._sequence), action, argument))

    def run(self, system: System, arrivals: Iterator[Arrival]) -> SimResult:
        """Replay ``arrivals`` (in time order, lazily: hours of them need not be in memory)."""
        self._arrivals = arrivals
        self._system = system
        system.start(self)
        self._every(self.config.report_period_s, self._report)
        self._every(self.config.scaler_period_s, system.tick)
        self._every(1.0, self._bill)
        self._next_arrival()
        horizon = self.duration_s + 60.0  # let queued work finish
        events = self._events
        pop = heapq.heappop
        while events and events[0][0] <= horizon:
            when, _, action, argument = pop(events)
            self.now = when
            action(argument)
            self.events += 1
        return self._result(system.name)

    def _every(self, period_s: float, action: Callable[[Simulation], None]) -> None:
        def repeat(_: Any) -> None:
            action(self)
            if self.now + period_s <= self.duration_s:
                self.at(self.now + period_s, repeat)

        self.at(0.0, repeat)

    def _next_arrival(self) -> None:
        arrival = next(self._arrivals, None)
        if arrival is not None and arrival.at < self.duration_s:
            self.at(arrival.at, self._arrive, arrival)

    def _arrive(self, arrival: Arrival) -> None:
        measured = arrival.at >= self.warmup_s
        query = Query(arrival, measured)
        if measured:
            self.measured_queries += 1
            self.outstanding += 1
        self._second(arrival.at).arrivals += 1
        self._next_arrival()
        self._system.route(self, query)

    # --- workers and instances --------------------------------------------------------------

    def add_worker(self, pool: PoolSpec, ready_in_s: float | None = None, monitored: bool = True) -> Worker:
        worker_id = f"{pool.name}-{next(self._worker_ids)}"
        ready_at = self.now + (self.config.worker_startup_s if ready_in_s is None else ready_in_s)
        monitor = WorkerMonitor(worker_id, pool.name, "", worker_slots(pool))
        worker = Worker(worker_id, pool, ready_at, monitor, monitored=monitored)
        self.workers[worker_id] = worker
        self.at(ready_at, self._touched)
        return worker

    def remove_worker(self, worker: Worker) -> None:
        """Drain: no new queries; it goes (and stops costing) once its queues are empty."""
        worker.draining = True
        self.touch()
        self._retire_if_idle(worker)

    def _retire_if_idle(self, worker: Worker) -> None:
        if worker.draining and all(not i.queue and not i.busy for i in worker.instances.values()):
            self.workers.pop(worker.id, None)

    def load(
        self, worker: Worker, variant: VariantProfile, preloaded: bool = False, copy: int = 0
    ) -> Instance:
        """An instance of ``variant`` on ``worker``, ready once the worker is up and the variant
        loaded (at once if ``preloaded``: a baseline provisioned before the run). ``copy``: a
        further copy of a variant the worker holds already (baselines only: the project's
        workers hold one session per variant)."""
        key = instance_key(variant, copy)
        instance = worker.instances.get(key)
        if instance is None:
            variant = self._by_id.get(variant.variant_id, variant)
            loading_s = 0.0 if preloaded else variant.load_latency_ms / 1000
            ready = max(self.now, worker.ready_at) + loading_s
            memory = instance_memory_gb(variant, self.pools.get(variant.pool, worker.pool))
            aimd = AimdController(max_limit_for(variant))
            estimate = profile_estimate(variant)
            caps = BudgetCaps(estimate, aimd.max_limit)
            instance = Instance(variant, worker, ready, aimd, memory, key, estimate, caps)
            worker.instances[key] = instance
            # A worker shows an instance once its load is done (``_show_if_loaded``): until then
            # selection must not take it for Active, nor queue queries behind a second's load.
            if ready > self.now:
                self.at(ready, self._loaded, instance)
            else:
                self._loaded(instance)
            self.touch()
        elif instance.draining:  # loaded again: the drain is called off (WorkerMonitor.loaded)
            instance.draining = False
            if instance.ready_at <= self.now:
                self._loaded(instance)
            self.touch()
        return instance

    def _loaded(self, instance: Instance) -> None:
        """``instance``'s load is done: its worker's monitor shows it, unless it went meanwhile."""
        worker = instance.worker
        if worker.instances.get(instance.key) is not instance or instance.draining:
            return
        if worker.monitored:
            worker.monitor.loaded(instance.variant)
        self.touch()

    def drain(self, worker: Worker, key: str, reserve: bool = False) -> bool:
        """The placer's unload (``POST /unload``), busy or not: an idle instance goes at once
        (True); a busy one stops taking queries (it leaves the reports and what selection sees),
        finishes its queue, then goes (False). ``reserve``: its slot is for another variant."""
        instance = worker.instances.get(key)
        if instance is None:
            return True
        instance.reserve = instance.reserve or reserve
        if not instance.queue and not instance.busy:
            self.unload(worker, key)
            return True
        instance.draining = True
        if worker.monitored:
            worker.monitor.draining(instance.variant.variant_id)
        self.touch()
        return False

    def unload(self, worker: Worker, key: str) -> None:
        instance = worker.instances.get(key)
        if instance is not None and not instance.queue and not instance.busy:
            del worker.instances[key]
            if instance.reserve:
                worker.refused_until[instance.variant.variant_id] = self.now + DRAINED_REFUSAL_S
            if worker.monitored:
                worker.monitor.unloaded(instance.variant.variant_id)
            self.touch()

    def refuses(self, worker: Worker, variant_id: str) -> bool:
        """Whether ``worker`` answers a query for ``variant_id`` with a retryable 503 (the
        worker's ``_admit``): the instance drains, or was drained for another variant lately."""
        instance = worker.instances.get(variant_id)
        if instance is not None:
            return instance.draining
        return self.now < worker.refused_until.get(variant_id, -math.inf)

    def enqueue(self, instance: Instance, query: Query) -> None:
        # The batcher remembers each budget its run could meet (VariantBatcher._note_budget).
        if query.slo_ms >= instance.estimate(1):
            instance.recent.observe(query.slo_ms, self.now)
        instance.queue.append(query)
        if instance.worker.monitored:
            instance.worker.monitor.started(instance.variant.variant_id)
        self._note_queue(instance)
        if instance.ready_at > self.now:
            self.at(instance.ready_at, self._serve, instance)
        else:
            self._serve(instance)

    def _serve(self, instance: Instance) -> None:
        if instance.busy or not instance.queue or instance.ready_at > self.now:
            return
        rows = self._take(instance)
        queue = instance.queue
        batch = [queue.popleft() for _ in range(rows)]
        service_ms = self.service_ms(instance.variant, rows, "worker")
        if self.calibration is not None:
            for query in batch:
                query.extra_ms = self._handoff_ms("worker")
        instance.busy = True
        self._note_queue(instance)
        self.at(self.now + service_ms / 1000, self._finish, (instance, batch, service_ms, self.now))

    def _take(self, instance: Instance) -> int:
        """The queries the next batch takes, as ``VariantBatcher`` chooses them: at most the AIMD
        limit capped by the recent-budget cap (``batch_limit``), a FIFO prefix whose expected
        latency meets the tightest deadline among those it takes that can still meet theirs;
        the head always (the batcher's delayed batching, a wait of under a millisecond for more
        rows, is not simulated)."""
        now = self.now
        limit = batch_limit(instance.aimd.limit, instance.recent.tightest(now), instance.caps)
        if instance.worker.monitored:  # the worker tells its monitor (VariantBatcher.current_limit)
            instance.worker.monitor.batching(instance.variant.variant_id, limit)
        queue = instance.queue
        if limit <= 1 or len(queue) == 1:
            return 1
        estimate = instance.estimate
        alone = estimate(1) / 1000

        def deadline(query: Query) -> float:
            return query.arrived + query.slo_ms / 1000

        head = deadline(queue[0])
        tightest = head if now + alone <= head else math.inf
        rows = 1
        for query in itertools.islice(queue, 1, None):
            if rows + 1 > limit:
                break
            own = deadline(query)
            joined = min(tightest, own) if now + alone <= own else tightest
            if now + estimate(rows + 1) / 1000 > joined:
                break
            rows += 1
            tightest = joined
        return rows

    def _finish(self, job: tuple[Instance, list[Query], float, float]) -> None:
        instance, batch, service_ms, started = job
        instance.busy = False
        self._note_queue(instance)
        rows = len(batch)
        # As VariantBatcher._execute: the run against the tightest budget the batch carried, each
        # as its query brought it, among queries a run of their own could have met. Not what the
        # queue left of it: a queue that has eaten the budgets says nothing about the batch size,
        # and halving the limit for it would shrink throughput just when the queue needs it.
        alone_ms = instance.estimate(1)
        budgets = [q.slo_ms for q in batch if q.slo_ms >= alone_ms]
        if budgets:
            instance.aimd.observe(rows, service_ms, min(budgets))
        if instance.worker.monitored:
            monitor = instance.worker.monitor
            variant_id = instance.variant.variant_id
            for position, query in enumerate(batch):
                queue_ms = (started - query.arrived) * 1000
                monitor.finished(
                    variant_id,
                    self.now,
                    rows,
                    queue_ms if position == 0 else queue_ms + service_ms,
                    service_ms if position == 0 else 0.0,
                )
        for query in batch:
            self.complete(query)
        self._serve(instance)
        if instance.draining and not instance.queue and not instance.busy:
            self.unload(instance.worker, instance.key)
        self._retire_if_idle(instance.worker)

    def service_ms(self, variant: VariantProfile, rows: int, tier: str = "worker") -> float:
        if self.calibration is not None:
            ratios = self.calibration.ratios(tier, variant.model_name)
            if ratios:
                return variant.median_ms(rows) * self.rng.choice(ratios)
        key = (variant.variant_id, rows)
        shape = self._service.get(key)
        if shape is None:
            median = variant.median_ms(rows)
            tail = max(median, variant.latency_ms(rows))
            shape = (median, math.log(tail / median) / Z99 if median > 0 else 0.0)
            self._service[key] = shape
        median, sigma = shape
        return median * math.exp(self.rng.gauss(0.0, sigma)) if sigma else median

    # --- the Lambda tier --------------------------------------------------------------------

    def run_on_lambda(self, variant: VariantProfile, query: Query | None) -> float | None:
        """Run ``query`` (None: a warm-up invocation) as the local tier does: on an idle container
        of the variant's memory size, one holding the variant first (else it loads it: its load
        time), else on a new container (a cold start: the container's start, then the load),
        else, at the concurrency limit, fail it (429)."""
        now = self.now
        memory = variant.memory_mb or LAMBDA_MB_PER_VCPU
        containers = self.containers.setdefault(memory, [])
        variant_id = variant.variant_id
        idle = [c for c in containers if c.busy_until <= now and c.ready_at <= now]
        if idle:
            container = max(idle, key=lambda c: (variant_id in c.variants, c.last_used))
            start = now if variant_id in container.variants else now + variant.load_latency_ms / 1000
        elif self.container_count < self.config.lambda_concurrency:
            start = now + (self.config.lambda_init_ms + variant.load_latency_ms) / 1000
            container = Container(memory, set(), start, start, now)
            containers.append(container)
            self.container_count += 1
        else:
            if query is not None:
                self.fail(query)
            return None
        container.variants.add(variant_id)
        service_ms = self.service_ms(variant, 1, "lambda")
        if query is not None and self.calibration is not None:
            query.extra_ms = self._handoff_ms("lambda")
        container.busy_until = start + service_ms / 1000
        container.last_used = container.busy_until
        billed_ms = math.ceil((container.busy_until - now) * 1000 / LAMBDA_BILLING_MS) * LAMBDA_BILLING_MS
        gb_seconds = memory / 1024 * billed_ms / 1000
        second = self._second(now)
        second.cost += LAMBDA_PRICE_UNITS * gb_seconds + LAMBDA_REQUEST_UNITS
        second.aws_cost += LAMBDA_DOLLARS_PER_GB_SECOND * gb_seconds + LAMBDA_DOLLARS_PER_REQUEST
        if query is not None:
            second.lambda_served += 1
        self._lambda_view = None
        self.at(container.busy_until, self._lambda_done, query)
        return container.busy_until

    def _lambda_done(self, query: Query | None) -> None:
        self._lambda_view = None  # a container went idle
        if query is not None:
            self.complete(query)

    def _handoff_ms(self, tier: str) -> float:
        assert self.calibration is not None
        samples = self.calibration.handoff_ms.get(tier)
        return self.rng.choice(samples) if samples else 0.0

    def warm_lambda(self, variant: VariantProfile) -> float | None:
        """The dispatcher's warm-up on the Lambda tier: one invocation of ``variant`` (an idle
        container loads it, or a new one starts: the tier grows by one when all are busy).
        Returns when it is done (None: refused at the concurrency limit)."""
        return self.run_on_lambda(variant, None)

    def keep_lambda_warm(self, variant: VariantProfile, containers: int) -> float:
        """One round of the warm pool's warm-up invocations (``InvokingWarmPool``): where fewer
        than ``containers`` containers holding ``variant`` ran within half the keep-warm time, as
        many invocations at once as the idle ones lack, each on a container of its own (an idle
        one, which loads the variant where it lacks it, else a new one: a cold start), so that
        ``containers`` stay warm. Each is billed as the invocation it is. Returns when the last
        of them is done (now, for none)."""
        now = self.now
        fresh_s = self.config.lambda_keep_warm_s / 2
        holding = [
            c
            for c in self.containers.get(variant.memory_mb or LAMBDA_MB_PER_VCPU, [])
            if variant.variant_id in c.variants
        ]
        if sum(1 for c in holding if now - c.last_used <= fresh_s) >= containers:
            return now
        busy = sum(1 for c in holding if c.busy_until > now)
        done = now
        for _ in range(containers - busy):
            finished = self.run_on_lambda(variant, None)
            if finished is None:
                break  # at the concurrency limit
            done = max(done, finished)
        return done

    def _reap_containers(self) -> None:
        keep_s = self.config.lambda_keep_warm_s
        for memory, containers in list(self.containers.items()):
            alive = [c for c in containers if self.now - c.last_used <= keep_s or c.busy_until > self.now]
            self.container_count -= len(containers) - len(alive)
            self._lambda_view = None
            if alive:
                self.containers[memory] = alive
            else:
                del self.containers[memory]

    def lambda_state(self) -> WorkerState | None:
        """The tier as selection sees it (``LocalLambdaTier.state``): a variant some running
        container holds is an instance of one Lambda-pool worker, Active while one of those
        containers is idle, Overloaded while all are busy; its queue is its busy containers."""
        if self._lambda_view is None:
            self._lambda_view = (self._lambda_state(),)
        return self._lambda_view[0]

    def _lambda_state(self) -> WorkerState | None:
        now = self.now
        holders: dict[str, list[bool]] = {}  # variant -> whether each container holding it is busy
        for containers in self.containers.values():
            for container in containers:
                if container.ready_at <= now:
                    busy = container.busy_until > now
                    for variant_id in container.variants:
                        holders.setdefault(variant_id, []).append(busy)
        if not holders:
            return None
        instances = tuple(
            InstanceStats(
                variant_id,
                InstanceState.OVERLOADED if all(busy) else InstanceState.ACTIVE,
                0.0,
                0.0,
                0.0,
                sum(busy),
            )
            for variant_id, busy in sorted(holders.items())
        )
        free = max(0, self.config.lambda_concurrency - self.container_count)
        return WorkerState("lambda-tier", self._lambda_pool_name(), "", 0.0, free, now, instances)

    def lambda_tier_state(self) -> LambdaTierState:
        """What the local tier tells selection besides its ``state`` (``tier_state``): its idle
        containers per memory size and the cold start to expect (the one this run measured)."""
        now = self.now
        idle = {
            memory: sum(1 for c in containers if c.ready_at <= now and c.busy_until <= now)
            for memory, containers in self.containers.items()
        }
        full = not any(idle.values()) and self.container_count >= self.config.lambda_concurrency
        return LambdaTierState(idle, LAMBDA_MB_PER_VCPU, self.config.lambda_init_ms, full)

    def _lambda_pool_name(self) -> str:
        return next((n for n, s in self.pools.items() if s.kind is PoolKind.LAMBDA), "lambda-cpu")

    # --- bookkeeping ------------------------------------------------------------------------

    def _second(self, at: float) -> Second:
        if at < self.warmup_s:
            return self._unmeasured
        return self.seconds[min(int(at - self.warmup_s), len(self.seconds) - 1)]

    def complete(self, query: Query) -> None:
        query.done = self.now
        if not query.measured:
            return
        self.outstanding -= 1
        latency_ms = (self.now - query.arrived) * 1000 + query.extra_ms
        if query.failed:
            self.failed += 1
        else:
            self._second(self.now).served += 1
            self.latencies_ms.append(latency_ms)
        if query.failed or latency_ms > query.slo_ms:
            self._second(query.arrived).violations += 1
            why = "refused" if query.failed else "late"
            self.violations_by[(query.model, why)] = self.violations_by.get((query.model, why), 0) + 1

    def fail(self, query: Query) -> None:
        query.failed = True
        self.complete(query)

    def _report(self, _: Simulation) -> None:
        states = []
        for worker in self.workers.values():
            if worker.monitored and worker.ready_at <= self.now and not worker.draining:
                states.append(_with_loading(worker.monitor.snapshot(self.now), worker, self.now))
        self._states = states
        self._reap_containers()
        self.touch()

    def _touched(self, _: Any = None) -> None:
        self.touch()

    def touch(self) -> None:
        """Something selection sees changed: rebuild its view on the next query."""
        self._view = None
        self._overlaid = None
        self._lambda_view = None

    def worker_states(self, with_lambda: bool = True) -> list[WorkerState]:
        """What selection sees, as the gateway would: the last reports, plus instances loaded
        since (its own recent loads), plus the Lambda tier's warm containers, with its own
        queries in flight laid over them (``live_view.with_in_flight``)."""
        if self._view is None:
            reported = {s.worker_id: s for s in self._states}
            states = []
            for worker in self.workers.values():
                if worker.draining or worker.ready_at > self.now:
                    continue
                state = reported.get(worker.id) or worker.monitor.snapshot(self.now)
                states.append(_with_loading(state, worker, self.now))
            self._view = states
            self._overlaid = None
        if self._overlaid is None:
            if self._in_flight:
                busy = {worker_id for worker_id, _ in self._in_flight}
                self._overlaid = [
                    with_in_flight(s, self._in_flight) if s.worker_id in busy else s for s in self._view
                ]
            else:
                self._overlaid = self._view
        if not with_lambda:
            return self._overlaid
        tier = self.lambda_state()
        return self._overlaid if tier is None else [*self._overlaid, tier]

    def _note_queue(self, instance: Instance) -> None:
        """The gateway's count of its queries in flight on ``instance`` (one gateway here)."""
        key = (instance.worker.id, instance.key)
        count = len(instance.queue) + instance.busy
        if count:
            self._in_flight[key] = count
        else:
            self._in_flight.pop(key, None)
        self._overlaid = None

    def _bill(self, _: Simulation) -> None:
        """One second of every instance on a running worker (INFaaS) and of every worker,
        starting, serving or draining (AWS)."""
        second = self._second(self.now)
        counts: dict[str, int] = {}
        for worker in self.workers.values():
            second.aws_cost += worker_dollars_per_second(worker.pool)
            if worker.ready_at > self.now:
                continue
            price = PRICE_PER_GB_SECOND[worker.pool.device]
            for instance in worker.instances.values():
                second.cost += price * instance.memory_gb
            if worker.instances:
                counts[worker.pool.name] = counts.get(worker.pool.name, 0) + len(worker.instances)
        if self.container_count:
            counts["lambda"] = self.container_count
        second.instances = counts

    def _result(self, name: str) -> SimResult:
        unfinished = self.outstanding
        return SimResult(
            system=name,
            seconds=self.seconds,
            latencies_ms=self.latencies_ms,
            queries=self.measured_queries,
            violations=sum(s.violations for s in self.seconds) + unfinished,
            failed=self.failed + unfinished,
            total_cost=sum(s.cost for s in self.seconds),
            total_aws_cost=sum(s.aws_cost for s in self.seconds),
            simulated_s=self.duration_s,
            events=self.events,
            notes=self.notes,
            violations_by={
                **self.violations_by,
                **({("(any)", "unanswered"): unfinished} if unfinished else {}),
            },
        )


def priced_per_instance(pools: Mapping[str, PoolSpec], footprint_gb: float) -> dict[str, PoolSpec]:
    """The pools as the project's policies see them when INFaaS's per-instance bill is what they
    are to minimise, through the inputs the scaler already has (a worker's price and its slots):
    an accelerator worker holds one instance (``instances_per_device`` 1) and costs one instance
    of ``footprint_gb`` at its hardware's INFaaS price per GB·s; a CPU worker holds one instance
    per vCPU and costs ``footprint_gb`` per vCPU; the Lambda tier its GB·s and request fee in the
    same units. A plan's cost in the program is then INFaaS's bill of that plan, but for two
    things: the program pays whole workers (a CPU worker holding one instance is priced as
    holding two) and one footprint for every variant (``footprint_gb``: the caller's typical
    one; INFaaS bills each instance its own)."""
    priced: dict[str, PoolSpec] = {}
    for name, spec in pools.items():
        unit = PRICE_PER_GB_SECOND[spec.device] * footprint_gb
        if spec.kind is PoolKind.LAMBDA:
            priced[name] = replace(
                spec,
                price_per_vcpu_second=LAMBDA_PRICE_UNITS * LAMBDA_MB_PER_VCPU / 1024,
                request_price=LAMBDA_REQUEST_UNITS,
            )
        elif spec.device == "cpu":
            priced[name] = replace(spec, price_per_vcpu_second=unit)
        else:
            priced[name] = replace(spec, price_per_device_second=unit, instances_per_device=1)
    return priced


def repriced(profiles: Sequence[VariantProfile], pools: Mapping[str, PoolSpec]) -> list[VariantProfile]:
    """The profiles with their prices recomputed from ``pools``, as registration prices them
    (``Placement.price_per_second``: the instance's share of its pool's price); plain profiles."""
    out = []
    for profile in profiles:
        spec = pools[profile.pool]
        price = spec.instance_price_per_second(profile.threads, profile.memory_mb)
        plain = VariantProfile(**{f.name: getattr(profile, f.name) for f in fields(VariantProfile)})
        out.append(replace(plain, price_per_second=price, request_price=spec.request_price))
    return out


def _with_loading(state: WorkerState, worker: Worker, now: float) -> WorkerState:
    """The report with the instances loaded since (a worker reports at once when its instances
    change): Active, their slots taken. One still loading is in neither, as in the real worker's
    report (its monitor counts an instance once loaded): a query sent there meanwhile is a load
    decision, priced at the whole load, and waits for the load under way (``ensure_loaded``'s lock)."""
    reported = {i.variant_id for i in state.instances}
    extra = tuple(
        InstanceStats(variant_id, InstanceState.ACTIVE, 0.0, 0.0, 0.0, len(instance.queue))
        for variant_id, instance in worker.instances.items()
        if variant_id not in reported and not instance.draining and instance.ready_at <= now
    )
    if not extra:
        return state
    return WorkerState(
        state.worker_id,
        state.pool,
        state.address,
        state.utilisation,
        max(0, state.free_slots - len(extra)),
        state.reported_at,
        (*state.instances, *extra),
    )


# --- the project: selection per query, the scaler on its period ---------------------------------


class SimStore(InMemoryMetadataStore):
    """The metadata store inside a simulation: the simulated workers' live reports (the Lambda
    tier is not a worker in the store: the dispatcher adds it, as ``extra_workers``)."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__()
        self._sim = sim

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        states = self._sim.worker_states(with_lambda=False)
        return [s for s in states if pool is None or s.pool == pool]


class SimWarmPool:
    """The scaler's Lambda warm pool inside a simulation, as ``InvokingWarmPool`` keeps it: the
    variants of one memory size take turns, a round of ``Simulation.keep_lambda_warm`` each,
    the next once the last is done."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def keep_warm(self, containers: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        turns: dict[int, list[tuple[VariantProfile, int]]] = {}
        for variant_id, count in sorted(containers.items()):
            variant = profiles[variant_id]
            turns.setdefault(variant.memory_mb, []).append((variant, count))
        for due in turns.values():
            self._round(due)

    def _round(self, due: list[tuple[VariantProfile, int]]) -> None:
        (variant, count), rest = due[0], due[1:]
        done = self._sim.keep_lambda_warm(variant, count)
        if rest:
            self._sim.at(done, self._round, rest)


class SimProvider:
    """The pool provider inside a simulation: workers start after the start-up time and leave
    after draining; a plan's instances are placed as ``InstancePlacer.place`` places them (the
    code both real providers apply plans with): idle surplus instances unloaded, missing ones
    loaded into the workers with the most free slots. Which workers leave on a scale-in:
    ``"aws"`` as ``AwsPoolProvider.choose_leaving`` (still booting, then the fewest instances,
    then the least utilised), ``"newest"`` as ``LocalWorkerPool.scale_to`` (the newest first)."""

    def __init__(self, sim: Simulation, pools: Mapping[str, PoolSpec], scale_in: str = "aws") -> None:
        if scale_in not in ("aws", "newest"):
            raise ValueError(f"scale_in must be 'aws' or 'newest', not {scale_in!r}")
        self._sim = sim
        self._pools = pools
        self._scale_in = scale_in

    def _members(self, pool: str) -> list[Worker]:
        return [w for w in self._sim.workers.values() if w.pool.name == pool and not w.draining]

    def size(self, pool: str) -> int:
        return len(self._members(pool))

    def scale(self, pool: str, workers: int) -> int:
        members = self._members(pool)
        for _ in range(workers - len(members)):
            self._sim.add_worker(self._pools[pool])
        leaving = max(0, len(members) - workers)
        if leaving:
            now = self._sim.now
            if self._scale_in == "newest":
                chosen = sorted(members, key=lambda w: int(w.id.rsplit("-", 1)[1]), reverse=True)[:leaving]
            else:
                chosen = sorted(
                    members,
                    key=lambda w: (
                        w.ready_at <= now,
                        len(w.instances),
                        w.monitor.snapshot(now).utilisation if w.ready_at <= now else 0.0,
                        w.id,
                    ),
                )[:leaving]
            for worker in chosen:
                self._sim.remove_worker(worker)
        return workers

    def heal(self, pool: str) -> list[str]:
        """Simulated workers neither die nor hang: nothing to replace."""
        return []

    def assign(self, pool: str, instances: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        """``InstancePlacer.place`` on the simulated workers: the instances the plan does not want
        are unloaded, busy or not, the least busy first (a busy one drains: its slot counts as
        free when its queue would be done within the placer's ``DRAIN_WAIT_S``, else on a later
        call); then the missing ones are loaded into the workers with the most free slots."""
        now = self._sim.now
        live = {w.id: (w, w.monitor.snapshot(now)) for w in self._members(pool) if w.ready_at <= now}
        have: dict[str, int] = {}
        for _, stats in live.values():
            for instance in stats.instances:
                have[instance.variant_id] = have.get(instance.variant_id, 0) + 1
        free = {worker_id: stats.free_slots for worker_id, (_, stats) in live.items()}
        surplus = sorted(
            (
                (worker_id, instance)
                for worker_id, (_, stats) in live.items()
                for instance in stats.instances
                if have[instance.variant_id] > instances.get(instance.variant_id, 0)
            ),
            key=lambda held: (held[1].queue_length, held[1].qps, held[1].utilisation, held[0]),
        )
        # The freed slots are for the plan's missing instances, if any (InstancePlacer's reserve).
        reserve = any(have.get(v, 0) < wanted and v in profiles for v, wanted in instances.items())
        for worker_id, reported in surplus:
            variant_id = reported.variant_id
            if have[variant_id] <= instances.get(variant_id, 0):
                continue  # enough of its kind already leaving
            worker = live[worker_id][0]
            held = worker.instances.get(variant_id)
            drain_s = 0.0 if held is None else (len(held.queue) + held.busy) * held.estimate(1) / 1000
            gone = self._sim.drain(worker, variant_id, reserve)
            have[variant_id] -= 1
            if gone or drain_s <= DRAIN_WAIT_S:
                free[worker_id] += 1
        holders = {
            worker_id: {i.variant_id for i in stats.instances} for worker_id, (_, stats) in live.items()
        }
        for variant_id, wanted in sorted(instances.items()):
            profile = profiles.get(variant_id)
            while profile is not None and have.get(variant_id, 0) < wanted:
                room = [w for w in live if free[w] > 0 and variant_id not in holders[w]]
                if not room:
                    break
                target = max(room, key=lambda w: (free[w], w))
                self._sim.load(live[target][0], profile)
                have[variant_id] = have.get(variant_id, 0) + 1
                free[target] -= 1
                holders[target].add(variant_id)


def exact_to_optimality(problem: ScalingProblem, time_limit_s: float) -> ScalingPlan:
    """``solve_exact`` with ``SIM_EXACT_TIME_LIMIT_S`` instead of the wall-clock limit it is given."""
    return solve_exact(problem, max(time_limit_s, SIM_EXACT_TIME_LIMIT_S))


class Modelless:
    """The project: selection per query (spilling to Lambda), query load counted per group, the
    scaler every period.

    Per query, what ``Dispatcher.select`` does, minus what only a real gateway needs: the
    candidates come from a real ``ProfileCache`` (the gateway's per-target cache); the live state is the
    simulation's, always current (the real snapshot TTL and recent-load overlay are wall-clock
    devices for a state read over the network); on a miss, or a late answer from a worker's queue
    (``needs_warming``), ``warmup`` names what to load and it is loaded here (the real one hands it
    to a thread that invokes a worker or the Lambda tier). The query that
    missed is refused (a 422), which counts as a violation."""

    def __init__(
        self,
        pools: Mapping[str, PoolSpec],
        config: ScalerConfig,
        solve: Solver = exact_to_optimality,
        name: str = "modelless",
        initial_workers: Mapping[str, int] | None = None,
        scale_in: str = "aws",
        keep_lambda_warm: bool = True,
    ) -> None:
        """``keep_lambda_warm``: the scaler keeps Lambda containers warm for the bursts a cold
        start would miss (``modelless.scaling.warm_pool``); False: Lambda grows with its load only."""
        self.name = name
        self._keep_lambda_warm = keep_lambda_warm
        self._scale_in = scale_in
        self._pools = {**DEFAULT_POOLS, **pools}  # the Lambda tier is always there
        self._config = config
        self._solve = solve
        self._initial = dict(initial_workers or {})
        self._policy = InfaasPolicy(self._pools)
        self._scaler: Scaler | None = None
        self._store: SimStore | None = None
        self._profiles: ProfileCache | None = None
        self._query_load = QueryLoadCounter()
        self._groups: dict[QueryTargets, QueryGroup] = {}
        # Variants with a warm-up in flight -> when it ends (the dispatcher warms a variant once
        # at a time: Dispatcher._warming).
        self._warming: dict[str, float] = {}

    def start(self, sim: Simulation) -> None:
        self._store = SimStore(sim)
        # The profiles priced as this system's pools are (registration prices them so).
        publish(self._store, [fast(p) for p in repriced(sim.profiles, self._pools)])
        self._profiles = ProfileCache(self._store)
        provider = SimProvider(sim, self._pools, self._scale_in)
        self._scaler = Scaler(
            self._store,
            provider,
            self._pools,
            self._config,
            self._solve,
            warm_pool=SimWarmPool(sim) if self._keep_lambda_warm else None,
        )
        for pool, count in self._initial.items():
            for _ in range(count):
                sim.add_worker(self._pools[pool], ready_in_s=0.0)

    def route(self, sim: Simulation, query: Query) -> None:
        assert self._store is not None and self._profiles is not None
        targets = query.targets
        group = self._groups.get(targets)
        if group is None:
            group = self._groups[targets] = group_of(targets)
        self._query_load.record(group, sim.now)
        if self._query_load.due(sim.now):
            taken = self._query_load.take(sim.now)
            self._store.add_load(taken.counts, int(sim.now), taken.peaks)
        candidates = self._profiles.candidates(targets, self._store.profiles_version(targets.app_id))
        workers = sim.worker_states()
        try:
            decision = self._policy.get_variant(
                targets, candidates, workers, lambda_tier=sim.lambda_tier_state()
            )
        except TargetsUnreachableError:
            self._warm_ahead(sim, targets, candidates, workers)
            sim.fail(query)
            return
        if needs_warming(decision, targets):
            self._warm_ahead(sim, targets, candidates, workers)
        chosen = sim.workers.get(decision.worker_id or "") if decision.tier is not Tier.LAMBDA else None
        if chosen is not None and sim.refuses(chosen, decision.variant.variant_id):
            # The worker answers 503 instance_draining: the dispatcher retries elsewhere (another
            # live instance, then the Lambda tier) within the query's budget.
            others = [w for w in workers if w.worker_id != decision.worker_id]
            try:
                decision = self._policy.get_variant(
                    targets, candidates, others, lambda_tier=sim.lambda_tier_state()
                )
            except TargetsUnreachableError:
                sim.fail(query)
                return
        if decision.tier is Tier.LAMBDA:
            sim.run_on_lambda(decision.variant, query)
            return
        assert decision.worker_id is not None
        worker = sim.workers[decision.worker_id]
        if sim.refuses(worker, decision.variant.variant_id):
            sim.fail(query)  # refused twice: the query's 503 names both attempts
            return
        sim.enqueue(sim.load(worker, decision.variant), query)

    def _warm_ahead(
        self,
        sim: Simulation,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> None:
        """``Dispatcher._warm_ahead``: load what would meet ``targets`` once loaded, one warm-up
        per variant at a time."""
        warm = self._policy.warmup(targets, candidates, workers)
        if warm is None or self._warming.get(warm.variant.variant_id, -math.inf) > sim.now:
            return
        if warm.tier is Tier.LAMBDA:
            done = sim.warm_lambda(warm.variant)
            if done is not None:
                self._warming[warm.variant.variant_id] = done
        elif warm.worker_id in sim.workers:
            instance = sim.load(sim.workers[warm.worker_id], warm.variant)
            self._warming[warm.variant.variant_id] = instance.ready_at

    def tick(self, sim: Simulation) -> None:
        assert self._scaler is not None
        report = self._scaler.tick(now=sim.now)
        if report.plan.unmet and len(sim.notes) < MAX_NOTES:
            sim.notes.append(f"t={sim.now:.0f}s: {next(iter(report.plan.unmet.values()))}")


def publish(store: InMemoryMetadataStore, profiles: Sequence[VariantProfile]) -> None:
    """Register each model of ``profiles`` in ``store`` as ready, with its variants."""
    by_model: dict[tuple[str, str], list[VariantProfile]] = {}
    for profile in profiles:
        by_model.setdefault((profile.app_id, profile.model_name), []).append(profile)
    for (app_id, model_name), variants in by_model.items():
        registration_id = f"sim-{app_id}-{model_name}"
        record = ModelRecord(app_id, model_name, "input", [1], "float32", 10, registration_id, "", True)
        registration = Registration(registration_id, app_id, model_name, RegistrationStatus.READY)
        store.add_model(record, registration)
        store.publish_variants(record, variants, registration)


# --- baselines: a fixed variant per model ---------------------------------------------------------


class FixedVariant:
    """Clipper+/SageMaker+-style serving (INFaaS §6): each model is served by one variant the
    developer picked, and every query names its model. ``static``: instances provisioned before
    the run that never change (Clipper+). Otherwise horizontal autoscaling of that one variant
    (SageMaker+), with the project scaler's own knobs so that only the vertical, model-less part
    differs: every period, enough instances for the last ``window_s``'s rate plus ``slack`` at the
    variant's per-instance rate within the model's SLO (``capacity``), scaling down after
    ``hold_s``. Instances share workers up to the catalog's slots, several copies of one variant
    on one worker included (INFaaS's Clipper+ CPU ran two on one); ``max_workers`` caps the
    workers per pool (INFaaS §6.2: one): an instance that fits nowhere is not added. A worker
    left empty goes. ``max_batch`` caps the batches (8: the TensorRT engine built for batch 8;
    1: a batch-1 one)."""

    def __init__(
        self,
        name: str,
        chosen: Mapping[str, VariantProfile],
        pools: Mapping[str, PoolSpec],
        replicas: Mapping[str, int],
        static: bool,
        capacity: Mapping[str, float] | None = None,
        max_batch: int | None = None,
        window_s: float = 30.0,
        slack: float = 0.2,
        hold_s: float = 30.0,
        max_workers: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self._chosen = dict(chosen)  # model -> its variant
        self._pools = pools
        self._replicas = dict(replicas)
        self._static = static
        self._capacity = dict(capacity or {})  # model -> QPS one instance takes within its SLO
        self._max_batch = max_batch
        self._window_s = window_s
        self._slack = slack
        self._hold_s = hold_s
        self._max_workers = dict(max_workers or {})
        self._arrivals: dict[str, deque[float]] = {model: deque() for model in chosen}
        self._low_since: dict[str, float] = {}
        self._owned: dict[str, list[Instance]] = {model: [] for model in chosen}
        self._retiring: list[Instance] = []  # scaled away: no new queries, unloaded once idle

    def start(self, sim: Simulation) -> None:
        for model, count in self._replicas.items():
            for _ in range(count):
                if not self._add(sim, model, preloaded=True):
                    break  # no worker may hold another: the rest would not fit either

    def _add(self, sim: Simulation, model: str, preloaded: bool = False) -> bool:
        """One more instance of ``model``'s variant; False where no worker may hold it."""
        variant = self._chosen[model]
        pool = self._pools[variant.pool]
        members = [w for w in sim.workers.values() if w.pool.name == pool.name and not w.draining]
        room = [w for w in members if len(w.instances) < w.slots]
        if room:
            worker = min(room, key=lambda w: w.id)
        elif len(members) < self._max_workers.get(pool.name, math.inf):
            worker = sim.add_worker(pool, 0.0 if preloaded else None, monitored=False)
        else:
            return False
        copy = next(n for n in itertools.count() if instance_key(variant, n) not in worker.instances)
        instance = sim.load(worker, variant, preloaded, copy)
        if self._max_batch is not None:
            instance.aimd = AimdController(min(self._max_batch, max_limit_for(variant)))
        self._owned[model].append(instance)
        return True

    def _retire(self, sim: Simulation) -> None:
        """Unload the instances scaled away once their queues are empty; free emptied workers."""
        busy = []
        for instance in self._retiring:
            worker = instance.worker
            if instance.queue or instance.busy:
                busy.append(instance)
                continue
            sim.unload(worker, instance.key)
            if not worker.instances:
                sim.remove_worker(worker)
        self._retiring = busy

    def route(self, sim: Simulation, query: Query) -> None:
        model = query.model
        self._arrivals[model].append(sim.now)
        ready = [i for i in self._owned[model] if i.ready_at <= sim.now and not i.worker.draining]
        if not ready:
            sim.fail(query)
            return
        # Join the shortest queue.
        sim.enqueue(min(ready, key=lambda i: (len(i.queue) + i.busy, i.worker.id, i.key)), query)

    def tick(self, sim: Simulation) -> None:
        if self._static:
            return
        for model, arrivals in self._arrivals.items():
            while arrivals and arrivals[0] < sim.now - self._window_s:
                arrivals.popleft()
            rate = len(arrivals) / self._window_s
            wanted = max(1, math.ceil(rate * (1 + self._slack) / max(self._capacity.get(model, 0.0), 1e-9)))
            live = self._owned[model]
            if wanted > len(live):
                self._low_since.pop(model, None)
                for _ in range(wanted - len(live)):
                    if not self._add(sim, model):
                        break
            elif wanted < len(live):
                since = self._low_since.setdefault(model, sim.now)
                if sim.now - since >= self._hold_s:
                    self._retiring += live[wanted:]
                    del live[wanted:]
                    self._low_since.pop(model, None)
            else:
                self._low_since.pop(model, None)
        self._retire(sim)
