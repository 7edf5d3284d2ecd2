"""Random variant-mix problems by *shape*, for the oracle test of the exact solver (test code only).

Each shape is a family of problems where a solver's claims have been wrong, or could be: the
oracle test (``tests/unit/test_scaling_oracle.py``) draws many of each with fresh seeds and judges
``solve_exact`` by the independent compact MILP of ``tests/scaling_reference.py`` (CBC, explicit
workers). Nothing here calls the project's solvers.

- ``must_cover_and_lax``: one model, two latency groups. A *tight* group that Lambda may not
  serve, so worker instances must cover it, and a *lax* group that Lambda may serve: the cheapest
  plan often runs the instances the tight group needs and splits the lax load between their spare
  time and Lambda (issue 32: the solver returned one instance more, called "optimal").
- ``several_pools``: variants of one or two models on up to four pools of different prices.
- ``tight_packing``: instances just above a half, a third or a quarter of a worker, several
  resources, copy limits: the fluid rows say less than a real packing.
- ``ties``: identical variants and pools, equal prices: many optima.
- ``infeasible_load``: pools with too few workers and groups Lambda may not serve: some load
  must stay unmet, the least possible.
- ``lambda_off``: Lambda switched off for the whole problem, or its concurrency binding.
- ``odd_resources``: variants that demand nothing, or one resource of several, workers with
  unusual capacities, large copy counts.
- ``mixed``: the reference module's own random problems (tiny and small), with fresh seeds.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from modelless.scaling.problem import ScalingGroup, ScalingPool, ScalingProblem, ScalingVariant
from tests.scaling_reference import SIZES, TINY_COMBINATIONS, _draw, combinations

PRICES = (1e-4, 2e-4, 3e-4, 5e-4)
SHARES = (0.25, 1 / 3, 0.34, 0.5, 0.51, 0.6, 0.7, 1.0)


def _pool(rng: random.Random, name: str, resources: dict[str, float], most: int | None = None) -> ScalingPool:
    least = rng.choice((0, 0, 0, 1))
    return ScalingPool(name, rng.choice(PRICES), resources, least, most if most is None else max(most, least))


def _variant(
    rng: random.Random,
    name: str,
    pool: ScalingPool,
    rates: dict[str, float],
    shares: tuple[float, ...] = SHARES,
) -> ScalingVariant:
    return ScalingVariant(
        id=name,
        pool=pool.name,
        saturation_qps=rates,
        demand={r: c * rng.choice(shares) for r, c in pool.capacity.items()},
        load_time_ms=rng.choice((0.0, 0.0, 500.0, 2000.0)),
        running=rng.choice((0, 0, 0, 1)),
        max_per_worker=rng.choice((None, 1, 1, 2)),
    )


def _lambda_price(rng: random.Random, pools: list[ScalingPool], base_qps: float) -> float:
    """About what a worker costs per query at ``base_qps``, cheaper or dearer."""
    cheapest = min(pool.price_per_worker_second for pool in pools)
    return cheapest / base_qps * rng.choice((0.2, 0.5, 0.8, 1.2, 3.0))


def must_cover_and_lax(rng: random.Random) -> ScalingProblem:
    pools = [
        _pool(rng, f"p{i}", {"vcpu": rng.choice((2.0, 4.0, 8.0)), "memory_mb": 8192.0})
        for i in range(rng.randint(1, 2))
    ]
    base = rng.choice((10.0, 25.0, 40.0, 100.0))
    variants = []
    for index in range(rng.randint(1, 4)):
        pool = rng.choice(pools)
        fast = base * rng.choice((0.5, 1.0, 1.3, 2.0))
        rates = {"lax": fast * rng.uniform(1.0, 4.0)}  # a lax budget allows larger batches
        if index == 0 or rng.random() < 0.75:
            rates["tight"] = fast
        variants.append(_variant(rng, f"v{index}", pool, rates))
    groups = [
        ScalingGroup("tight", base * rng.uniform(0.1, 3.5), 20.0, None, 0.0),
        ScalingGroup(
            "lax",
            base * rng.uniform(0.2, 6.0),
            200.0,
            _lambda_price(rng, pools, base),
            rng.choice((0.05, 0.2)),
        ),
    ]
    return ScalingProblem(
        variants, pools, groups, slack=rng.choice((0.0, 0.1)), load_cost_weight=rng.choice((0.0, 0.01, 0.5))
    )


def several_pools(rng: random.Random) -> ScalingProblem:
    pools = [
        _pool(rng, "cpu", {"vcpu": 4.0, "memory_mb": 8192.0}, rng.choice((None, 4))),
        _pool(rng, "cpu-xl", {"vcpu": 8.0, "memory_mb": 16384.0}, rng.choice((None, 3))),
        _pool(rng, "gpu", {"vcpu": 4.0, "memory_mb": 16384.0, "device_slots": 4.0}, rng.choice((None, 2))),
        _pool(rng, "accel", {"vcpu": 4.0, "memory_mb": 8192.0, "device_slots": 4.0}, rng.choice((None, 2))),
    ][: rng.randint(2, 4)]
    models = [f"m{i}" for i in range(rng.randint(1, 2))]
    group_ids = [f"{m}/{tier}" for m in models for tier in ("tight", "lax")]
    base = {g: rng.choice((10.0, 25.0, 40.0)) for g in group_ids}
    variants = []
    for index in range(rng.randint(2, 6)):
        model = rng.choice(models)
        pool = rng.choice(pools)
        speed = rng.choice((0.5, 1.0, 2.0, 4.0))
        rates = {
            g: base[g] * speed * (2.0 if g.endswith("lax") else 1.0)
            for g in group_ids
            if g.startswith(model + "/")
        }
        if rng.random() < 0.3:
            rates.pop(f"{model}/tight")
        variants.append(_variant(rng, f"v{index}", pool, rates))
    groups = []
    for g in group_ids:
        price = None if g.endswith("tight") and rng.random() < 0.7 else _lambda_price(rng, pools, base[g])
        groups.append(ScalingGroup(g, base[g] * rng.uniform(0.0, 4.0), 50.0, price, 0.1))
    return ScalingProblem(variants, pools, groups, load_cost_weight=rng.choice((0.0, 0.01)))


def tight_packing(rng: random.Random) -> ScalingProblem:
    resources = {"vcpu": 4.0, "memory_mb": 8192.0, "device_slots": 4.0}
    pools = [
        _pool(
            rng,
            f"p{i}",
            dict(rng.sample(sorted(resources.items()), rng.randint(1, 3))),
            rng.choice((None, None, 3)),
        )
        for i in range(rng.randint(1, 2))
    ]
    group_ids = [f"g{i}" for i in range(rng.randint(1, 3))]
    base = {g: rng.choice((10.0, 25.0)) for g in group_ids}
    variants = []
    for index in range(rng.randint(2, 5)):
        pool = rng.choice(pools)
        served = [g for g in group_ids if rng.random() < 0.7] or [rng.choice(group_ids)]
        variant = _variant(
            rng,
            f"v{index}",
            pool,
            {g: base[g] * rng.choice((0.5, 1.0, 1.5)) for g in served},
            (0.26, 0.34, 0.35, 0.51, 0.55, 0.6),
        )
        variants.append(variant)
    groups = [
        ScalingGroup(
            g,
            base[g] * rng.uniform(0.5, 5.0),
            100.0,
            None if rng.random() < 0.5 else _lambda_price(rng, pools, base[g]),
            0.05,
        )
        for g in group_ids
    ]
    return ScalingProblem(variants, pools, groups)


def ties(rng: random.Random) -> ScalingProblem:
    capacity = {"vcpu": 4.0}
    price = rng.choice(PRICES)
    pools = [ScalingPool(f"p{i}", price, capacity) for i in range(rng.randint(1, 2))]
    share = rng.choice((0.25, 0.5, 1.0))
    rate = rng.choice((10.0, 20.0))
    variants = [
        ScalingVariant(
            f"v{index}",
            rng.choice(pools).name,
            {"g0": rate, "g1": rate},
            {"vcpu": 4.0 * share},
            max_per_worker=rng.choice((None, 1)),
        )
        for index in range(rng.randint(2, 4))
    ]
    lam = price * share / rate  # Lambda at exactly what an instance's time costs
    groups = [
        ScalingGroup("g0", rate * rng.choice((0.5, 1.0, 2.0, 2.5)), 50.0, rng.choice((None, lam)), 0.05),
        ScalingGroup("g1", rate * rng.choice((0.5, 1.0, 1.5)), 50.0, lam, 0.05),
    ]
    return ScalingProblem(variants, pools, groups)


def infeasible_load(rng: random.Random) -> ScalingProblem:
    problem = must_cover_and_lax(rng) if rng.random() < 0.5 else tight_packing(rng)
    pools = [
        ScalingPool(p.name, p.price_per_worker_second, p.capacity, 0, rng.choice((0, 1, 2)))
        for p in problem.pools
    ]
    groups = [
        ScalingGroup(
            g.id,
            g.load_qps * rng.uniform(1.0, 3.0),
            g.latency_budget_ms,
            None if rng.random() < 0.6 else g.lambda_price_per_query,
            g.lambda_seconds_per_query,
        )
        for g in problem.groups
    ]
    return ScalingProblem(
        problem.variants, pools, groups, slack=problem.slack, load_cost_weight=problem.load_cost_weight
    )


def lambda_off(rng: random.Random) -> ScalingProblem:
    problem = must_cover_and_lax(rng) if rng.random() < 0.5 else several_pools(rng)
    if rng.random() < 0.5:
        return ScalingProblem(problem.variants, problem.pools, problem.groups, lambda_allowed=False)
    held = sum(
        problem.need(g) * g.lambda_seconds_per_query for g in problem.groups if g.lambda_price_per_query
    )
    return ScalingProblem(
        problem.variants, problem.pools, problem.groups, lambda_concurrency=held * rng.uniform(0.0, 0.8)
    )


def odd_resources(rng: random.Random) -> ScalingProblem:
    pools = [
        ScalingPool("wide", rng.choice(PRICES), {"vcpu": 64.0, "memory_mb": 262144.0}, 0, None),
        ScalingPool(
            "slots",
            rng.choice(PRICES),
            {"device_slots": rng.choice((1.0, 3.0, 7.0))},
            0,
            rng.choice((None, 2)),
        ),
    ]
    group_ids = ["g0", "g1"]
    variants = []
    for index in range(rng.randint(2, 5)):
        pool = rng.choice(pools)
        resource = rng.choice(sorted(pool.capacity))
        demand = (
            {}
            if rng.random() < 0.2
            else {resource: pool.capacity[resource] * rng.choice((0.05, 1 / 7, 1 / 3, 0.5, 1.0))}
        )
        rates = {g: rng.choice((5.0, 10.0, 30.0)) for g in group_ids if rng.random() < 0.7} or {"g0": 10.0}
        variants.append(
            ScalingVariant(f"v{index}", pool.name, rates, demand, max_per_worker=rng.choice((None, 1, 3)))
        )
    groups = [
        ScalingGroup(g, rng.uniform(5.0, 80.0), 50.0, rng.choice((None, 2e-6, 2e-5)), 0.1) for g in group_ids
    ]
    return ScalingProblem(variants, pools, groups)


def mixed(rng: random.Random) -> ScalingProblem:
    for _ in range(100):
        size = rng.choice(("tiny", "small"))

        problem = _draw(rng, *SIZES[size])
        if size != "tiny" or combinations(problem) <= TINY_COMBINATIONS:
            return problem
    raise RuntimeError("no problem drawn")


SHAPES: dict[str, Callable[[random.Random], ScalingProblem]] = {
    "must_cover_and_lax": must_cover_and_lax,
    "several_pools": several_pools,
    "tight_packing": tight_packing,
    "ties": ties,
    "infeasible_load": infeasible_load,
    "lambda_off": lambda_off,
    "odd_resources": odd_resources,
    "mixed": mixed,
}


def shaped_problem(shape: str, seed: int) -> ScalingProblem:
    """The problem of ``shape`` drawn with ``seed`` (the same for the same arguments)."""
    return SHAPES[shape](random.Random(f"oracle/{shape}/{seed}"))
