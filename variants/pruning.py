"""Drop dominated variants: another of the same model and pool is at least as accurate, and no
slower, no slower to load and no costlier at every batch size.

Profiles are measurements, so both comparisons allow for their noise:

- Accuracy: each profile carries a 95 % confidence interval (Wilson, from the number of
  validation examples). Two accuracies each inside the other's interval are a tie, broken by
  ``agreement`` (the share of examples answered as the registered model answers them): the
  closer to the original counts as the more accurate. Profiles without an interval (hand-made,
  imported) compare their point accuracies.
- Speed is judged on median latencies (a p99 over a few dozen runs is mostly noise), compared on
  a logarithmic grid 10 % wide after adding 2 µs of timer slack: two variants whose timings fall
  in the same cells are the same for selection's purposes, and only one of them is kept.

Variants are visited so that a dominator comes before what it dominates, and a variant is
pruned only when a variant already kept dominates it: every pruned variant names a kept one that
dominates it (``Pruning.reasons``). With point accuracies, dominance is transitive and the kept
variants are exactly the undominated ones.

Whatever dominance says, per pool the registered model's own precision (FP32) keeps its best
variant and every precision keeps the best of its own (a variant on that precision's frontier):
queries that name the model are served within a tolerance of FP32's accuracy, and a precision
may win on hardware the pruning did not see.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from modelless.types import VariantProfile
from variants.stats import has_interval

TOLERANCE = 0.10  # timings within one 10 % step of each other count as equal
SLACK_MS = 0.002  # timer resolution and scheduling noise on sub-10-µs models
REGISTERED_PRECISION = "fp32"


@dataclass(frozen=True)
class Pruning:
    kept: list[VariantProfile]
    pruned: list[VariantProfile]
    reasons: dict[str, str] = field(default_factory=dict)  # pruned variant id -> why


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


def _interval(v: VariantProfile) -> tuple[float, float]:
    if has_interval(v.accuracy_low, v.accuracy_high, v.accuracy_examples):
        return v.accuracy_low, v.accuracy_high
    return v.accuracy, v.accuracy


def accuracy_tie(a: VariantProfile, b: VariantProfile) -> bool:
    """Whether the two accuracies differ by less than their measurement tells apart."""
    a_low, a_high = _interval(a)
    b_low, b_high = _interval(b)
    return b_low <= a.accuracy <= b_high and a_low <= b.accuracy <= a_high


def compare_accuracy(a: VariantProfile, b: VariantProfile) -> int:
    """1 when ``a`` is the more accurate, -1 when ``b`` is, 0 when they are equal: a tie within
    the confidence intervals goes to the one that agrees more with the registered model."""
    if a.accuracy == b.accuracy and a.agreement == b.agreement:
        return 0
    if accuracy_tie(a, b):
        # (Without intervals a tie is an exact equality of the point accuracies.)
        if a.agreement is None or b.agreement is None:
            return 0
        return _sign(a.agreement - b.agreement)
    return _sign(a.accuracy - b.accuracy)


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def dominates(a: VariantProfile, b: VariantProfile) -> bool:
    """``a`` is at least as good as ``b`` on every axis, on the noise grid. Exact ties (equally
    accurate, same cells everywhere) go to the smaller id, so that exactly one of them is kept."""
    batches = sorted(set(a.latency_p99_ms) & set(b.latency_p99_ms))
    if not batches or a.variant_id == b.variant_id:
        return False
    accuracy = compare_accuracy(a, b)
    if accuracy < 0:
        return False
    mine, theirs = _signature(a, batches), _signature(b, batches)
    if any(x > y for x, y in zip(mine, theirs, strict=True)):
        return False
    if accuracy > 0 or mine != theirs:
        return True
    return a.variant_id < b.variant_id


def _quality(v: VariantProfile) -> tuple[float, float, float, str]:
    """Best first: most accurate, closest to the original, then fastest at its smallest batch."""
    smallest = min(v.latency_p50_ms or v.latency_p99_ms)
    return (-v.accuracy, -(v.agreement or 0.0), v.median_ms(smallest), v.variant_id)


def _visit_order(group: list[VariantProfile]) -> list[VariantProfile]:
    """Every dominator before what it dominates (a topological order of dominance, by quality
    among the free ones); a cycle, possible when ties within intervals chain, is broken by quality."""
    remaining = sorted(group, key=_quality)
    beaten_by = {v.variant_id: {a.variant_id for a in group if dominates(a, v)} for v in group}
    order: list[VariantProfile] = []
    placed: set[str] = set()
    while remaining:
        free = next((v for v in remaining if beaten_by[v.variant_id] <= placed), remaining[0])
        remaining.remove(free)
        order.append(free)
        placed.add(free.variant_id)
    return order


def short_name(v: VariantProfile) -> str:
    """``fp32_all/cpu-1t``: the recipe and placement part of a variant id."""
    parts = v.variant_id.split("/")
    return "/".join(parts[-2:]) if len(parts) >= 2 else v.variant_id


def _accuracy_text(v: VariantProfile) -> str:
    low, high = _interval(v)
    text = f"{v.accuracy:.3f}" if low == high else f"{v.accuracy:.3f} [{low:.3f},{high:.3f}]"
    if v.agreement is not None:
        text += f", agreement {v.agreement:.3f}"
    return text


def explain(winner: VariantProfile, loser: VariantProfile) -> str:
    """Why ``loser`` goes: the dominating variant and the comparisons, in numbers."""
    batches = sorted(set(winner.latency_p99_ms) & set(loser.latency_p99_ms))
    if compare_accuracy(winner, loser) > 0 and not accuracy_tie(winner, loser):
        accuracy = "less accurate"
    elif accuracy_tie(winner, loser) and winner.accuracy != loser.accuracy:
        accuracy = "no more accurate within the confidence intervals"
    else:
        accuracy = "no more accurate"
    speeds = "/".join(str(b) for b in batches)
    accuracies = f"{_accuracy_text(loser)} vs {_accuracy_text(winner)}"
    return (
        f"dominated by {short_name(winner)}: {accuracy} ({accuracies}), "
        f"not faster at batch {speeds} (p50@{batches[0]} {loser.median_ms(batches[0]):.3f} vs "
        f"{winner.median_ms(batches[0]):.3f} ms), not faster to load "
        f"({loser.load_latency_ms:.1f} vs {winner.load_latency_ms:.1f} ms) nor cheaper"
    )


def prune_variants(variants: Sequence[VariantProfile]) -> Pruning:
    """Split into kept and pruned, comparing only variants of the same model and pool (a Lambda
    variant is never pruned for a provisioned one: it serves what pools cannot absorb), with
    the reason of every prune."""
    groups: dict[tuple[str, str], list[VariantProfile]] = defaultdict(list)
    for variant in variants:
        groups[(variant.model_name, variant.pool)].append(variant)
    kept: list[VariantProfile] = []
    pruned: list[VariantProfile] = []
    reasons: dict[str, str] = {}
    for group in groups.values():
        order = _visit_order(group)
        group_kept: list[VariantProfile] = []
        group_pruned: dict[str, str] = {}
        for variant in order:
            winner = next((k for k in group_kept if dominates(k, variant)), None)
            if winner is None:
                group_kept.append(variant)
            else:
                group_pruned[variant.variant_id] = explain(winner, variant)
        # Every precision keeps its best variant (FP32, the registered one, among them).
        for precision in dict.fromkeys(v.precision for v in order):
            if not any(k.precision == precision for k in group_kept):
                best = next(v for v in order if v.precision == precision)
                group_kept.append(best)
                del group_pruned[best.variant_id]
        kept += group_kept
        pruned += [v for v in order if v.variant_id in group_pruned]
        reasons.update(group_pruned)
    return Pruning(kept, pruned, reasons)


def prune_dominated(variants: list[VariantProfile]) -> tuple[list[VariantProfile], list[VariantProfile]]:
    """``prune_variants`` as (kept, pruned)."""
    result = prune_variants(variants)
    return result.kept, result.pruned
