"""WorkerMonitor driven tick by tick over an explicit clock (no sleeping)."""

from __future__ import annotations

import pytest

from modelless.serving.monitoring import WINDOW_S, WorkerMonitor
from modelless.types import InstanceState, InstanceStats, VariantProfile, WorkerState

T0 = 1_000.0


def profile(variant_id: str, p99: dict[int, float] | None = None) -> VariantProfile:
    table = p99 or {1: 2.0, 8: 6.0}
    return VariantProfile(
        variant_id=variant_id,
        app_id="app",
        model_name="m",
        pool="cpu",
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key=f"k/{variant_id}.onnx",
        size_bytes=1,
        load_latency_ms=5.0,
        latency_p50_ms={b: v / 2 for b, v in table.items()},
        latency_p99_ms=table,
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=1.0,
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )


def monitor(slots: int = 4) -> WorkerMonitor:
    return WorkerMonitor("w1", "cpu", "http://w1:9000", slots=slots)


def run(
    m: WorkerMonitor, variant_id: str, at: float, inference_ms: float, queue_ms: float = 0.0, batch: int = 1
) -> None:
    """One complete run: queued, then finished at ``at``."""
    m.started(variant_id)
    m.finished(variant_id, at=at, batch=batch, queue_ms=queue_ms, inference_ms=inference_ms)


def instance(state: WorkerState, variant_id: str) -> InstanceStats:
    found = [i for i in state.instances if i.variant_id == variant_id]
    assert len(found) == 1, state.instances
    return found[0]


def test_a_freshly_loaded_instance_is_active_and_idle() -> None:
    m = monitor(slots=3)
    m.loaded(profile("v"))

    state = m.snapshot(T0)

    assert (state.worker_id, state.pool, state.address, state.reported_at) == (
        "w1",
        "cpu",
        "http://w1:9000",
        T0,
    )
    assert state.utilisation == 0.0
    assert state.free_slots == 2
    assert state.instances == (InstanceStats("v", InstanceState.ACTIVE, 0.0, 0.0, 0.0, 0),)


def test_qps_and_latency_percentiles_over_the_window() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 50.0}))  # generous profile: stays Active
    # 10 runs: total latencies 1..10 ms (queue 0.5 + inference i - 0.5).
    for i in range(1, 11):
        run(m, "v", at=T0 + i * 0.1, inference_ms=i - 0.5, queue_ms=0.5)

    stats = instance(m.snapshot(T0 + 1.0), "v")

    assert stats.qps == pytest.approx(10 / WINDOW_S)
    assert stats.latency_p50_ms == 6.0  # sorted[int(0.5 * 10)]
    assert stats.latency_p99_ms == 10.0  # sorted[int(0.99 * 10)]
    assert stats.state is InstanceState.ACTIVE
    assert stats.queue_length == 0


def test_p99_is_the_tail_of_a_hundred_runs() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 500.0}))
    for i in range(100):
        run(m, "v", at=T0, inference_ms=1.0 if i < 98 else 200.0)

    stats = instance(m.snapshot(T0), "v")

    assert stats.latency_p50_ms == 1.0
    assert stats.latency_p99_ms == 200.0
    assert stats.qps == pytest.approx(100 / WINDOW_S)


def test_runs_older_than_the_window_are_dropped() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 100.0}))
    run(m, "v", at=T0, inference_ms=50.0)
    run(m, "v", at=T0 + 3.0, inference_ms=10.0)

    at_edge = instance(m.snapshot(T0 + WINDOW_S), "v")  # the first run is exactly 5 s old: kept
    assert at_edge.qps == pytest.approx(2 / WINDOW_S)
    assert at_edge.latency_p99_ms == 50.0

    later = instance(m.snapshot(T0 + WINDOW_S + 0.01), "v")
    assert later.qps == pytest.approx(1 / WINDOW_S)
    assert later.latency_p99_ms == 10.0

    gone = instance(m.snapshot(T0 + 3.0 + WINDOW_S + 0.01), "v")
    assert gone.qps == 0.0
    assert gone.latency_p50_ms == 0.0 and gone.latency_p99_ms == 0.0
    assert gone.state is InstanceState.ACTIVE


def test_utilisation_is_busy_time_over_window_and_slots() -> None:
    m = monitor(slots=2)
    m.loaded(profile("a", {1: 1000.0}))
    m.loaded(profile("b", {1: 1000.0}))
    run(m, "a", at=T0, inference_ms=1000.0)  # 1 s busy
    run(m, "b", at=T0, inference_ms=1500.0)  # 1.5 s busy

    state = m.snapshot(T0)

    assert state.utilisation == pytest.approx(2500 / (WINDOW_S * 1000 * 2))
    assert state.free_slots == 0
    per_instance = {i.variant_id: i.utilisation for i in state.instances}
    assert per_instance == {"a": pytest.approx(1000 / (WINDOW_S * 1000)), "b": pytest.approx(0.3)}


def test_utilisation_is_capped_at_one() -> None:
    m = monitor(slots=1)
    m.loaded(profile("v"))
    run(m, "v", at=T0, inference_ms=60_000.0)
    assert m.snapshot(T0).utilisation == 1.0


def test_free_slots_follow_loads_and_unloads() -> None:
    m = monitor(slots=2)
    assert m.snapshot(T0).free_slots == 2
    m.loaded(profile("a"))
    m.loaded(profile("a"))  # loading the same variant twice holds one slot
    assert m.snapshot(T0).free_slots == 1
    m.loaded(profile("b"))
    m.loaded(profile("c"))  # more than its slots: never negative
    assert m.snapshot(T0).free_slots == 0
    m.unloaded("b")
    m.unloaded("c")
    state = m.snapshot(T0)
    assert state.free_slots == 1
    assert [i.variant_id for i in state.instances] == ["a"]


def test_instances_are_reported_sorted_by_variant() -> None:
    m = monitor()
    for vid in ["c", "a", "b"]:
        m.loaded(profile(vid))
    assert [i.variant_id for i in m.snapshot(T0).instances] == ["a", "b", "c"]


def test_overloaded_when_busy_at_least_90_percent_of_the_window() -> None:
    m = monitor(slots=1)
    m.loaded(profile("v", {1: 100.0}))
    # 44 runs of 100 ms = 4.4 s busy of 5 s (88 %): still Active.
    for i in range(44):
        run(m, "v", at=T0 + i * 0.1, inference_ms=100.0)
    assert instance(m.snapshot(T0 + 4.4), "v").state is InstanceState.ACTIVE

    # One more: 4.5 s = exactly 90 %.
    run(m, "v", at=T0 + 4.4, inference_ms=100.0)
    state = m.snapshot(T0 + 4.4)
    assert instance(state, "v").state is InstanceState.OVERLOADED
    assert state.utilisation == pytest.approx(0.9)


def test_interfered_when_p99_far_above_the_profile_while_not_overloaded() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 2.0}))  # interfered above 2 * (2.0 + 1) = 6 ms of inference
    for i in range(10):
        run(m, "v", at=T0 + i * 0.1, inference_ms=6.0)
    assert instance(m.snapshot(T0 + 1), "v").state is InstanceState.ACTIVE  # exactly at the bound

    run(m, "v", at=T0 + 1.0, inference_ms=12.0)
    stats = instance(m.snapshot(T0 + 1), "v")
    assert stats.latency_p99_ms == 12.0
    assert stats.state is InstanceState.INTERFERED


def test_queueing_alone_is_load_not_interference() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 2.0}))
    for i in range(10):
        run(m, "v", at=T0 + i * 0.1, inference_ms=2.0, queue_ms=30.0)
    stats = instance(m.snapshot(T0 + 1), "v")
    assert stats.latency_p99_ms == 32.0
    assert stats.state is InstanceState.ACTIVE


def test_overloaded_takes_precedence_over_interfered() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 1.0}))
    run(m, "v", at=T0, inference_ms=4_600.0)  # far above the profile and 92 % busy
    assert instance(m.snapshot(T0), "v").state is InstanceState.OVERLOADED


def test_back_to_active_when_the_load_drops() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 2.0}))
    for i in range(50):
        run(m, "v", at=T0 + i * 0.1, inference_ms=95.0)  # 4.75 s busy, and slow
    assert instance(m.snapshot(T0 + 5), "v").state is InstanceState.OVERLOADED

    run(m, "v", at=T0 + 9.0, inference_ms=1.5)  # load dropped; the old runs leave the window
    recovered = instance(m.snapshot(T0 + 10.5), "v")
    assert recovered.state is InstanceState.ACTIVE
    assert recovered.qps == pytest.approx(1 / WINDOW_S)


def test_a_cold_first_run_after_a_load_is_load_not_interference() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 2.0}))
    run(m, "v", at=T0, inference_ms=40.0)  # the first run pays the runtime's one-time costs
    first = instance(m.snapshot(T0), "v")
    assert first.state is InstanceState.ACTIVE
    assert first.latency_p99_ms == 40.0 and first.utilisation > 0  # still load: it was served
    assert m.snapshot(T0).online_latency_ratio == 0.0  # nor does the offline throttle see it

    run(m, "v", at=T0 + 0.1, inference_ms=40.0)  # a slow run once warm is interference
    assert instance(m.snapshot(T0 + 0.1), "v").state is InstanceState.INTERFERED

    m.unloaded("v")  # loaded again later: its first run is cold again
    m.loaded(profile("v", {1: 2.0}))
    run(m, "v", at=T0 + 10, inference_ms=40.0)
    assert instance(m.snapshot(T0 + 10), "v").state is InstanceState.ACTIVE


def test_back_to_active_when_interference_ends() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 2.0}))
    run(m, "v", at=T0 - 10, inference_ms=2.0)  # warm
    run(m, "v", at=T0, inference_ms=30.0)
    assert instance(m.snapshot(T0), "v").state is InstanceState.INTERFERED
    run(m, "v", at=T0 + 6, inference_ms=2.0)
    assert instance(m.snapshot(T0 + 6), "v").state is InstanceState.ACTIVE


def test_queue_length_counts_runs_in_flight() -> None:
    m = monitor()
    m.loaded(profile("v"))
    m.started("v")
    m.started("v")
    m.started("v")
    assert instance(m.snapshot(T0), "v").queue_length == 3

    m.finished("v", at=T0, batch=1, queue_ms=0.0, inference_ms=1.0)
    assert instance(m.snapshot(T0), "v").queue_length == 2


def test_abandoned_runs_leave_the_queue_without_a_sample() -> None:
    m = monitor()
    m.loaded(profile("v"))
    m.started("v")
    m.started("v")

    m.abandoned("v")
    stats = instance(m.snapshot(T0), "v")
    assert stats.queue_length == 1
    assert stats.qps == 0.0  # no latency sample recorded

    m.abandoned("v")
    m.abandoned("v")  # never below zero
    assert instance(m.snapshot(T0), "v").queue_length == 0


def test_batched_runs_at_their_profiled_latency_are_not_interfered() -> None:
    m = monitor()
    m.loaded(profile("v", {1: 1.0, 8: 10.0}))
    for i in range(10):
        run(m, "v", at=T0 + i * 0.1, inference_ms=9.0, batch=8)  # faster than the batch-8 profile

    assert instance(m.snapshot(T0 + 1), "v").state is InstanceState.ACTIVE
