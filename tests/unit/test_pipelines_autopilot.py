"""The planner and tuner in the live loop, on a fake clock: pipeline arrivals become a plan at
the measured rate, the plan's stages become demand floors for the scaler's query groups, a burst
raises a stage's floor at once and quiet lowers it only after the hold, a changed workload
re-plans (at most every ``replan_every_s``), and a pipeline without traffic holds nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelless.pipelines.autopilot import ArrivalLog, AutopilotConfig, PipelineAutopilot
from modelless.pipelines.planner import PipelinePlan, StagePlan, VariantChoice
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.tuner import TunerConfig
from modelless.query_load import group_of
from modelless.types import QueryTargets

APP = "app"
SPEC = PipelineSpec.model_validate(
    {
        "name": "cascade",
        "stages": [
            {"name": "cheap", "model": "small"},
            {"name": "expensive", "model": "big", "accuracy": 0.9},
        ],
        "edges": [
            {"source": "cheap", "target": "expensive", "when": {"kind": "confidence_below", "threshold": 0.5}}
        ],
        "latencySlo": 200.0,
        "accuracy": 0.7,
    }
)
CAPACITY_QPS = 5.0  # one instance's planned rate, per stage


def plan_for(qps: float) -> PipelinePlan:
    """What the planner would say: each stage served by enough instances of CAPACITY_QPS."""

    def stage(name: str, model: str, share: float, budget: float) -> StagePlan:
        load = qps * share
        instances = max(1, int(np.ceil(load / CAPACITY_QPS)))
        choice = VariantChoice(f"{APP}/{model}/v", "cpu", "fp32", 1, 10.0, load, instances, CAPACITY_QPS, 8.0)
        return StagePlan(name, model, share, load, budget, [choice])

    stages = [stage("cheap", "small", 1.0, 80.0), stage("expensive", "big", 0.5, 120.0)]
    return PipelinePlan("cascade", qps, 200.0, True, 0.01, stages, 200.0, 1)


@dataclass
class FakeService:
    """The pipeline service's face the autopilot sees: arrivals, the spec, and a planner."""

    arrivals: ArrivalLog = field(default_factory=ArrivalLog)
    planned_at_qps: list[float] = field(default_factory=list)
    feasible: bool = True

    def get(self, app_id: str, name: str) -> PipelineSpec:
        assert (app_id, name) == (APP, "cascade")
        return SPEC

    def plan(self, app_id: str, name: str, qps: float, lambda_allowed: bool = False) -> PipelinePlan:
        self.planned_at_qps.append(qps)
        plan = plan_for(qps)
        return plan if self.feasible else PipelinePlan(**{**plan.__dict__, "feasible": False})

    def query_at(self, times: np.ndarray, unsure_every: int = 2) -> None:
        for index, at in enumerate(times):
            stages = ["cheap", "expensive"] if index % unsure_every == 0 else ["cheap"]
            self.arrivals.record(APP, "cascade", stages, float(at))


def group(stage: str, budget: float, accuracy: float, model: str) -> str:
    return group_of(QueryTargets(APP, budget, accuracy, model)).key


CHEAP = group("cheap", 80.0, 0.7, "small")
EXPENSIVE = group("expensive", 120.0, 0.9, "big")
CONFIG = AutopilotConfig(tuner=TunerConfig(hold_s=15.0), replan_every_s=30.0)


def autopilot(service: FakeService) -> PipelineAutopilot:
    return PipelineAutopilot(service, CONFIG)  # type: ignore[arg-type]


def test_steady_traffic_is_planned_at_its_rate_and_held_as_floors_of_the_stage_groups() -> None:
    service = FakeService()
    service.query_at(np.arange(0.0, 60.0, 0.1))  # 10 QPS for a minute
    pilot = autopilot(service)

    floors = pilot.floors(now=60.0)

    assert service.planned_at_qps == [10.0]
    # 10 QPS at 5 per instance: 2 instances for the cheap stage; the expensive one takes half.
    assert floors == {CHEAP: 2 * CAPACITY_QPS, EXPENSIVE: 1 * CAPACITY_QPS}
    assert pilot.floors(now=60.5) == floors  # the same traffic: the same floors, no new plan
    assert service.planned_at_qps == [10.0]


def test_a_burst_raises_a_stage_floor_at_once_and_quiet_lowers_it_only_after_the_hold() -> None:
    service = FakeService()
    service.query_at(np.arange(0.0, 60.0, 0.1))
    pilot = autopilot(service)
    pilot.floors(now=60.0)

    service.query_at(np.linspace(60.0, 61.0, 60, endpoint=False), unsure_every=10**9)  # 60 in 1 s
    burst = pilot.floors(now=61.0)
    assert burst[CHEAP] > 2 * CAPACITY_QPS
    [decisions] = pilot.decisions().values()
    assert {d.stage: d.action.value for d in decisions}["cheap"] == "up"

    # Back to 10 QPS: the floor stays up through the hold, then comes down.
    service.query_at(np.arange(61.0, 70.0, 0.1))
    assert pilot.floors(now=70.0)[CHEAP] == burst[CHEAP]
    service.query_at(np.arange(70.0, 125.0, 0.1))
    pilot.floors(now=125.0)  # the burst has left the 60 s history: fewer asked for since now
    service.query_at(np.arange(125.0, 141.0, 0.1))
    assert pilot.floors(now=141.0)[CHEAP] == 2 * CAPACITY_QPS


def test_a_changed_rate_re_plans_but_not_more_often_than_allowed() -> None:
    service = FakeService()
    service.query_at(np.arange(0.0, 60.0, 0.1))
    pilot = autopilot(service)
    pilot.floors(now=60.0)

    service.query_at(np.arange(60.0, 75.0, 0.025))  # 40 QPS from now on
    pilot.floors(now=75.0)  # the shape changed, but the last plan is only 15 s old
    assert len(service.planned_at_qps) == 1
    service.query_at(np.arange(75.0, 130.0, 0.025))
    floors = pilot.floors(now=130.0)
    assert len(service.planned_at_qps) == 2 and service.planned_at_qps[-1] > 30.0
    assert floors[CHEAP] >= 8 * CAPACITY_QPS


def test_no_traffic_no_plan_and_an_infeasible_plan_hold_nothing() -> None:
    service = FakeService()
    assert autopilot(service).floors(now=10.0) == {}
    service.query_at(np.arange(0.0, 0.3, 0.1))  # too few arrivals to plan on
    assert autopilot(service).floors(now=1.0) == {} and service.planned_at_qps == []

    service.feasible = False
    service.query_at(np.arange(1.0, 60.0, 0.1))
    refused = autopilot(service)
    planned = len(service.planned_at_qps)
    assert refused.floors(now=60.0) == {}
    assert refused.floors(now=70.0) == {} and len(service.planned_at_qps) == planned + 1  # not again yet
    service.feasible = True
    service.query_at(np.arange(60.0, 95.0, 0.1))
    assert refused.floors(now=95.0) and len(service.planned_at_qps) == planned + 2  # 35 s later: again

    # Traffic that stopped a minute ago: the pipeline is forgotten with its floors.
    service.feasible = True
    pilot = autopilot(service)
    assert pilot.floors(now=60.0)
    assert pilot.floors(now=200.0) == {} and pilot.decisions() == {}
