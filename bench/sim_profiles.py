"""The zoo the simulator serves, as the project's profiler measured it, and the latency targets
its queries carry.

The zoo is the real one (``bench.real_zoo``: timm image models at 3x224x224 and a BERT-style text
model, registered in-process by the project's ``RegistrationService`` and cached), so that the
cost study runs on the latencies of real architectures: a few ms to a few hundred ms per query
on one CPU thread. CPU and Lambda profiles are those measured at registration; GPU and Inferentia
profiles are derived from them (``bench.real_zoo.derive_accelerator_entries``: INFaaS Table 2's
ResNet-50 ratios), marked ``imported`` and "not measured here".

The heavy model (INFaaS §6.2's ResNet-50 patterns run on it alone) is the zoo's slowest
architecture on a CPU (ResNet-50 when the zoo holds it); the popularity of the architectures
follows INFaaS §6.1, where the popular ones are the large, accurate ones: slowest first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.real_zoo import RealZoo, RegisteredModel, real_zoo
from modelless.query_load import LATENCY_CLASSES_MS
from modelless.types import QueryTargets, VariantProfile
from sim.traces import Architecture

POPULAR = 2  # the first this many are "popular", the others "cold" (INFaaS: 4 of 22)
# Latency targets (INFaaS §6.1): popular models 50 ms; cold ones 1.5x the profiled latency (p99,
# batch 1) of their fastest CPU variant that meets their accuracy target, but never under
# COLD_FLOOR_MS: below it the serving path's own hand-off and jitter (about 2-3 ms through the
# Python HTTP stack, bench/serving.py), which INFaaS's rule could neglect and the simulator does
# not model, would decide whether a query is late. The real zoo's cold models get 10-500 ms.
POPULAR_SLO_MS = 50.0
COLD_SLO_FACTOR = 1.5
COLD_FLOOR_MS = 10.0
# INFaaS §6.2's patterns (ResNet-50 alone) state no SLO; its Table 3 gives ResNet-50 300 ms, 1.5x
# its 200 ms CPU variant. Here: the smallest of the project's latency classes
# (modelless.query_load.LATENCY_CLASSES_MS) at or above 1.5x the heavy model's developer CPU
# variant's p99 at batch 1, so that the scaler plans with exactly the target.
PATTERN_SLO_FACTOR = 1.5


@dataclass(frozen=True)
class Zoo:
    """The profiles the simulator serves (measured and derived) and the registered models they
    came from (none in a hand-built zoo)."""

    profiles: list[VariantProfile]
    repository: Path = Path("repo")
    models: list[RegisteredModel] = field(default_factory=list)

    @classmethod
    def of(cls, real: RealZoo) -> Zoo:
        return cls(real.profiles, real.repository, list(real.models))

    def by_model(self) -> dict[str, list[VariantProfile]]:
        grouped: dict[str, list[VariantProfile]] = {}
        for profile in self.profiles:
            grouped.setdefault(profile.model_name, []).append(profile)
        return grouped

    def measured(self) -> list[VariantProfile]:
        return [p for p in self.profiles if not p.imported]

    @property
    def popularity(self) -> tuple[str, ...]:
        """The architectures, most popular first: the slowest on a CPU first (INFaaS §6.1: the
        popular architectures are the large, accurate ones)."""
        by_model = self.by_model()
        return tuple(sorted(by_model, key=lambda m: (-developer_cpu_variant(by_model[m]).median_ms(1), m)))

    @property
    def heavy(self) -> str:
        """The model INFaaS §6.2's patterns serve alone: the slowest on a CPU."""
        return self.popularity[0]

    @property
    def named(self) -> tuple[str, ...]:
        """Architectures whose queries name their model: the heavy one (INFaaS's implementation
        queries a model architecture with a latency target; a model-less query for it might be
        answered by a smaller model of equal rounded accuracy, and the patterns would then say
        nothing about the regime INFaaS measured). The others are model-less."""
        return (self.heavy,)

    @property
    def registration_s(self) -> float:
        return sum(m.all_profiled_s for m in self.models)


def measured_zoo(
    state_dir: Path = Path(".modelless"), quick: bool = False, only: Sequence[str] | None = None
) -> Zoo:
    """The real zoo's profiles, registered (or taken from the cache) by ``bench.real_zoo``."""
    return Zoo.of(real_zoo(only, quick=quick, state_dir=state_dir))


def developer_cpu_variant(profiles: Sequence[VariantProfile]) -> VariantProfile:
    """The CPU variant a developer who must pick one would deploy (INFaaS's baselines: the
    framework's FP32 model, one thread): FP32 with the fewest threads, fully optimised if kept,
    the fastest of those; the fastest CPU variant when pruning kept no FP32 one."""
    cpu = [p for p in profiles if p.pool == "cpu"]
    fp32 = [p for p in cpu if p.precision == "fp32"] or cpu
    return min(fp32, key=lambda p: (p.threads, p.opt_level != "all", p.latency_p50_ms[1], p.variant_id))


def developer_gpu_variant(profiles: Sequence[VariantProfile]) -> VariantProfile:
    return min((p for p in profiles if p.pool == "gpu"), key=lambda p: (p.latency_p50_ms[1], p.variant_id))


def accuracy_target(profiles: Sequence[VariantProfile]) -> float:
    """The accuracy a query for this model asks for: its developer's variant's, rounded down to
    the hundredth (the scaler's load groups round accuracy up to the next one)."""
    return math.floor(round(developer_cpu_variant(profiles).accuracy * 100, 6)) / 100


def fastest_accurate_cpu_ms(profiles: Sequence[VariantProfile]) -> float:
    """The profiled latency (p99, batch 1) of the model's fastest CPU variant among those meeting
    its accuracy target."""
    floor = accuracy_target(profiles)
    return min(p.latency_ms(1) for p in profiles if p.pool == "cpu" and p.accuracy >= floor)


def cold_slo_ms(profiles: Sequence[VariantProfile]) -> float:
    """INFaaS §6.1's target for a cold model: 1.5x ``fastest_accurate_cpu_ms``, at least
    ``COLD_FLOOR_MS``."""
    return max(COLD_FLOOR_MS, round(COLD_SLO_FACTOR * fastest_accurate_cpu_ms(profiles), 3))


def pattern_slo_ms(zoo: Zoo) -> float:
    """The patterns' target: the latency class at or above 1.5x the heavy model's developer CPU
    variant's p99 at batch 1 (INFaaS Table 3: 300 ms for a 200 ms ResNet-50 CPU variant)."""
    wanted = PATTERN_SLO_FACTOR * developer_cpu_variant(zoo.by_model()[zoo.heavy]).latency_ms(1)
    return min((c for c in LATENCY_CLASSES_MS if c >= wanted), default=math.ceil(wanted))


def _architecture(zoo: Zoo, model: str, slo_ms: float) -> Architecture:
    profiles = zoo.by_model()[model]
    named = model if model in zoo.named else None
    targets = QueryTargets(
        profiles[0].app_id, latency_ms=slo_ms, min_accuracy=accuracy_target(profiles), model_name=named
    )
    return Architecture(model, targets, slo_ms)


def architectures(zoo: Zoo) -> list[Architecture]:
    """The zoo as the trace workloads ask for it (INFaaS §6.1), most popular first: each
    architecture's queries carry its accuracy target and its latency target (50 ms for the
    popular ones, ``cold_slo_ms`` for the others), and name their model where ``Zoo.named``."""
    by_model = zoo.by_model()
    return [
        _architecture(zoo, model, POPULAR_SLO_MS if rank < POPULAR else cold_slo_ms(by_model[model]))
        for rank, model in enumerate(zoo.popularity)
    ]


def cpu_servable_architectures(zoo: Zoo) -> list[Architecture]:
    """``architectures`` as a machine of CPUs alone can serve them (the simulator's check against
    the live embedded stack, ``bench.sim_validation``): an architecture whose latency target no
    CPU variant meeting its accuracy fits at batch 1 (p99) gets the cold models' target instead
    (``cold_slo_ms``). Otherwise its every query would be refused, live and simulated alike (no
    variant meets the targets), and the check would compare nothing of its latencies."""
    by_model = zoo.by_model()
    servable: list[Architecture] = []
    for architecture in architectures(zoo):
        profiles = by_model[architecture.model]
        if fastest_accurate_cpu_ms(profiles) > architecture.slo_ms:
            architecture = _architecture(zoo, architecture.model, cold_slo_ms(profiles))
        servable.append(architecture)
    return servable


def pattern_architectures(zoo: Zoo) -> list[Architecture]:
    """INFaaS §6.2's patterns: the heavy model alone, named, with ``pattern_slo_ms``."""
    return [_architecture(zoo, zoo.heavy, pattern_slo_ms(zoo))]
