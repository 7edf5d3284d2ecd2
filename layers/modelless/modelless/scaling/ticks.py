"""The deployed scaler's clock: a tick every ``period_s`` within each scheduled invocation.

EventBridge runs the Scaler function once a minute at most (``rate(1 minute)`` in template.yaml):
a plan made once a minute follows a 30 s spike only once it is over (INFaaS's fluctuating
pattern), where the embedded stack ticks every 5 s. So each invocation ticks every ``period_s``
until the next invocation is due: at the first moment, then on the grid ``scheduled + k·period_s``
of the event's scheduled time. The caller keeps one ``ScheduledTicks`` (and one ``Scaler``) per
container, so that the scaler's hold timers run on across ticks and warm invocations.

Two invocations must never tick at once (each container has its own Scaler, whose hold timers
would fight the other's): EventBridge delivers an event at least once and retries a failed
invocation, and a last tick that overruns meets the next invocation's first. Each tick is taken
under a lease in the metadata store (``acquire_scaler_lease``: SET NX PX, extended by its holder
tick by tick, dropped when it stops; a crashed holder's lapses a period and a tick's reserve after
its last tick). The lease names the schedule its holder ticks for: an invocation that finds it
held for the same or a later schedule is a duplicate, or late, and stops; one that finds an
earlier invocation still ticking leaves that tick out and tries again at the next.

An invocation stops before a tick that Lambda's remaining time would not cover: the longest tick
this container has run, and at least ``min_reserve_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from aws_lambda_powertools import Logger

logger = Logger(service="scaler", child=True)

SCHEDULE_S = 60.0  # the EventBridge schedule's interval: rate(1 minute), the finest it allows
DEFAULT_PERIOD_S = 10.0
MIN_TICK_RESERVE_S = 5.0  # a tick: the store's reads, a 1 s solve, the Auto Scaling and worker calls

T = TypeVar("T")


class ScalerLease(Protocol):
    """The metadata store's scaler lease (``MetadataStore``)."""

    def acquire_scaler_lease(self, owner: str, ttl_s: float) -> bool: ...

    def release_scaler_lease(self, owner: str) -> None: ...

    def scaler_lease_holder(self) -> str | None: ...


@dataclass(frozen=True)
class TickWindow(Generic[T]):
    """What one invocation did: each tick's result in order, the ticks it left out because
    another invocation held the lease, those that raised (logged), and why it stopped."""

    results: list[T]
    skipped: int
    failed: int
    stopped: str


class ScheduledTicks(Generic[T]):
    def __init__(
        self,
        tick: Callable[[float], T],
        lease: ScalerLease,
        period_s: float = DEFAULT_PERIOD_S,
        schedule_s: float = SCHEDULE_S,
        min_reserve_s: float = MIN_TICK_RESERVE_S,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``tick(now)``: one scaling tick at wall-clock ``now``. ``clock`` is the wall clock
        (the event's scheduled time is one)."""
        if not (math.isfinite(period_s) and 0 < period_s <= schedule_s):
            raise ValueError(
                f"the scaler's period must be above 0 and at most {schedule_s:g} s, got {period_s!r}"
            )
        self._tick = tick
        self._lease = lease
        self._period_s = period_s
        self._schedule_s = schedule_s
        self._min_reserve_s = min_reserve_s
        self._clock = clock
        self._sleep = sleep
        self._longest_tick_s = 0.0

    @property
    def period_s(self) -> float:
        return self._period_s

    @property
    def reserve_s(self) -> float:
        """The time a tick is allowed: the longest this container has run, at least the minimum."""
        return max(self._min_reserve_s, self._longest_tick_s)

    def run(
        self, scheduled_at: float | None, remaining_ms: Callable[[], int], invocation_id: str
    ) -> TickWindow[T]:
        """Tick until the invocation after the one scheduled at ``scheduled_at`` (the event's
        time; None: now) is due, or until ``remaining_ms()`` (the Lambda context's) would not
        cover a tick. Raises the last error when every tick it ran failed."""
        now = self._clock()
        # When the next invocation is due: a schedule after this one, but within a schedule from
        # now (a clock ahead of EventBridge's), and not before now (a late or retried event
        # ticks once).
        due = now + self._schedule_s
        if scheduled_at is not None:
            due = min(max(scheduled_at + self._schedule_s, now), due)
        grid = due - self._schedule_s
        owner = f"{due:.3f}/{invocation_id}"
        results: list[T] = []
        skipped = failed = 0
        last_error: Exception | None = None
        stopped = "the next invocation is due"
        try:
            while True:
                if remaining_ms() / 1000 < self.reserve_s:
                    stopped = "the invocation's remaining time would not cover a tick"
                    break
                if self._lease.acquire_scaler_lease(owner, self._period_s + self.reserve_s):
                    started = self._clock()
                    try:
                        results.append(self._tick(started))
                    except Exception as error:  # the next tick may well succeed: log, go on
                        logger.exception("scaling tick failed")
                        failed += 1
                        last_error = error
                    self._longest_tick_s = max(self._longest_tick_s, self._clock() - started)
                elif self._holder_due() >= due - 1e-3:
                    stopped = "another invocation ticks for this schedule or a later one"
                    break
                else:
                    skipped += 1  # an earlier invocation still ticks: try again at the next tick
                now = self._clock()
                step = math.floor((now - grid) / self._period_s + 1e-9) + 1
                if step * self._period_s >= self._schedule_s - 1e-6:
                    break  # the next invocation is due
                wait_s = grid + step * self._period_s - now
                if remaining_ms() / 1000 - wait_s < self.reserve_s:
                    stopped = "the invocation's remaining time would not cover a tick"
                    break
                self._sleep(wait_s)
        finally:
            try:
                self._lease.release_scaler_lease(owner)
            except Exception:  # the store is unreachable: the lease lapses on its own
                logger.exception("could not release the scaler's lease")
        if last_error is not None and not results:
            raise last_error
        return TickWindow(results, skipped, failed, stopped)

    def _holder_due(self) -> float:
        """When the invocation after the lease holder's is due; -inf when nobody holds it (it
        lapsed meanwhile) or the holder is not one of these loops."""
        holder = self._lease.scaler_lease_holder()
        try:
            return float(holder.split("/", 1)[0]) if holder is not None else -math.inf
        except ValueError:
            return -math.inf
