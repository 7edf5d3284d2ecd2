"""The offline throttle (INFaaS §6.3.2), tick by tick on an explicit clock: pause when online
utilisation passes 40 % or online latency passes 2x its profile, resume only once calm again."""

from __future__ import annotations

import pytest

from modelless.offline.throttle import RUNNING, ThrottleConfig, ThrottleState, next_state
from modelless.serving.monitoring import WorkerMonitor
from modelless.types import InstanceState, InstanceStats, WorkerState
from tests.offline_kit import variant

CONFIG = ThrottleConfig()  # pause > 40 %, resume <= 30 %; latency 2.0x / 1.5x; 2 s minimum pause


def report(at: float, utilisation: float = 0.0, offline: float = 0.0, ratio: float = 0.0) -> WorkerState:
    return WorkerState(
        worker_id="w-1",
        pool="cpu",
        address="http://w-1",
        utilisation=utilisation,
        free_slots=1,
        reported_at=at,
        offline_utilisation=offline,
        online_latency_ratio=ratio,
    )


def step(ticks: list[tuple[float, WorkerState | None]]) -> list[ThrottleState]:
    """Feed (now, latest report) pairs through the throttle; the state after each."""
    state, seen = RUNNING, []
    for now, worker in ticks:
        state = next_state(state, worker, now, CONFIG)
        seen.append(state)
    return seen


def test_quiet_worker_runs_offline_work() -> None:
    assert not step([(0.0, report(0.0, utilisation=0.1))])[0].paused


def test_offline_works_own_share_does_not_count_against_it() -> None:
    # 90 % busy, 70 points of it offline: online uses 20 %, under the threshold.
    state = step([(0.0, report(0.0, utilisation=0.9, offline=0.7))])[0]
    assert not state.paused


def test_online_utilisation_over_40_percent_pauses_until_below_30_percent() -> None:
    states = step(
        [
            (0.0, report(0.0, utilisation=0.35)),  # between the thresholds: keeps running
            (1.0, report(1.0, utilisation=0.45)),  # passes 40 %: pause
            (2.0, report(2.0, utilisation=0.35)),  # under 40 % but not under 30 %: still paused
            (3.0, report(3.0, utilisation=0.29)),  # calm, and the pause has lasted 2 s: resume
            (4.0, report(4.0, utilisation=0.35)),  # between the thresholds again: keeps running
        ]
    )
    assert [s.paused for s in states] == [False, True, True, False, False]
    assert states[1].reason == "w-1: online utilisation 45% > 40%"
    assert states[1].since == 1.0


def test_a_pause_lasts_its_minimum_even_when_calm_at_once() -> None:
    states = step(
        [
            (0.0, report(0.0, utilisation=0.5)),
            (1.0, report(1.0, utilisation=0.0)),  # calm already, but only 1 s into the pause
            (2.5, report(2.5, utilisation=0.0)),
        ]
    )
    assert [s.paused for s in states] == [True, True, False]


def test_resuming_needs_a_report_taken_after_the_pause_began() -> None:
    # The report that caused the pause is old; the same stale-but-fresh-enough calm report does
    # not count: the worker's window must have seen the calm after the pause.
    paused = step([(10.0, report(9.9, utilisation=0.5))])[0]
    still = next_state(paused, report(9.95, utilisation=0.1), 12.5, CONFIG)
    assert still.paused
    resumed = next_state(still, report(12.4, utilisation=0.1), 12.5, CONFIG)
    assert not resumed.paused


def test_online_latency_over_its_profile_pauses_with_hysteresis() -> None:
    states = step(
        [
            (0.0, report(0.0, ratio=1.8)),  # under 2x: runs
            (1.0, report(1.0, ratio=2.4)),  # over 2x: pause
            (3.0, report(3.0, ratio=1.7)),  # under 2x but not under 1.5x: still paused
            (4.0, report(4.0, ratio=1.2)),  # calm: resume
        ]
    )
    assert [s.paused for s in states] == [False, True, True, False]
    assert states[1].reason == "w-1: online p99 at 2.4x its profile > 2x"


def test_the_pause_reason_follows_the_latest_cause_and_keeps_its_start() -> None:
    states = step([(0.0, report(0.0, utilisation=0.5)), (1.0, report(1.0, ratio=3.0))])
    assert states[1].paused and states[1].since == 0.0 and "p99" in states[1].reason


@pytest.mark.parametrize(
    ("worker", "reason"),
    [(None, "not reporting"), (report(0.0), "last report is 5.0 s old")],
)
def test_a_silent_or_stale_worker_gets_no_offline_work(worker: WorkerState | None, reason: str) -> None:
    state = next_state(RUNNING, worker, 5.0, CONFIG)
    assert state.paused and reason in state.reason


def test_thresholds_must_leave_room_for_hysteresis() -> None:
    with pytest.raises(ValueError):
        ThrottleConfig(pause_utilisation=0.3, resume_utilisation=0.4)


def test_the_monitor_reports_offline_work_apart_from_online_traffic() -> None:
    """The two signals the throttle reads, as a worker's monitoring loop computes them."""
    profile = variant()  # p99 2 ms at batch 1
    monitor = WorkerMonitor("w-1", "cpu", "http://w-1", slots=2)
    monitor.loaded(profile)
    for i in range(10):
        monitor.started(profile.variant_id)
        # Online queries that waited 4 ms behind offline runs: 4.5 ms vs (2 + 1 slack) ms.
        monitor.finished(profile.variant_id, 100.0 + i * 0.1, 1, 4.0, 0.5)
    for i in range(20):
        monitor.finished_offline(100.0 + i * 0.1, 200.0)  # 4 s of offline work

    state = monitor.snapshot(101.0)

    assert state.offline_utilisation == pytest.approx(4000 / 10000)
    assert state.utilisation == pytest.approx((4000 + 5) / 10000)
    assert state.online_utilisation == pytest.approx(5 / 10000)
    assert state.online_latency_ratio == pytest.approx(4.5 / 3.0)
    [instance] = state.instances
    assert instance.qps == pytest.approx(10 / 5.0)  # offline runs are not online queries
    # ...and both age out of the window.
    later = monitor.snapshot(110.0)
    assert later.offline_utilisation == 0.0 and later.online_latency_ratio == 0.0


def with_instance(at: float, state: InstanceState) -> WorkerState:
    instance = InstanceStats(
        "app/m/v/cpu-1t", state, qps=5.0, latency_p50_ms=1.0, latency_p99_ms=2.0, queue_length=0
    )
    return WorkerState("w-1", "cpu", "http://w-1", 0.05, 1, at, (instance,))


@pytest.mark.parametrize("troubled", [InstanceState.INTERFERED, InstanceState.OVERLOADED])
def test_an_instance_turning_online_traffic_away_pauses_offline_work(troubled: InstanceState) -> None:
    states = step([(0.0, with_instance(0.0, troubled)), (3.0, with_instance(3.0, InstanceState.ACTIVE))])
    assert states[0].paused and states[0].reason == f"w-1: app/m/v/cpu-1t is {troubled.value}"
    assert not states[1].paused


def test_pauses_soon_after_resuming_double_the_next_minimum_pause() -> None:
    """Offline work that brings the trouble back each time it resumes runs less and less often;
    after running a while without trouble, the minimum is back to its start."""
    busy, calm = 0.5, 0.0
    ticks: list[tuple[float, WorkerState | None]] = []
    timeline = [
        (0.0, busy),  # pause (strike 0: minimum 2 s)
        (2.0, calm),  # resume
        (3.0, busy),  # 1 s after resuming: strike 1 (minimum 4 s)
        (5.0, calm),  # 2 s: not yet
        (7.0, calm),  # 4 s: resume
        (8.0, busy),  # strike 2 (minimum 8 s)
        (15.0, calm),  # 7 s: not yet
        (16.0, calm),  # 8 s: resume
        (27.0, calm),  # ran past the probation: strikes forgotten
        (28.0, busy),  # a pause long after the resume: strike 0 again
        (30.0, calm),  # 2 s: resume
    ]
    for at, utilisation in timeline:
        ticks.append((at, report(at, utilisation=utilisation)))
    states = step(ticks)
    assert [s.paused for s in states] == [
        True,
        False,
        True,
        True,
        False,
        True,
        True,
        False,
        False,
        True,
        False,
    ]
    assert [s.strikes for s in states] == [0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0]


def test_the_minimum_pause_is_capped() -> None:
    assert CONFIG.minimum_pause_s(0) == 2.0 and CONFIG.minimum_pause_s(3) == 16.0
    assert CONFIG.minimum_pause_s(10) == CONFIG.max_pause_s


def test_the_default_thresholds_are_infaas_utilisation_and_the_workers_interfered_factors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 % is INFaaS's; the latency thresholds are the worker's Interfered factors (pause when
    the instance would be judged Interfered, resume when it would be let go), and the
    deployment's settings default to the same (they are what the offline runner uses)."""
    from modelless.catalog import DEFAULT_POOLS
    from modelless.config import Settings
    from modelless.metadata.memory import InMemoryMetadataStore
    from modelless.offline.service import OfflineService
    from modelless.serving.monitoring import INTERFERED_EXIT_FACTOR, INTERFERED_FACTOR

    assert (CONFIG.pause_utilisation, CONFIG.resume_utilisation) == (0.40, 0.30)
    assert (CONFIG.pause_latency_ratio, CONFIG.resume_latency_ratio) == (
        INTERFERED_FACTOR,
        INTERFERED_EXIT_FACTOR,
    )
    for name in (
        "PAUSE_UTILISATION",
        "RESUME_UTILISATION",
        "PAUSE_LATENCY_RATIO",
        "RESUME_LATENCY_RATIO",
    ):
        monkeypatch.delenv(f"MODELLESS_OFFLINE_{name}", raising=False)
    service = OfflineService.from_settings(Settings(), InMemoryMetadataStore(), DEFAULT_POOLS)
    assert service.throttle_config() == CONFIG
    service.close()
