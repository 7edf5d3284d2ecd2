"""When offline work may use a worker: INFaaS §6.3.2 as a pure function over explicit state.

INFaaS throttles offline queries "when utilization for the underlying worker exceeds a threshold
(set to 40%), or the observed latency for online queries exceeds a model/variant's profiled
latency". Here the signals come from the worker's own report (``WorkerState``):

- the share of its compute online queries use (offline runs are counted apart);
- its online instances' p99 latency over their profiles, queueing included;
- its instances' states: one Overloaded or Interfered (INFaaS Figure 4) means online traffic is
  being turned away from it, which is no time for offline work either.

The thresholds (``ThrottleConfig``; ``MODELLESS_OFFLINE_*`` settings):

- **utilisation**: pause above 40 % (INFaaS's value), resume below 30 %;
- **latency**: pause when the online p99 passes 2x the profile, resume below 1.5x. INFaaS pauses
  as soon as observed latency exceeds the profiled one (1x); here the observed figure is the
  worker's own online latency, queueing included (so that waiting behind an offline run counts),
  while the profile is an inference alone. Online traffic queues behind itself with no offline
  work at all (two queries arriving together: the second waits one inference), so at 1x offline
  work would pause for the online load's own queueing and starve. 2x, and 1.5x to resume, are
  the factors at which the worker itself declares an instance Interfered and lets it go
  (monitoring.INTERFERED_FACTOR / INTERFERED_EXIT_FACTOR): since this measure includes queueing
  and that one does not, offline work pauses no later than online traffic would be turned away
  from the instance. ``bench/offline.py`` reports the ratio online load alone produces;
- **instance state**: an Overloaded or Interfered instance pauses offline work on its worker.

Each exit has hysteresis: pause above one threshold, resume only below a lower one, in a report
taken after the pause began, once the pause has lasted its minimum. That minimum doubles each
time a pause follows soon after a resume (offline work, or what comes with it, is then the likely
cause: on one machine the runner's own reads and writes compete with the worker) and falls back
once offline work has run a while without trouble: the duty cycle of harmful offline work
shrinks instead of flapping at the report period.

``next_state`` is pure: the caller supplies the time, so tests step it tick by tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modelless.types import InstanceState, WorkerState


@dataclass(frozen=True)
class ThrottleConfig:
    pause_utilisation: float = 0.40  # INFaaS's threshold
    resume_utilisation: float = 0.30
    pause_latency_ratio: float = 2.0  # online p99 / (profile + slack), see the docstring above
    resume_latency_ratio: float = 1.5
    min_pause_s: float = 2.0  # two report periods: a pause is never shorter
    max_pause_s: float = 60.0  # the longest the minimum grows to
    probation_s: float = 10.0  # a pause this soon after a resume doubles the next minimum
    stale_after_s: float = 3.0  # a report older than this cannot vouch for the worker

    def __post_init__(self) -> None:
        if not 0.0 <= self.resume_utilisation <= self.pause_utilisation:
            raise ValueError("need 0 <= resume_utilisation <= pause_utilisation")
        if not 0.0 <= self.resume_latency_ratio <= self.pause_latency_ratio:
            raise ValueError("need 0 <= resume_latency_ratio <= pause_latency_ratio")

    def minimum_pause_s(self, strikes: int) -> float:
        return min(self.max_pause_s, self.min_pause_s * 2.0 ** min(strikes, 30))


@dataclass(frozen=True)
class ThrottleState:
    """One worker, as offline work sees it: paused or not, since when, why, and how many pauses
    in a row came soon after a resume."""

    paused: bool = False
    since: float = -math.inf  # when the current pause (or run) began
    reason: str = ""
    strikes: int = 0


RUNNING = ThrottleState()
TROUBLED = (InstanceState.OVERLOADED, InstanceState.INTERFERED)


def next_state(
    state: ThrottleState, worker: WorkerState | None, now: float, config: ThrottleConfig
) -> ThrottleState:
    """The worker's throttle state at ``now`` given its latest report (None: it is not reporting)."""
    if worker is None:
        return _pause(state, now, "the worker is not reporting", config)
    age = now - worker.reported_at
    if age > config.stale_after_s:
        return _pause(state, now, f"{worker.worker_id}'s last report is {age:.1f} s old", config)
    online = worker.online_utilisation
    ratio = worker.online_latency_ratio
    if online > config.pause_utilisation:
        reason = f"{worker.worker_id}: online utilisation {online:.0%} > {config.pause_utilisation:.0%}"
        return _pause(state, now, reason, config)
    if ratio > config.pause_latency_ratio:
        reason = (
            f"{worker.worker_id}: online p99 at {ratio:.1f}x its profile > {config.pause_latency_ratio:g}x"
        )
        return _pause(state, now, reason, config)
    troubled = next((i for i in worker.instances if i.state in TROUBLED), None)
    if troubled is not None:
        reason = f"{worker.worker_id}: {troubled.variant_id} is {troubled.state.value}"
        return _pause(state, now, reason, config)
    if not state.paused:
        if state.strikes and now - state.since >= config.probation_s:
            return ThrottleState(False, state.since, "", 0)  # ran a while without trouble
        return state
    # Paused, and the worker is under the pause thresholds: resume only once it is under the
    # lower resume thresholds too, in a report taken after the pause began (the report window
    # must have seen the calm), and the pause has lasted its minimum.
    if (
        now - state.since >= config.minimum_pause_s(state.strikes)
        and worker.reported_at > state.since
        and online <= config.resume_utilisation
        and ratio <= config.resume_latency_ratio
    ):
        return ThrottleState(False, now, "", state.strikes)
    return state


def _pause(state: ThrottleState, now: float, reason: str, config: ThrottleConfig) -> ThrottleState:
    if state.paused:
        # The pause goes on; its start stays (the minimum counts from it), its reason is the latest.
        return state if state.reason == reason else ThrottleState(True, state.since, reason, state.strikes)
    strikes = state.strikes + 1 if now - state.since < config.probation_s else 0
    return ThrottleState(True, now, reason, strikes)
