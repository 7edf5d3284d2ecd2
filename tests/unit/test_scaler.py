"""The scaling function's controller, tick by tick on a fake clock: measured load in, a solved
plan applied through a fake pool provider, with scale-down held for the hold time."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from modelless.catalog import CPU_POOL, DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.query_load import QueryGroup
from modelless.scaling.controller import ScaleDownHold, Scaler, ScalerConfig
from modelless.scaling.problem import PlanStatus, ScalingPlan, ScalingProblem
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    Registration,
    RegistrationStatus,
    VariantProfile,
    WorkerState,
)

APP = "app"
GROUP = QueryGroup(APP, None, 0.9, 50.0)


class FakeProvider:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = dict(sizes)
        self.assigned: dict[str, dict[str, int]] = {}
        self.calls: list[tuple[str, int]] = []
        self.profiles: dict[str, VariantProfile] = {}
        self.replaced: dict[str, list[str]] = {}  # pool -> workers the next heal reports

    def size(self, pool: str) -> int:
        return self.sizes.get(pool, 0)

    def scale(self, pool: str, workers: int) -> int:
        self.calls.append((pool, workers))
        self.sizes[pool] = workers
        return workers

    def assign(self, pool: str, instances: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        self.assigned[pool] = dict(instances)
        self.profiles = dict(profiles)

    def heal(self, pool: str) -> list[str]:
        return self.replaced.pop(pool, [])


def profile(name: str, pool: str, p99_ms: float, accuracy: float = 0.95, threads: int = 1) -> VariantProfile:
    return VariantProfile(
        variant_id=f"{APP}/m/{name}/{pool}", app_id=APP, model_name="m", pool=pool, precision="fp32",
        opt_level="all", threads=threads, artifact_key="k", size_bytes=1, load_latency_ms=5.0,
        latency_p50_ms={1: p99_ms * 0.8, 8: p99_ms * 4}, latency_p99_ms={1: p99_ms, 8: p99_ms * 5},
        peak_memory_mb=20.0, accuracy=accuracy, price_per_second=CPU_POOL.instance_price_per_second(threads),
        request_price=0.0 if pool == "cpu" else 2e-7, hardware="test", measured_on_target=True,
        memory_mb=0 if pool == "cpu" else 1769,
    )  # fmt: skip


@pytest.fixture
def store() -> InMemoryMetadataStore:
    store = InMemoryMetadataStore()
    record = ModelRecord(APP, "m", "input", [1, 8, 8], "float32", 10, "reg", "src", True)
    registration = Registration("reg", APP, "m", RegistrationStatus.READY)
    store.add_model(record, registration)
    store.publish_variants(
        record, [profile("fast", "cpu", 2.0), profile("fast", "lambda-cpu", 2.0)], registration
    )
    return store


def load(store: InMemoryMetadataStore, qps: int, start: int, seconds: int = 30) -> None:
    for second in range(start, start + seconds):
        store.add_load({GROUP.key: qps}, second)


def test_the_hold_lets_scale_up_through_and_holds_scale_down() -> None:
    hold = ScaleDownHold()
    assert hold.decide("cpu", current=1, wanted=3, hold_s=30, now=0) == 3
    assert hold.decide("cpu", current=3, wanted=1, hold_s=30, now=10) == 3  # held
    assert hold.decide("cpu", current=3, wanted=1, hold_s=30, now=39) == 3
    assert hold.decide("cpu", current=3, wanted=1, hold_s=30, now=40) == 1  # 30 s of wanting fewer
    # A break in the wish restarts the hold.
    assert hold.decide("cpu", current=3, wanted=2, hold_s=30, now=50) == 3
    assert hold.decide("cpu", current=3, wanted=3, hold_s=30, now=60) == 3
    assert hold.decide("cpu", current=3, wanted=2, hold_s=30, now=61) == 3
    assert hold.decide("cpu", current=3, wanted=2, hold_s=30, now=91) == 2


def test_load_scales_the_pool_up_then_down_after_the_hold(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 1})
    config = ScalerConfig(
        window_s=10, slack=0.0, min_hold_s=30, max_workers={"cpu": 8}, provision_for_envelope=False
    )
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)

    # One 1-thread instance serves 500 q/s at batch 1 (2 ms); a worker holds one of a variant.
    load(store, 2500, start=1000, seconds=20)
    busy = scaler.tick(now=1020.5)
    assert busy.plan.status.value == "optimal"
    assert busy.workers["cpu"] >= 2
    assert sum(provider.assigned["cpu"].values()) >= 2
    assert busy.instances == provider.assigned  # the report says what the tick assigned
    peak = busy.workers["cpu"]

    # Load falls to a trickle, which Lambda serves for less than a worker costs: the plan wants
    # no worker at once, the pool keeps its workers for the 30 s hold, then lets them go.
    load(store, 5, start=1021, seconds=60)
    quiet = scaler.tick(now=1040.5)
    assert quiet.workers["cpu"] == peak and quiet.held["cpu"] == (peak, 0)
    assert quiet.plan.lambda_qps[GROUP.key] == pytest.approx(5.0)
    assert scaler.tick(now=1060.5).workers["cpu"] == peak
    later = scaler.tick(now=1071.0)
    assert later.workers["cpu"] == 0 and not later.held
    assert later.summary()["load_qps"] == {GROUP.key: 5.0}


def test_what_the_pool_cannot_take_is_left_to_the_lambda_tier(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 1})
    config = ScalerConfig(window_s=10, slack=0.0, max_workers={"cpu": 1})  # the pool at its cap
    load(store, 5000, start=1000, seconds=20)
    report = Scaler(store, provider, DEFAULT_POOLS, config).tick(now=1020.5)
    assert report.workers["cpu"] == 1
    assert report.plan.lambda_qps[GROUP.key] > 0
    assert report.plan.lambda_qps[GROUP.key] > 0 and "lambda_qps" in report.summary()


def test_a_demand_floor_is_planned_for_though_the_measured_load_is_lower(
    store: InMemoryMetadataStore,
) -> None:
    """The pipelines' tuned stages (modelless.pipelines.autopilot) reach the one program as floors
    of their groups' load; the report keeps the measured load apart from them."""
    provider = FakeProvider({"cpu": 1})
    config = ScalerConfig(window_s=10, slack=0.0, max_workers={"cpu": 8}, provision_for_envelope=False)
    load(store, 5, start=1000, seconds=20)
    floors: dict[str, float] = {}
    scaler = Scaler(store, provider, DEFAULT_POOLS, config, demand_floors=lambda now: floors)

    plain = scaler.tick(now=1020.5)
    assert plain.plan.lambda_qps[GROUP.key] == pytest.approx(5.0) and plain.floors_qps == {}

    floors[GROUP.key] = 2500.0  # more than one instance serves (500 q/s at batch 1)
    floored = scaler.tick(now=1020.5)
    assert floored.workers["cpu"] >= 2 and sum(provider.assigned["cpu"].values()) >= 2
    assert floored.plan.lambda_qps.get(GROUP.key, 0.0) < 2500.0
    assert floored.load_qps == {GROUP.key: 5.0} and floored.floors_qps == {GROUP.key: 2500.0}
    assert floored.summary()["floors_qps"] == {GROUP.key: 2500.0}


def test_no_load_means_the_minimum(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 2})
    config = ScalerConfig(min_hold_s=0, min_workers={"cpu": 1}, max_workers={"cpu": 4})
    report = Scaler(store, provider, DEFAULT_POOLS, config).tick(now=5000.0)
    assert report.workers["cpu"] == 1
    assert report.plan.total_instances == 0


def test_each_tick_has_the_pools_heal_and_reports_what_was_replaced(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 2})
    provider.replaced["cpu"] = ["i-silent"]
    config = ScalerConfig(min_hold_s=0, min_workers={"cpu": 1}, max_workers={"cpu": 4})
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)
    first = scaler.tick(now=5000.0)
    assert first.healed == {"cpu": ["i-silent"]}
    assert first.summary()["healed"] == {"cpu": ["i-silent"]}
    assert scaler.tick(now=5010.0).healed == {}


def test_an_instance_the_plan_drops_is_kept_loaded_for_the_hold(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 1})
    config = ScalerConfig(
        window_s=10,
        slack=0.0,
        min_hold_s=30,
        min_workers={"cpu": 1},
        max_workers={"cpu": 2},
        provision_for_envelope=False,
    )
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)
    variant_id = profile("fast", "cpu", 2.0).variant_id
    # Worker reports are judged fresh on the real clock: the ticks' clock starts there.
    base = int(time.time())
    load(store, 400, start=base - 20, seconds=20)
    assert scaler.tick(now=base + 0.5).plan.instances_of(variant_id) == 1
    assert provider.assigned["cpu"] == {variant_id: 1}
    assert provider.profiles[variant_id].variant_id == variant_id  # what a worker needs to load it

    # The worker reports the instance loaded; then the load stops: the plan wants none.
    instance = InstanceStats(variant_id, InstanceState.ACTIVE, 0.0, 2.0, 2.0, 0)
    for offset in (20.0, 49.0, 51.0):
        store.put_worker_state(WorkerState("cpu-0", "cpu", "http://w", 0.0, 1, time.time(), (instance,)))
        report = scaler.tick(now=base + offset)
        assert report.plan.total_instances == 0
        if offset < 50:
            assert provider.assigned["cpu"] == {variant_id: 1}, offset  # held: kept loaded
    assert provider.assigned["cpu"] == {}  # 30 s of not wanting it: unloaded


def test_workers_that_do_not_report_yet_are_starting_and_the_plan_bridges_them(
    store: InMemoryMetadataStore,
) -> None:
    provider = FakeProvider({"cpu": 3})  # three asked for, one of them running (it reports)
    config = ScalerConfig(
        window_s=10, slack=0.0, max_workers={"cpu": 8}, worker_startup_s=45.0, provision_for_envelope=False
    )
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)
    base = int(time.time())
    store.put_worker_state(WorkerState("cpu-0", "cpu", "http://w", 0.0, 1, time.time(), ()))
    load(store, 2500, start=base - 20, seconds=20)

    pool = scaler.build_problem(base + 0.5).problem.pool("cpu")
    assert (pool.current_workers, pool.ready_workers, pool.startup_s) == (3, 1, 45.0)

    # Nothing runs yet: until the new workers start and load the variant, Lambda takes it all
    # (what the plan leaves to Lambda anyway, and the bridge).
    report = scaler.tick(now=base + 0.5)
    assert report.workers["cpu"] > 1
    steady = report.plan.lambda_qps.get(GROUP.key, 0.0)
    assert report.plan.bridge_qps[GROUP.key] + steady == pytest.approx(2500.0)
    assert report.plan.bridge_qps[GROUP.key] > steady
    bridge = report.summary()["bridge"]
    assert isinstance(bridge, dict)
    assert bridge["seconds"] == pytest.approx(45.0, abs=0.1)  # start-up, plus a 5 ms load
    assert bridge["cost"] > 0


def test_an_instance_the_plan_moves_to_another_pool_serves_until_its_replacement_runs(
    store: InMemoryMetadataStore,
) -> None:
    # Make before break: the plan moves the group from the CPU instance to a GPU one whose worker
    # has yet to start. Dropping the CPU instance once its hold ran out would leave the group with
    # nothing (a group Lambda cannot serve in time was refused for a second on the conv trace).
    record = store.get_model(APP, "m")
    assert record is not None
    registration = Registration("reg", APP, "m", RegistrationStatus.READY)
    cpu, gpu = profile("fast", "cpu", 2.0), profile("fast", "gpu", 1.0)
    store.publish_variants(record, [cpu, profile("fast", "lambda-cpu", 2.0), gpu], registration)
    provider = FakeProvider({"cpu": 1, "gpu": 0})
    config = ScalerConfig(
        window_s=10, slack=0.0, min_hold_s=30, max_workers={"cpu": 2, "gpu": 2}, provision_for_envelope=False
    )

    def to_the_gpu(problem: ScalingProblem, time_limit_s: float) -> ScalingPlan:
        return ScalingPlan(
            instances={(gpu.variant_id, "gpu"): 1}, workers={"cpu": 0, "gpu": 1}, lambda_qps={},
            served={(gpu.variant_id, GROUP.key): 400.0}, cost_per_second=1.0, objective=1.0,
            solver="milp", status=PlanStatus.OPTIMAL, solve_seconds=0.0,
        )  # fmt: skip

    scaler = Scaler(store, provider, DEFAULT_POOLS, config, to_the_gpu)
    base = int(time.time())
    load(store, 400, start=base - 20, seconds=90)  # steady load throughout
    on_cpu = InstanceStats(cpu.variant_id, InstanceState.ACTIVE, 0.0, 2.0, 2.0, 0)
    for offset in (0.5, 20.0, 40.0, 60.0):  # past the 30 s hold: the GPU worker has not started
        store.put_worker_state(WorkerState("cpu-0", "cpu", "http://c", 0.0, 1, base + offset, (on_cpu,)))
        report = scaler.tick(now=base + offset)
        assert provider.assigned["cpu"] == {cpu.variant_id: 1}, offset
        assert report.workers["cpu"] == 1 and provider.assigned["gpu"] == {gpu.variant_id: 1}, offset
    # The GPU instance runs: the CPU one (its hold long over) goes, and its worker with it.
    on_gpu = InstanceStats(gpu.variant_id, InstanceState.ACTIVE, 0.0, 1.0, 1.0, 0)
    store.put_worker_state(WorkerState("gpu-0", "gpu", "http://g", 0.0, 1, base + 61.0, (on_gpu,)))
    store.put_worker_state(WorkerState("cpu-0", "cpu", "http://c", 0.0, 1, base + 61.0, (on_cpu,)))
    report = scaler.tick(now=base + 61.0)
    assert provider.assigned["cpu"] == {}
    assert report.workers["cpu"] == 0
