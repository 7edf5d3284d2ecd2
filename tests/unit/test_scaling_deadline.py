"""The solvers' deadline (modelless.scaling.deadline): a call returns by it at any size, with the
best plan found, or the holding plan where none was."""

from __future__ import annotations

import time

import pytest

from modelless.scaling import (
    PlanStatus,
    ScalingGroup,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    violations,
)
from modelless.scaling.deadline import Deadline, OutOfTime, holding_plan
from modelless.scaling.exact import solve_exact
from modelless.scaling.greedy import solve_greedy
from modelless.scaling.problem import VCPU
from sim.problems import make_problem
from tests.waiting import scaled


def test_a_deadline_raises_once_past() -> None:
    deadline = Deadline.after(60.0)
    deadline.check()
    assert 59.0 < deadline.left() <= 60.0 and not deadline.passed()
    with pytest.raises(OutOfTime):
        Deadline(time.perf_counter() - 1.0).check()
    assert deadline.earlier_by(10.0).at == pytest.approx(deadline.at - 10.0)


def test_the_holding_plan_keeps_what_runs_and_gives_the_rest_to_lambda_or_leaves_it_unmet() -> None:
    pool = ScalingPool("pool", 1.0, {VCPU: 2.0}, current_workers=1, ready_workers=1)
    variants = [
        ScalingVariant("runs", "pool", {"a": 100.0, "b": 100.0}, {VCPU: 1.0}, running=1),
        ScalingVariant("idle", "pool", {"a": 500.0}, {VCPU: 1.0}),
    ]
    groups = [ScalingGroup("a", 150.0, 50.0, lambda_price_per_query=1e-6), ScalingGroup("b", 50.0, 50.0)]
    problem = ScalingProblem(variants, [pool], groups)
    plan = holding_plan(problem, "milp", time.perf_counter(), "out of time")
    assert plan.instances == {("runs", "pool"): 1} and plan.workers == {"pool": 1}
    # The running instance serves b first (Lambda may not), then what its time leaves of a.
    assert plan.served[("runs", "b")] == pytest.approx(50.0)
    assert plan.served[("runs", "a")] == pytest.approx(50.0)
    assert plan.lambda_qps == {"a": pytest.approx(100.0)} and plan.unmet_qps == {}
    assert plan.status is PlanStatus.TIME_LIMIT and "holding plan" in plan.notes[0]
    assert violations(problem, plan) == []


@pytest.mark.parametrize("solver", ["exact", "greedy"])
def test_a_large_problem_is_answered_by_the_deadline_with_a_valid_plan(solver: str) -> None:
    problem = make_problem(1500, seed=7)  # about 45,000 variants: no proof fits 0.3 s
    limit = 0.3
    started = time.perf_counter()
    if solver == "exact":
        plan = solve_exact(problem, limit)
    else:
        plan = solve_greedy(problem, deadline=Deadline.after(limit))
    elapsed = time.perf_counter() - started
    # By the deadline, give or take what a busy machine adds to the last step (reading the plan).
    assert elapsed <= limit + scaled(0.5)
    assert plan.status is not PlanStatus.OPTIMAL
    assert violations(problem, plan) == []
