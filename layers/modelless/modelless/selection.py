"""Per-query variant selection: INFaaS ``getVariant`` (§4.1), as a pluggable policy.

A policy is a pure function of the query's targets, the candidate profiles and the workers'
live state: no I/O, so it is tested on hand-built profiles and timed on its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from modelless.exceptions import TargetsUnreachableError
from modelless.pools.catalog import PoolKind, PoolSpec
from modelless.types import Decision, InstanceState, QueryTargets, Tier, VariantProfile, WorkerState


class SelectionPolicy(Protocol):
    def get_variant(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision:
        """Choose a variant and where to run it, or raise TargetsUnreachableError."""

    def warmup(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision | None:
        """After a miss, the variant worth loading so that the next such query is served."""


@dataclass(frozen=True)
class _Placement:
    variant: VariantProfile
    worker: WorkerState


class InfaasPolicy:
    """Active instances first (cheapest, then least-loaded worker); else the inactive variant
    with the lowest load + inference latency, on the least-utilised worker of its pool or, when
    no worker has room, on the Lambda tier. Overloaded and Interfered instances are skipped."""

    def __init__(self, pools: Mapping[str, PoolSpec]) -> None:
        self._pools = pools

    def get_variant(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision:
        budget = _budget(targets)
        eligible = _eligible(targets, candidates)
        eligible_ids = {v.variant_id: v for v in eligible}

        # Active: variants with a healthy loaded instance whose profiled latency meets the budget.
        active: list[_Placement] = []
        for worker in workers:
            for instance in worker.instances:
                variant = eligible_ids.get(instance.variant_id)
                if (
                    variant is not None
                    and instance.state is InstanceState.ACTIVE
                    and variant.latency_ms(targets.batch) <= budget
                ):
                    active.append(_Placement(variant, worker))
        if active:
            best = min(
                active,
                key=lambda p: (
                    p.variant.cost_per_query(targets.batch),
                    p.variant.latency_ms(targets.batch),
                    p.worker.utilisation,
                    p.worker.worker_id,
                ),
            )
            tier = Tier.LAMBDA if self._is_lambda(best.worker.pool) else Tier.WORKER
            return Decision(
                variant=best.variant,
                tier=tier,
                worker_id=best.worker.worker_id,
                state=InstanceState.ACTIVE,
                expected_latency_ms=best.variant.latency_ms(targets.batch),
                worker_address=best.worker.address or None,
                reason=(
                    f"cheapest active variant meeting accuracy>={targets.min_accuracy:g} and "
                    f"latency<={budget:g} ms; least-loaded worker running it"
                ),
            )

        # Inactive (or only Overloaded/Interfered): a new instance must be loaded first, so the
        # load latency counts against the budget.
        inactive = [v for v in eligible if v.load_latency_ms + v.latency_ms(targets.batch) <= budget]
        if inactive:
            variant = min(
                inactive,
                key=lambda v: (
                    v.load_latency_ms + v.latency_ms(targets.batch),
                    v.cost_per_query(targets.batch),
                    v.variant_id,
                ),
            )
            return self._place(
                variant,
                targets,
                workers,
                "no active variant meets the targets; "
                "inactive variant with the lowest load+inference latency",
            )
        raise unreachable_error(targets, candidates)

    def warmup(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision | None:
        """After a miss: the variant that would meet the targets were it loaded, and where to
        load it, so that the next such query finds it Active. None if none would."""
        budget = _budget(targets)
        fits = [v for v in _eligible(targets, candidates) if v.latency_ms(targets.batch) <= budget]
        if not fits:
            return None
        variant = min(fits, key=lambda v: (v.cost_per_query(targets.batch), v.load_latency_ms, v.variant_id))
        return self._place(variant, targets, workers, "loaded ahead of the next query with these targets")

    def _place(
        self, variant: VariantProfile, targets: QueryTargets, workers: Sequence[WorkerState], reason: str
    ) -> Decision:
        """Where a new instance of ``variant`` goes: the least-utilised worker of its pool with
        room that does not already hold it, else the Lambda tier."""
        expected = variant.load_latency_ms + variant.latency_ms(targets.batch)
        if self._is_lambda(variant.pool):
            return Decision(variant, Tier.LAMBDA, None, InstanceState.INACTIVE, expected, reason)
        with_room = [
            w
            for w in workers
            if w.pool == variant.pool
            and w.free_slots > 0
            and all(i.variant_id != variant.variant_id for i in w.instances)
        ]
        if with_room:
            worker = min(with_room, key=lambda w: (w.utilisation, w.worker_id))
            return Decision(
                variant,
                Tier.WORKER,
                worker.worker_id,
                InstanceState.INACTIVE,
                expected,
                reason,
                worker.address,
            )
        return Decision(
            variant,
            Tier.LAMBDA,
            None,
            InstanceState.INACTIVE,
            expected,
            f"{reason}; no worker of pool {variant.pool!r} has room, spilled to the Lambda tier",
        )

    def _is_lambda(self, pool: str) -> bool:
        spec = self._pools.get(pool)
        return spec is not None and spec.kind is PoolKind.LAMBDA


def _budget(targets: QueryTargets) -> float:
    return targets.latency_ms if targets.latency_ms is not None else math.inf


def _eligible(targets: QueryTargets, candidates: Sequence[VariantProfile]) -> list[VariantProfile]:
    return [
        v
        for v in candidates
        if v.accuracy >= targets.min_accuracy
        and v.max_batch >= targets.batch
        and (targets.model_name is None or v.model_name == targets.model_name)
    ]


def closest_variant(targets: QueryTargets, variants: Sequence[VariantProfile]) -> VariantProfile | None:
    """The variant that misses the targets by least: accuracy shortfall first, then the relative
    latency overshoot (what INFaaS suggests back to the developer)."""
    budget = targets.latency_ms if targets.latency_ms is not None else math.inf
    usable = [v for v in variants if v.max_batch >= targets.batch]
    if not usable:
        return None

    def shortfall(v: VariantProfile) -> tuple[float, float]:
        accuracy_gap = max(0.0, targets.min_accuracy - v.accuracy)
        latency = v.latency_ms(targets.batch)
        latency_gap = 0.0 if math.isinf(budget) else max(0.0, latency - budget) / budget
        return (round(accuracy_gap, 6), latency_gap)

    return min(usable, key=lambda v: (shortfall(v), v.variant_id))


def unreachable_error(targets: QueryTargets, variants: Sequence[VariantProfile]) -> TargetsUnreachableError:
    """The 4xx a query gets when nothing meets its targets, naming the closest variant."""
    closest = closest_variant(targets, variants)
    wanted = f"accuracy>={targets.min_accuracy:g}"
    if targets.latency_ms is not None:
        wanted += f" within {targets.latency_ms:g} ms"
    if closest is None:
        return TargetsUnreachableError(
            f"no variant can serve a batch of {targets.batch} ({wanted})", requested=_requested(targets)
        )
    achievable = {
        "variant": closest.variant_id,
        "model": closest.model_name,
        "accuracy": closest.accuracy,
        "latency_ms": round(closest.latency_ms(targets.batch), 3),
        "cold_latency_ms": round(closest.load_latency_ms + closest.latency_ms(targets.batch), 3),
    }
    return TargetsUnreachableError(
        f"no variant meets {wanted}; closest is {closest.variant_id} "
        f"(accuracy {closest.accuracy:.4f}, {achievable['latency_ms']} ms p99 when loaded)",
        requested=_requested(targets),
        closest=achievable,
    )


def _requested(targets: QueryTargets) -> dict[str, object]:
    return {
        "accuracy": targets.min_accuracy,
        "latency_ms": targets.latency_ms,
        "model": targets.model_name,
        "batch": targets.batch,
    }
