"""The pipeline tuner on a fake clock: envelopes of arrival timestamps, scale-up at once when a
window holds more than planned, scale-down only after the hold, re-plan when the workload's
shape (rate or burstiness) moves away from the plan's."""

from __future__ import annotations

import numpy as np

from modelless.pipelines.tuner import (
    MIN_PLANNED_ARRIVALS,
    Action,
    StageState,
    TunerConfig,
    burst_rate,
    envelope,
    sustained_rate,
    tune,
)

CONFIG = TunerConfig(hold_s=15.0)


def steady(rate: float, start: float, end: float) -> list[float]:
    return [float(t) for t in np.arange(start, end, 1.0 / rate)]


PLANNED = envelope(steady(10.0, 0.0, 60.0), now=60.0)  # 10 QPS, evenly spread


def planned_stage(instances: int = 2) -> StageState:
    # The plan: ``instances`` take the planned 10 QPS.
    return StageState(instances, PLANNED, capacity_qps=10.0 / instances, instances=instances)


def test_the_envelope_is_the_most_arrivals_in_any_window_of_each_length() -> None:
    arrivals = [0.0, 0.01, 0.02, 0.5, 5.0, 5.05, 5.06, 5.07, 30.0]
    assert envelope(arrivals, now=31.0, windows_s=(0.1, 1.0, 60.0)) == {0.1: 4, 1.0: 4, 60.0: 9}
    # Only the last longest window counts.
    assert envelope(arrivals, now=70.0, windows_s=(0.1, 1.0, 60.0)) == {0.1: 1, 1.0: 1, 60.0: 1}
    assert PLANNED[1.0] == 10 and PLANNED[10.0] == 100 and PLANNED[60.0] == 600


def test_only_windows_over_the_plan_that_say_enough_are_bursts() -> None:
    assert PLANNED[0.1] < MIN_PLANNED_ARRIVALS
    assert burst_rate({0.1: 50, 1.0: 10, 10.0: 100, 60.0: 600}, PLANNED) == (0.0, None)
    assert burst_rate({0.1: 1, 1.0: 30, 10.0: 150, 60.0: 600}, PLANNED) == (30.0, 1.0)
    # Arrivals may wait the stage's budget: a 1 s window's are served within 1.5 s.
    assert burst_rate({0.1: 1, 1.0: 30, 10.0: 100, 60.0: 600}, PLANNED, budget_s=0.5) == (20.0, 1.0)
    # The sustained rate leaves the short windows (below 10 s) out.
    assert sustained_rate({0.1: 50, 1.0: 12, 10.0: 110, 60.0: 600}) == 11.0


def test_traffic_as_planned_keeps_the_plan() -> None:
    state, [decision], replans = tune({"s": planned_stage()}, {"s": steady(10.0, 0.0, 60.0)}, 60.0, CONFIG)

    assert decision.action is Action.KEEP and decision.instances == 2 and replans == []
    assert state["s"].instances == 2


def test_a_burst_scales_up_at_once_and_down_only_after_the_hold() -> None:
    # 60 s as planned, then a one-second burst of 40 queries.
    arrivals = steady(10.0, 0.0, 60.0) + steady(40.0, 60.0, 61.0)
    state, [up], _ = tune({"s": planned_stage()}, {"s": arrivals}, 61.0, CONFIG)

    assert up.action is Action.UP and up.instances == 8  # 2 planned x 40/10 in the 1 s window
    assert "1 s" in up.reason

    # The burst over, the traffic is as planned again. The envelope (over the last 60 s) holds
    # the burst for a minute; then 8 are more than needed, but kept for the hold; then 2.
    arrivals += steady(10.0, 61.0, 160.0)
    actions: dict[float, Action] = {}
    for clock in np.arange(62.0, 160.0, 1.0):
        state, [decision], _ = tune(state, {"s": arrivals}, float(clock), CONFIG)
        actions[float(clock)] = decision.action
        assert decision.instances == (2 if decision.action is Action.DOWN or state["s"].instances == 2 else 8)
    holding = [c for c, a in actions.items() if a is Action.HOLD]
    [down] = [c for c, a in actions.items() if a is Action.DOWN]
    assert all(a is Action.KEEP for c, a in actions.items() if c < holding[0])
    assert holding[0] >= 61.0 + 60.0 - 1.0  # the burst left the envelope
    assert down == holding[0] + CONFIG.hold_s and state["s"].instances == 2
    assert all(a is Action.KEEP for c, a in actions.items() if c > down)


def test_a_short_dip_below_the_need_is_held_not_followed() -> None:
    state = {"s": StageState(2, PLANNED, capacity_qps=5.0, instances=4)}
    arrivals = steady(10.0, 0.0, 120.0)
    state, [first], _ = tune(state, {"s": arrivals}, 100.0, CONFIG)
    assert first.action is Action.HOLD and first.needed == 2

    # The need goes back up before the hold ends: the count never dropped, and the hold restarts.
    burst = arrivals + steady(30.0, 100.0, 101.0)
    state, [second], _ = tune(state, {"s": sorted(burst)}, 101.0, CONFIG)
    assert second.action is Action.UP and second.instances > 4
    assert state["s"].lower_since is None


def test_a_changed_rate_or_burstiness_asks_for_a_new_plan() -> None:
    _, _, doubled = tune({"s": planned_stage()}, {"s": steady(20.0, 0.0, 60.0)}, 60.0, CONFIG)
    assert [r.stage for r in doubled] == ["s"] and "rate moved +100%" in doubled[0].reason

    # The same 600 queries a minute, in 6 bursts of 100 within a second each.
    bursty = sorted(t for start in range(0, 60, 10) for t in steady(100.0, float(start), start + 1.0))
    _, [decision], shaped = tune({"s": planned_stage()}, {"s": bursty}, 60.0, CONFIG)
    assert decision.action is Action.UP
    assert [r.stage for r in shaped] == ["s"] and "burstiness" in shaped[0].reason


def test_a_burst_is_drained_within_the_budget_at_an_instances_full_throughput() -> None:
    # Each instance takes 15 QPS with room for its queue, 20 QPS flat out.
    stage = StageState(2, PLANNED, capacity_qps=15.0, instances=2, budget_ms=1000.0, throughput_qps=20.0)
    arrivals = steady(10.0, 0.0, 60.0) + steady(120.0, 60.0, 61.0)

    _, [decision], _ = tune({"s": stage}, {"s": arrivals}, 61.0, CONFIG)

    # 120 arrivals in 1 s, served within 1 s + the 1 s budget at 20 QPS each: 3 instances (the
    # 10 s window's 21 QPS at 15 QPS each asks for 2 only).
    assert decision.action is Action.UP and decision.instances == 3
    assert "120 arrivals in 1 s" in decision.reason
