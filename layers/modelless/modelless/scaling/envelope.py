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
) -> Provisioning:
    """What to provision one group for (module docstring).

    ``counts``: the group's arrivals per second, oldest first; ``mean_qps``: its mean over the
    scaler's window; ``hardware_price_per_qps``: $/s per QPS on the cheapest variant that may
    serve it (None: none may, the mean is all there is to plan); ``lambda_price_per_query``
    (None: Lambda may not serve it); ``lead_s``: how far ahead the forecast looks (a worker's
    start-up); ``lambda_qps_limit``: the QPS Lambda's concurrency can take of this group.
    """
    found = envelope(counts)
    if not len(counts) or hardware_price_per_qps is None:
        return Provisioning(mean_qps, mean_qps, 0, 0.0, 0.0, found)
    window = min(burst_window_s(mean_qps), len(counts))
    rates = window_rates(counts, window)
    if lambda_price_per_query is None or lambda_price_per_query <= 0:
        quantile = 1.0
    else:
        quantile = min(1.0, max(0.0, 1.0 - hardware_price_per_qps / lambda_price_per_query))
    target = float(np.quantile(rates, quantile, method="higher"))
    # The forecast adds at most the target again: a minute of a steep rise is a guess.
    trend = min(target, growth_qps_per_s(counts) * lead_s)
    target += trend
    if lambda_qps_limit is not None and found:
        target = max(target, found[min(found)] - lambda_qps_limit)
    return Provisioning(max(mean_qps, target), mean_qps, window, quantile, trend, found)
