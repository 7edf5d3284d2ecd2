"""Drop dominated variants: another of the same model and pool is at least as accurate, and no
slower, no slower to load and no costlier at every batch size.

Profiles are measurements, so "no slower" allows for their noise (``TOLERANCE``): two variants
within it of each other are the same for selection's purposes, and only one is kept. Variants
are visited best first, and one is kept only if no variant already kept dominates it, so a
dominator is always decided before what it dominates.
"""

from __future__ import annotations

from collections import defaultdict

from modelless.types import VariantProfile

TOLERANCE = 0.10  # relative: timings within 10 % of each other count as equal
ABSOLUTE_SLACK_MS = 0.002  # timer resolution and scheduling noise on sub-10-µs models


def _no_worse(a: float, b: float, slack: float = 0.0) -> bool:
    return a <= b * (1 + TOLERANCE) + slack


def dominates(a: VariantProfile, b: VariantProfile) -> bool:
    """``a`` is at least as good as ``b`` on every axis, within the measurement tolerance."""
    batches = sorted(set(a.latency_p99_ms) & set(b.latency_p99_ms))
    if not batches or a.accuracy < b.accuracy:
        return False
    if not _no_worse(a.load_latency_ms, b.load_latency_ms):
        return False
    return all(
        _no_worse(a.latency_ms(n), b.latency_ms(n), ABSOLUTE_SLACK_MS)
        and _no_worse(a.cost_per_query(n), b.cost_per_query(n))
        for n in batches
    )


def _best_first(variant: VariantProfile) -> tuple[float, float, float, str]:
    return (
        -variant.accuracy,
        sum(variant.latency_p99_ms.values()),
        variant.load_latency_ms,
        variant.variant_id,
    )


def prune_dominated(variants: list[VariantProfile]) -> tuple[list[VariantProfile], list[VariantProfile]]:
    """Split into (kept, pruned), comparing only variants of the same model and pool: a Lambda
    variant is never pruned for a provisioned one, since it serves what pools cannot absorb."""
    groups: dict[tuple[str, str], list[VariantProfile]] = defaultdict(list)
    for variant in variants:
        groups[(variant.model_name, variant.pool)].append(variant)
    kept: list[VariantProfile] = []
    pruned: list[VariantProfile] = []
    for group in groups.values():
        frontier: list[VariantProfile] = []
        for variant in sorted(group, key=_best_first):
            if any(dominates(better, variant) for better in frontier):
                pruned.append(variant)
            else:
                frontier.append(variant)
        kept += frontier
    return kept, pruned
