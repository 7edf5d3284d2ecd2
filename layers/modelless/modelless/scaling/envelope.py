"""What load to provision a group for: its arrival envelope, not its mean (issue 14).

Real arrivals are bursty at the scale of seconds: the mean over half a minute hides bursts of
several times the mean, which then spill to Lambda at its per-request price. A plan holds for
tens of seconds and a new worker takes about a minute to start, so a burst cannot be met by
scaling after it starts: capacity for it must be there before, or Lambda takes it.

Whether to provision for a burst is an economic choice, made here per group as a newsvendor
decision (InferLine's tuner provisions for the arrival envelope; INFaaS for the mean):

- The group's recent arrivals (per-second counts, ``MetadataStore.load_series``) give its rate
  in sliding windows of ``W`` seconds, ``W`` long enough that a Poisson process at the group's
  mean rate puts about ``POISSON_ARRIVALS`` queries in it: shorter windows would count as burst
  the random arrivals that the program's saturation rates already absorb (each instance is
  planned at the utilisation at which its queue's p99 fits the budget: ``saturation_for_budget``).
- Capacity C costs ``h`` per QPS-second on the cheapest variant that may serve the group (its
  instance price over its rate); load above C goes to Lambda at ``p`` per query. The expected
  cost ``h·C + p·E[(rate - C)+]`` is least where ``P(rate > C) = h / p``: C is the
  ``1 - h/p`` quantile of the window rates. Where Lambda may not serve the group, C is their
  maximum (the envelope at ``W``).
- Bursts shorter than a second (``burst_qps``): each second's peak, the most queries in one
  ``PEAK_SLICE_S`` slice (``MetadataStore.peak_series``), is read as a Poisson rate: the least
  rate at which the highest peak of the history is no rarer than one slice in all of them, where
  Poisson arrivals at the mean would not reach it (``BURST_SIGNIFICANCE``): for clumped arrivals,
  what a Poisson-sized plan (the saturation rates) must be given so that the clumps fit its
  queues. It counts where Lambda cannot take a burst in time: no Lambda variant meets the
  budget, or a cold start (``ScalerConfig.lambda_init_ms`` plus the variant's load) does not fit
  it, so that a burst beyond the warm containers is late on Lambda whatever it costs. There the
  window rates are covered at their maximum too.
- A short-horizon forecast: where the rate has been growing, C grows by the trend over the time
  a worker takes to start (least squares over the series).
- Lambda's limits: C is at least the highest one-second rate less what Lambda's concurrency
  share can run at once (``lambda_qps_limit``); a burst Lambda cannot take must be provisioned.

A group whose mean load Lambda serves for less than the fewest whole instances it would need is
left at its mean (the controller's ``_for_envelope``): Lambda costs the same per query in a burst,
and pricing the envelope as steady load would make hardware look worth it where it is not.
The provisioned load is never below the mean over the scaler's window. Scale-down keeps the
scaler's hold (``ScaleDownHold``): a group whose envelope falls keeps its instances that long.
All pure functions of explicit inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import pdtrc, pdtri

from modelless.query_load import PEAK_SLICE_S

# A window long enough that Poisson arrivals at the mean rate put this many queries in it (their
# relative spread is then 1/sqrt of it, about 18 %): what is left above is burst.
POISSON_ARRIVALS = 30.0
MAX_WINDOW_S = 30  # never a window longer than this (at very low rates the mean decides)
ENVELOPE_WINDOWS_S = (1, 2, 5, 10, 30, 60)  # what operators see of the envelope


@dataclass(frozen=True)
class Provisioning:
    """What a group is provisioned for, and why."""

    load_qps: float  # what the program covers
    mean_qps: float  # the mean over the scaler's window
    window_s: int  # the window the burst quantile was taken at
    quantile: float  # the quantile of window rates provisioned for (1: their maximum)
    trend_qps: float  # what the forecast added
    burst_qps: float  # the Poisson-equivalent rate of the sub-second peaks (0: not counted)
    envelope: dict[int, float]  # window (s) -> highest rate in such a window of the series


def window_rates(counts: Sequence[int], window_s: int) -> np.ndarray:
    """The rate (QPS) in every window of ``window_s`` consecutive seconds of ``counts``."""
    series = np.asarray(counts, dtype=np.float64)
    if window_s <= 0 or len(series) < window_s:
        return np.asarray([series.sum() / max(1, len(series))]) if len(series) else np.zeros(1)
    sums = np.convolve(series, np.ones(window_s), mode="valid")
    return np.asarray(sums / window_s, dtype=np.float64)


def envelope(counts: Sequence[int], windows_s: Sequence[int] = ENVELOPE_WINDOWS_S) -> dict[int, float]:
    """Window (s) -> the highest rate over any window of that length (InferLine's arrival
    envelope, per second), for the windows the series is long enough for."""
    return {w: float(window_rates(counts, w).max()) for w in windows_s if len(counts) >= w}


def burst_window_s(mean_qps: float) -> int:
    """The window at which burst is told from Poisson noise (module docstring)."""
    if mean_qps <= 0:
        return MAX_WINDOW_S
    return int(min(MAX_WINDOW_S, max(1, math.ceil(POISSON_ARRIVALS / mean_qps))))


BURST_SIGNIFICANCE = 0.01  # peaks this likely from Poisson arrivals at the mean are no burst


def poisson_equivalent_qps(
    peaks: Sequence[int], mean_qps: float = 0.0, slice_s: float = PEAK_SLICE_S
) -> float:
    """The least rate (QPS) at which Poisson arrivals reach the highest of ``peaks`` in a slice of
    ``slice_s`` no more rarely than once in all the slices ``peaks`` covers (one entry per second:
    that second's most queries in one slice). 0 without a peak, or where Poisson arrivals at
    ``mean_qps`` reach it in one of those slices with a chance of ``BURST_SIGNIFICANCE`` or more:
    a few queries in one slice at a low rate are chance, not a burst to provision for."""
    highest = max(peaks, default=0)
    if highest <= 0:
        return 0.0
    slices = max(2.0, len(peaks) / slice_s)
    in_one_slice = float(pdtrc(highest - 1, mean_qps * slice_s))  # P(X >= highest) at the mean
    if -math.expm1(slices * math.log1p(-min(in_one_slice, 1.0 - 1e-12))) >= BURST_SIGNIFICANCE:
        return 0.0
    # P(X >= highest) = 1 / slices  <=>  P(X <= highest - 1) = 1 - 1 / slices
    return float(pdtri(highest - 1, 1.0 - 1.0 / slices)) / slice_s


TREND_WINDOW_S = 15  # the forecast's trend: the slope over this many last seconds
TREND_SIGNIFICANCE = 2.0  # ... counted only where it is this many standard errors above zero


def growth_qps_per_s(counts: Sequence[int], window_s: int = TREND_WINDOW_S) -> float:
    """The least-squares slope of the last ``window_s`` per-second counts, in QPS per second,
    where it is significantly positive (``TREND_SIGNIFICANCE`` standard errors); else 0. A step
    that has already happened is no trend: only a rise still going on in the last seconds is."""
    recent = np.asarray(counts[-window_s:], dtype=np.float64)
    if len(recent) < 5:
        return 0.0
    t = np.arange(len(recent), dtype=np.float64)
    t -= t.mean()
    slope = float(t @ (recent - recent.mean()) / (t @ t))
    residual = recent - recent.mean() - slope * t
    error = math.sqrt(float(residual @ residual) / (len(recent) - 2) / float(t @ t))
    return slope if slope > TREND_SIGNIFICANCE * error else 0.0


def provision(
    counts: Sequence[int],
    mean_qps: float,
    hardware_price_per_qps: float | None,
    lambda_price_per_query: float | None,
    *,
    lead_s: float = 0.0,
    lambda_qps_limit: float | None = None,
    peaks: Sequence[int] = (),
    lambda_takes_bursts: bool = True,
) -> Provisioning:
    """What to provision one group for (module docstring).

    ``counts``: the group's arrivals per second, oldest first; ``mean_qps``: its mean over the
    scaler's window; ``hardware_price_per_qps``: $/s per QPS on the cheapest variant that may
    serve it (None: none may, the mean is all there is to plan); ``lambda_price_per_query``
    (None: Lambda may not serve it); ``lead_s``: how far ahead the forecast looks (a worker's
    start-up); ``lambda_qps_limit``: the QPS Lambda's concurrency can take of this group;
    ``peaks``: its most queries in one ``PEAK_SLICE_S`` slice, per second of ``counts``;
    ``lambda_takes_bursts``: whether a Lambda cold start fits the group's budget.
    """
    found = envelope(counts)
    if not len(counts) or hardware_price_per_qps is None:
        return Provisioning(mean_qps, mean_qps, 0, 0.0, 0.0, 0.0, found)
    window = min(burst_window_s(mean_qps), len(counts))
    rates = window_rates(counts, window)
    burst = 0.0
    if lambda_price_per_query is None or lambda_price_per_query <= 0 or not lambda_takes_bursts:
        quantile = 1.0  # what goes beyond the plan is late on Lambda, whatever it costs
        burst = poisson_equivalent_qps(peaks, mean_qps)
    else:
        quantile = min(1.0, max(0.0, 1.0 - hardware_price_per_qps / lambda_price_per_query))
    target = max(float(np.quantile(rates, quantile, method="higher")), burst)
    # The forecast adds at most the target again: a minute of a steep rise is a guess.
    trend = min(target, growth_qps_per_s(counts) * lead_s)
    target += trend
    if lambda_qps_limit is not None and found:
        target = max(target, found[min(found)] - lambda_qps_limit)
    return Provisioning(max(mean_qps, target), mean_qps, window, quantile, trend, burst, found)
