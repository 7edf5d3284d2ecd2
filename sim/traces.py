"""Workloads for the simulator: load shapes (INFaaS's three patterns, a real arrival trace scaled
to a target rate), model popularity (Zipf over the zoo) and the query arrivals they make.

A load shape is a ``RateCurve``: queries per second, piecewise constant over bins. Arrivals are a
Poisson process at the curve's rate (exponential gaps within each bin; the process is memoryless,
so starting afresh at each bin's edge is exact), each query drawn from the architectures by
their Zipf popularity and sent with that architecture's targets (accuracy and latency, model-less
or naming its model; the baselines, which cannot take a model-less query, are sent the
architecture's name).

The real trace (``../shared/traces/azure_llm_conv_2023.csv``: one hour, 19,365 request arrivals
to an Azure LLM inference service, CC-BY, Patel et al., ISCA 2024) is read at run time, never
copied into the repository; its per-bin arrival counts give the curve's shape, which
``RateCurve.scaled_to_mean`` keeps while scaling the rate (INFaaS §6.1 mapped a Twitter trace
to 10..1,000 QPS).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

import numpy as np

from modelless.types import QueryTargets
from sim.simulator import Arrival

# The repository's sibling ``shared/`` (this file is <repo>/sim/traces.py).
TRACE_PATH = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "azure_llm_conv_2023.csv"


@dataclass(frozen=True)
class RateCurve:
    """Queries per second, one value per ``bin_s`` seconds."""

    name: str
    bin_s: float
    rates: tuple[float, ...]

    @property
    def duration_s(self) -> float:
        return self.bin_s * len(self.rates)

    @property
    def mean(self) -> float:
        return sum(self.rates) / len(self.rates) if self.rates else 0.0

    @property
    def peak(self) -> float:
        return max(self.rates, default=0.0)

    def rate_at(self, t: float) -> float:
        index = int(t // self.bin_s)
        return self.rates[min(max(index, 0), len(self.rates) - 1)]

    def scaled_to_mean(self, mean_qps: float, name: str | None = None) -> RateCurve:
        """The same shape with its mean rate at ``mean_qps``."""
        factor = mean_qps / self.mean
        return replace(self, name=name or self.name, rates=tuple(r * factor for r in self.rates))

    def window(self, start_s: float, length_s: float, name: str | None = None) -> RateCurve:
        """The contiguous part from ``start_s`` lasting ``length_s`` (whole bins)."""
        first = int(start_s // self.bin_s)
        count = max(1, math.ceil(length_s / self.bin_s))
        return replace(self, name=name or self.name, rates=self.rates[first : first + count])

    def busiest_window(self, length_s: float) -> float:
        """Where the ``length_s`` window with the most queries starts."""
        count = max(1, math.ceil(length_s / self.bin_s))
        if count >= len(self.rates):
            return 0.0
        sums = [sum(self.rates[i : i + count]) for i in range(len(self.rates) - count + 1)]
        return sums.index(max(sums)) * self.bin_s


def pattern(name: str, duration_s: float, rate: object) -> RateCurve:
    """A synthetic pattern, one-second bins, ``rate(t)`` taken at each bin's start."""
    assert callable(rate)
    return RateCurve(name, 1.0, tuple(float(rate(float(t))) for t in range(int(duration_s))))


def fluctuating_rate(t: float) -> float:
    """INFaaS §6.2 (c): 4 QPS, with spikes to 80 QPS at 60-90 s and 150-180 s."""
    return 80.0 if 60.0 <= t < 90.0 or 150.0 <= t < 180.0 else 4.0


# INFaaS §6.2's three patterns (Figure 6 runs them for about 300 s).
PATTERN_SECONDS = 300.0
PATTERNS = {
    "flat": pattern("flat, low load (4 QPS)", PATTERN_SECONDS, lambda t: 4.0),
    "steady": pattern(
        "steady, high load (650 → 700 QPS)", PATTERN_SECONDS, lambda t: 650.0 + 50.0 * t / PATTERN_SECONDS
    ),
    "fluctuating": pattern("fluctuating load (4 ↔ 80 QPS)", PATTERN_SECONDS, fluctuating_rate),
}


def load_trace(path: Path = TRACE_PATH) -> list[float]:
    """The trace's arrival times, in seconds from its first request (its TIMESTAMP column:
    ``YYYY-MM-DD HH:MM:SS.fffffff``)."""
    offsets: list[float] = []
    with path.open() as lines:
        header = next(lines).strip().split(",")
        if header[0] != "TIMESTAMP":
            raise ValueError(f"{path}: expected a TIMESTAMP column first, found {header[0]!r}")
        for number, line in enumerate(lines, start=2):
            stamp = line.split(",", 1)[0].strip()
            if not stamp:
                continue
            try:
                day, clock = stamp.split(" ")
                hours, minutes, seconds = clock.split(":")
                days = date.fromisoformat(day).toordinal()
                offsets.append(days * 86400.0 + int(hours) * 3600.0 + int(minutes) * 60.0 + float(seconds))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: bad timestamp {stamp!r}") from error
    if not offsets:
        raise ValueError(f"{path}: no arrivals")
    offsets.sort()
    first = offsets[0]
    return [t - first for t in offsets]


def trace_curve(offsets: Sequence[float], bin_s: float, name: str = "trace") -> RateCurve:
    """The arrival rate per ``bin_s`` bin (the last, partial bin dropped unless it is the only one)."""
    bins = max(1, int(offsets[-1] // bin_s))
    counts = [0] * (bins + 1)
    for t in offsets:
        counts[int(t // bin_s)] += 1
    if len(counts) > 1:
        counts = counts[:bins]
    return RateCurve(name, bin_s, tuple(c / bin_s for c in counts))


# --- model popularity -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    """One architecture of the zoo as the workload asks for it: the targets a query
    for it carries, the SLO it is judged by (its latency target), and its name (for baselines)."""

    model: str
    targets: QueryTargets
    slo_ms: float


def zipf_weights(count: int, exponent: float = 1.0) -> list[float]:
    """Popularity of ranks 1..count under Zipf's law, summing to 1."""
    raw = [1.0 / rank**exponent for rank in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


@dataclass(frozen=True)
class Mix:
    """Architectures, most popular first, with their shares of the queries."""

    architectures: tuple[Architecture, ...]
    shares: tuple[float, ...]

    @classmethod
    def zipf(cls, architectures: Sequence[Architecture], exponent: float = 1.0) -> Mix:
        return cls(tuple(architectures), tuple(zipf_weights(len(architectures), exponent)))

    def cumulative(self) -> list[float]:
        total, out = 0.0, []
        for share in self.shares:
            total += share
            out.append(total)
        return out

    def share_of(self, model: str) -> float:
        return next(s for a, s in zip(self.architectures, self.shares, strict=True) if a.model == model)


def arrivals(curve: RateCurve, mix: Mix, seed: int, warmup_s: float = 0.0) -> Iterator[Arrival]:
    """Poisson arrivals at ``curve``'s rate, each for an architecture drawn from ``mix``; the
    first ``warmup_s`` seconds at the curve's first rate (unmeasured), the curve after them.

    Per bin: a Poisson count at the bin's rate, placed uniformly in the bin (the same process
    as exponential gaps), drawn in bulk with numpy's seeded generator."""
    generator = np.random.default_rng(seed)
    cumulative = np.array(mix.cumulative())
    cumulative[-1] = 1.0
    targets = [a.targets for a in mix.architectures]
    slos = [a.slo_ms for a in mix.architectures]
    models = [a.model for a in mix.architectures]
    segments = [(0.0, warmup_s, curve.rates[0])] if warmup_s > 0 else []
    segments += [
        (warmup_s + i * curve.bin_s, warmup_s + (i + 1) * curve.bin_s, rate)
        for i, rate in enumerate(curve.rates)
    ]
    for start, end, rate in segments:
        count = int(generator.poisson(rate * (end - start))) if rate > 0 else 0
        if count == 0:
            continue
        times = np.sort(generator.uniform(start, end, count)).tolist()
        picks = np.searchsorted(cumulative, generator.random(count), side="right").tolist()
        for t, k in zip(times, picks, strict=True):
            yield Arrival(t, targets[k], slos[k], models[k])
