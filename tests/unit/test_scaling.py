"""The variant-mix program (docs/ARCHITECTURE.md §5): the exact MILP and the INFaaS greedy on small problems
whose answers are known, on seeded random problems checked against the constraints, and the
inputs' arithmetic (saturation per budget, validation). Pure: no network, no store, no clock."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import pytest

from modelless.scaling import (
    PlanStatus,
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    one_instance_per_worker,
    saturation_for_budget,
    solve_exact,
    solve_greedy,
    violations,
)
from modelless.types import VariantProfile
from sim.problems import make_problem

Solver = Callable[[ScalingProblem], ScalingPlan]
SOLVERS: list[Solver] = [solve_exact, solve_greedy]
SOLVER_IDS = ["exact", "greedy"]
SLOT = "slot"  # the one resource of the toy pools below: a worker holds one instance


def one_instance_pool(name: str, price: float, max_workers: int | None = None) -> ScalingPool:
    """A pool whose worker holds exactly one instance, so an instance costs the worker's price."""
    return ScalingPool(name, price, {SLOT: 1.0}, max_workers=max_workers)


def variant(
    name: str,
    pool: str,
    saturation: Mapping[str, float],
    *,
    load_time_ms: float = 0.0,
    running: int = 0,
) -> ScalingVariant:
    return ScalingVariant(
        id=name,
        pool=pool,
        saturation_qps=saturation,
        demand={SLOT: 1.0},
        model="m",
        load_time_ms=load_time_ms,
        running=running,
    )


def assert_valid(problem: ScalingProblem, plan: ScalingPlan) -> None:
    assert violations(problem, plan) == [], plan


def served_total(plan: ScalingPlan, group_id: str) -> float:
    return sum(qps for (_, group), qps in plan.served.items() if group == group_id)


# ----------------------------------------------------------------------------- INFaaS §4.2


# Table 2: (latency ms, QPS one instance sustains, cost per instance).
INFAAS_VARIANTS = {"A": (200.0, 5.0, 1.0), "B": (20.0, 100.0, 3.0), "C": (15.0, 800.0, 16.0)}


def infaas_problem(qps: float, slo_ms: float) -> ScalingProblem:
    """Table 2's variants, one pool each (one instance per worker, priced at the variant's cost),
    serving one group; a variant serves the group only where its latency fits the SLO."""
    group = ScalingGroup("g", qps, slo_ms)
    pools = [one_instance_pool(f"pool-{name}", cost) for name, (_, _, cost) in INFAAS_VARIANTS.items()]
    variants = [
        variant(name, f"pool-{name}", {group.id: saturation} if latency <= slo_ms else {})
        for name, (latency, saturation, _) in INFAAS_VARIANTS.items()
    ]
    return ScalingProblem(variants, pools, [group], slack=0.0, load_cost_weight=0.0)


# Table 3: (QPS, SLO ms) -> (instances per variant, cost).
INFAAS_ANSWERS = [
    (10.0, 300.0, {"A": 2, "B": 0, "C": 0}, 2.0),
    (10.0, 50.0, {"A": 0, "B": 1, "C": 0}, 3.0),
    (1000.0, 300.0, {"A": 0, "B": 2, "C": 1}, 22.0),
]


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
@pytest.mark.parametrize(
    ("qps", "slo_ms", "instances", "cost"),
    INFAAS_ANSWERS,
    ids=["10qps-300ms", "10qps-50ms", "1000qps-300ms"],
)
def test_both_solvers_reproduce_the_infaas_worked_example(
    solver: Solver, qps: float, slo_ms: float, instances: dict[str, int], cost: float
) -> None:
    problem = infaas_problem(qps, slo_ms)
    plan = solver(problem)
    assert {name: plan.instances_of(name) for name in INFAAS_VARIANTS} == instances
    assert plan.cost_per_second == pytest.approx(cost)
    assert plan.objective == pytest.approx(cost)
    assert plan.lambda_qps == {}
    assert plan.unmet_qps == {}
    assert served_total(plan, "g") == pytest.approx(qps)
    assert plan.status is (PlanStatus.OPTIMAL if solver is solve_exact else PlanStatus.FEASIBLE)
    assert_valid(problem, plan)


def test_the_infaas_example_has_no_instance_of_a_variant_too_slow_for_the_slo() -> None:
    problem = infaas_problem(10.0, 50.0)
    assert problem.variants[0].saturation_qps == {}  # A's 200 ms does not fit 50 ms
    assert solve_exact(problem).instances_of("A") == 0


# ----------------------------------------------------------------------------- the Lambda tier


def lambda_problem(
    load_qps: float, lambda_price: float, price: float, max_workers: int | None = None
) -> ScalingProblem:
    group = ScalingGroup("g", load_qps, 100.0, lambda_price_per_query=lambda_price)
    return ScalingProblem(
        [variant("v", "pool", {"g": 100.0})],
        [one_instance_pool("pool", price, max_workers)],
        [group],
    )


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_tiny_load_is_left_to_lambda_when_a_worker_costs_more(solver: Solver) -> None:
    # 0.1 QPS at $1e-4 a query is $1e-5/s; a worker is $1/s.
    problem = lambda_problem(load_qps=0.1, lambda_price=1e-4, price=1.0)
    plan = solver(problem)
    assert plan.lambda_qps == {"g": pytest.approx(0.1)}
    assert plan.total_instances == 0
    assert plan.workers == {"pool": 0}
    assert plan.cost_per_second == pytest.approx(1e-5)
    assert_valid(problem, plan)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_large_load_goes_to_instances_when_they_are_cheaper_than_lambda(solver: Solver) -> None:
    # 1000 QPS on Lambda is $0.1/s; ten instances of 100 QPS at $0.001/s are $0.01/s.
    problem = lambda_problem(load_qps=1000.0, lambda_price=1e-4, price=0.001)
    plan = solver(problem)
    assert plan.lambda_qps == {}
    assert plan.instances_of("v") == 10
    assert plan.workers == {"pool": 10}
    assert plan.cost_per_second == pytest.approx(0.01)
    assert_valid(problem, plan)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_pool_at_its_worker_limit_leaves_the_rest_to_lambda(solver: Solver) -> None:
    # Instances cost $1e-4 a query (cheaper than Lambda's $1e-3), but only one worker is allowed.
    problem = lambda_problem(load_qps=250.0, lambda_price=1e-3, price=0.01, max_workers=1)
    plan = solver(problem)
    assert plan.instances_of("v") == 1
    assert plan.workers == {"pool": 1}
    assert served_total(plan, "g") == pytest.approx(100.0)
    assert plan.lambda_qps == {"g": pytest.approx(150.0)}
    assert plan.unmet_qps == {}
    assert plan.cost_per_second == pytest.approx(0.01 + 150.0 * 1e-3)
    assert_valid(problem, plan)


# ----------------------------------------------------------------------------- infeasible problems


def capped_problem() -> ScalingProblem:
    """250 QPS, 100 QPS per instance, one instance per worker, at most 2 workers, no Lambda."""
    return ScalingProblem(
        [variant("v", "pool", {"g": 100.0})],
        [one_instance_pool("pool", 1.0, max_workers=2)],
        [ScalingGroup("g", 250.0, 100.0)],
    )


def test_the_exact_solver_serves_what_it_can_of_an_infeasible_problem_and_says_why() -> None:
    problem = capped_problem()
    plan = solve_exact(problem)
    assert plan.status is PlanStatus.INFEASIBLE_PARTIAL
    assert plan.instances_of("v") == 2
    assert plan.workers == {"pool": 2}
    assert served_total(plan, "g") == pytest.approx(200.0)
    assert plan.unmet_qps == {"g": pytest.approx(50.0)}
    assert "worker limit" in plan.unmet["g"]
    assert "pool 2/2" in plan.unmet["g"]
    assert plan.lambda_qps == {}
    assert_valid(problem, plan)


def test_the_greedy_serves_what_it_can_of_an_infeasible_problem_and_says_why() -> None:
    problem = capped_problem()
    plan = solve_greedy(problem)
    assert plan.status is PlanStatus.INFEASIBLE_PARTIAL
    assert plan.instances_of("v") == 2
    assert served_total(plan, "g") == pytest.approx(200.0)
    assert plan.unmet_qps == {"g": pytest.approx(50.0)}
    assert "worker limit" in plan.unmet["g"]
    assert_valid(problem, plan)


# ----------------------------------------------------------------------------- random problems


@pytest.mark.parametrize(
    ("architectures", "seed"), [(3, 11), (3, 21), (4, 12), (4, 22), (5, 13), (5, 23), (6, 14), (6, 15)]
)
def test_both_plans_of_a_random_problem_are_valid_and_the_exact_one_costs_no_more(
    architectures: int, seed: int
) -> None:
    problem = make_problem(architectures=architectures, seed=seed)
    exact = solve_exact(problem, time_limit_s=10.0)
    greedy = solve_greedy(problem)
    assert violations(problem, exact) == []
    assert violations(problem, greedy) == []
    assert exact.status is PlanStatus.OPTIMAL
    assert exact.objective <= greedy.objective * (1 + 1e-6)


# ----------------------------------------------------------------------------- time sharing


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_one_instance_time_shared_serves_a_tight_and_a_lax_group_of_one_model(solver: Solver) -> None:
    # The lax budget allows a larger batch: 300 QPS against 100 in the tight one. Together the
    # loads take 40/100 + 90/300 = 0.7 of an instance; one instance per group would take two.
    tight, lax = ScalingGroup("tight", 40.0, 20.0), ScalingGroup("lax", 90.0, 200.0)
    problem = ScalingProblem(
        [variant("v", "pool", {"tight": 100.0, "lax": 300.0})],
        [one_instance_pool("pool", 1.0)],
        [tight, lax],
    )
    plan = solver(problem)
    assert plan.instances_of("v") == 1
    assert plan.workers == {"pool": 1}
    assert plan.served[("v", "tight")] == pytest.approx(40.0)
    assert plan.served[("v", "lax")] == pytest.approx(90.0)
    assert plan.cost_per_second == pytest.approx(1.0)
    assert_valid(problem, plan)


# ----------------------------------------------------------------------------- load cost


def load_cost_problem(load_time_ms: float) -> ScalingProblem:
    """A running instance of "old" ($1.1/s) against loading "new" ($1.0/s, saving $0.1/s).

    With λ = 0.01/s, loading "new" costs λ · $1.0/s · T_load: $0.2 at 20 s, $0.05 at 5 s.
    """
    group = ScalingGroup("g", 50.0, 100.0)
    return ScalingProblem(
        [
            variant("old", "pool-old", {"g": 100.0}, load_time_ms=load_time_ms, running=1),
            variant("new", "pool-new", {"g": 100.0}, load_time_ms=load_time_ms),
        ],
        [one_instance_pool("pool-old", 1.1), one_instance_pool("pool-new", 1.0)],
        [group],
        load_cost_weight=0.01,
    )


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_running_instance_is_kept_when_loading_a_cheaper_one_costs_more_than_it_saves(
    solver: Solver,
) -> None:
    problem = load_cost_problem(load_time_ms=20_000.0)
    assert problem.load_cost(problem.variants[1]) == pytest.approx(0.2)
    plan = solver(problem)
    assert plan.instances_of("old") == 1
    assert plan.instances_of("new") == 0
    assert plan.cost_per_second == pytest.approx(1.1)
    assert plan.objective == pytest.approx(1.1)  # keeping a running instance loads nothing
    assert_valid(problem, plan)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_cheaper_variant_is_loaded_when_it_saves_more_than_loading_it_costs(solver: Solver) -> None:
    problem = load_cost_problem(load_time_ms=5_000.0)
    assert problem.load_cost(problem.variants[1]) == pytest.approx(0.05)
    plan = solver(problem)
    assert plan.instances_of("old") == 0
    assert plan.instances_of("new") == 1
    assert plan.cost_per_second == pytest.approx(1.0)
    assert plan.objective == pytest.approx(1.05)
    assert_valid(problem, plan)


# ----------------------------------------------------------------------------- saturation


def profile_with(latency_p99_ms: dict[int, float]) -> VariantProfile:
    return VariantProfile(
        variant_id="app/m/v/cpu",
        app_id="app",
        model_name="m",
        pool="cpu",
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key="",
        size_bytes=1,
        load_latency_ms=100.0,
        latency_p50_ms={b: t * 0.8 for b, t in latency_p99_ms.items()},
        latency_p99_ms=latency_p99_ms,
        peak_memory_mb=50.0,
        accuracy=0.9,
        price_per_second=0.0,
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )


LATENCIES = {1: 10.0, 2: 15.0, 4: 25.0, 8: 40.0}  # 100, 133, 160, 200 QPS


def test_batch_one_leaves_the_budget_room_for_queueing() -> None:
    profile = profile_with({1: 10.0})  # p99 10 ms, median 8 ms
    # What the budget leaves after the run's p99 bounds the queue: little room, little load.
    k = 2 * (12.0 - 10.0) / (math.log(100) * 8.0)
    assert saturation_for_budget(profile, 12.0) == pytest.approx(k / (1 + k) * 1000.0 / 8.0)
    assert saturation_for_budget(profile, 20.0) > saturation_for_budget(profile, 12.0)
    # The p99 alone filling the budget: no load meets it reliably.
    assert saturation_for_budget(profile, 10.0) == 0.0
    # A generous budget: the instance runs near saturation, never above 1 / p99.
    assert saturation_for_budget(profile, 10_000.0) == pytest.approx(100.0)


def rate_at(batch: int, p99_ms: float, budget_ms: float) -> float:
    """The queueing rule by hand: utilisation k / (1 + k) of runs of ``batch`` (median 0.8 p99)."""
    median = 0.8 * p99_ms
    k = 2 * (budget_ms - p99_ms) / (math.log(100) * median)
    return batch * min(1000.0 / p99_ms, k / (1 + k) * 1000.0 / median)


def test_a_larger_batch_fits_only_within_half_the_budget() -> None:
    profile = profile_with(LATENCIES)
    # Batch 2 runs in 15 ms <= 29 ms, but a query may wait a batch first: 2 x 15 > 29.
    assert saturation_for_budget(profile, 29.0) == pytest.approx(rate_at(1, 10.0, 29.0))
    # From 30 ms batch 2 may run; it is taken where it answers more within the budget.
    assert saturation_for_budget(profile, 30.0) == pytest.approx(
        max(rate_at(1, 10.0, 30.0), rate_at(2, 15.0, 30.0))
    )
    at_80 = [rate_at(1, 10.0, 80.0), rate_at(2, 15.0, 80.0), rate_at(4, 25.0, 80.0), rate_at(8, 40.0, 80.0)]
    assert saturation_for_budget(profile, 80.0) == pytest.approx(max(at_80))


def test_a_batched_instance_keeps_room_for_its_queue() -> None:
    # Batches of 8 in 40 ms would sustain 200 QPS back to back; planned there, a queue of random
    # arrivals would grow without bound. The plan holds the load where the queue's p99 still fits.
    profile = profile_with(LATENCIES)
    assert saturation_for_budget(profile, 80.0) < 8 * 1000.0 / 40.0
    assert saturation_for_budget(profile, 10_000.0) == pytest.approx(8 * 1000.0 / 40.0, rel=0.01)


def test_the_best_throughput_is_taken_even_when_a_larger_batch_is_slower() -> None:
    # Batch 8 fits a 1 s budget but sustains at most 40 QPS; batch 4 about 160.
    profile = profile_with({1: 10.0, 4: 25.0, 8: 200.0})
    assert saturation_for_budget(profile, 1000.0) == pytest.approx(rate_at(4, 25.0, 1000.0))


def test_nothing_fits_a_budget_below_the_batch_one_latency() -> None:
    assert saturation_for_budget(profile_with(LATENCIES), 9.9) == 0.0


# ----------------------------------------------------------------------------- validation


def test_a_variant_on_an_unknown_pool_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown pool"):
        ScalingProblem([variant("v", "nowhere", {})], [one_instance_pool("pool", 1.0)], [])


def test_a_variant_naming_an_unknown_group_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown groups"):
        ScalingProblem([variant("v", "pool", {"ghost": 1.0})], [one_instance_pool("pool", 1.0)], [])


def test_duplicate_variant_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="variant ids must be unique"):
        ScalingProblem(
            [variant("v", "pool", {}), variant("v", "pool", {})], [one_instance_pool("pool", 1.0)], []
        )


def test_duplicate_pool_names_and_group_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        ScalingProblem([], [one_instance_pool("pool", 1.0), one_instance_pool("pool", 2.0)], [])
    with pytest.raises(ValueError, match="unique"):
        ScalingProblem([], [], [ScalingGroup("g", 1.0, 10.0), ScalingGroup("g", 2.0, 10.0)])


def test_negative_slack_or_load_cost_weight_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        ScalingProblem([], [], [], slack=-0.1)
    with pytest.raises(ValueError, match="non-negative"):
        ScalingProblem([], [], [], load_cost_weight=-1.0)


# ----------------------------------------------------------------------------- time limit


def test_a_missed_time_limit_still_returns_a_valid_plan() -> None:
    problem = make_problem(60, seed=1)
    plan = solve_exact(problem, time_limit_s=0.01)
    assert plan.status in (PlanStatus.TIME_LIMIT, PlanStatus.OPTIMAL, PlanStatus.INFEASIBLE_PARTIAL)
    if plan.status is not PlanStatus.OPTIMAL:
        assert any("time limit" in note for note in plan.notes)
    if plan.status is PlanStatus.INFEASIBLE_PARTIAL:  # no plan in time: what runs now holds
        assert any("holding plan" in note for note in plan.notes)
    else:
        assert plan.unmet_qps == {}
    assert violations(problem, plan) == []


def test_one_instance_per_worker_limits_copies_without_changing_what_an_instance_costs() -> None:
    pool = ScalingPool("cpu", 1.0, {"vcpu": 4.0})
    quarter = ScalingVariant("v", "cpu", {"g": 10.0}, {"vcpu": 1.0}, load_time_ms=1000.0)
    pools, variants = one_instance_per_worker([pool], [quarter])
    before = ScalingProblem([quarter], [pool], [ScalingGroup("g", 35.0, 100.0)], load_cost_weight=0.5)
    after = ScalingProblem(variants, pools, [ScalingGroup("g", 35.0, 100.0)], load_cost_weight=0.5)

    assert after.instance_price(variants[0]) == before.instance_price(quarter) == pytest.approx(0.25)
    assert after.load_cost(variants[0]) == pytest.approx(0.5 * 0.25 * 1.0)
    assert before.per_worker(quarter) == 4 and after.per_worker(variants[0]) == 1
    plan = solve_exact(after)
    assert plan.instances_of("v") == 4 and plan.workers["cpu"] == 4  # one copy per worker
