"""Query load per group: what the scaler provisions for.

A group (docs/ARCHITECTURE.md §5) is the set of queries that the same variants can serve: the same app (or
named model), the same accuracy class and the same latency class. Classes round towards the
stricter side (accuracy up to the next hundredth, latency down to the class below), so whatever
serves a group serves every query in it.

The gateway counts queries per group in memory and hands the counts to the metadata store about
once a second, off the per-query path; the scaler reads the recent rate of every group. With each
second's count goes the group's peak: the most queries that arrived in one slice of
``PEAK_SLICE_S`` (100 ms) during it, the shortest window of InferLine's arrival envelope. A
per-second count cannot tell ten queries spread over a second from ten in one clump that a 50 ms
budget must absorb at once (issue 14: real arrivals are far burstier at 0.1 s than at 1 s).

"Query load" (traffic: queries per group per second) is never a variant's load (a model loaded
onto a worker): in this package "load" alone means the latter.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass

from modelless.types import QueryTargets

# Steps of 1.33-1.67x up to 1 s: a budget there loses at most 40 % to its class (with 1-2-5 steps
# up to half: an 8 ms budget was planned as 5 ms, under a 7 ms model that meets it). Coarser
# above 1 s, where a variant that misses its class by that much is rare. More classes split the
# query load into more groups: more rows in the scaler's program, not more instances (one
# instance serves several groups by time sharing).
LATENCY_CLASSES_MS = (
    1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 70.0,
    100.0, 150.0, 200.0, 300.0, 500.0, 700.0, 1000.0, 2000.0, 5000.0,
)  # fmt: skip
FLUSH_EVERY_S = 1.0
PEAK_SLICE_S = 0.1  # the slice a peak is counted in (InferLine's shortest envelope window)


@dataclass(frozen=True)
class QueryGroup:
    app_id: str
    model_name: str | None
    min_accuracy: float
    latency_ms: float  # the class's budget: no more than any query of the group allows

    @property
    def key(self) -> str:
        return f"{self.app_id}|{self.model_name or '*'}|{self.min_accuracy:.2f}|{self.latency_ms:g}"

    @classmethod
    def parse(cls, key: str) -> QueryGroup:
        app_id, model, accuracy, latency = key.split("|")
        return cls(app_id, None if model == "*" else model, float(accuracy), float(latency))


def group_of(targets: QueryTargets) -> QueryGroup:
    accuracy = math.ceil(round(targets.min_accuracy * 100, 6)) / 100
    budget = targets.latency_ms if targets.latency_ms is not None else LATENCY_CLASSES_MS[-1]
    latency = max((c for c in LATENCY_CLASSES_MS if c <= budget), default=budget)
    return QueryGroup(targets.app_id, targets.model_name, min(1.0, accuracy), latency)


class QueryLoadCounter:
    """Counts queries per group, and each group's peak per ``PEAK_SLICE_S`` slice; ``due`` says
    when the counts should go to the store."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._peaks: dict[str, int] = {}  # group -> most queries in one slice since the last take
        self._slices: dict[str, tuple[int, int]] = {}  # group -> (its current slice, queries in it)
        self._lock = threading.Lock()
        self._last_flush = 0.0

    def record(self, group: QueryGroup, now: float) -> None:
        """Count one query of ``group`` arriving at ``now`` (epoch seconds)."""
        slice_index = math.floor(now / PEAK_SLICE_S)
        key = group.key
        with self._lock:
            self._counts[key] += 1
            current, in_slice = self._slices.get(key, (slice_index, 0))
            # A slice runs on across a take: a clump split by a flush is still one clump.
            in_slice = in_slice + 1 if current == slice_index else 1
            self._slices[key] = (slice_index, in_slice)
            self._peaks[key] = max(self._peaks.get(key, 0), in_slice)

    def due(self, now: float) -> bool:
        return now - self._last_flush >= FLUSH_EVERY_S

    def take(self, now: float) -> QueryLoad:
        """The counts and peaks since the last take, which start again from zero."""
        with self._lock:
            counts, self._counts = dict(self._counts), Counter()
            peaks, self._peaks = self._peaks, {}
            self._last_flush = now
        return QueryLoad(counts, peaks)


@dataclass(frozen=True)
class QueryLoad:
    """What a gateway hands the store for one second: queries per group key, and per group key
    the most that arrived in one ``PEAK_SLICE_S`` slice."""

    counts: dict[str, int]
    peaks: dict[str, int]
