"""The start-up bridge (modelless.scaling.bridge): what Lambda takes while a plan's new workers
and instances start, for how long and at what price, from explicit pool state (ready workers,
running instances), as both solvers report it. Pure: no network, no store, no clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from modelless.scaling import (
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    solve_exact,
    solve_greedy,
    start_up_bridge,
    violations,
)

Solver = Callable[[ScalingProblem], ScalingPlan]
SOLVERS: list[Solver] = [solve_exact, solve_greedy]
SOLVER_IDS = ["exact", "greedy"]
SLOT = "slot"
LAMBDA_PRICE = 1e-5  # per query: 250 QPS cost more on Lambda than three workers
STARTUP_S = 60.0
LOAD_S = 2.0


def problem_with(
    running: int, ready: int, lambda_price: float | None = LAMBDA_PRICE, load_qps: float = 250.0
) -> ScalingProblem:
    """250 QPS; a worker holds one instance of 100 QPS and costs $0.0001/s; ``running`` instances
    loaded now on ``ready`` ready workers; a new worker serves after 60 s, an instance after 2 s."""
    pool = ScalingPool(
        "pool", 1e-4, {SLOT: 1.0}, current_workers=ready, ready_workers=ready, startup_s=STARTUP_S
    )
    variant = ScalingVariant(
        "v", "pool", {"g": 100.0}, {SLOT: 1.0}, load_time_ms=LOAD_S * 1000, running=running
    )
    return ScalingProblem([variant], [pool], [ScalingGroup("g", load_qps, 100.0, lambda_price)])


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_lambda_takes_what_runs_now_cannot_until_the_new_workers_start(solver: Solver) -> None:
    problem = problem_with(running=1, ready=1)
    plan = solver(problem)
    assert plan.workers == {"pool": 3} and plan.lambda_qps == {}
    # One instance serves 100 QPS now; the other 150 wait for two new workers and their loads.
    assert plan.bridge_qps == {"g": pytest.approx(150.0)}
    assert plan.bridge_s == pytest.approx(STARTUP_S + LOAD_S)
    assert plan.bridge_cost == pytest.approx(LAMBDA_PRICE * 150.0 * (STARTUP_S + LOAD_S))
    assert violations(problem, plan) == []


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_workers_already_running_leave_only_the_load_time_to_bridge(solver: Solver) -> None:
    plan = solver(problem_with(running=1, ready=3))
    assert plan.workers == {"pool": 3}
    assert plan.bridge_qps == {"g": pytest.approx(150.0)}
    assert plan.bridge_s == pytest.approx(LOAD_S)
    assert plan.bridge_cost == pytest.approx(LAMBDA_PRICE * 150.0 * LOAD_S)


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_plan_that_what_runs_now_serves_has_no_bridge(solver: Solver) -> None:
    plan = solver(problem_with(running=3, ready=3))
    assert plan.instances_of("v") == 3
    assert plan.bridge_qps == {} and plan.bridge_s == 0.0 and plan.bridge_cost == 0.0


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_load_the_plan_leaves_to_lambda_anyway_is_no_bridge(solver: Solver) -> None:
    # 0.5 QPS: Lambda ($5e-6/s) is cheaper than any worker; the plan starts nothing.
    plan = solver(problem_with(running=0, ready=0, load_qps=0.5))
    assert plan.lambda_qps == {"g": pytest.approx(0.5)}
    assert plan.bridge_qps == {} and plan.bridge_cost == 0.0


@pytest.mark.parametrize("solver", SOLVERS, ids=SOLVER_IDS)
def test_a_group_lambda_may_not_serve_waits_and_the_plan_says_so(solver: Solver) -> None:
    plan = solver(problem_with(running=1, ready=1, lambda_price=None))
    assert plan.bridge_qps == {"g": pytest.approx(150.0)}
    assert plan.bridge_cost == 0.0  # nobody is paid to serve it: it waits
    assert any("g, which Lambda may not serve, wait for the start-up" in note for note in plan.notes)


def test_the_instances_running_now_are_shared_where_they_save_the_most() -> None:
    # One running instance, two groups: "dear" pays 10x more per query on Lambda, so the running
    # instance serves it first (100 QPS of its time), and what is left of it the other.
    pool = ScalingPool("pool", 1.0, {SLOT: 1.0}, current_workers=1, ready_workers=1, startup_s=STARTUP_S)
    variant = ScalingVariant("v", "pool", {"dear": 200.0, "cheap": 200.0}, {SLOT: 1.0}, running=1)
    groups = [ScalingGroup("dear", 100.0, 100.0, 1e-4), ScalingGroup("cheap", 300.0, 100.0, 1e-5)]
    problem = ScalingProblem([variant], [pool], groups)
    # The plan asks for two more workers of instances that serve everything.
    bridge = start_up_bridge(
        problem,
        instances={("v", "pool"): 2},
        workers={"pool": 2},
        served={("v", "dear"): 100.0, ("v", "cheap"): 300.0},
        lambda_qps={},
        unmet_qps={},
    )
    assert bridge.qps == {"cheap": pytest.approx(200.0)}
    assert bridge.seconds == pytest.approx(STARTUP_S)
    assert bridge.cost == pytest.approx(1e-5 * 200.0 * STARTUP_S)
