"""The simulator's zoo and its calibration (issue 7, part 1): accelerator profiles derived from
measured CPU ones and marked so, the developer's variant the baselines serve, and the host
calibration taken from a live run's replies. Pure functions on hand-built profiles."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.real_zoo import DEVICE_FLOOR_MS, NOT_MEASURED, derive_accelerator_entries
from bench.sim_profiles import developer_cpu_variant
from bench.sim_validation import LiveQuery, LiveRun, Phases, calibrate
from modelless.types import VariantProfile


def cpu(recipe: str, threads: int, p50: float, accuracy: float = 0.99) -> VariantProfile:
    precision, opt_level = recipe.rsplit("_", 1)
    return VariantProfile(
        variant_id=f"app/m/{recipe}/cpu-{threads}t",
        app_id="app",
        model_name="m",
        pool="cpu",
        precision=precision,
        opt_level=opt_level,
        threads=threads,
        artifact_key="",
        size_bytes=1,
        load_latency_ms=10.0,
        latency_p50_ms={1: p50, 4: 3 * p50},
        latency_p99_ms={1: 1.2 * p50, 4: 4.5 * p50},
        peak_memory_mb=60.0,
        accuracy=accuracy,
        price_per_second=1e-5,
        request_price=0.0,
        hardware="here",
        measured_on_target=True,
    )


def test_accelerator_profiles_follow_infaas_table_2_and_say_they_were_not_measured() -> None:
    source = cpu("fp32_all", 1, 20.0)
    entries = {e["pool"]: e for e in derive_accelerator_entries([source, cpu("int8_all", 1, 5.0, 0.9)])}
    gpu, accel = entries["gpu"], entries["accel"]
    assert gpu["recipe"] == accel["recipe"] == "fp32_all"  # the FP32 artifact, not the faster INT8 one
    # GPU: batch 1 at the CPU's latency / 50; a batch of 4 costs 0.75 + 0.25 * 4 batch-1 calls.
    assert float(gpu["latency_p50_ms"]["1"]) == pytest.approx(0.4)
    assert float(gpu["latency_p50_ms"]["4"]) == pytest.approx(0.4 * 1.75)
    # Inferentia: the CPU's latency / 10 at each batch size; tails keep the CPU's p99/p50 ratio.
    assert float(accel["latency_p50_ms"]["4"]) == pytest.approx(6.0)
    assert float(accel["latency_p99_ms"]["4"]) == pytest.approx(6.0 * 1.5)
    assert gpu["accuracy"] == source.accuracy and gpu["load_latency_ms"] > source.load_latency_ms
    assert NOT_MEASURED in gpu["hardware"] and NOT_MEASURED in accel["hardware"]


def test_no_device_answers_faster_than_its_floor() -> None:
    entries = derive_accelerator_entries([cpu("fp32_all", 1, 0.02)])
    for entry in entries:
        assert min(float(v) for v in entry["latency_p50_ms"].values()) >= DEVICE_FLOOR_MS


def test_no_one_thread_cpu_profile_derives_nothing() -> None:
    assert derive_accelerator_entries([cpu("fp32_all", 2, 1.0)]) == []


def test_the_developer_deploys_the_fp32_variant_on_the_fewest_threads() -> None:
    fp32_two = cpu("fp32_all", 2, 0.5)
    fp32_one = cpu("fp32_basic", 1, 0.9)
    int8_one = cpu("int8_all", 1, 0.2)
    assert developer_cpu_variant([fp32_two, int8_one, fp32_one]) == fp32_one
    assert (
        developer_cpu_variant(
            [int8_one, replace(int8_one, variant_id="x", latency_p50_ms={1: 0.1})]
        ).variant_id
        == "x"
    )


def test_the_host_calibration_uses_the_calibration_phase_only() -> None:
    phases = Phases(rate_qps=10, duration_s=10, calibration_qps=10, calibration_s=10, warmup_s=5)
    profile = cpu("fp32_all", 1, 0.5)
    timings = {"queue_ms": 0.2, "inference_ms": 1.0, "load_ms": 0.0, "cold_start_ms": 0.0}

    def query(at: float, tier: str = "worker", **changed: float) -> LiveQuery:
        return LiveQuery(
            at, "m", 10.0, 200, 2.0, 1.2, 3.0, tier, {**timings, **changed}, "", profile.variant_id
        )

    queries = [query(1.0, inference_ms=9.0)]  # warm-up: left out
    queries += [query(5.0 + i * 0.1) for i in range(25)]  # calibration: ratio 2
    queries += [query(8.0, load_ms=12.0)]  # a load's reply: left out
    queries += [query(9.0, tier="lambda", inference_ms=0.75, queue_ms=0.0)]
    queries += [query(20.0, inference_ms=50.0)]  # the compared phase: never used
    calibration = calibrate(LiveRun(queries, [300.0], [250.0], phases, {profile.variant_id: profile}))
    assert calibration.ratios("worker", "m") == pytest.approx([2.0] * 25)
    assert calibration.ratios("lambda", "m") == pytest.approx([1.5])  # too few for its own: the tier's
    assert calibration.handoff_ms["worker"] == pytest.approx([0.2] * 25)
