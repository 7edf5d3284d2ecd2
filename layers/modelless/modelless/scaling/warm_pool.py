"""How many Lambda containers to keep warm for the bursts Lambda takes (issue 14).

A query whose budget a Lambda cold start does not fit (a container's start plus the variant's
load: hundreds of ms against a 50 ms budget) is served on Lambda only by a container that is warm
and idle when it arrives; beyond those, selection refuses it (a 422) or answers it late. Reacting
to the first such query (the dispatcher's warm-up) is too late for the burst it belongs to. So the
scaler keeps warm, ahead of the burst, as many containers as the group's sub-second clumps need:

- a group's burst rate is its highest count in one ``PEAK_SLICE_S`` slice over the envelope's
  history, read per second (never below its mean rate);
- the containers it holds at once on Lambda are, by Little's law, that rate times the seconds an
  invocation runs; the containers to keep are one more than the ``WARM_QUANTILE`` quantile of a
  Poisson count with that mean, so that a query in a burst finds an idle one but once in a
  thousand;
- a container serves every variant of its memory size (one Lambda function per size), but one
  that does not hold a variant must load it first, which a budget a cold start misses does not
  fit either. So the pool is sized per memory size, for its variants' loads together (pooled, as
  the function's containers are), and each of those variants is kept warm in every one of its
  containers: a query of any of them finds the idle ones holding it. The whole pool stays within
  Lambda's account concurrency (``limit``), shared in proportion when it would not.

What keeping a container warm means is the warm pool's (``LambdaWarmPool``): on AWS, provisioned
concurrency or periodic concurrent warm-up invocations; in the local tier and the simulator, warm-up
invocations that start or refresh containers. Pure functions of explicit inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.special import pdtr

from modelless.query_load import PEAK_SLICE_S
from modelless.types import VariantProfile

WARM_QUANTILE = 0.999  # the share of a burst's queries that find an idle warm container holding their variant


@dataclass(frozen=True)
class WarmDemand:
    """One group's claim on a Lambda variant's warm containers."""

    variant_id: str
    memory_mb: int  # the Lambda function (memory size) that runs it
    burst_qps: float  # the rate its sub-second clumps arrive at
    seconds_per_query: float  # how long an invocation holds a container


def burst_rate(peaks: Sequence[int], mean_qps: float) -> float:
    """The group's highest ``PEAK_SLICE_S`` slice count in ``peaks`` as a rate per second, never
    below ``mean_qps``."""
    highest = max(peaks, default=0)
    return max(highest / PEAK_SLICE_S, mean_qps)


def containers_for(offered: float, quantile: float = WARM_QUANTILE) -> int:
    """Containers for ``offered`` of them busy on average (rate x seconds per query): one more
    than the ``quantile`` quantile of a Poisson count with that mean, so that a query arriving in
    a burst (arrivals see the time average) finds the busy ones and an idle one for itself with
    that probability. 0 for no load."""
    if not offered > 0:
        return 0
    # The quantile lies within a few standard deviations of the mean: search that range at once.
    top = int(offered + 10 * math.sqrt(offered) + 10)
    counts = np.arange(top + 1)
    busy = int(np.searchsorted(pdtr(counts, offered), quantile))
    return min(busy, top) + 1


def warm_containers(
    demands: Iterable[WarmDemand], limit: float | None = None, quantile: float = WARM_QUANTILE
) -> dict[str, int]:
    """Variant id -> the containers of its memory size to keep warm, each holding it, for
    ``demands`` (the same count for every variant of one size), within ``limit`` containers in
    all (Lambda's account concurrency)."""
    offered: dict[int, float] = {}
    variants: dict[int, set[str]] = {}
    for demand in demands:
        load = demand.burst_qps * demand.seconds_per_query
        if load > 0:
            offered[demand.memory_mb] = offered.get(demand.memory_mb, 0.0) + load
            variants.setdefault(demand.memory_mb, set()).add(demand.variant_id)
    sizes = within({memory: containers_for(load, quantile) for memory, load in offered.items()}, limit)
    return {variant_id: sizes[memory] for memory in sorted(sizes) for variant_id in sorted(variants[memory])}


def within(containers: Mapping[int, int], limit: float | None) -> dict[int, int]:
    """``containers`` (per memory size), shared in proportion within ``limit`` in all where they
    would pass it, each keeping at least one."""
    total = sum(containers.values())
    if limit is None or total <= limit:
        return dict(containers)
    share = limit / total
    return {key: max(1, math.floor(n * share)) for key, n in containers.items()}


class LambdaWarmPool(Protocol):
    """Keeps Lambda containers warm: ``keep_warm`` is called every scaler tick with, per variant,
    the containers of its memory size that should hold it warm (``warm_containers``: the same for
    every variant of one size) and its profile; a variant left out needs none any more."""

    def keep_warm(self, containers: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None: ...
