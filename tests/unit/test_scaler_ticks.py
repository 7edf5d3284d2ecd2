"""The deployed scaler's ticks within each scheduled invocation (modelless.scaling.ticks), on a
fake clock and a fake Lambda context: the grid, the stop before the next invocation or the end of
the invocation's time, the lease that keeps two invocations from ticking at once, and a real
Scaler whose hold timers run on across ticks and invocations."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.scaling.controller import Scaler, ScalerConfig, ScalingReport
from modelless.scaling.ticks import SCHEDULE_S, ScheduledTicks, TickWindow
from tests.unit.test_scaler import GROUP, FakeProvider, load
from tests.unit.test_scaler import store as scaler_store  # noqa: F401 (the scaler's fixture)

T = 1_800_000_000.0  # an EventBridge schedule's time (a whole minute)
R = TypeVar("R")


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept.append(seconds)
        self.now += seconds


class FakeContext:
    """Lambda's context: the remaining time of an invocation that started at ``started`` with
    a ``timeout_s`` timeout, on the fake clock."""

    def __init__(self, clock: FakeClock, timeout_s: float = 70.0) -> None:
        self._clock = clock
        self._deadline = clock.now + timeout_s
        self.aws_request_id = f"req-{clock.now:.0f}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock.now) * 1000))


class Recorder:
    """A tick that records when it ran and takes ``duration_s`` of the fake clock."""

    def __init__(self, clock: FakeClock, duration_s: float = 0.5) -> None:
        self.clock = clock
        self.duration_s = duration_s
        self.at: list[float] = []
        self.during: Callable[[int], None] | None = None  # called with the tick's index

    def __call__(self, now: float) -> float:
        self.at.append(now)
        if self.during is not None:
            self.during(len(self.at) - 1)
        self.clock.now += self.duration_s
        return now


def setup(
    start: float = T + 0.3, duration_s: float = 0.5, period_s: float = 10.0
) -> tuple[FakeClock, InMemoryMetadataStore, Recorder, ScheduledTicks[float]]:
    clock = FakeClock(start)
    store = InMemoryMetadataStore(lease_clock=clock)
    tick = Recorder(clock, duration_s)
    return clock, store, tick, ScheduledTicks(tick, store, period_s=period_s, clock=clock, sleep=clock.sleep)


def run(
    ticks: ScheduledTicks[R], clock: FakeClock, scheduled: float | None, timeout_s: float = 70.0
) -> TickWindow[R]:
    context = FakeContext(clock, timeout_s)
    return ticks.run(scheduled, context.get_remaining_time_in_millis, context.aws_request_id)


def test_an_invocation_ticks_every_period_until_the_next_one_is_due() -> None:
    clock, store, tick, ticks = setup()

    window = run(ticks, clock, scheduled=T)

    # At once (0.3 s after the schedule), then on the schedule's grid, never at the next one's.
    assert tick.at == [T + 0.3, T + 10, T + 20, T + 30, T + 40, T + 50]
    assert window.results == tick.at
    assert (window.skipped, window.failed, window.stopped) == (0, 0, "the next invocation is due")
    assert clock.now == pytest.approx(T + 50.5)  # it returns after its last tick, no wait
    assert store.scaler_lease_holder() is None  # released for the next invocation


def test_warm_invocations_tick_on_with_the_same_loop() -> None:
    clock, _, tick, ticks = setup()
    run(ticks, clock, scheduled=T)
    clock.now = T + 60.2  # the next minute's invocation, in the same container

    run(ticks, clock, scheduled=T + 60)

    assert tick.at == [
        T + 0.3,
        *(T + 10 * k for k in range(1, 6)),
        T + 60.2,
        *(T + 10 * k for k in range(7, 12)),
    ]


@pytest.mark.parametrize("period_s", [5.0, 15.0, 60.0])
def test_other_periods_fill_the_minute_on_their_grid(period_s: float) -> None:
    clock, _, tick, ticks = setup(period_s=period_s)

    run(ticks, clock, scheduled=T)

    assert tick.at == [T + 0.3, *(T + period_s * k for k in range(1, math.ceil(SCHEDULE_S / period_s)))]


def test_a_late_invocation_ticks_at_once_then_joins_the_grid() -> None:
    clock, _, tick, ticks = setup(start=T + 23.0)  # a cold start and a slow first connection

    run(ticks, clock, scheduled=T)

    assert tick.at == [T + 23, T + 30, T + 40, T + 50]


def test_an_event_from_long_ago_ticks_once() -> None:
    # A retried delivery of an old schedule: its next invocation is long due.
    clock, _, tick, ticks = setup(start=T + 3600)

    window = run(ticks, clock, scheduled=T)

    assert tick.at == [T + 3600]
    assert window.stopped == "the next invocation is due"


def test_without_a_scheduled_time_the_grid_starts_now() -> None:
    clock, _, tick, ticks = setup(start=T + 7)

    run(ticks, clock, scheduled=None)

    assert tick.at == [T + 7 + 10 * k for k in range(6)]


def test_it_stops_before_a_tick_the_remaining_time_would_not_cover() -> None:
    clock, _, tick, ticks = setup()

    window = run(ticks, clock, scheduled=T, timeout_s=25.0)

    # At T+20 there are 5.3 s left: a tick's reserve (5 s). At T+30 there would be none.
    assert tick.at == [T + 0.3, T + 10, T + 20]
    assert window.stopped == "the invocation's remaining time would not cover a tick"
    assert clock.now == pytest.approx(T + 20.5)  # no sleep into the timeout


def test_the_reserve_grows_to_the_longest_tick_seen() -> None:
    clock, _, tick, ticks = setup(duration_s=8.0)

    run(ticks, clock, scheduled=T, timeout_s=25.0)

    # After an 8 s tick, 5.3 s left at T+20 would not cover the next one.
    assert tick.at == [T + 0.3, T + 10]
    assert ticks.reserve_s == 8.0


def test_no_time_at_all_means_no_tick() -> None:
    clock, store, tick, ticks = setup()

    window = run(ticks, clock, scheduled=T, timeout_s=3.0)

    assert tick.at == [] and window.results == []
    assert store.scaler_lease_holder() is None


def test_the_lease_is_held_while_ticking_and_outlives_the_wait_for_the_next_tick() -> None:
    clock, store, tick, ticks = setup()
    holders: list[str | None] = []

    def look(index: int) -> None:
        holders.append(store.scaler_lease_holder())
        clock.now += 14.9  # still held just before a period and a tick's reserve have passed
        holders.append(store.scaler_lease_holder())
        clock.now -= 14.9

    tick.during = look
    run(ticks, clock, scheduled=T)

    assert len(holders) == 12
    assert all(holder == f"{T + 60:.3f}/req-{T + 0.3:.0f}" for holder in holders)


def test_an_earlier_invocation_still_ticking_is_waited_for() -> None:
    clock, store, tick, ticks = setup()
    # The previous minute's invocation ticks (its lease lapses at T+12.3, a tick after its last).
    assert store.acquire_scaler_lease(f"{T:.3f}/previous", ttl_s=12.0)

    window = run(ticks, clock, scheduled=T)

    assert tick.at == [T + 20, T + 30, T + 40, T + 50]
    assert window.skipped == 2


def test_a_duplicate_invocation_of_the_same_schedule_returns_at_once() -> None:
    clock, store, tick, ticks = setup()
    twin = f"{T + 60:.3f}/twin"
    assert store.acquire_scaler_lease(twin, ttl_s=15.0)

    window = run(ticks, clock, scheduled=T)

    assert tick.at == [] and clock.slept == []
    assert window.stopped == "another invocation ticks for this schedule or a later one"
    assert store.scaler_lease_holder() == twin  # the twin's lease is left alone


def test_an_invocation_whose_tick_overran_hands_over_to_the_next_one() -> None:
    clock, store, tick, ticks = setup()

    def overrun(index: int) -> None:
        if index == 2:  # the tick at T+20 hangs for 16 s: its lease (a period and 5 s) lapses...
            clock.now += 16
            assert store.acquire_scaler_lease(f"{T + 120:.3f}/next", ttl_s=15.0)  # ...and is taken

    tick.during = overrun
    window = run(ticks, clock, scheduled=T)

    assert tick.at == [T + 0.3, T + 10, T + 20]
    assert window.stopped == "another invocation ticks for this schedule or a later one"
    assert store.scaler_lease_holder() == f"{T + 120:.3f}/next"


def test_a_failing_tick_is_logged_and_the_next_ones_run() -> None:
    clock, _, tick, ticks = setup()

    def fail_once(index: int) -> None:
        if index == 1:
            raise ConnectionError("redis went away")

    tick.during = fail_once
    window = run(ticks, clock, scheduled=T)

    assert len(tick.at) == 6 and window.failed == 1 and len(window.results) == 5


def test_an_invocation_whose_every_tick_fails_fails(caplog: pytest.LogCaptureFixture) -> None:
    clock, store, tick, ticks = setup()

    def fail(index: int) -> None:
        raise ConnectionError("redis is down")

    tick.during = fail
    with pytest.raises(ConnectionError, match="redis is down"):
        run(ticks, clock, scheduled=T)
    assert len(tick.at) == 6
    assert store.scaler_lease_holder() is None


@pytest.mark.parametrize("period_s", [0.0, -5.0, 61.0, math.nan, math.inf])
def test_a_period_outside_the_schedule_is_refused(period_s: float) -> None:
    with pytest.raises(ValueError, match="period must be above 0 and at most 60 s"):
        ScheduledTicks(lambda now: now, InMemoryMetadataStore(), period_s=period_s)


# --- a real Scaler: a spike followed while it lasts, its holds kept across invocations ---------


def test_a_30_s_spike_is_followed_while_it_lasts_and_released_after_the_hold(
    scaler_store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    store = scaler_store
    clock = FakeClock(T + 0.3)
    provider = FakeProvider({"cpu": 0})
    # The mean and INFaaS's hold, not the envelope (which remembers the spike for its history).
    config = ScalerConfig(
        window_s=10, slack=0.0, min_hold_s=30, max_workers={"cpu": 8}, provision_for_envelope=False
    )
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)
    reports: list[ScalingReport] = []

    def tick(now: float) -> ScalingReport:
        reports.append(scaler.tick(now))
        return reports[-1]

    # 2,500 q/s from T+5 to T+35: more than Lambda is worth, over before a minute has passed.
    load(store, 2500, start=int(T) + 5, seconds=30)
    ticks = ScheduledTicks(tick, store, period_s=10.0, clock=clock, sleep=clock.sleep)
    run(ticks, clock, scheduled=T)
    clock.now = T + 60.2
    run(ticks, clock, scheduled=T + 60)

    workers = [report.workers["cpu"] for report in reports]
    assert len(reports) == 12
    # Ticking once a minute, at T and T+60, would miss the spike altogether. Every 10 s, the
    # pool follows it as it happens: at T+10 (half the window's seconds loaded), T+20, T+30.
    assert workers[0] == 0
    peak = max(workers)
    assert 1 <= workers[1] < peak and workers[2] == workers[3] == peak >= 2
    # From T+40 the plan wants fewer workers: the pool keeps them for the 30 s hold, whose timer
    # runs on into the next invocation (at T+60.2 it is still held), and lets them go at T+70.
    assert [report.held.get("cpu") for report in reports[4:7]] == [(peak, 2), (peak, 0), (peak, 0)]
    assert workers[4:7] == [peak, peak, peak]
    assert workers[7:] == [0] * 5 and GROUP.key not in reports[-1].load_qps
