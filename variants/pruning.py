"""Drop dominated variants: another of the same model and pool is at least as accurate, and no
slower, no slower to load and no costlier at every batch size.

Profiles are measurements, so "no slower" must allow for their noise. Speed is judged on median
latencies (a p99 over a few dozen runs is mostly noise), compared on a logarithmic grid 10 %
wide after adding 2 µs of timer slack: two variants whose timings fall in the same cells are the
same for selection's purposes, and only one of them is kept. Comparing
grid cells rather than "within 10 %" keeps dominance transitive, so the kept variants are exactly
the undominated ones: none of them is dominated by another, and every pruned variant is dominated
by a kept one.
"""

from __future__ import annotations

import math
from collections import defaultdict

from modelless.types import VariantProfile

TOLERANCE = 0.10  # timings within one 10 % step of each other count as equal
SLACK_MS = 0.002  # timer resolution and scheduling noise on sub-10-µs models


def _cell(value: float) -> int:
    return math.floor(math.log(max(value, 1e-12)) / math.log1p(TOLERANCE))


def _signature(v: VariantProfile, batches: list[int]) -> list[int]:
    """The variant's timings and costs on the noise grid, at the given batch sizes."""
    cells = [_cell(v.load_latency_ms + SLACK_MS)]
    for n in batches:
        latency = v.median_ms(n) + SLACK_MS
        cells.append(_cell(latency))
        cells.append(_cell(v.price_per_second * latency / 1000 + v.request_price))
    return cells


def dominates(a: VariantProfile, b: VariantProfile) -> bool:
    """``a`` is at least as good as ``b`` on every axis, on the noise grid. Exact ties (same
    accuracy, same cells everywhere) go to the smaller id, so that exactly one of them is kept."""
    batches = sorted(set(a.latency_p99_ms) & set(b.latency_p99_ms))
    if not batches or a.accuracy < b.accuracy or a.variant_id == b.variant_id:
        return False
    mine, theirs = _signature(a, batches), _signature(b, batches)
    if any(x > y for x, y in zip(mine, theirs, strict=True)):
        return False
    if a.accuracy > b.accuracy or mine != theirs:
        return True
    return a.variant_id < b.variant_id


def prune_dominated(variants: list[VariantProfile]) -> tuple[list[VariantProfile], list[VariantProfile]]:
    """Split into (kept, pruned), comparing only variants of the same model and pool: a Lambda
    variant is never pruned for a provisioned one, since it serves what pools cannot absorb."""
    groups: dict[tuple[str, str], list[VariantProfile]] = defaultdict(list)
    for variant in variants:
        groups[(variant.model_name, variant.pool)].append(variant)
    kept: list[VariantProfile] = []
    pruned: list[VariantProfile] = []
    for group in groups.values():
        for variant in group:
            if any(dominates(other, variant) for other in group):
                pruned.append(variant)
            else:
                kept.append(variant)
    return kept, pruned
