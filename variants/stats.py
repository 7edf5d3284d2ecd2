"""The statistics behind profiles: confidence intervals for a median latency and for an accuracy.

Pure arithmetic (no numpy, no onnxruntime), so that the gateway, registration and pruning can
import it.

- The median's interval is distribution-free: the order statistics x(l) and x(u) of n timings
  bracket the true median with probability 1 - 2 P(Binomial(n, 1/2) < l), whatever the latency
  distribution (skewed, heavy-tailed, bimodal). Exact binomial below 200 runs, the normal
  approximation of the ranks above it.
- An accuracy measured on n examples gets a Wilson score interval, which stays inside [0, 1] and
  behaves near 0 and 1 (where the textbook normal interval collapses to a point).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

Z_95 = 1.959963984540054  # the 97.5th percentile of the standard normal
EXACT_RANKS_UP_TO = 200  # beyond this many runs the normal approximation of the ranks is exact enough


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks (l, u) of the sorted timings that bracket the median with at least
    ``confidence`` (or the whole range when ``n`` is too small for that: n < 6 at 95 %)."""
    if n <= 0:
        raise ValueError("no timings")
    alpha = (1.0 - confidence) / 2
    if n > EXACT_RANKS_UP_TO:
        half = Z_95 * math.sqrt(n) / 2
        low = max(0, math.floor(n / 2 - half))
        high = min(n - 1, math.ceil(n / 2 + half))
        return low, high
    # The largest k with P(X < k) <= alpha, X ~ Binomial(n, 1/2): x(k) (0-based k) is the lower
    # bound; the upper one mirrors it. Exact integers: no overflow, no rounding.
    total = 2**n
    limit = alpha * total
    below = 0  # P(X < k) * 2^n
    k = 0
    while k < n and below + math.comb(n, k) <= limit:
        below += math.comb(n, k)
        k += 1
    low = k - 1 if k > 0 else 0
    if k == 0:
        return 0, n - 1  # too few runs for the confidence asked: the whole range
    return low, n - 1 - low


def median_ci(timings: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the sample median and its distribution-free confidence interval."""
    ordered = sorted(timings)
    n = len(ordered)
    middle = n // 2
    median = ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    low, high = median_ci_ranks(n, confidence)
    return median, ordered[low], ordered[high]


def median_ci_pct(timings: Sequence[float]) -> float:
    """Half-width of the median's 95 % interval as a percentage of the median (the wider side)."""
    median, low, high = median_ci(timings)
    if median <= 0:
        return math.inf
    return 100.0 * max(median - low, high - median) / median


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion; (0, 1) when nothing was measured."""
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials")
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    # At 0 or n successes the bound is exactly 0 or 1 (rounding would leave 1 - 1e-16).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def has_interval(low: float, high: float, examples: int) -> bool:
    """Whether a profile's recorded accuracy interval carries information: profiles written
    before intervals were measured (or imported without one) hold the (0, 1) default."""
    return examples > 0 and (low, high) != (0.0, 1.0)
