"""A worker's view of its own load: per-instance QPS, latency, queue and state (INFaaS Figure 4).

Pure bookkeeping over an explicit clock, so transitions are tested tick by tick without sleeping.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from modelless.types import InstanceState, InstanceStats, VariantProfile, WorkerState

WINDOW_S = 5.0
# Each state is entered past one threshold and left only below a lower one (hysteresis), so an
# instance hovering around a threshold does not flap in and out of selection every report.
OVERLOADED_BUSY_FRACTION = 0.9  # an instance busy this share of the window is at saturation...
OVERLOADED_EXIT_BUSY_FRACTION = 0.7  # ...and stays Overloaded until it is below this
OVERLOADED_QUEUE = 8  # this many requests waiting on one instance: saturated, whatever the window says


def saturated_queue(batch_limit: int) -> int:
    """Requests in flight on one instance at which it serves at saturation: ``OVERLOADED_QUEUE``,
    or, for an instance that batches, two of its batches (one running, one full and waiting: a
    query arriving then could only go in a third). The worker's monitor and the gateway's own
    in-flight count use this one rule."""
    return max(OVERLOADED_QUEUE, 2 * max(1, batch_limit))


INTERFERED_FACTOR = 2.0  # inference p99 this many times the profile's (plus slack) = interfered...
INTERFERED_EXIT_FACTOR = 1.5  # ...until it is back under this
INTERFERED_SLACK_MS = 1.0


@dataclass(frozen=True)
class _Run:
    at: float
    batch: int
    queue_ms: float
    inference_ms: float
    # The instance's first run since its load: it pays one-time costs (the runtime's first
    # allocations, the weights' first reads) that profiling leaves out as warm-up, so it counts
    # as load but says nothing of interference.
    cold: bool = False


class WorkerMonitor:
    def __init__(self, worker_id: str, pool: str, address: str, slots: int) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.address = address
        self.slots = slots
        self._runs: dict[str, deque[_Run]] = {}
        self._warm: set[str] = set()  # instances that have finished a run since their load
        self._profiles: dict[str, VariantProfile] = {}
        self._in_flight: dict[str, int] = {}
        self._states: dict[str, InstanceState] = {}
        self._batch_limits: dict[str, int] = {}  # rows each instance's batcher takes per run now
        # Each tuned instance's (intra, inter, concurrency, measured latency scale): modelless.tuning.
        self._tuned: dict[str, tuple[int, int, int, float]] = {}
        # Instances being drained (an unload waiting for the queries they hold): no longer
        # reported, so that selection stops choosing them, but still holding their slot.
        self._draining: set[str] = set()
        # Offline batch runs (docs/ARCHITECTURE.md §6), worker-wide: they count towards the worker's busy time
        # but never towards an instance's online QPS, latency or state.
        self._offline_runs: deque[_Run] = deque()
        self._lock = threading.Lock()

    def loaded(self, variant: VariantProfile) -> None:
        """The instance is loaded (again: a drain in progress is called off)."""
        with self._lock:
            self._draining.discard(variant.variant_id)
            self._profiles[variant.variant_id] = variant
            self._runs.setdefault(variant.variant_id, deque())

    def draining(self, variant_id: str) -> None:
        """The instance is on its way out: it leaves the reports at once (selection and the scaler
        stop counting it) but keeps its slot until ``unloaded``, when its queries are done."""
        with self._lock:
            if variant_id in self._runs:
                self._draining.add(variant_id)
            self._runs.pop(variant_id, None)
            self._states.pop(variant_id, None)

    def unloaded(self, variant_id: str) -> None:
        with self._lock:
            self._draining.discard(variant_id)
            self._warm.discard(variant_id)
            self._profiles.pop(variant_id, None)
            self._runs.pop(variant_id, None)
            self._states.pop(variant_id, None)
            self._batch_limits.pop(variant_id, None)
            self._tuned.pop(variant_id, None)

    def batching(self, variant_id: str, batch_limit: int) -> None:
        """The rows the instance's batcher takes per run now: its saturation follows it."""
        with self._lock:
            if variant_id in self._runs:
                self._batch_limits[variant_id] = max(1, batch_limit)

    def tuned(self, variant_id: str, intra: int, inter: int, concurrency: int, latency_scale: float) -> None:
        """The instance runs this parallelism configuration now, its runs ``latency_scale`` times
        the profile's under it (0: not measured yet): reported so that the scaler plans with it."""
        with self._lock:
            if variant_id in self._runs:
                self._tuned[variant_id] = (intra, inter, concurrency, latency_scale)

    @property
    def draining_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._draining)

    def started(self, variant_id: str) -> None:
        with self._lock:
            self._in_flight[variant_id] = self._in_flight.get(variant_id, 0) + 1

    def abandoned(self, variant_id: str) -> None:
        """A run that failed: it leaves the queue without a latency sample."""
        with self._lock:
            self._in_flight[variant_id] = max(0, self._in_flight.get(variant_id, 0) - 1)

    def finished(self, variant_id: str, at: float, batch: int, queue_ms: float, inference_ms: float) -> None:
        with self._lock:
            self._in_flight[variant_id] = max(0, self._in_flight.get(variant_id, 0) - 1)
            runs = self._runs.get(variant_id)
            if runs is not None:  # a run that ends after its unload must not bring the instance back
                cold = variant_id not in self._warm
                self._warm.add(variant_id)
                runs.append(_Run(at, batch, queue_ms, inference_ms, cold))

    def finished_offline(self, at: float, inference_ms: float) -> None:
        """An offline batch ran for ``inference_ms`` (between online batches, never with them)."""
        with self._lock:
            self._offline_runs.append(_Run(at, 0, 0.0, inference_ms))

    def snapshot(self, now: float) -> WorkerState:
        instances: list[InstanceStats] = []
        busy_ms_total = 0.0
        latency_ratio = 0.0
        with self._lock:
            while self._offline_runs and self._offline_runs[0].at < now - WINDOW_S:
                self._offline_runs.popleft()
            offline_busy_ms = sum(r.inference_ms for r in self._offline_runs)
            for variant_id, runs in self._runs.items():
                while runs and runs[0].at < now - WINDOW_S:
                    runs.popleft()
                latencies = sorted(r.queue_ms + r.inference_ms for r in runs)
                busy_ms = sum(r.inference_ms for r in runs)
                busy_ms_total += busy_ms
                p50 = _percentile(latencies, 0.5)
                p99 = _percentile(latencies, 0.99)
                queued = self._in_flight.get(variant_id, 0)
                batch_limit = self._batch_limits.get(variant_id, 1)
                intra, inter, concurrency, latency_scale = self._tuned.get(variant_id, (0, 0, 0, 0.0))
                state = next_state(
                    self._states.get(variant_id, InstanceState.ACTIVE),
                    busy_ms / (WINDOW_S * 1000),
                    queued,
                    _slowdown(self._profiles.get(variant_id), runs),
                    saturated_queue(batch_limit),
                )
                self._states[variant_id] = state
                latency_ratio = max(latency_ratio, _latency_ratio(self._profiles.get(variant_id), runs))
                instances.append(
                    InstanceStats(
                        variant_id=variant_id,
                        state=state,
                        qps=len(runs) / WINDOW_S,
                        latency_p50_ms=p50,
                        latency_p99_ms=p99,
                        queue_length=queued,
                        utilisation=round(min(1.0, busy_ms / (WINDOW_S * 1000)), 4),
                        batch_limit=batch_limit,
                        intra_threads=intra,
                        inter_threads=inter,
                        concurrency=concurrency,
                        latency_scale=round(latency_scale, 4),
                    )
                )
            loaded_count = len(self._runs) + len(self._draining)
        capacity_ms = WINDOW_S * 1000 * max(1, self.slots)
        utilisation = min(1.0, (busy_ms_total + offline_busy_ms) / capacity_ms)
        return WorkerState(
            worker_id=self.worker_id,
            pool=self.pool,
            address=self.address,
            utilisation=round(utilisation, 4),
            free_slots=max(0, self.slots - loaded_count),
            reported_at=now,
            instances=tuple(sorted(instances, key=lambda i: i.variant_id)),
            offline_utilisation=round(min(utilisation, offline_busy_ms / capacity_ms), 4),
            online_latency_ratio=round(latency_ratio, 3),
        )


def next_state(
    previous: InstanceState,
    busy_fraction: float,
    queued: int,
    slowdown: float,
    queue_limit: int = OVERLOADED_QUEUE,
) -> InstanceState:
    """INFaaS Figure 4 for one loaded instance: Active, Overloaded (serving at saturation) or
    Interfered (slower than profiled while not overloaded), with hysteresis on every exit.
    ``queue_limit``: requests in flight at which it is saturated (``saturated_queue``)."""
    overloaded = busy_fraction >= OVERLOADED_BUSY_FRACTION or queued >= queue_limit
    if previous is InstanceState.OVERLOADED:
        still_busy = busy_fraction >= OVERLOADED_EXIT_BUSY_FRACTION or queued >= queue_limit // 2
        overloaded = overloaded or still_busy
    if overloaded:
        return InstanceState.OVERLOADED
    limit = INTERFERED_EXIT_FACTOR if previous is InstanceState.INTERFERED else INTERFERED_FACTOR
    return InstanceState.INTERFERED if slowdown > limit else InstanceState.ACTIVE


def _slowdown(profile: VariantProfile | None, runs: deque[_Run]) -> float:
    """p99 over the window of inference time / profiled time at the same batch size. Queueing is
    load, not interference, so it is left out."""
    return _p99_over_profile(profile, runs, lambda r: r.inference_ms)


def _latency_ratio(profile: VariantProfile | None, runs: deque[_Run]) -> float:
    """p99 over the window of online latency on the worker (queue + inference) / profiled time
    at the same batch size: unlike ``_slowdown``, queueing counts, since waiting behind offline
    work is exactly what the offline throttle must see."""
    return _p99_over_profile(profile, runs, lambda r: r.queue_ms + r.inference_ms)


def _p99_over_profile(
    profile: VariantProfile | None, runs: deque[_Run], measure: Callable[[_Run], float]
) -> float:
    """p99 over the window of ``measure`` / (profiled time at the run's batch size + slack), the
    cold first run after a load left out (``_Run.cold``); 0 with no profile or no warm run."""
    if profile is None:
        return 0.0
    ratios = sorted(
        measure(r) / (profile.latency_ms(min(r.batch, profile.max_batch)) + INTERFERED_SLACK_MS)
        for r in runs
        if not r.cold
    )
    return _percentile(ratios, 0.99)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return round(sorted_values[index], 3)
