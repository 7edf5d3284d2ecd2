"""Workloads for the simulator: load shapes (INFaaS's three patterns), real arrival traces
replayed at their recorded times, bursty synthetic arrival processes, model popularity (Zipf
over the zoo) and the query arrivals they make.

Two kinds of arrival source:

- A ``RateCurve``: queries per second, piecewise constant over bins (INFaaS's patterns, and
  a trace's shape for plots). Its arrivals (``arrivals()``) are a Poisson process at the curve's
  rate (exponential gaps within each bin; the process is memoryless, so starting afresh at each
  bin's edge is exact).
- ``ArrivalTimes``: the arrival instants themselves. A recorded trace replayed at a target mean
  rate (``replay``: time-compressed, or several shifted copies superposed), or one draw of a
  bursty process (``gamma_arrivals``: renewal with Gamma gaps of a given coefficient of
  variation; ``on_off_arrivals``: a two-state Markov-modulated Poisson process). Binning a trace
  into a rate curve and drawing Poisson arrivals over it would smooth away the bursts shorter
  than a bin, and those decide how much capacity a system must hold; these keep them.
  ``burstiness()`` measures what a sequence holds: its inter-arrival CV and, per window of 0.1,
  1, 10 and 60 s, the most arrivals in any such window over the mean (InferLine's arrival
  envelope, normalised).

Either way, each query is drawn from the architectures by their Zipf popularity and sent with
that architecture's targets (accuracy and latency, model-less or naming its model; the
baselines, which cannot take a model-less query, are sent the architecture's name):
``arrivals()`` for a curve, ``arrivals_at()`` for given times.

The real trace (``../shared/traces/azure_llm_conv_2023.csv``: one hour, 19,365 request arrivals
to an Azure LLM inference service, CC-BY, Patel et al., ISCA 2024) is read at run time, never
copied into the repository (``load_trace``); so is any other trace given by path
(``load_arrival_times``: a CSV with an arrival-time column in seconds or ISO 8601).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

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


# Column names taken, case-insensitively and in this order, for a trace's arrival time when none
# is named: the Azure traces' TIMESTAMP, vidur's processed ``arrived_at``, and common spellings.
TIME_COLUMNS = ("timestamp", "arrived_at", "arrival_time", "arrival_timestamp", "arrival", "time", "ts", "at")


def parse_instant(text: str) -> float:
    """Seconds from a number (seconds) or an ISO 8601 date and time (``2023-11-16 18:15:46.68``,
    ``…T…Z``; more than six digits of fraction are cut to six; no zone: taken as UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    stamp = text.strip().replace("Z", "+00:00")
    day, _, clock = stamp.replace("T", " ").partition(" ")
    if "." in clock:  # Python reads at most six digits of fraction (the Azure traces have seven)
        whole, _, rest = clock.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        clock = f"{whole}.{rest[: min(digits, 6)]}{rest[digits:]}"
    moment = datetime.fromisoformat(f"{day} {clock}" if clock else day)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def load_arrival_times(path: Path, column: str | None = None) -> list[float]:
    """A trace's arrival times, in seconds from its first arrival, sorted: one arrival per row of
    a CSV whose ``column`` (or the first of ``TIME_COLUMNS`` its header has) holds the arrival
    time in seconds or as an ISO 8601 date and time. Reads the Azure traces too."""
    with path.open(newline="") as lines:
        reader = csv.reader(lines)
        header = [name.strip() for name in next(reader, [])]
        lowered = [name.lower() for name in header]
        wanted = [column.lower()] if column else list(TIME_COLUMNS)
        index = next((lowered.index(name) for name in wanted if name in lowered), None)
        if index is None:
            raise ValueError(
                f"{path}: no arrival-time column: expected {column!r}"
                if column
                else f"{path}: no arrival-time column among {header} "
                f"(expected one of {', '.join(TIME_COLUMNS)})"
            )
        instants: list[float] = []
        for number, row in enumerate(reader, start=2):
            if len(row) <= index or not row[index].strip():
                continue
            try:
                instants.append(parse_instant(row[index]))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: bad arrival time {row[index]!r}") from error
    if not instants:
        raise ValueError(f"{path}: no arrivals")
    instants.sort()
    first = instants[0]
    return [t - first for t in instants]


# --- arrival times: recorded ones replayed, bursty synthetic ones, and how bursty they are ---------

# InferLine's arrival envelope, normalised: for each window, the most arrivals in any window of
# that length over the mean rate's count in it (1 for perfectly even arrivals).
BURST_WINDOWS_S = (0.1, 1.0, 10.0, 60.0)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Burstiness:
    """How bursty an arrival sequence is: its mean rate, its inter-arrival times' coefficient of
    variation (1 for a Poisson process), and per window length the most arrivals in any such
    window (sliding) over the mean rate times the window (its peak-to-mean ratio)."""

    count: int
    mean_qps: float
    cv: float
    peak_over_mean: tuple[tuple[float, float], ...]  # (window in s, max count / (mean · window))

    def at(self, window_s: float) -> float:
        return dict(self.peak_over_mean)[window_s]


def burstiness(
    times: Sequence[float] | FloatArray,
    duration_s: float | None = None,
    windows_s: Sequence[float] = BURST_WINDOWS_S,
) -> Burstiness:
    """The statistics of ``times`` (sorted, seconds). The mean rate is the count over
    ``duration_s``, or, without it, one over the mean inter-arrival time. Windows slide: each
    starts at an arrival (where the most arrivals of any window are found), ``[t, t + w)``."""
    at = np.asarray(times, dtype=np.float64)
    count = len(at)
    gaps = np.diff(at)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else math.nan
    if duration_s is not None:
        mean = count / duration_s
    else:
        mean = 1.0 / float(gaps.mean()) if len(gaps) and gaps.mean() > 0 else math.nan
    peaks = []
    for window in windows_s:
        most = int((np.searchsorted(at, at + window, side="left") - np.arange(count)).max()) if count else 0
        peaks.append((window, most / (mean * window) if mean > 0 else math.nan))
    return Burstiness(count, mean, cv, tuple(peaks))


@dataclass(frozen=True, eq=False)
class ArrivalTimes:
    """Arrival instants: ``times`` sorted, in seconds, within ``[0, duration_s)``; ``how`` says
    how they were made. The same on every seed (a replay is the recorded trace, not a draw)."""

    name: str
    times: FloatArray
    duration_s: float
    how: str = ""

    @property
    def count(self) -> int:
        return len(self.times)

    @property
    def mean_qps(self) -> float:
        return self.count / self.duration_s if self.duration_s > 0 else 0.0

    def draw(self, seed: int) -> ArrivalTimes:
        return self

    def rate_over(self, start_s: float, length_s: float) -> float:
        """The mean rate over ``[start_s, start_s + length_s)``."""
        first, last = np.searchsorted(self.times, [start_s, start_s + length_s], side="left")
        return float(last - first) / length_s

    def peak_qps(self, window_s: float) -> float:
        """The highest rate over any ``window_s`` window (sliding)."""
        if not self.count:
            return 0.0
        ends = np.searchsorted(self.times, self.times + window_s, side="left")
        return float((ends - np.arange(self.count)).max()) / window_s

    def busiest_window(self, length_s: float) -> float:
        """Where the ``length_s`` window (within the duration) holding the most arrivals starts:
        at an arrival, or at 0 when the window is the whole duration."""
        if length_s >= self.duration_s or not self.count:
            return 0.0
        starts = self.times[self.times <= self.duration_s - length_s]
        if not len(starts):
            return 0.0
        held = np.searchsorted(self.times, starts + length_s, side="left") - np.arange(len(starts))
        return float(starts[int(held.argmax())])

    def window(self, start_s: float, length_s: float, name: str | None = None) -> ArrivalTimes:
        """The arrivals in ``[start_s, start_s + length_s)``, from 0 again."""
        length = min(length_s, self.duration_s - start_s)
        first, last = np.searchsorted(self.times, [start_s, start_s + length], side="left")
        how = f"{self.how}; {length / 60:.3g} min from {start_s / 60:.3g} min" if self.how else ""
        return ArrivalTimes(name or self.name, self.times[first:last] - start_s, length, how)

    def burstiness(self) -> Burstiness:
        return burstiness(self.times, self.duration_s)


ReplayMethod = Literal["auto", "compress", "superpose"]


def replay(
    offsets: Sequence[float] | FloatArray,
    mean_qps: float,
    *,
    method: ReplayMethod = "auto",
    min_span_s: float | None = None,
    copies: int | None = None,
    seed: int = 0,
    name: str = "replay",
) -> ArrivalTimes:
    """A recorded trace's arrival times at a mean of ``mean_qps``, without drawing new ones.

    The trace (``offsets``, seconds, sorted) is taken as one period of ``P`` = its span plus one
    mean gap (so that a copy wrapped around its end does not put two arrivals at one instant), at
    ``r = n / P`` arrivals per second; the factor to reach is ``f = mean_qps / r``.

    - ``compress``: every time divided by ``f``. The recorded order, and every burst's shape
      relative to the mean, are kept exactly; the replay lasts ``P / f`` (a 1-hour trace at
      5.5 QPS replayed at 100 QPS lasts about 3 min, and what was a burst of one minute now lasts
      3 s).
    - ``superpose``: ``copies`` = k copies of the trace, the first as recorded, each other
      shifted by a uniformly drawn offset (``seed``) modulo ``P``, merged, then divided by the
      remaining factor ``f / k``: the replay lasts ``k · P / f``. Each copy keeps its own recorded
      bursts, squeezed only by ``f / k`` rather than ``f``; the copies' slower swings, being
      shifted apart, partly average out (k copies at random offsets: a swing relative to the
      mean shrinks by about √k; the conversation trace at 1,000 QPS over 10 min, 31 copies, is
      nearly as even as Poisson arrivals).
    - ``auto``: the fewest copies that make the replay last at least ``min_span_s``: compression
      alone where it is long enough (k = 1, always when ``min_span_s`` is None); else k =
      ⌈f · min_span_s / P⌉, so that high rates are replayed for as long as asked with their
      bursts at (up to the remaining factor) their recorded time scale rather than squeezed
      f-fold. ``copies``, when given, overrides it.

    The mean is exact: ``k · n`` arrivals over ``k · P / f`` seconds."""
    base = np.asarray(offsets, dtype=np.float64)
    if len(base) < 2:
        raise ValueError("a trace to replay needs at least two arrivals")
    base = np.sort(base) - float(np.min(base))
    span = float(base[-1])
    if span <= 0:
        raise ValueError("a trace to replay needs arrivals at more than one instant")
    period = span + span / (len(base) - 1)
    factor = mean_qps / (len(base) / period)
    if method == "compress":
        k = 1
    elif copies is not None:
        k = copies
    elif method == "superpose" and min_span_s is None:
        raise ValueError("superpose needs copies or min_span_s")
    else:
        k = max(1, math.ceil(factor * min_span_s / period)) if min_span_s is not None else 1
    if k < 1:
        raise ValueError(f"copies must be at least 1, not {k}")
    generator = np.random.default_rng(seed)
    shifts = np.concatenate(([0.0], generator.uniform(0.0, period, k - 1)))
    merged = np.sort(np.concatenate([(base + shift) % period for shift in shifts]), kind="stable")
    compression = factor / k
    how = (
        f"recorded times divided by {compression:.3g}"
        if k == 1
        else f"{k} copies at seeded random offsets, superposed, times divided by {compression:.3g}"
    )
    return ArrivalTimes(name, merged / compression, period / compression, how)


def gamma_arrivals(
    mean_qps: float, cv: float, duration_s: float, seed: int, name: str | None = None
) -> ArrivalTimes:
    """A renewal process whose inter-arrival times are Gamma-distributed with coefficient of
    variation ``cv`` (shape 1/cv², mean 1/``mean_qps``): cv 1 is a Poisson process; cv 4 and 8
    put most arrivals in clumps of near-simultaneous queries separated by long silences.

    Exactly ``round(mean_qps · duration_s)`` arrivals: that many gaps and one more are drawn and
    their sums scaled so that the one more lands on ``duration_s`` (the gaps conditioned on their
    total; the scale is within a few % of 1 for a few thousand gaps, and keeps runs at different
    cv at the same load)."""
    if cv <= 0:
        raise ValueError("cv must be positive")
    count = round(mean_qps * duration_s)
    generator = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    edges = np.cumsum(generator.gamma(shape, 1.0 / (shape * mean_qps), count + 1))
    times = edges[:-1] * (duration_s / edges[-1]) if edges[-1] > 0 else np.zeros(count)
    # A last gap below the float's resolution would put an arrival at the duration itself.
    times = np.minimum(times, np.nextafter(duration_s, 0.0))
    return ArrivalTimes(
        name or f"Gamma gaps, CV {cv:g}", times, duration_s, f"Gamma renewal, CV {cv:g}, seed {seed}"
    )


def on_off_rates(mean_qps: float, on_s: float, off_s: float, burst_ratio: float) -> tuple[float, float]:
    """The ON and OFF rates whose time-weighted mean is ``mean_qps``, ON ``burst_ratio`` times OFF."""
    off = mean_qps * (on_s + off_s) / (burst_ratio * on_s + off_s)
    return burst_ratio * off, off


def on_off_arrivals(
    mean_qps: float,
    duration_s: float,
    seed: int,
    *,
    on_s: float = 10.0,
    off_s: float = 30.0,
    burst_ratio: float = 10.0,
    exact_share: bool = True,
    name: str | None = None,
) -> ArrivalTimes:
    """A two-state Markov-modulated Poisson process: ON periods (exponential lengths, mean
    ``on_s``) of Poisson arrivals at ``burst_ratio`` times the rate of the OFF periods (mean
    ``off_s``), the two rates set so that the long-run mean is ``mean_qps`` (``on_off_rates``).
    It starts ON with the stationary probability ``on_s / (on_s + off_s)``. Defaults: 10 s
    bursts (one scaler period) at 10x the rate of 30 s lulls (as long as a worker's start-up),
    i.e. 3.1x the mean and 0.31x it at 100 QPS.

    ``exact_share``: the drawn ON lengths are scaled by one factor, and the OFF lengths by
    another, so that ON takes exactly its long-run share of ``duration_s`` (when the duration
    holds both states). Over 10 minutes there are only about 15 cycles, and without it the mean
    load of one draw ranges over 0.6-1.25x the asked one (seeds 1-7 at 100 QPS); with it, the
    mean is the asked one up to the Poisson counts' noise, as the Gamma process's is."""
    if burst_ratio < 1:
        raise ValueError("burst_ratio must be at least 1")
    on_qps, off_qps = on_off_rates(mean_qps, on_s, off_s, burst_ratio)
    on_share = on_s / (on_s + off_s)
    generator = np.random.default_rng(seed)
    on = bool(generator.random() < on_share)
    periods: list[tuple[bool, float]] = []
    total = 0.0
    while total < duration_s:
        length = min(duration_s - total, float(generator.exponential(on_s if on else off_s)))
        periods.append((on, length))
        total += length
        on = not on
    on_total = sum(length for state, length in periods if state)
    off_total = total - on_total
    if exact_share and on_total > 0 and off_total > 0:
        on_scale, off_scale = on_share * duration_s / on_total, (1 - on_share) * duration_s / off_total
        periods = [(state, length * (on_scale if state else off_scale)) for state, length in periods]
    start, parts = 0.0, []
    for state, length in periods:
        end = min(duration_s, start + length)
        count = int(generator.poisson((on_qps if state else off_qps) * (end - start)))
        parts.append(np.sort(generator.uniform(start, end, count)))
        start = end
    times = np.concatenate(parts) if parts else np.zeros(0)
    how = f"on-off: {on_s:g} s at {on_qps:.3g} QPS / {off_s:g} s at {off_qps:.3g} QPS (means), seed {seed}"
    return ArrivalTimes(name or "on-off bursts", times, duration_s, how)


class ArrivalProcess(Protocol):
    """What makes a workload's arrival times: the same every seed (``ArrivalTimes``: a replay) or
    drawn afresh per seed (``GammaProcess``, ``OnOffProcess``)."""

    @property
    def name(self) -> str: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def mean_qps(self) -> float: ...

    def draw(self, seed: int) -> ArrivalTimes: ...


@dataclass(frozen=True)
class GammaProcess:
    """``gamma_arrivals`` drawn per seed."""

    mean_qps: float
    cv: float
    duration_s: float

    @property
    def name(self) -> str:
        return f"Gamma inter-arrival times, CV {self.cv:g}, {self.mean_qps:g} QPS"

    def draw(self, seed: int) -> ArrivalTimes:
        return gamma_arrivals(self.mean_qps, self.cv, self.duration_s, seed, self.name)


@dataclass(frozen=True)
class OnOffProcess:
    """``on_off_arrivals`` drawn per seed."""

    mean_qps: float
    duration_s: float
    on_s: float = 10.0
    off_s: float = 30.0
    burst_ratio: float = 10.0

    @property
    def name(self) -> str:
        on, off = on_off_rates(self.mean_qps, self.on_s, self.off_s, self.burst_ratio)
        return (
            f"on-off bursts, {self.mean_qps:g} QPS mean ({self.on_s:g} s at {on:.0f} QPS / "
            f"{self.off_s:g} s at {off:.0f} QPS, exponential lengths)"
        )

    def draw(self, seed: int) -> ArrivalTimes:
        return on_off_arrivals(
            self.mean_qps,
            self.duration_s,
            seed,
            on_s=self.on_s,
            off_s=self.off_s,
            burst_ratio=self.burst_ratio,
            name=self.name,
        )


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


def arrivals_at(
    times: Sequence[float] | FloatArray, mix: Mix, seed: int, warmup_s: float = 0.0, warmup_qps: float = 0.0
) -> Iterator[Arrival]:
    """Arrivals at ``times`` (seconds, sorted; moved ``warmup_s`` later), each for an architecture
    drawn from ``mix`` (seeded, as ``arrivals()`` draws them); before them ``warmup_s`` seconds of
    Poisson arrivals at ``warmup_qps`` (unmeasured: the system settles at the starting rate)."""
    generator = np.random.default_rng(seed)
    cumulative = np.array(mix.cumulative())
    cumulative[-1] = 1.0
    targets = [a.targets for a in mix.architectures]
    slos = [a.slo_ms for a in mix.architectures]
    models = [a.model for a in mix.architectures]
    warm = int(generator.poisson(warmup_qps * warmup_s)) if warmup_s > 0 and warmup_qps > 0 else 0
    instants = np.concatenate(
        (np.sort(generator.uniform(0.0, warmup_s, warm)), np.asarray(times, dtype=np.float64) + warmup_s)
    )
    picks = np.searchsorted(cumulative, generator.random(len(instants)), side="right").tolist()
    for t, k in zip(instants.tolist(), picks, strict=True):
        yield Arrival(t, targets[k], slos[k], models[k])
