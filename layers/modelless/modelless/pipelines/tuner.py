"""The pipeline tuner (InferLine §5, the high-frequency tuner): between plans, each stage's
instance count follows its traffic envelope.

A stage's **envelope** is the most arrivals in any window of each of several lengths (0.1, 1, 10
and 60 s, as InferLine): short windows see bursts, long ones the rate. The plan was sized for a
planned envelope (the arrivals it was planned on, per stage); the planned instances absorb it.
On every tick the tuner compares the stage's observed envelope with the planned one:

- **scale up at once** when a window holds more arrivals than planned: to the instances that
  drain that window's arrivals within its length plus the stage's budget (the highest such
  rate of the windows over the plan) at one instance's throughput, so that the burst is met
  before its queue builds, not after;
- **scale down only after a hold**: to what the sustained rates ask for (the windows of at
  least ``SUSTAINED_WINDOW_S``, at the planned capacity), once that has stayed below the
  current count for ``hold_s`` (a burst's tail is not scaled into); never below one instance;
- **re-plan** when the workload's shape changed, which scaling the planned configuration cannot
  follow at the right cost: the long-window rate moved by more than ``replan_rate_change`` from
  the planned one, or the burstiness (short-window over long-window rate) by more than
  ``replan_burstiness_change`` times.

Pure: arrival timestamps and the previous state in, decisions and the next state out; the clock
is the caller's (``now``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

ENVELOPE_WINDOWS_S = (0.1, 1.0, 10.0, 60.0)
# A window the plan expected fewer arrivals in than this says too little to scale by (a 0.1 s
# window at a few QPS holds 0 or 1 query: noise).
MIN_PLANNED_ARRIVALS = 5
SUSTAINED_WINDOW_S = 10.0  # shorter windows show bursts: they scale up, never hold capacity


@dataclass(frozen=True)
class TunerConfig:
    windows_s: tuple[float, ...] = ENVELOPE_WINDOWS_S
    hold_s: float = 15.0  # how long a stage must ask for fewer instances before it gets them
    replan_rate_change: float = 0.5  # relative change of the long-window rate that re-plans
    replan_burstiness_change: float = 2.0  # factor on the short/long rate ratio that re-plans
    max_instances: int = 1000


@dataclass(frozen=True)
class StageState:
    """What the tuner keeps per stage between ticks."""

    planned_instances: int
    planned_envelope: Mapping[float, int]  # window (s) -> arrivals the plan absorbs
    capacity_qps: float  # one instance's planned rate within the stage's budget (queue included)
    instances: int  # what the stage runs now (what the last decision asked for)
    lower_since: float | None = None  # since when the envelope has asked for fewer
    budget_ms: float = 0.0  # the stage's share of the SLO: a window's arrivals may wait that long
    # One instance's throughput flat out (its batch over its p99): what drains a burst, whose
    # queue the window-plus-budget rate already allows for; 0: ``capacity_qps``.
    throughput_qps: float = 0.0


class Action(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"  # fewer would do, but not for long enough yet
    KEEP = "keep"


@dataclass(frozen=True)
class StageDecision:
    stage: str
    action: Action
    instances: int  # what the stage should run
    needed: int  # what its envelope asks for now
    observed: Mapping[float, int]
    reason: str


@dataclass(frozen=True)
class Replan:
    stage: str
    reason: str


def envelope(
    timestamps: Sequence[float], now: float, windows_s: Sequence[float] = ENVELOPE_WINDOWS_S
) -> dict[float, int]:
    """Window -> the most arrivals in any window of that length within the last longest window
    before ``now`` (``timestamps`` sorted, seconds)."""
    start = bisect_left(timestamps, now - max(windows_s))
    recent = np.asarray(timestamps[start:], dtype=np.float64)
    found: dict[float, int] = {}
    for window in windows_s:
        # Per arrival t, the arrivals in (t - window, t]; a window is half-open, and floats blur
        # its edge (arrivals exactly a window apart are not both in it).
        firsts = np.searchsorted(recent, recent - window + 1e-9, side="left")
        found[window] = int((np.arange(len(recent)) - firsts + 1).max()) if len(recent) else 0
    return found


def burst_rate(
    observed: Mapping[float, int], planned: Mapping[float, int], budget_s: float = 0.0
) -> tuple[float, float | None]:
    """(the highest rate of a window holding more arrivals than planned, that window); (0, None)
    when none does (windows the plan expected fewer than ``MIN_PLANNED_ARRIVALS`` in are noise).
    A window's arrivals must be served by the window's end plus the stage's budget (they may
    queue that long): its rate is its arrivals over that time, so that a clump of queries within
    a tenth of a second asks for what drains it within the budget, not for ten times its count."""
    rate, where = 0.0, None
    for window, planned_count in planned.items():
        over = planned_count >= MIN_PLANNED_ARRIVALS and observed.get(window, 0) > planned_count
        if over and observed[window] / (window + budget_s) > rate:
            rate, where = observed[window] / (window + budget_s), window
    return rate, where


def sustained_rate(observed: Mapping[float, int]) -> float:
    """The highest rate over the windows of at least ``SUSTAINED_WINDOW_S``."""
    return max(
        (count / window for window, count in observed.items() if window >= SUSTAINED_WINDOW_S), default=0.0
    )


def tune(
    state: Mapping[str, StageState],
    arrivals: Mapping[str, Sequence[float]],
    now: float,
    config: TunerConfig = TunerConfig(),
) -> tuple[dict[str, StageState], list[StageDecision], list[Replan]]:
    """One tick: per stage, its decision from its arrivals (timestamps, sorted) against its
    planned envelope; the next state; and the stages whose workload's shape asks for a new plan."""
    next_state: dict[str, StageState] = {}
    decisions: list[StageDecision] = []
    replans: list[Replan] = []
    for stage, current in state.items():
        observed = envelope(arrivals.get(stage, ()), now, config.windows_s)
        rate, window = burst_rate(observed, current.planned_envelope, current.budget_ms / 1000.0)
        burst = _instances(rate, current.throughput_qps or current.capacity_qps, config)
        needed = max(1, _instances(sustained_rate(observed), current.capacity_qps, config), burst)
        if needed > current.instances:
            action, instances, lower_since = Action.UP, needed, None
            reason = (
                f"the sustained rate needs {needed} at {current.capacity_qps:g} QPS each"
                if window is None or burst < needed
                else f"{observed[window]} arrivals in {window:g} s ({rate:g} QPS), "
                f"{current.planned_envelope[window]} planned"
            )
        elif needed < current.instances:
            lower_since = current.lower_since if current.lower_since is not None else now
            if now - lower_since >= config.hold_s:
                action, instances, lower_since = Action.DOWN, needed, None
                reason = f"the envelope asked for {needed} for {config.hold_s:g} s"
            else:
                action, instances = Action.HOLD, current.instances
                left = config.hold_s - (now - lower_since)
                reason = f"the envelope asks for {needed}; holding {left:.1f} s more"
        else:
            action, instances, lower_since, reason = Action.KEEP, current.instances, None, "within the plan"
        next_state[stage] = replace(current, instances=instances, lower_since=lower_since)
        decisions.append(StageDecision(stage, action, instances, needed, observed, reason))
        shape = _shape_change(observed, current.planned_envelope, config)
        if shape is not None:
            replans.append(Replan(stage, shape))
    return next_state, decisions, replans


def _instances(rate_qps: float, capacity_qps: float, config: TunerConfig) -> int:
    if rate_qps <= 0:
        return 0
    return min(config.max_instances, math.ceil(rate_qps / capacity_qps - 1e-9))


def _shape_change(
    observed: Mapping[float, int], planned: Mapping[float, int], config: TunerConfig
) -> str | None:
    """Why the workload no longer looks like the one planned for, or None."""
    longest = max(planned)
    if planned[longest] < MIN_PLANNED_ARRIVALS or observed.get(longest, 0) == 0:
        return None
    change = observed[longest] / planned[longest] - 1.0
    if abs(change) > config.replan_rate_change:
        return f"the {longest:g} s rate moved {change:+.0%} from the plan's"
    short = [w for w in sorted(planned) if planned[w] >= MIN_PLANNED_ARRIVALS and w < longest]
    if not short:
        return None
    window = short[0]
    planned_burst = (planned[window] / window) / (planned[longest] / longest)
    observed_burst = (observed.get(window, 0) / window) / (observed[longest] / longest)
    factor = max(observed_burst / planned_burst, planned_burst / max(observed_burst, 1e-9))
    if factor > config.replan_burstiness_change:
        return (
            f"burstiness ({window:g} s rate over the {longest:g} s rate) is {observed_burst:.2f}, "
            f"planned {planned_burst:.2f}"
        )
    return None
