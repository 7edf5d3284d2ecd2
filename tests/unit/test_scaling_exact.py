"""The exact solver's pattern program against the program as INFaaS writes it (the compact one),
its proven lower bounds, the packing check and what it does to a plan's status, the
one-instance-per-worker rule in the packing, the closed-form split of a set's instances and the
patterns the duals keep. Pure: no network, no store, no clock."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from modelless.scaling import (
    PlanStatus,
    ScalingGroup,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    solve_compact,
    solve_exact,
    solve_greedy,
    violations,
)
from modelless.scaling.patterns import (
    Prices,
    _pattern_table,
    _reduced,
    _Sets,
    _split_by_lp,
    _split_two,
    components_of,
    k_instances,
    usable_variants,
)
from modelless.scaling.problem import first_fit_workers
from sim.problems import make_problem

VCPU = "vcpu"


# 60/3 takes proof rounds that rule ways out by their reduced cost (exact's module docstring).
@pytest.mark.parametrize(
    ("architectures", "seed"), [(3, 11), (5, 13), (8, 17), (12, 19), (20, 5), (30, 7), (60, 3)]
)
def test_the_pattern_program_finds_the_optimum_of_the_compact_program(architectures: int, seed: int) -> None:
    problem = make_problem(architectures, seed)
    exact = solve_exact(problem, time_limit_s=60.0)
    compact = solve_compact(problem, time_limit_s=60.0)
    assert exact.status is PlanStatus.OPTIMAL and compact.status is PlanStatus.OPTIMAL
    assert violations(problem, exact) == [] and violations(problem, compact) == []
    # Both are optimal within HiGHS's 0.01 % gap.
    assert exact.objective == pytest.approx(compact.objective, rel=2e-4)
    assert exact.lower_bound is not None
    assert exact.lower_bound <= compact.objective * (1 + 1e-9)
    assert exact.gap is not None and exact.gap <= 1e-4


def test_a_plan_stopped_by_its_deadline_is_valid_and_its_lower_bound_holds() -> None:
    problem = make_problem(60, seed=3)
    optimum = solve_exact(problem, time_limit_s=120.0)
    assert optimum.status is PlanStatus.OPTIMAL
    for limit in (0.01, 0.1, 0.3):
        plan = solve_exact(problem, time_limit_s=limit)
        assert violations(problem, plan) == []
        if plan.lower_bound is not None:
            assert plan.lower_bound <= optimum.objective * (1 + 1e-9)
        if plan.status is PlanStatus.INFEASIBLE_PARTIAL:
            # Nothing found in time: what runs now holds, and what Lambda may not take waits.
            assert any("holding plan" in note for note in plan.notes)
            continue
        assert plan.unmet_qps == {}
        assert plan.objective >= optimum.objective * (1 - 1e-4)
        if plan.status is not PlanStatus.OPTIMAL:
            assert plan.status is PlanStatus.TIME_LIMIT
            assert any("time limit" in note for note in plan.notes)


def one_per_worker(name: str, q: float, group: str, vcpus: float = 1.0) -> ScalingVariant:
    return ScalingVariant(name, "pool", {group: q}, {VCPU: vcpus}, max_per_worker=1)


def test_copies_of_a_variant_need_as_many_workers_as_copies() -> None:
    # Four instances would fit one worker's vCPUs, but a worker holds one copy of a variant.
    pool = ScalingPool("pool", 1.0, {VCPU: 4.0})
    problem = ScalingProblem([one_per_worker("v", 100.0, "g")], [pool], [ScalingGroup("g", 250.0, 50.0)])
    for solver in (solve_exact, solve_greedy):
        plan = solver(problem)
        assert plan.instances_of("v") == 3
        assert plan.workers == {"pool": 3}
        assert violations(problem, plan) == []
    assert solve_exact(problem).status is PlanStatus.OPTIMAL


def test_a_dominated_variant_is_kept_where_the_one_it_loses_to_cannot_carry_the_load_alone() -> None:
    # "fast" is better than "slow" in every way, but one worker holds one copy of each, and one
    # "fast" carries 100 of the 150 QPS: the plan needs "slow" beside it.
    group = ScalingGroup("g", 150.0, 50.0)
    pool = ScalingPool("pool", 1.0, {VCPU: 4.0}, max_workers=1)
    variants = [one_per_worker("fast", 100.0, "g"), one_per_worker("slow", 60.0, "g")]
    problem = ScalingProblem(variants, [pool], [group])
    plan = solve_exact(problem)
    assert plan.status is PlanStatus.OPTIMAL
    assert plan.instances_of("fast") == 1 and plan.instances_of("slow") == 1
    assert plan.workers == {"pool": 1}
    assert plan.unmet_qps == {}
    assert violations(problem, plan) == []


def usable_by_definition(problem: ScalingProblem) -> list[int]:
    """``usable_variants`` as its docstring words it, pair by pair: the reference for its numpy."""
    needs = {group.id: problem.need(group) for group in problem.groups}
    active = {
        vi: {g: q for g, q in variant.saturation_qps.items() if q > 0 and needs[g] > 1e-6}
        for vi, variant in enumerate(problem.variants)
    }
    candidates = [vi for vi, v in enumerate(problem.variants) if problem.per_worker(v) > 0 and active[vi]]

    def dominates(ui: int, vi: int) -> bool:
        u, v = problem.variants[ui], problem.variants[vi]
        carries = sum(needs[g] / q for g, q in active[ui].items()) <= 1.0 + 1e-9
        return (
            problem.load_cost(u) <= problem.load_cost(v)
            and ((u.max_per_worker is None and v.max_per_worker is None) or carries)
            and all(u.demand.get(r, 0.0) <= v.demand.get(r, 0.0) for r in {*u.demand, *v.demand})
            and all(active[ui].get(g, 0.0) >= q for g, q in active[vi].items())
        )

    def lost(vi: int) -> bool:
        variant = problem.variants[vi]
        first = next(iter(active[vi]))
        rivals = [ui for ui in candidates if ui != vi and problem.variants[ui].pool == variant.pool]
        return variant.running == 0 and any(
            first in active[ui] and dominates(ui, vi) and (ui < vi or not dominates(vi, ui)) for ui in rivals
        )

    return [vi for vi in candidates if not lost(vi)]


@pytest.mark.parametrize("seed", range(40))
def test_the_usable_variants_are_those_no_other_dominates_by_definition(seed: int) -> None:
    # Random shapes the catalog's problems do not have: twins, copies limits, running variants,
    # resources only some variants name, groups without load, variants serving several groups.
    rng = np.random.default_rng(seed)
    groups = [ScalingGroup(f"g{i}", float(rng.choice([0.0, 5.0, 40.0, 400.0])), 50.0) for i in range(4)]
    pools = [ScalingPool(f"p{i}", 1.0, {VCPU: 4.0, "memory_mb": 8000.0}) for i in range(2)]
    variants = []
    for i in range(int(rng.integers(2, 14))):
        served = rng.choice(4, size=int(rng.integers(1, 4)), replace=False)
        rates = {f"g{g}": float(rng.choice([0.0, 50.0, 100.0, 150.0])) for g in served}
        demand = {VCPU: float(rng.choice([1.0, 2.0, 5.0]))}
        if rng.random() < 0.5:
            demand["memory_mb"] = float(rng.choice([500.0, 1000.0]))
        variants.append(
            ScalingVariant(
                f"v{i}", f"p{rng.integers(2)}", rates, demand,
                load_time_ms=float(rng.choice([100.0, 200.0])),
                running=int(rng.random() < 0.2),
                max_per_worker=1 if rng.random() < 0.3 else None,
            )
        )  # fmt: skip
        if rng.random() < 0.2:  # a twin: of identical variants the first stays
            variants.append(replace(variants[-1], id=f"v{i}-twin"))
    problem = ScalingProblem(variants, pools, groups, load_cost_weight=0.01)
    assert usable_variants(problem) == usable_by_definition(problem)


def three_large_instances(max_workers: int | None, lambda_price: float | None) -> ScalingProblem:
    """Three variants of 1.1 vCPU on 2-vCPU workers, one group each: the resource rows say two
    workers hold them (3.3 <= 4), but no worker holds two of them."""
    groups = [ScalingGroup(f"g{i}", 10.0, 100.0, lambda_price) for i in range(3)]
    variants = [ScalingVariant(f"v{i}", "pool", {f"g{i}": 100.0}, {VCPU: 1.1}) for i in range(3)]
    return ScalingProblem(variants, [ScalingPool("pool", 1.0, {VCPU: 2.0}, max_workers=max_workers)], groups)


def test_items_over_half_a_worker_get_a_worker_each_in_the_program_itself() -> None:
    # The fluid rows alone say two workers (3.3 vCPUs <= 4); the packing row (items over half a
    # worker need one each) makes the program's optimum the plan that really packs: proven.
    problem = three_large_instances(max_workers=None, lambda_price=None)
    plan = solve_exact(problem)
    assert plan.workers == {"pool": 3}
    assert plan.total_instances == 3
    assert plan.status is PlanStatus.OPTIMAL
    assert plan.lower_bound == pytest.approx(3.0)
    assert plan.objective == pytest.approx(3.0)
    assert violations(problem, plan) == []


@pytest.mark.parametrize("lambda_price", [1.0, None], ids=["lambda", "no-lambda"])
def test_instances_that_do_not_fit_the_pool_limit_give_their_load_to_lambda_or_leave_it_unmet(
    lambda_price: float | None,
) -> None:
    problem = three_large_instances(max_workers=2, lambda_price=lambda_price)
    plan = solve_exact(problem)
    assert plan.workers == {"pool": 2}
    assert plan.total_instances == 2
    moved = plan.lambda_qps if lambda_price is not None else plan.unmet_qps
    assert sum(moved.values()) == pytest.approx(10.0)
    expected = PlanStatus.OPTIMAL if lambda_price is not None else PlanStatus.INFEASIBLE_PARTIAL
    assert plan.status is expected
    assert violations(problem, plan) == []


def test_first_fit_puts_copies_of_a_variant_on_different_workers() -> None:
    pool = ScalingPool("pool", 1.0, {VCPU: 4.0})
    free = ScalingVariant("v", "pool", {}, {VCPU: 1.0})
    limited = ScalingVariant("v", "pool", {}, {VCPU: 1.0}, max_per_worker=1)
    assert first_fit_workers(pool, [free, free, free]) == 1
    assert first_fit_workers(pool, [limited, limited, limited]) == 3
    # The variant with the most copies goes first, so that the others fill around it.
    other = [ScalingVariant(f"o{i}", "pool", {}, {VCPU: 1.0}, max_per_worker=1) for i in range(4)]
    assert first_fit_workers(pool, [*other[:2], limited, limited]) == 2


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_closed_form_split_saves_as_much_as_the_lp_split(seed: int) -> None:
    # Random sets of three instances sharing two groups (a Lambda price, or none: must cover).
    rng = np.random.default_rng(seed)
    sets, k = 400, 3
    rates = rng.uniform(0.0, 100.0, size=(sets, k, 2)) * (rng.random((sets, k, 2)) > 0.2)
    needs = rng.uniform(1.0, 250.0, size=2)
    for weight in (np.array([2.0, 1.0]), np.array([1.0, 3.0]), np.array([1000.0, 1.0])):
        part = _Sets(0, np.zeros((sets, k), dtype=np.int64), [0, 1], needs, [1.0, 1.0], weight, rates)
        closed = _split_two(rates, needs, weight)
        _split_by_lp([part])
        for served in (closed, part.served):
            # Each instance's time is at most one, each group gets at most its need.
            assert np.all((served / np.where(rates > 0, rates, 1.0)).sum(axis=2) <= 1 + 1e-9)
            assert np.all(served.sum(axis=1) <= needs + 1e-6)
            assert np.all(served[rates == 0] == 0)
        worth_closed = closed.sum(axis=1) @ weight
        worth_lp = part.served.sum(axis=1) @ weight
        assert worth_closed == pytest.approx(worth_lp, rel=1e-9, abs=1e-6)


def test_priced_patterns_are_every_pattern_whose_reduced_cost_is_within_the_slack() -> None:
    problem = make_problem(30, seed=7)
    usable = usable_variants(problem)
    components = components_of(problem, usable)
    wanted = {ci: component for ci, component in enumerate(components) if component.patterns}
    everything = k_instances(problem, wanted, 2)
    rng = np.random.default_rng(7)
    keys = [(pi, r) for pi, pool in enumerate(problem.pools) for r in pool.capacity]
    prices = Prices(
        capacity={key: float(rng.uniform(0.0, 2.0)) for key in keys},
        choice={ci: float(rng.uniform(0.5, 3.0)) for ci in wanted},
        scale=min(pool.price_per_worker_second for pool in problem.pools),
        slack=0.1,  # about half the two-instance patterns have a reduced cost within it
    )
    fresh_components = components_of(problem, usable)
    priced = k_instances(problem, {ci: fresh_components[ci] for ci in wanted}, 2, prices)
    checked = 0
    for ci, patterns in everything.items():
        table = _pattern_table(problem, patterns)
        within_slack = _reduced(table, problem, prices, ci) <= prices.slack
        kept = {(p.instances, round(p.cost, 15)) for p in priced[ci]}
        kept_table = _pattern_table(problem, priced[ci]) if priced[ci] else np.zeros((0, table.shape[1]))
        for pattern, row, cheap in zip(patterns, table, within_slack, strict=True):
            if not cheap:
                continue
            checked += 1
            # Kept, or dominated by a kept pattern (no more of anything, no dearer).
            assert (pattern.instances, round(pattern.cost, 15)) in kept or np.any(
                np.all(kept_table <= row + 1e-12 * (1 + np.abs(row)), axis=1)
            )
    assert checked >= 10


def test_an_empty_problem_is_an_empty_plan() -> None:
    plan = solve_exact(ScalingProblem(variants=[], pools=[], groups=[]), 1.0)
    assert plan.status is PlanStatus.OPTIMAL
    assert plan.total_instances == 0 and plan.cost_per_second == 0.0 and not plan.unmet


def stopped_by_the_deadline(
    monkeypatch: pytest.MonkeyPatch, objective_factor: float, bound_factor: float
) -> None:
    """Make every plan solve_exact reads look stopped by its deadline: objective and proven lower
    bound set from the true plan's objective (HiGHS's incumbent cannot be made poor on cue)."""
    from dataclasses import replace

    from modelless.scaling import readback

    real_plan = readback.read_plan

    def poor(*args: object, **kwargs: object) -> object:
        plan = real_plan(*args, **kwargs)  # type: ignore[arg-type]
        return replace(
            plan,
            status=PlanStatus.TIME_LIMIT,
            objective=plan.objective * objective_factor,
            lower_bound=plan.objective * bound_factor,
        )

    monkeypatch.setattr(readback, "read_plan", poor)


def test_a_poor_plan_stopped_by_the_deadline_gives_way_to_the_greedys_when_cheaper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = make_problem(8, seed=17)
    greedy = solve_greedy(problem)
    optimum = solve_exact(problem, time_limit_s=60.0)
    assert greedy.objective < 3 * optimum.objective
    stopped_by_the_deadline(monkeypatch, objective_factor=3.0, bound_factor=1.0)

    plan = solve_exact(problem, time_limit_s=60.0)

    assert plan.solver == "greedy" and plan.status is PlanStatus.TIME_LIMIT
    assert plan.objective == pytest.approx(greedy.objective)
    assert plan.lower_bound == pytest.approx(optimum.objective)  # the program's bound still holds
    assert any("certified gap of 66.7%" in note for note in plan.notes), plan.notes
    assert violations(problem, plan) == []


def test_a_plan_stopped_by_the_deadline_is_kept_when_the_greedys_is_no_cheaper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = make_problem(8, seed=17)
    optimum = solve_exact(problem, time_limit_s=60.0)
    stopped_by_the_deadline(monkeypatch, objective_factor=1.0, bound_factor=0.5)

    plan = solve_exact(problem, time_limit_s=60.0)

    assert plan.solver == "milp" and plan.status is PlanStatus.TIME_LIMIT
    assert plan.objective == pytest.approx(optimum.objective)
    assert plan.gap == pytest.approx(0.5)


@pytest.mark.parametrize(("architectures", "seed"), [(8, 17), (20, 5), (60, 3)])
def test_the_lps_rounding_is_a_valid_plan_where_every_component_has_a_block(
    architectures: int, seed: int
) -> None:
    """Blocks (per-variant rows, switched on by m) are rounded too: the block as if fully on,
    instances rounded up; the plan it reads back serves every group and breaks nothing."""
    import time

    from modelless.scaling import exact_model, highs, incumbent, readback

    problem = make_problem(architectures, seed)
    usable = usable_variants(problem)
    components = components_of(problem, usable)
    blocks = frozenset(range(len(components)))
    model = exact_model.build_model(problem, components, usable, blocks, patterns=True)
    duals = highs.lp_duals(model, 60.0)
    assert duals is not None and model.m_cols.keys() == blocks
    rounded = incumbent.rounded(problem, model, duals.x)
    assert rounded is not None
    assert float(model.c @ rounded) >= duals.bound - 1e-6
    plan = readback.read_plan(problem, model, rounded, PlanStatus.TIME_LIMIT, time.perf_counter(), [], None)
    assert violations(problem, plan) == [] and plan.unmet_qps == {}


@pytest.mark.parametrize(("architectures", "seed"), [(8, 17), (20, 5), (60, 3), (100, 1)])
def test_a_milp_that_never_answers_leaves_the_best_rounding_not_the_holding_plan(
    monkeypatch: pytest.MonkeyPatch, architectures: int, seed: int
) -> None:
    """HiGHS abandoned past its deadline (OutOfTime) in the plan's MILP: the call still returns
    a plan of the program (the best rounding, or the greedy's where that is cheaper than a plan
    whose certified gap is poor), with the bound the compact LP proved, and nothing unmet."""
    from modelless.scaling import highs
    from modelless.scaling.deadline import OutOfTime

    problem = make_problem(architectures, seed)
    optimum = solve_exact(problem, time_limit_s=120.0)

    def abandoned(*args: object, **kwargs: object) -> object:
        raise OutOfTime

    monkeypatch.setattr(highs, "attempt", abandoned)  # every MILP of the solve calls it there
    plan = solve_exact(problem, time_limit_s=60.0)

    assert plan.solver in ("milp", "greedy") and plan.status is PlanStatus.TIME_LIMIT
    assert plan.unmet_qps == {} and violations(problem, plan) == []
    assert plan.lower_bound is not None and plan.lower_bound <= optimum.objective * (1 + 1e-9)
    assert optimum.objective * (1 - 1e-4) <= plan.objective
    assert plan.gap is not None  # certified: how wide depends on how few workers there are


@pytest.mark.parametrize(("architectures", "seed"), [(8, 17), (20, 5), (60, 3), (100, 1)])
def test_filling_a_roundings_spare_room_breaks_no_row_and_never_costs_more(
    architectures: int, seed: int
) -> None:
    from modelless.scaling import exact_model, highs, incumbent

    problem = make_problem(architectures, seed)
    usable = usable_variants(problem)
    components = components_of(problem, usable)
    forced = frozenset(ci for ci, component in enumerate(components) if not component.patterns)
    model = exact_model.build_model(problem, components, usable, forced, patterns=True)
    duals = highs.lp_duals(model, 60.0)
    assert duals is not None
    rounded = incumbent.rounded(problem, model, duals.x)
    assert rounded is not None
    filled = incumbent.filled(model, rounded)
    rows = model.matrix @ filled
    assert np.all(rows <= model.row_upper + 1e-7) and np.all(rows >= model.row_lower - 1e-7)
    assert np.array_equal(filled[list(model.w_cols.values())], rounded[list(model.w_cols.values())])
    assert float(model.c @ filled) <= float(model.c @ rounded) + 1e-12
    assert float(model.c @ filled) >= duals.bound - 1e-6


def _one_by_one_first_fit(
    pool: ScalingPool, items: list[ScalingVariant], most: int | None
) -> tuple[int, list[str]]:
    """First fit decreasing one instance at a time (the definition ``first_fit_workers`` keeps,
    written apart): workers used and the ids of the instances left out."""
    resources = list(pool.capacity)
    counts = {v.id: sum(1 for w in items if w.id == v.id) for v in items}

    def key(v: ScalingVariant) -> tuple[float, float, str]:
        shares = (v.demand.get(r, 0.0) / pool.capacity[r] for r in resources if pool.capacity[r] > 0)
        share = max(shares, default=0.0)
        spread = counts[v.id] / v.max_per_worker if v.max_per_worker else 0.0
        return (-spread, -share, v.id)

    rooms: list[list[float]] = []
    held: list[dict[str, int]] = []
    left_out: list[str] = []
    for v in sorted(items, key=key):
        limit = math.inf if v.max_per_worker is None else v.max_per_worker
        demand = [v.demand.get(r, 0.0) for r in resources]
        if limit < 1 or any(d > pool.capacity[r] + 1e-9 for d, r in zip(demand, resources, strict=True)):
            left_out.append(v.id)
            continue
        for room, copies in zip(rooms, held, strict=True):
            if all(d <= f + 1e-9 for d, f in zip(demand, room, strict=True)) and copies.get(v.id, 0) < limit:
                room[:] = [f - d for f, d in zip(room, demand, strict=True)]
                copies[v.id] = copies.get(v.id, 0) + 1
                break
        else:
            if most is not None and len(rooms) >= most:
                left_out.append(v.id)
                continue
            rooms.append([pool.capacity[r] - d for r, d in zip(resources, demand, strict=True)])
            held.append({v.id: 1})
    return len(rooms), sorted(left_out)


@pytest.mark.parametrize("seed", range(40))
def test_first_fit_by_counts_places_every_copy_where_one_by_one_would(seed: int) -> None:
    from modelless.scaling.problem import pack_within

    rng = random.Random(f"first-fit/{seed}")
    names = rng.sample(["vcpu", "memory_mb", "device_slots"], rng.randint(1, 3))
    capacity = {r: rng.choice((1.0, 4.0, 8.0)) for r in names}
    pool = ScalingPool("pool", 1.0, capacity)
    for _ in range(25):
        variants = [
            ScalingVariant(
                f"v{i}", "pool", {},
                {r: c * rng.choice((0.0, 0.2, 0.25, 1 / 3, 0.5, 0.6, 1.0, 1.2)) for r, c in capacity.items()},
                max_per_worker=rng.choice((None, 0, 1, 2, 3)),
            )
            for i in range(rng.randint(1, 5))
        ]  # fmt: skip
        items = [v for v in variants for _ in range(rng.randint(0, 15))]
        rng.shuffle(items)
        most = rng.choice((None, None, 1, 2, 5))
        used, left_out = _one_by_one_first_fit(pool, items, most)
        if most is None:
            assert first_fit_workers(pool, items) == (None if left_out else used)
        else:
            assert sorted(v.id for v in pack_within(pool, items, most)) == left_out


def test_first_fit_packs_thirty_thousand_copies_of_one_variant() -> None:
    pool = ScalingPool("pool", 1.0, {VCPU: 4.0})
    alone = ScalingVariant("alone", "pool", {}, {VCPU: 1.0}, max_per_worker=1)
    shared = ScalingVariant("shared", "pool", {}, {VCPU: 1.0})
    # 30,000 workers of one copy each; the 45,000 others fill their rooms three at a time.
    assert first_fit_workers(pool, [alone] * 30_000 + [shared] * 45_000) == 30_000
    assert first_fit_workers(pool, [alone] * 30_000 + [shared] * 90_001) == 30_001


def test_a_set_that_packs_tighter_is_not_dominated_by_one_of_fewer_resources() -> None:
    """Issue 32's mechanism (the oracle's tight_packing seed 500187): three instances of 0.55 of
    a worker use less in aggregate than two of 0.55 and two of 0.34, but need three workers where
    the four pack into two. With dominance on aggregate shares the four were dropped, and a plan
    one worker dearer came back "optimal"; the optimum is two workers and Lambda for the rest."""
    pool = ScalingPool("p1", 2e-4, {VCPU: 4.0}, 0, 3)
    fast = ScalingVariant("fast", "p1", {"g": 15.0}, {VCPU: 2.2})
    slow = ScalingVariant("slow", "p1", {"g": 5.0}, {VCPU: 1.36}, max_per_worker=1)
    other = ScalingVariant("other", "p1", {"g": 10.0}, {VCPU: 2.2}, load_time_ms=500.0, max_per_worker=1)
    group = ScalingGroup("g", 43.12, 100.0, 6e-5, 0.05)
    problem = ScalingProblem([fast, slow, other], [pool], [group])
    plan = solve_exact(problem, time_limit_s=10.0)
    two_workers = 2 * 2e-4 + (43.12 - 40.0) * 6e-5
    assert plan.objective == pytest.approx(two_workers, rel=1e-6)
    assert plan.instances == {("fast", "p1"): 2, ("slow", "p1"): 2} and plan.workers == {"p1": 2}
    assert plan.status is PlanStatus.OPTIMAL and violations(problem, plan) == []
