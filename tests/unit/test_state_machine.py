"""INFaaS Figure 4 with hysteresis, tick by tick on explicit figures (no clock, no sleeping)."""

from __future__ import annotations

import pytest

from modelless.serving.monitoring import (
    INTERFERED_EXIT_FACTOR,
    INTERFERED_FACTOR,
    OVERLOADED_BUSY_FRACTION,
    OVERLOADED_EXIT_BUSY_FRACTION,
    OVERLOADED_QUEUE,
    WorkerMonitor,
    next_state,
    saturated_queue,
)
from modelless.types import InstanceState, VariantProfile

ACTIVE, OVERLOADED, INTERFERED = InstanceState.ACTIVE, InstanceState.OVERLOADED, InstanceState.INTERFERED


def profile() -> VariantProfile:
    return VariantProfile(
        variant_id="v", app_id="a", model_name="m", pool="cpu", precision="fp32", opt_level="all",
        threads=1, artifact_key="k", size_bytes=1, load_latency_ms=1.0,
        latency_p50_ms={1: 10.0}, latency_p99_ms={1: 10.0}, peak_memory_mb=1.0, accuracy=0.9,
        price_per_second=1e-5, request_price=0.0, hardware="test", measured_on_target=True,
    )  # fmt: skip


def drive(ticks: list[tuple[float, int, float]], start: InstanceState = ACTIVE) -> list[InstanceState]:
    """Feed (busy fraction, queued, slowdown) figures one report at a time."""
    states, state = [], start
    for busy, queued, slowdown in ticks:
        state = next_state(state, busy, queued, slowdown)
        states.append(state)
    return states


def test_saturation_enters_overloaded_and_leaves_only_well_below_it() -> None:
    hovering = OVERLOADED_EXIT_BUSY_FRACTION + 0.05  # between the two thresholds
    states = drive(
        [
            (0.5, 0, 1.0),
            (OVERLOADED_BUSY_FRACTION, 0, 1.0),  # enters
            (hovering, 0, 1.0),  # stays: not yet below the exit threshold
            (hovering, 0, 1.0),
            (OVERLOADED_EXIT_BUSY_FRACTION - 0.05, 0, 1.0),  # leaves
        ]
    )
    assert states == [ACTIVE, OVERLOADED, OVERLOADED, OVERLOADED, ACTIVE]
    # Without having been Overloaded, the same hovering load is just Active.
    assert next_state(ACTIVE, hovering, 0, 1.0) is ACTIVE


def test_a_long_queue_is_overload_whatever_the_busy_time() -> None:
    assert next_state(ACTIVE, 0.1, OVERLOADED_QUEUE, 1.0) is OVERLOADED
    assert next_state(OVERLOADED, 0.1, OVERLOADED_QUEUE // 2, 1.0) is OVERLOADED
    assert next_state(OVERLOADED, 0.1, OVERLOADED_QUEUE // 2 - 1, 1.0) is ACTIVE


def test_a_batching_instance_is_saturated_at_two_of_its_batches_in_flight() -> None:
    # One batch running and one full batch waiting: a query arriving now could only go in a third.
    assert saturated_queue(1) == OVERLOADED_QUEUE
    assert saturated_queue(16) == 32
    assert next_state(ACTIVE, 0.1, OVERLOADED_QUEUE, 1.0, saturated_queue(16)) is ACTIVE
    assert next_state(ACTIVE, 0.1, 32, 1.0, saturated_queue(16)) is OVERLOADED
    assert next_state(OVERLOADED, 0.1, 16, 1.0, saturated_queue(16)) is OVERLOADED
    assert next_state(OVERLOADED, 0.1, 15, 1.0, saturated_queue(16)) is ACTIVE


def test_the_monitor_reports_the_batch_size_its_saturation_follows() -> None:
    monitor = WorkerMonitor("w", "cpu", "http://127.0.0.1:1", slots=2)
    variant = profile()
    monitor.loaded(variant)
    monitor.batching(variant.variant_id, 16)
    for _ in range(OVERLOADED_QUEUE):  # a batch-1 instance would be Overloaded by now
        monitor.started(variant.variant_id)
    (instance,) = monitor.snapshot(1000.0).instances
    assert instance.batch_limit == 16 and instance.queue_length == OVERLOADED_QUEUE
    assert instance.state is ACTIVE
    for _ in range(saturated_queue(16) - OVERLOADED_QUEUE):
        monitor.started(variant.variant_id)
    assert monitor.snapshot(1001.0).instances[0].state is OVERLOADED


def test_slowdown_enters_interfered_and_leaves_below_the_exit_factor() -> None:
    between = (INTERFERED_FACTOR + INTERFERED_EXIT_FACTOR) / 2
    states = drive(
        [
            (0.3, 0, 1.0),
            (0.3, 0, INTERFERED_FACTOR + 0.1),  # enters
            (0.3, 0, between),  # stays
            (0.3, 0, INTERFERED_EXIT_FACTOR - 0.1),  # leaves
        ]
    )
    assert states == [ACTIVE, INTERFERED, INTERFERED, ACTIVE]
    assert next_state(ACTIVE, 0.3, 0, between) is ACTIVE


@pytest.mark.parametrize("previous", [ACTIVE, INTERFERED])
def test_overload_takes_precedence_over_interference(previous: InstanceState) -> None:
    assert next_state(previous, OVERLOADED_BUSY_FRACTION, 0, 10.0) is OVERLOADED


def test_the_monitor_remembers_each_instance_state_between_reports() -> None:
    monitor = WorkerMonitor("w", "cpu", "http://127.0.0.1:1", slots=2)
    monitor.loaded(profile())
    # 4.6 s of inference in the 5 s window: 92 % busy -> Overloaded.
    for i in range(46):
        monitor.finished("v", at=100.0 + i * 0.1, batch=1, queue_ms=0.0, inference_ms=100.0)
    assert monitor.snapshot(104.6).instances[0].state is OVERLOADED
    # Half a second later the window holds 4.1 s of work: 82 %, between exit and entry: still Overloaded.
    assert monitor.snapshot(105.1).instances[0].state is OVERLOADED
    # Much later the window is empty: back to Active.
    assert monitor.snapshot(120.0).instances[0].state is ACTIVE
    monitor.unloaded("v")
    assert monitor.snapshot(120.0).instances == ()
