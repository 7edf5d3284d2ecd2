"""The cost study's configuration (issue 7, part 1; re-based on the real zoo in issue 12): the
latency targets INFaaS set, its §6.2 patterns on the heavy model alone with one worker per pool,
its §6.1 trace over the whole zoo, the baselines as INFaaS configured them, the project priced by
the bill it is judged on, and the verdicts on its targets. A hand-built zoo with the real zoo's
names and latencies of their order; nothing is simulated or timed here."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.costs import (
    CLIPPER_CPU_INSTANCES,
    CLIPPER_GPU_BATCH,
    MAX_WORKERS,
    ONE_WORKER,
    PEAK_WINDOW_S,
    QUICK_S,
    REPLAY_MIN_S,
    SLACK,
    START_WINDOW_S,
    WORKLOADS,
    Workload,
    build_system,
    compare_violations,
    make_setup,
    make_workloads,
    typical_footprint_gb,
    verdict,
)
from bench.sim_profiles import (
    COLD_FLOOR_MS,
    POPULAR_SLO_MS,
    Zoo,
    architectures,
    cpu_servable_architectures,
    pattern_architectures,
    pattern_slo_ms,
)
from modelless.catalog import DEFAULT_POOLS
from modelless.types import VariantProfile
from sim.simulator import FixedVariant, Modelless, instance_memory_gb, worker_slots
from sim.traces import TRACE_PATH, ArrivalTimes, GammaProcess, OnOffProcess, RateCurve

APP = "zoo-images"
HEAVY = "resnet50"
# batch-1 median latency (ms) and accuracy of each architecture's variants in this hand-built zoo
SPEED = {HEAVY: 110.0, "densenet121": 45.0, "resnet18": 20.0, "efficientnet_b0": 15.0}
SPEED |= {"mobilenetv2_100": 10.0, "mobilenetv3_small_100": 3.0}
POPULARITY = tuple(SPEED)  # the slowest first
ACCURACY = {HEAVY: 0.9389, "densenet121": 0.9526, "resnet18": 0.9152, "efficientnet_b0": 0.9078}
ACCURACY |= {"mobilenetv2_100": 0.8944, "mobilenetv3_small_100": 0.7889}


def profile(
    model: str, pool: str, recipe: str = "fp32_all", speed: float = 1.0, accuracy: float = 0.0
) -> VariantProfile:
    p50 = SPEED[model] * speed
    precision, opt_level = recipe.rsplit("_", 1)
    return VariantProfile(
        variant_id=f"{APP}/{model}/{recipe}/{pool}",
        app_id=APP,
        model_name=model,
        pool=pool,
        precision=precision,
        opt_level=opt_level,
        threads=1,
        artifact_key="",
        size_bytes=1,
        load_latency_ms=10.0 if pool in ("cpu", "lambda-cpu") else 1010.0,
        latency_p50_ms={b: p50 * b for b in (1, 2, 4, 8, 16)},
        latency_p99_ms={b: 1.05 * p50 * b for b in (1, 2, 4, 8, 16)},
        peak_memory_mb=300.0 if model == HEAVY else 60.0,
        accuracy=accuracy or ACCURACY[model],
        price_per_second=1e-5,
        request_price=0.0,
        hardware="hand-built",
        measured_on_target=pool in ("cpu", "lambda-cpu"),
        memory_mb=1769 if pool == "lambda-cpu" else 0,
    )


def hand_built_zoo() -> Zoo:
    profiles = []
    for model in sorted(POPULARITY):  # the zoo orders them itself
        profiles += [
            profile(model, "cpu"),
            profile(model, "lambda-cpu"),
            profile(model, "gpu", speed=0.02),
            profile(model, "accel", speed=0.1),
            # faster but far less accurate: it must not set the cold models' targets
            profile(model, "cpu", "int8-static_all", speed=0.2, accuracy=0.2),
        ]
    return Zoo(profiles, Path("repo"))


def test_the_targets_are_those_infaas_set() -> None:
    zoo = hand_built_zoo()
    found = {a.model: a for a in architectures(zoo)}
    # The slowest on a CPU are the most popular; the slowest of all is the patterns' heavy model.
    assert zoo.popularity == POPULARITY and zoo.heavy == HEAVY
    assert [a.model for a in architectures(zoo)] == list(POPULARITY)
    assert found[HEAVY].slo_ms == found["densenet121"].slo_ms == POPULAR_SLO_MS  # the popular ones
    # A cold model: 1.5x its fastest accurate CPU variant's p99 (not the INT8 one's)...
    assert found["efficientnet_b0"].slo_ms == pytest.approx(1.5 * 1.05 * 15.0)
    # ...but at least the floor, below which the serving path's own milliseconds would decide.
    assert found["mobilenetv3_small_100"].slo_ms == COLD_FLOOR_MS
    assert all(10.0 <= a.slo_ms <= 500.0 for a in found.values())
    assert found[HEAVY].targets.model_name == HEAVY  # named
    assert found["densenet121"].targets.model_name is None  # model-less
    assert found[HEAVY].targets.min_accuracy == 0.93  # its own accuracy, rounded down
    assert found[HEAVY].targets.app_id == APP
    (pattern,) = pattern_architectures(zoo)
    # The latency class at or above 1.5x the heavy model's developer CPU p99 (1.5 * 115.5 ms).
    assert pattern_slo_ms(zoo) == 200.0
    assert (pattern.model, pattern.slo_ms, pattern.targets.latency_ms) == (HEAVY, 200.0, 200.0)


def test_a_cold_model_slower_than_the_floor_gets_one_and_a_half_times_its_latency() -> None:
    zoo = hand_built_zoo()
    slow = [
        replace(p, latency_p99_ms={1: 40.0, 2: 80.0}) if p.model_name == "mobilenetv3_small_100" else p
        for p in zoo.profiles
    ]
    found = {a.model: a for a in architectures(replace(zoo, profiles=slow))}
    assert found["mobilenetv3_small_100"].slo_ms == pytest.approx(60.0)


def test_the_validation_gives_a_model_no_cpu_can_serve_in_time_the_cold_target() -> None:
    # The simulator's check runs on CPUs alone: a popular model whose accurate CPU variants miss
    # 50 ms would be refused throughout, live and simulated alike.
    zoo = hand_built_zoo()
    usual = {a.model: a for a in architectures(zoo)}
    servable = {a.model: a for a in cpu_servable_architectures(zoo)}
    assert [a.model for a in cpu_servable_architectures(zoo)] == list(POPULARITY)
    assert usual[HEAVY].slo_ms == POPULAR_SLO_MS < 1.05 * SPEED[HEAVY]
    assert (
        servable[HEAVY].slo_ms
        == servable[HEAVY].targets.latency_ms
        == pytest.approx(1.5 * 1.05 * SPEED[HEAVY])
    )
    assert servable[HEAVY].targets.min_accuracy == usual[HEAVY].targets.min_accuracy
    assert servable[HEAVY].targets.model_name == HEAVY
    # The others, which a CPU serves within their targets, keep them.
    for model in POPULARITY:
        if 1.05 * SPEED[model] <= usual[model].slo_ms:
            assert servable[model] == usual[model]


def second_trace(path: Path) -> Path:
    """A hand-made second trace: one hour of bursts, ten arrivals 50 ms apart every 10 s."""
    rows = [f"{start + 0.05 * i:.3f}" for start in range(0, 3600, 10) for i in range(10)]
    path.write_text("arrived_at,num_prefill_tokens\n" + "".join(f"{t},1\n" for t in rows))
    return path


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not beside this checkout")
def test_patterns_serve_the_heavy_model_on_one_worker_and_bursty_traffic_the_whole_zoo(
    tmp_path: Path,
) -> None:
    setup = make_setup(hand_built_zoo(), 300.0)
    trace2 = second_trace(tmp_path / "second.csv")
    workloads = {
        w.key: w for w in make_workloads(setup, quick=False, repeats=3, trace=TRACE_PATH, trace2=trace2)
    }
    assert tuple(workloads) == WORKLOADS
    for key in ("flat", "steady", "fluctuating"):
        assert [a.model for a in workloads[key].mix.architectures] == [HEAVY]
        assert workloads[key].max_workers == ONE_WORKER and workloads[key].seeds == (1, 2, 3)
        assert isinstance(workloads[key].source, RateCurve)  # Poisson over INFaaS's curves
    bursty = [k for k in WORKLOADS if k not in ("flat", "steady", "fluctuating")]
    for key in bursty:
        assert [a.model for a in workloads[key].mix.architectures] == list(POPULARITY)
        assert workloads[key].max_workers == MAX_WORKERS
    for key in ("conv-1000", "trace2-1000"):
        assert workloads[key].seeds == (1,) and workloads[key].duration_s == 300.0  # the busiest 5 min
    # Replayed at recorded times, at the asked mean (the busiest window's at least that).
    for key, mean in (("conv-10", 10.0), ("conv-100", 100.0), ("trace2-100", 100.0)):
        replayed = workloads[key].source
        assert isinstance(replayed, ArrivalTimes) and replayed.duration_s >= REPLAY_MIN_S
        assert replayed.mean_qps == pytest.approx(mean)
        assert replayed.draw(1) is replayed.draw(2)  # the same arrivals on every seed
    assert workloads["conv-1000"].mean_qps >= 1000.0
    assert workloads["conv-10"].replayed == "all 32.3 min: recorded times divided by 1.81"  # compressed only
    assert "copies" in workloads["trace2-100"].replayed  # 100 QPS from 2.8 QPS: superposed
    # The synthetic ones are drawn per seed at 100 QPS.
    gamma = workloads["gamma-cv8"].source
    assert isinstance(gamma, GammaProcess) and gamma.cv == 8.0
    assert not np.array_equal(gamma.draw(1).times, gamma.draw(2).times)
    assert isinstance(workloads["on-off"].source, OnOffProcess)
    # Every bursty workload's arrivals are measured for the write-up.
    stats = workloads["trace2-100"].burstiness(1)
    assert stats.mean_qps == pytest.approx(100.0) and stats.cv > 1


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not beside this checkout")
def test_workloads_can_be_picked_and_the_quick_run_is_short(tmp_path: Path) -> None:
    setup = make_setup(hand_built_zoo(), 300.0)
    picked = make_workloads(setup, False, 2, TRACE_PATH, keys=["gamma-cv4", "flat"])
    assert [w.key for w in picked] == ["flat", "gamma-cv4"] and picked[1].seeds == (1, 2)
    quick = make_workloads(setup, True, 3, TRACE_PATH)
    assert [w.key for w in quick] == ["flat", "fluctuating", "conv-10", "gamma-cv4"]
    assert all(w.seeds == (1,) for w in quick)
    assert all(w.duration_s <= QUICK_S for w in quick if not w.pattern)
    # Without a second trace its workloads are left out, unless asked for by name.
    assert not [w for w in make_workloads(setup, False, 1, TRACE_PATH) if w.key.startswith("trace2")]
    with pytest.raises(ValueError, match="no second trace"):
        make_workloads(setup, False, 1, TRACE_PATH, keys=["trace2-100"])
    with pytest.raises(ValueError, match="unknown workloads"):
        make_workloads(setup, False, 1, TRACE_PATH, keys=["trace-10"])


def test_bursty_workloads_size_the_baselines_by_their_own_arrivals() -> None:
    setup = make_setup(hand_built_zoo(), 300.0)
    # 20 QPS for the first 30 s, then one 10 s burst at 2,000 QPS, then quiet.
    times = np.sort(
        np.concatenate(
            (np.linspace(0.0, 30.0, 600, endpoint=False), np.linspace(100.0, 110.0, 20_000, endpoint=False))
        )
    )
    workload = Workload(
        "burst",
        "a burst",
        ArrivalTimes("a burst", times, 200.0),
        (1,),
        2.0,
        "",
        setup.trace_mix,
        MAX_WORKERS,
        pattern=False,
    )
    assert workload.peak_qps(1) == pytest.approx(20_000 / PEAK_WINDOW_S)
    assert workload.start_qps(1) == pytest.approx(600 / START_WINDOW_S)
    clipper_gpu = build_system("clipper+-gpu", setup, workload)
    sagemaker = build_system("sagemaker+-cpu", setup, workload)
    assert isinstance(clipper_gpu, FixedVariant) and isinstance(sagemaker, FixedVariant)
    share = dict(zip([a.model for a in setup.trace_mix.architectures], setup.trace_mix.shares, strict=True))
    # SageMaker+ starts sized for the first 30 s's 20 QPS (not the run's mean, 103 QPS)...
    capacity = sagemaker._capacity
    assert {m: n for m, n in sagemaker._replicas.items() if capacity[m]} == {
        m: max(1, math.ceil(20.0 * share[m] * (1 + SLACK) / capacity[m])) for m in share if capacity[m]
    }
    # ...and a variant that cannot meet its SLO at any rate gets what its capped pool can hold,
    # not billions of instances.
    assert capacity[HEAVY] == 0
    assert sagemaker._replicas[HEAVY] == MAX_WORKERS["cpu"] * worker_slots(DEFAULT_POOLS["cpu"])
    # Sized for the burst: more GPU instances than for the starting rate.
    calm = Workload(
        "calm",
        "calm",
        ArrivalTimes("calm", times[:600], 200.0),
        (1,),
        2.0,
        "",
        setup.trace_mix,
        MAX_WORKERS,
        False,
    )
    calm_gpu = build_system("clipper+-gpu", setup, calm)
    assert isinstance(calm_gpu, FixedVariant)
    assert sum(clipper_gpu._replicas.values()) > sum(calm_gpu._replicas.values())
    # Every query of the measured part is sent at its time, after a Poisson warm-up at the start rate.
    sent = list(workload.arrivals(1, warmup_s=60.0))
    assert [a.at - 60.0 for a in sent if a.at >= 60.0] == pytest.approx(times.tolist())
    assert abs(sum(1 for a in sent if a.at < 60.0) - 1200) < 4 * 1200**0.5


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not beside this checkout")
def test_the_baselines_are_configured_as_infaas_configured_them() -> None:
    setup = make_setup(hand_built_zoo(), 300.0)
    steady = next(w for w in make_workloads(setup, False, 1, TRACE_PATH) if w.key == "steady")
    clipper_cpu = build_system("clipper+-cpu", setup, steady)
    assert isinstance(clipper_cpu, FixedVariant)
    assert clipper_cpu._replicas == {HEAVY: CLIPPER_CPU_INSTANCES} and clipper_cpu._static
    assert clipper_cpu._chosen[HEAVY].variant_id.endswith("fp32_all/cpu")  # the developer's FP32 variant
    clipper_gpu = build_system("clipper+-gpu", setup, steady)
    assert isinstance(clipper_gpu, FixedVariant)
    assert clipper_gpu._max_batch == CLIPPER_GPU_BATCH and clipper_gpu._replicas[HEAVY] >= 1
    sagemaker_gpu = build_system("sagemaker+-gpu", setup, steady)
    assert isinstance(sagemaker_gpu, FixedVariant)
    assert sagemaker_gpu._max_batch == 1 and not sagemaker_gpu._static
    for name in ("clipper+-cpu", "clipper+-gpu", "sagemaker+-cpu", "sagemaker+-gpu"):
        system = build_system(name, setup, steady)
        assert isinstance(system, FixedVariant) and system._max_workers == ONE_WORKER


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not beside this checkout")
def test_the_project_is_priced_by_the_bill_it_is_judged_on_or_by_aws() -> None:
    setup = make_setup(hand_built_zoo(), 300.0)
    flat = next(w for w in make_workloads(setup, False, 1, TRACE_PATH) if w.key == "flat")
    footprint = instance_memory_gb(setup.cpu_variant[HEAVY], DEFAULT_POOLS["cpu"])
    assert typical_footprint_gb(setup, flat.mix) == pytest.approx(footprint)
    ours = build_system("modelless", setup, flat)
    assert isinstance(ours, Modelless)
    assert ours._pools["accel"].price_per_device_second == pytest.approx(0.190 * footprint)
    aws = build_system("modelless-aws", setup, flat)
    assert isinstance(aws, Modelless)
    assert aws._pools["cpu"] == DEFAULT_POOLS["cpu"]


def test_violations_are_compared_per_seed_and_equal_zeros_are_not_a_miss() -> None:
    def runs(*violations: int) -> list[dict[str, int]]:
        return [{"seed": seed, "violations": v} for seed, v in enumerate(violations, start=1)]

    assert compare_violations(runs(0, 0), runs(0, 0)) == "equal (both 0)"
    assert compare_violations(runs(1, 2), runs(3, 4)) == "fewer"
    assert compare_violations(runs(1, 5), runs(3, 4)) == "more"
    assert compare_violations(runs(0, 4), runs(3, 4)) == "not fewer on every seed"
    assert verdict({"status": "equal (both 0)"}).startswith("cheaper; violations equal (both 0)")
    missed = verdict({"status": "missed", "cheaper": False, "violations": "more"})
    assert "missed" in missed and "costlier" in missed and "more" in missed
