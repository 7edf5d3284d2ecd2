"""The solvers' deadline (modelless.scaling.deadline): a call returns by it at any size, with the
best plan found, or the holding plan where none was."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from modelless.scaling import (
    PlanStatus,
    ScalingGroup,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    exact,
    patterns,
    violations,
)
from modelless.scaling.deadline import STOP_SLACK_S, Deadline, OutOfTime, holding_plan, holding_reserve_s
from modelless.scaling.exact import solve_exact
from modelless.scaling.greedy import solve_greedy
from modelless.scaling.problem import VCPU
from modelless.scaling.time_budget import FINISH_PER_SCAN
from sim.problems import make_problem
from tests.waiting import scaled


def test_a_deadline_raises_once_past() -> None:
    deadline = Deadline.after(60.0)
    deadline.check()
    assert 59.0 < deadline.left() <= 60.0 and not deadline.passed()
    with pytest.raises(OutOfTime):
        Deadline(time.perf_counter() - 1.0).check()
    assert deadline.earlier_by(10.0).at == pytest.approx(deadline.at - 10.0)
    # A share of the time since a scan began, less what is kept back already (never later).
    since = time.perf_counter() - 4.0
    assert deadline.at - 2.5 <= deadline.keeping_back(0.5, since).at <= deadline.at - 2.0
    assert deadline.at - 1.5 <= deadline.keeping_back(0.5, since, already_s=1.0).at <= deadline.at - 1.0
    assert deadline.keeping_back(0.5, since, already_s=100.0).at == deadline.at


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
    # By the deadline, give or take what a busy machine adds to the last step (reading the plan):
    # the greedy, 0.15 s here when idle, once took 0.96 s of its 0.3 s in a full CI-style run.
    assert elapsed <= limit + scaled(1.0)
    assert plan.status is not PlanStatus.OPTIMAL
    assert violations(problem, plan) == []


def test_the_holding_plan_reads_only_what_runs_and_says_why_load_is_unmet() -> None:
    pool = ScalingPool("pool", 1.0, {VCPU: 4.0}, current_workers=1, ready_workers=1)
    idle = [ScalingVariant(f"idle-{i}", "pool", {"a": 500.0}, {VCPU: 1.0}) for i in range(200)]
    variants = [
        ScalingVariant("one", "pool", {"a": 40.0, "b": 30.0}, {VCPU: 1.0}, running=1),
        ScalingVariant("two", "pool", {"b": 50.0}, {VCPU: 1.0}, running=2),
        *idle,
    ]
    groups = [ScalingGroup("a", 100.0, 50.0), ScalingGroup("b", 60.0, 20.0)]
    problem = ScalingProblem(variants, [pool], groups, lambda_allowed=False)

    plan = holding_plan(problem, "greedy", time.perf_counter(), "deadline reached")

    assert [v.id for v in problem.running_variants] == ["one", "two"]
    assert set(plan.instances) == {("one", "pool"), ("two", "pool")}
    # No group gets more than its need, no variant more than its instances' time.
    for group in groups:
        assert sum(q for (_, g), q in plan.served.items() if g == group.id) <= group.load_qps + 1e-9
    for variant in variants[:2]:
        time_used = sum(q / variant.saturation_qps[g] for (v, g), q in plan.served.items() if v == variant.id)
        assert time_used <= variant.running + 1e-9
    # "one" serves b first (the tighter budget), "two" the rest of b; a gets what is left of one.
    assert plan.served[("one", "b")] == pytest.approx(30.0)
    assert plan.served[("two", "b")] == pytest.approx(30.0)
    assert plan.unmet_qps == {"a": pytest.approx(100.0)}
    assert (
        "before new ones could be planned" in plan.unmet["a"]
        and "Lambda fallback is disabled" in plan.unmet["a"]
    )
    assert violations(problem, plan) == []


def test_the_exact_search_keeps_back_the_time_to_read_its_plan_measured_on_its_own_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the best plan (its packing, its bridge) comes after the search stops: the search
    stops that much earlier, a share of the call's own scan of the variants, so that a slower
    machine keeps back more. A machine several times slower is played by running the scan that
    many times (real work); what the search is given is read off the deadline its next step gets."""
    slowdown = 8
    scans: list[float] = []
    search_deadlines: list[Deadline | None] = []
    real_scan, real_components = patterns.usable_variants, patterns.components_of  # as exact.py imports them

    def slow_scan(problem: ScalingProblem, deadline: Deadline | None = None) -> list[int]:
        began = time.perf_counter()
        for _ in range(slowdown):
            usable = real_scan(problem, deadline)
        scans.append(time.perf_counter() - began)
        return usable

    def components(problem: ScalingProblem, usable: Sequence[int], deadline: Deadline | None = None) -> Any:
        search_deadlines.append(deadline)
        return real_components(problem, usable, deadline)

    monkeypatch.setattr(exact, "usable_variants", slow_scan)
    monkeypatch.setattr(exact, "components_of", components)
    problem = make_problem(50, seed=3)
    limit = 30.0  # far off: what is kept back is read off the deadline, not off the clock
    started = time.perf_counter()
    plan = solve_exact(problem, limit)

    [scan_s] = scans
    [search] = search_deadlines
    assert search is not None
    kept_back = started + limit - search.at  # at most what the solver keeps (its clock starts later)
    assert kept_back >= STOP_SLACK_S + FINISH_PER_SCAN * scan_s - 0.01
    assert kept_back >= holding_reserve_s(problem) - 0.01  # the holding plan's time is kept too
    assert violations(problem, plan) == []
