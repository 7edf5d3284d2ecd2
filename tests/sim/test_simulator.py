"""The discrete-event simulator (issue 7, part 1): deterministic, conserving queries, billing as
INFaaS bills and as AWS bills, sized as the catalog sizes workers, baselines configured as INFaaS
configured them, and driving the project's own selection and scaler. Hand-built profiles and
short workloads; no timing is asserted."""

from __future__ import annotations

import math

import pytest

from modelless.catalog import DEFAULT_POOLS, PoolSpec
from modelless.scaling.controller import ScalerConfig
from modelless.serving.batching import AimdController, RecentTightestBudget
from modelless.types import InstanceState, QueryTargets, VariantProfile
from sim.simulator import (
    LAMBDA_DOLLARS_PER_GB_SECOND,
    LAMBDA_DOLLARS_PER_REQUEST,
    LAMBDA_PRICE_UNITS,
    LAMBDA_REQUEST_UNITS,
    PRICE_PER_GB_SECOND,
    Arrival,
    FastProfile,
    FixedVariant,
    Modelless,
    Query,
    SimConfig,
    SimProvider,
    SimResult,
    Simulation,
    fast,
    instance_memory_gb,
    priced_per_instance,
    repriced,
    worker_dollars_per_second,
    worker_slots,
)
from sim.traces import Architecture, Mix, arrivals, pattern

APP = "simtest"
POOLS = DEFAULT_POOLS  # the hardware (and the AWS prices registration gives the profiles)
FOOTPRINT_GB = (56.0 + 200.0) / 1024  # every hand-built variant's: its peak + the serving process
PRICED = priced_per_instance(DEFAULT_POOLS, FOOTPRINT_GB)  # as the INFaaS-priced project sees them


def variant(
    model: str, pool: str, p50_ms: float, accuracy: float, load_ms: float = 5.0, memory_mb: int = 0
) -> VariantProfile:
    spec: PoolSpec = POOLS[pool]
    return VariantProfile(
        variant_id=f"{APP}/{model}/fp32_all/{pool}",
        app_id=APP,
        model_name=model,
        pool=pool,
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key="",
        size_bytes=1000,
        load_latency_ms=load_ms,
        latency_p50_ms={1: p50_ms, 2: 1.5 * p50_ms, 4: 2.5 * p50_ms},
        latency_p99_ms={1: 1.3 * p50_ms, 2: 2.0 * p50_ms, 4: 3.2 * p50_ms},
        peak_memory_mb=56.0,
        accuracy=accuracy,
        price_per_second=spec.instance_price_per_second(1, memory_mb),
        request_price=spec.request_price,
        hardware="hand-built for a test",
        measured_on_target=False,
        memory_mb=memory_mb,
        saturation_qps=4000 / (2.5 * p50_ms),
        max_useful_batch=4,
    )


def zoo() -> list[VariantProfile]:
    return [
        variant("big", "cpu", 0.5, 0.99),
        variant("big", "lambda-cpu", 0.5, 0.99, memory_mb=1769),
        variant("big", "gpu", 0.1, 0.99, load_ms=1000.0),
        variant("small", "cpu", 0.05, 0.90),
        variant("small", "lambda-cpu", 0.05, 0.90, memory_mb=1769),
        variant("small", "gpu", 0.1, 0.90, load_ms=1000.0),
    ]


MIX = Mix.zipf(
    [
        Architecture("big", QueryTargets(APP, latency_ms=10.0, min_accuracy=0.99), 10.0),
        Architecture("small", QueryTargets(APP, latency_ms=2.0, min_accuracy=0.90), 2.0),
    ]
)
CONFIG = SimConfig(lambda_init_ms=300.0, worker_startup_s=30.0, seed=3)


def by_id(profiles: list[VariantProfile], model: str, pool: str) -> VariantProfile:
    return next(p for p in profiles if p.model_name == model and p.pool == pool)


def simulate(system_name: str, rate: float = 4.0, seconds: float = 60.0, seed: int = 3) -> SimResult:
    profiles = zoo()
    curve = pattern("flat", seconds, lambda t: rate)
    sim = Simulation(profiles, POOLS, SimConfig(lambda_init_ms=300.0, seed=seed), seconds, warmup_s=30.0)
    system: Modelless | FixedVariant
    if system_name == "modelless":
        system = Modelless(PRICED, ScalerConfig(max_workers={"cpu": 4, "gpu": 2}), initial_workers={"cpu": 1})
    else:
        pool = "gpu" if system_name.endswith("gpu") else "cpu"
        chosen = {m: by_id(profiles, m, pool) for m in ("big", "small")}
        system = FixedVariant(system_name, chosen, POOLS, {m: 1 for m in chosen}, static=True)
    return sim.run(system, arrivals(curve, MIX, seed, warmup_s=30.0))


def test_the_same_seed_gives_the_same_run() -> None:
    first, second = simulate("modelless"), simulate("modelless")
    assert first.queries == second.queries > 0
    assert first.total_cost == second.total_cost
    assert list(first.latencies_ms) == list(second.latencies_ms)
    assert simulate("modelless", seed=4).latencies_ms != first.latencies_ms


@pytest.mark.parametrize("system", ["modelless", "clipper+-cpu"])
def test_every_measured_query_is_answered_or_counted_as_a_violation(system: str) -> None:
    result = simulate(system, rate=20.0)
    assert len(result.latencies_ms) + result.failed == result.queries
    assert sum(s.arrivals for s in result.seconds) == result.queries
    slo = {a.model: a.slo_ms for a in MIX.architectures}
    assert result.violations >= result.failed
    assert result.violations <= result.failed + sum(
        latency > min(slo.values()) for latency in result.latencies_ms
    )


def test_a_static_gpu_baseline_meets_a_low_load_at_a_high_cost() -> None:
    gpu = simulate("clipper+-gpu")
    ours = simulate("modelless")
    assert gpu.violations == 0
    assert gpu.total_cost > 10 * ours.total_cost


def test_each_instance_is_billed_its_memory_at_its_pools_price_per_gb_second() -> None:
    profiles = zoo()
    big = by_id(profiles, "big", "cpu")
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=10.0)
    system = FixedVariant("one", {"big": big}, POOLS, {"big": 1}, static=True)
    result = sim.run(system, iter([]))
    memory_gb = (56.0 + 200.0) / 1024  # profiled peak + the serving process, as the scaler counts it
    assert instance_memory_gb(big, POOLS["cpu"]) == pytest.approx(memory_gb)
    billed_seconds = sum(1 for s in result.seconds if s.cost > 0)
    assert result.total_cost == pytest.approx(billed_seconds * PRICE_PER_GB_SECOND["cpu"] * memory_gb)
    # AWS's bill: the whole worker (a c5.large) at its list price, in dollars.
    assert worker_dollars_per_second(DEFAULT_POOLS["cpu"]) == pytest.approx(0.085 / 3600)
    assert result.total_aws_cost == pytest.approx(billed_seconds * 0.085 / 3600)


def test_two_instances_on_one_gpu_worker_cost_twice_one_and_the_worker_once() -> None:
    profiles = zoo()
    chosen = {m: by_id(profiles, m, "gpu") for m in ("big", "small")}
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=5.0)
    result = sim.run(FixedVariant("gpu", chosen, POOLS, {"big": 1, "small": 1}, static=True), iter([]))
    assert len(sim.workers) == 1  # both fit one device (4 instances per GPU in the catalog)
    second = result.seconds[0]
    assert second.cost == pytest.approx(2 * PRICE_PER_GB_SECOND["cuda"] * (56.0 + 200.0) / 1024)
    assert second.aws_cost == pytest.approx(0.526 / 3600)  # one g4dn.xlarge
    assert second.instances == {"gpu": 2}


def test_a_lambda_query_costs_its_gb_seconds_in_1_ms_steps_and_the_request_fee() -> None:
    profiles = zoo()
    small = by_id(profiles, "small", "lambda-cpu")
    sim = Simulation(profiles, POOLS, SimConfig(lambda_init_ms=300.0, seed=1), duration_s=5.0)

    class OnLambda:
        name = "lambda only"

        def start(self, sim: Simulation) -> None:
            pass

        def route(self, sim: Simulation, query: Query) -> None:
            sim.run_on_lambda(small, query)

        def tick(self, sim: Simulation) -> None:
            pass

    targets = QueryTargets(APP, latency_ms=2.0, min_accuracy=0.9)
    result = sim.run(
        OnLambda(),
        iter([Arrival(1.0, targets, 2.0, "small"), Arrival(2.0, targets, 2.0, "small")]),
    )
    gb = 1769 / 1024
    cold_ms = math.ceil(300.0 + 5.0 + result.latencies_ms[0] - 305.0)  # init + load + the run, rounded up
    assert result.lambda_served == 2
    assert result.latencies_ms[0] > 305.0  # a cold start: the container's init and the model's load
    assert result.latencies_ms[1] < 1.0  # warm
    first = LAMBDA_PRICE_UNITS * gb * cold_ms / 1000 + LAMBDA_REQUEST_UNITS
    second = LAMBDA_PRICE_UNITS * gb * 1 / 1000 + LAMBDA_REQUEST_UNITS  # under 1 ms: billed 1 ms
    assert result.total_cost == pytest.approx(first + second)
    aws = LAMBDA_DOLLARS_PER_GB_SECOND * gb * (cold_ms + 1) / 1000 + 2 * LAMBDA_DOLLARS_PER_REQUEST
    assert result.total_aws_cost == pytest.approx(aws)


def test_workers_hold_as_many_instances_as_the_catalog_gives_their_pool() -> None:
    assert worker_slots(DEFAULT_POOLS["cpu"]) == DEFAULT_POOLS["cpu"].vcpus_per_worker == 2
    assert worker_slots(DEFAULT_POOLS["gpu"]) == DEFAULT_POOLS["gpu"].instances_per_device == 4
    assert worker_slots(DEFAULT_POOLS["accel"]) == DEFAULT_POOLS["accel"].instances_per_device == 4
    profiles = [variant(f"m{i}", pool, 0.1, 0.9) for i in range(6) for pool in ("cpu", "gpu")]
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=1.0)
    for pool in ("cpu", "gpu"):
        sim.add_worker(POOLS[pool], ready_in_s=0.0)
    provider = SimProvider(sim, POOLS)
    for pool in ("cpu", "gpu"):
        wanted = {p.variant_id: 1 for p in profiles if p.pool == pool}
        provider.assign(pool, wanted, {p.variant_id: p for p in profiles})
    loaded = {w.pool.name: len(w.instances) for w in sim.workers.values()}
    assert loaded == {"cpu": 2, "gpu": 4}


def test_a_scale_in_removes_the_newest_worker_locally_and_the_emptiest_in_aws() -> None:
    profiles = zoo()
    for scale_in, leaves in (("newest", "cpu-1"), ("aws", "cpu-0")):
        sim = Simulation(profiles, POOLS, CONFIG, duration_s=1.0)
        first = sim.add_worker(POOLS["cpu"], ready_in_s=0.0)
        second = sim.add_worker(POOLS["cpu"], ready_in_s=0.0)
        sim.load(second, by_id(profiles, "big", "cpu"))
        assert (first.id, second.id) == ("cpu-0", "cpu-1")
        SimProvider(sim, POOLS, scale_in).scale("cpu", 1)
        assert leaves not in sim.workers


def test_the_instance_priced_pools_make_a_plans_price_infaas_bill_of_it() -> None:
    # An accelerator worker holds one instance and costs one footprint at its INFaaS price...
    assert PRICED["gpu"].instances_per_device == PRICED["accel"].instances_per_device == 1
    assert worker_slots(PRICED["gpu"]) == 1
    assert PRICED["gpu"].price_per_device_second == pytest.approx(0.498 * FOOTPRINT_GB)
    assert PRICED["accel"].price_per_device_second == pytest.approx(0.190 * FOOTPRINT_GB)
    # ...a CPU worker one footprint per vCPU (an instance per vCPU), Lambda its GB·s in INFaaS units.
    cpu = PRICED["cpu"]
    assert cpu.price_per_vcpu_second * cpu.vcpus_per_worker == pytest.approx(2 * 0.031 * FOOTPRINT_GB)
    assert PRICED["lambda-cpu"].request_price == LAMBDA_REQUEST_UNITS
    # A one-thread instance is then priced at what INFaaS bills it.
    dollars = variant("big", "cpu", 0.5, 0.99)
    (units,) = repriced([dollars], PRICED)
    assert units.price_per_second == pytest.approx(
        PRICE_PER_GB_SECOND["cpu"] * instance_memory_gb(dollars, cpu)
    )
    # Repricing a tabulated profile gives a plain one (its tables are the simulator's own).
    (plain,) = repriced([fast(dollars)], PRICED)
    assert type(plain) is VariantProfile


def test_a_baseline_holds_copies_of_one_variant_on_one_worker() -> None:
    big = by_id(zoo(), "big", "cpu")
    sim = Simulation(zoo(), POOLS, CONFIG, duration_s=1.0)
    clipper = FixedVariant(
        "clipper+-cpu", {"big": big}, POOLS, {"big": 2}, static=True, max_workers={"cpu": 1}
    )
    sim.run(clipper, iter([]))
    (worker,) = sim.workers.values()
    assert sorted(worker.instances) == [big.variant_id, f"{big.variant_id}#1"]


def test_a_capped_baseline_grows_no_further_than_its_workers_hold() -> None:
    big = by_id(zoo(), "big", "cpu")
    sim = Simulation(zoo(), POOLS, CONFIG, duration_s=1.0)
    system = FixedVariant(
        "sagemaker+-cpu",
        {"big": big},
        POOLS,
        {"big": 5},
        static=False,
        capacity={"big": 1.0},
        max_workers={"cpu": 1},
    )
    system.start(sim)
    assert len(sim.workers) == 1
    assert sum(len(w.instances) for w in sim.workers.values()) == worker_slots(POOLS["cpu"])


def test_an_engine_built_for_batch_8_runs_batches_of_8_at_most() -> None:
    gpu = variant("big", "gpu", 0.1, 0.99)
    gpu = fast(
        VariantProfile(
            **{
                **{f: getattr(gpu, f) for f in gpu.__dataclass_fields__},
                "latency_p50_ms": {b: 0.1 * b for b in (1, 2, 4, 8, 16, 32)},
                "latency_p99_ms": {b: 0.12 * b for b in (1, 2, 4, 8, 16, 32)},
                "max_useful_batch": 32,
            }
        )
    )
    sim = Simulation([gpu], POOLS, CONFIG, duration_s=1.0)
    clipper = FixedVariant("clipper+-gpu", {"big": gpu}, POOLS, {"big": 1}, static=True, max_batch=8)
    clipper.start(sim)
    (worker,) = sim.workers.values()
    (instance,) = worker.instances.values()
    assert instance.aimd.max_limit == 8


def test_a_tabulated_profile_answers_as_the_profile_does() -> None:
    profile = variant("big", "cpu", 0.5, 0.99)
    tabulated = fast(profile)
    assert isinstance(tabulated, FastProfile)
    for batch in range(1, 5):
        assert tabulated.latency_ms(batch) == profile.latency_ms(batch)
        assert tabulated.median_ms(batch) == profile.median_ms(batch)
    assert tabulated.max_batch == profile.max_batch == 4
    with pytest.raises(ValueError):
        tabulated.latency_ms(5)
    assert VariantProfile.from_json(tabulated.to_json()) == profile


def test_a_busy_instance_the_plan_drops_drains_then_goes() -> None:
    # InstancePlacer.place: surplus instances are unloaded busy or not; a busy one stops taking
    # queries (selection no longer sees it), finishes its queue, then frees its slot.
    profiles = zoo()
    big = by_id(profiles, "big", "cpu")
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=5.0)
    worker = sim.add_worker(POOLS["cpu"], ready_in_s=0.0)
    instance = sim.load(worker, big, preloaded=True)
    targets = QueryTargets(APP, latency_ms=10.0, min_accuracy=0.99)
    for _ in range(3):
        sim.enqueue(instance, Query(Arrival(0.0, targets, 10.0, "big"), measured=False))
    small = by_id(profiles, "small", "cpu")
    SimProvider(sim, POOLS).assign("cpu", {small.variant_id: 1}, {small.variant_id: small})
    assert instance.draining and big.variant_id in worker.instances
    assert sim.refuses(worker, big.variant_id)  # the worker's 503 instance_draining
    seen = [i.variant_id for state in sim.worker_states() for i in state.instances]
    assert big.variant_id not in seen and small.variant_id not in seen  # small: still loading
    sim.run(FixedVariant("idle", {}, POOLS, {}, static=True), iter([]))  # let its queue finish
    assert big.variant_id not in worker.instances
    assert small.variant_id in [i.variant_id for state in sim.worker_states() for i in state.instances]
    # Its slot went to another variant (reserve): a query for it is still refused for a while.
    assert worker.refused_until[big.variant_id] > 0


def test_an_instance_still_loading_is_not_shown_until_loaded() -> None:
    # The worker shows an instance once its load is done (_show_if_loaded): selection sent
    # queries behind a second's load while the simulator showed it Active from the start.
    profiles = zoo()
    gpu = by_id(profiles, "big", "gpu")  # a 1 s load
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=5.0)
    worker = sim.add_worker(POOLS["gpu"], ready_in_s=0.0)
    free = next(s for s in sim.worker_states() if s.worker_id == worker.id).free_slots
    instance = sim.load(worker, gpu)
    assert instance.ready_at == pytest.approx(1.0)
    state = next(s for s in sim.worker_states() if s.worker_id == worker.id)
    assert gpu.variant_id not in [i.variant_id for i in state.instances]
    assert state.free_slots == free  # as the worker reports it: its monitor counts loaded ones
    sim.run(FixedVariant("idle", {}, POOLS, {}, static=True), iter([]))  # past the load's end
    shown = next(s for s in sim.worker_states() if s.worker_id == worker.id)
    assert [i.state for i in shown.instances if i.variant_id == gpu.variant_id] == [InstanceState.ACTIVE]


def test_a_batch_never_outgrows_the_tightest_deadline_it_takes() -> None:
    # VariantBatcher._take: a tight query behind loose ones goes in the next batch.
    big = fast(variant("big", "cpu", 0.5, 0.99))  # p99: 0.65 ms alone, 1.0 ms for 2, 1.6 ms for 4
    sim = Simulation([big], POOLS, CONFIG, duration_s=1.0)
    worker = sim.add_worker(POOLS["cpu"], ready_in_s=0.0)
    instance = sim.load(worker, big, preloaded=True)
    instance.busy = True  # hold the queue while it fills
    loose = QueryTargets(APP, latency_ms=50.0, min_accuracy=0.99)
    tight = QueryTargets(APP, latency_ms=0.9, min_accuracy=0.99)
    instance.aimd = AimdController(4, initial=4)
    for slo, targets in ((50.0, loose), (50.0, loose), (0.9, tight), (50.0, loose)):
        sim.enqueue(instance, Query(Arrival(0.0, targets, slo, "big"), measured=False))
    # The recent-budget cap (budget_batch_cap): a 0.9 ms budget seen lately allows no batch of 2
    # (1.0 ms > 0.9 / 2), whatever is queued now.
    assert sim._take(instance) == 1
    # Without it, the deadlines alone: the tight one would make a batch of 3 miss its 0.9 ms.
    instance.recent = RecentTightestBudget()
    assert sim._take(instance) == 2


def test_a_queue_that_ate_the_budgets_does_not_shrink_the_batch_limit() -> None:
    # VariantBatcher._execute: the limit answers to the run against the budgets the queries
    # brought, not to what the queue left of them (else a backlog halves the limit, throughput
    # falls and the backlog grows: a spiral the real worker does not have).
    big = fast(variant("big", "cpu", 0.5, 0.99))
    sim = Simulation([big], POOLS, CONFIG, duration_s=1.0)
    worker = sim.add_worker(POOLS["cpu"], ready_in_s=0.0)
    instance = sim.load(worker, big, preloaded=True)
    instance.aimd = AimdController(8, initial=4)
    targets = QueryTargets(APP, latency_ms=10.0, min_accuracy=0.99)
    batch = [Query(Arrival(0.0, targets, 10.0, "big"), measured=False) for _ in range(4)]
    sim.now = 0.05  # they queued 50 ms: every budget is spent before the run starts
    sim._finish((instance, batch, 1.5, sim.now))
    assert instance.aimd.limit == 5  # a full batch that ran within its 10 ms: it grows
    sim._finish((instance, [Query(Arrival(0.0, targets, 10.0, "big"), measured=False)] * 5, 12.0, sim.now))
    assert instance.aimd.limit == 2  # a run over the budget itself: it shrinks


def test_the_warm_pool_keeps_its_containers_warm_and_refreshes_them_before_they_go() -> None:
    profiles = zoo()
    small = by_id(profiles, "small", "lambda-cpu")
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=5.0)
    sim.keep_lambda_warm(small, 3)
    assert sim.container_count == 3  # three invocations at once: three containers
    assert all(small.variant_id in c.variants for c in sim.containers[1769])
    sim.now = 10.0
    sim.keep_lambda_warm(small, 3)  # warm still: nothing more
    assert sim.container_count == 3 and sim.lambda_tier_state().idle_by_memory == {1769: 3}
    sim.now = CONFIG.lambda_keep_warm_s * 0.75  # past half the keep-warm time: refreshed
    sim.keep_lambda_warm(small, 3)
    assert sim.container_count == 3
    assert all(c.last_used > sim.now for c in sim.containers[1769])
    sim.now = CONFIG.lambda_keep_warm_s * 1.2  # the refresh kept every one past the keep-warm time
    sim._reap_containers()
    assert sim.container_count == 3
    sim.keep_lambda_warm(small, 5)  # more wanted: two more containers
    assert sim.container_count == 5


def test_a_burst_a_cold_start_would_miss_finds_the_warm_pool_the_scaler_kept() -> None:
    profiles = zoo()
    targets = QueryTargets(APP, latency_ms=10.0, min_accuracy=0.99)  # "big" on Lambda: 0.5 ms
    # One query a second, then clumps of 6 within 0.6 ms every second: a cold start (300 ms) misses
    # the 10 ms budget, so only containers warm before a clump serve it in time.
    steady = [Arrival(float(t), targets, 10.0, "big") for t in range(60)]
    clumps = [Arrival(60.0 + s + i * 0.0001, targets, 10.0, "big") for s in range(60) for i in range(6)]
    results = {}
    for warm in (True, False):
        system = Modelless(PRICED, ScalerConfig(max_workers={"cpu": 0}), keep_lambda_warm=warm)
        sim = Simulation(profiles, POOLS, SimConfig(lambda_init_ms=300.0, seed=1), 60.0, warmup_s=60.0)
        results[warm] = sim.run(system, iter(steady + clumps))
    assert results[True].queries == results[False].queries == len(clumps)
    assert results[True].violations < results[False].violations


def test_a_lambda_container_serves_every_variant_of_its_memory_size() -> None:
    profiles = zoo()
    big, small = by_id(profiles, "big", "lambda-cpu"), by_id(profiles, "small", "lambda-cpu")
    sim = Simulation(profiles, POOLS, CONFIG, duration_s=5.0)
    first = sim.run_on_lambda(big, None)
    assert first is not None and first > 0.3  # a cold start: the container's start and the load
    sim.now = first
    second = sim.run_on_lambda(small, None)
    assert second is not None and second - first < 0.3  # the idle container loads it: no cold start
    assert sim.container_count == 1
    (container,) = sim.containers[1769]
    assert container.variants == {big.variant_id, small.variant_id}
    # While it is busy, the tier shows both as Overloaded, and a warm-up starts another container.
    state = sim.lambda_state()
    assert state is not None and {i.state for i in state.instances} == {InstanceState.OVERLOADED}
    assert sim.lambda_tier_state().idle_by_memory == {1769: 0}
    sim.warm_lambda(big)
    assert sim.container_count == 2
