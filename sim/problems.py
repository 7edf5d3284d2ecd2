"""Random variant-mix problems shaped like the catalog and like what the scaler builds: for
sizing studies (how the exact program scales with the number of architectures), the scaler's
benchmark (``bench/scaler.py``) and the solver's tests.

Every architecture has 8 variants (fp32 and int8, two optimisation levels, one or two threads) on
each of 4 provisioned pools (c5.large, c5.2xlarge, g4dn.xlarge with 4 instances per T4,
inf1.xlarge with 4 per Inferentia chip), with batch latency tables, peak memory and load times; a
worker holds one instance of a variant (``one_instance_per_worker``, as ``ScalerConfig`` has it);
two latency classes of load per architecture (some idle, some with an accuracy class only fp32
meets); a Lambda price per query for about half the groups; one variant per architecture already
running for half of them, on ready workers (a worker start-up of 60 s for the others); INFaaS's
λ = 0.01/s; slack 0.1. Seeded: the same arguments give the same instances.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from modelless.catalog import ACCEL_POOL, CPU_POOL, GPU_POOL, LAMBDA_MB_PER_VCPU, PoolKind, PoolSpec
from modelless.scaling import (
    ScalingGroup,
    ScalingProblem,
    ScalingVariant,
    one_instance_per_worker,
    pool_from_spec,
    variant_from_profile,
)
from modelless.scaling.problem import first_fit_workers
from modelless.types import VariantProfile

# c5.2xlarge: 8 vCPUs, 16 GiB, $0.34/h.
CPU_XL_POOL = PoolSpec(
    name="cpu-xl",
    kind=PoolKind.PROVISIONED,
    vcpus_per_worker=8,
    memory_mb_per_worker=16384,
    price_per_vcpu_second=0.34 / 3600 / 8,
    thread_options=(1, 2),
)
POOLS = (CPU_POOL, CPU_XL_POOL, GPU_POOL, ACCEL_POOL)
# How much faster than one CPU thread at batch one, and how latency grows per extra input.
SPEEDUP = {"cpu": 1.0, "cpu-xl": 1.1, "gpu": 6.0, "accel": 4.0}
PER_INPUT = {"cpu": 0.85, "cpu-xl": 0.85, "gpu": 0.08, "accel": 0.15}
BATCHES = (1, 2, 4, 8, 16, 32)
LAMBDA_GB_SECOND = 0.0000166667
LAMBDA_REQUEST = 0.0000002
WORKER_STARTUP_S = 60.0  # as ScalerConfig.worker_startup_s


def _profile(
    rng: random.Random, arch: int, spec: PoolSpec, index: int, base_ms: float, memory: float
) -> VariantProfile:
    precision = "int8" if index & 1 else "fp32"
    opt_level = "all" if index & 2 else "basic"
    threads = 2 if index & 4 and spec.device == "cpu" else 1
    speed = SPEEDUP[spec.name] * (1.6 if precision == "int8" else 1.0) * (1.15 if opt_level == "all" else 1.0)
    speed *= 1.7 if threads == 2 else 1.0
    one = base_ms / speed * rng.uniform(0.85, 1.15)
    table = {b: one * (1 + PER_INPUT[spec.name] * (b - 1)) for b in BATCHES}
    peak = memory * (0.5 if precision == "int8" else 1.0)
    return VariantProfile(
        variant_id=f"a{arch}/{precision}-{opt_level}-{threads}t-{index}/{spec.name}",
        app_id="bench",
        model_name=f"a{arch}",
        pool=spec.name,
        precision=precision,
        opt_level=opt_level,
        threads=threads,
        artifact_key="",
        size_bytes=int(peak * 1e6),
        # Loading reads the weights and builds the session: it grows with the model's size, and
        # the full graph optimisations take longer to apply; accelerators add a device transfer.
        load_latency_ms=(150 + 2.5 * peak)
        * (1.3 if opt_level == "all" else 1.0)
        * (2.0 if spec.device != "cpu" else 1.0)
        * rng.uniform(0.9, 1.1),
        latency_p50_ms={b: t * 0.8 for b, t in table.items()},
        latency_p99_ms=table,
        peak_memory_mb=peak,
        accuracy=0.9,
        price_per_second=0.0,
        request_price=0.0,
        hardware="synthetic",
        measured_on_target=False,
    )


def make_problem(architectures: int, seed: int) -> ScalingProblem:
    """A random problem shaped like the catalog and like the scaler's (the module docstring)."""
    rng = random.Random(seed)
    pools = []
    for spec in POOLS:
        limit = max(2, math.ceil(architectures * rng.uniform(0.5, 3.0)))
        pools.append(pool_from_spec(spec, max_workers=limit))
    variants: list[ScalingVariant] = []
    groups: list[ScalingGroup] = []
    for arch in range(architectures):
        base_ms = math.exp(rng.uniform(math.log(2.0), math.log(150.0)))  # one CPU thread, batch 1
        memory = rng.uniform(40.0, 1200.0)
        own: list[ScalingGroup] = []
        strict_accuracy: set[str] = set()  # groups whose accuracy class only fp32 variants meet
        for tier, factor in (("tight", rng.uniform(0.4, 1.5)), ("lax", rng.uniform(3.0, 12.0))):
            load = 0.0 if rng.random() < 0.15 else math.exp(rng.uniform(math.log(0.5), math.log(400.0)))
            budget = base_ms * factor
            lambda_price = None
            if rng.random() < 0.5 and base_ms <= budget:
                lambda_price = LAMBDA_GB_SECOND * LAMBDA_MB_PER_VCPU / 1024 * base_ms / 1000 + LAMBDA_REQUEST
            own.append(ScalingGroup(f"a{arch}/{tier}", load, budget, lambda_price))
            if rng.random() < 0.3:
                strict_accuracy.add(own[-1].id)
        groups.extend(own)
        # What the previous plan left running: one or two instances of one variant, for half the
        # architectures (the rest are new, or were idle).
        deployed = rng.randrange(len(POOLS) * 8) if rng.random() < 0.5 else -1
        for pool_index, spec in enumerate(POOLS):
            for index in range(8):
                profile = _profile(rng, arch, spec, index, base_ms, memory)
                running = rng.choice((1, 2)) if pool_index * 8 + index == deployed else 0
                eligible = [g for g in own if profile.precision == "fp32" or g.id not in strict_accuracy]
                variant = variant_from_profile(profile, spec, eligible, running=running)
                if variant.saturation_qps:
                    variants.append(variant)
    # As the controller builds it: one instance of a variant per worker; the pools have the
    # workers that hold what runs, ready, and take a minute to start more.
    pools, variants = one_instance_per_worker(pools, variants)
    for index, pool in enumerate(pools):
        loaded = [v for v in variants if v.pool == pool.name for _ in range(v.running)]
        ready = first_fit_workers(pool, loaded) or 0
        pools[index] = replace(pool, current_workers=ready, ready_workers=ready, startup_s=WORKER_STARTUP_S)
    return ScalingProblem(variants, pools, groups, slack=0.1, load_cost_weight=0.01)
