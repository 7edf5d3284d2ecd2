"""What the scaler plans with once a worker has tuned an instance: the capacity the tuner
reached, not the registration-time guess.

A worker reports, per instance, its configuration and how its runs compare with the profile's
(``InstanceStats.latency_scale``: measured run time over profiled, at the same batch size). The
scaler then plans the variant with its profile's latency tables scaled by that (averaged over the
workers that report it), its instance's throughput multiplied by the concurrent batches the
configuration runs, and its CPU demand the threads the configuration keeps busy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from modelless.tuning.base import ParallelConfig
from modelless.types import VariantProfile, WorkerState

# A worker's measured slowdown is trusted within these bounds only: a window of runs on a busy
# machine can read anything, and one bad report must not make the scaler plan ten times the fleet.
MIN_SCALE, MAX_SCALE = 0.1, 10.0


def clamped_scale(latency_scale: float) -> float:
    """A reported latency scale within the bounds it is trusted in (``MIN_SCALE``..``MAX_SCALE``)."""
    return min(MAX_SCALE, max(MIN_SCALE, latency_scale))


@dataclass(frozen=True)
class TunedCapacity:
    config: ParallelConfig
    latency_scale: float  # measured run time over the profile's, under ``config``


def reported_tuning(workers: Iterable[WorkerState]) -> dict[str, TunedCapacity]:
    """Variant id -> the tuned capacity its instances report: the configuration most instances
    run, and the mean of their measured scales (instances that measured nothing yet left out)."""
    seen: dict[str, list[tuple[ParallelConfig, float]]] = {}
    for worker in workers:
        for instance in worker.instances:
            if instance.latency_scale <= 0 or instance.intra_threads <= 0:
                continue
            config = ParallelConfig(
                instance.intra_threads, max(1, instance.inter_threads), max(1, instance.concurrency)
            )
            seen.setdefault(instance.variant_id, []).append((config, instance.latency_scale))
    tuned = {}
    for variant_id, reports in seen.items():
        configs = [config for config, _ in reports]
        common = max(set(configs), key=lambda c: (configs.count(c), c))
        scale = sum(s for _, s in reports) / len(reports)
        tuned[variant_id] = TunedCapacity(common, clamped_scale(scale))
    return tuned


def tuned_profile(profile: VariantProfile, tuned: TunedCapacity) -> VariantProfile:
    """``profile`` as the tuned instance performs: latency tables scaled by the measured slowdown,
    throughput by the slowdown and the concurrent batches, threads those the configuration uses.
    (Per-run latency is what a query sees; ``saturation_qps`` is what one instance serves.)"""
    scale = tuned.latency_scale
    return replace(
        profile,
        threads=tuned.config.threads,
        latency_p50_ms={b: ms * scale for b, ms in profile.latency_p50_ms.items()},
        latency_p99_ms={b: ms * scale for b, ms in profile.latency_p99_ms.items()},
        saturation_qps=profile.saturation_qps * tuned.config.concurrency / scale,
    )
