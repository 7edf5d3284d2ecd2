"""The planner and the tuner in the live loop (InferLine §4-5): what the scaler is told about
pipelines on every tick.

The gateway's pipeline service notes when each stage of each pipeline query ran (``ArrivalLog``).
On every scaler tick the autopilot, per pipeline with recent traffic:

- **plans** (low frequency) when it has no plan yet, or when the tuner says the workload's shape
  changed (at most every ``replan_every_s``): at the pipeline's measured arrival rate and measured
  branch probabilities (``PipelineService.plan``; the plan's stage budgets then guide the
  gateway's queries of the pipeline);
- **tunes** (every tick) each stage's instance count against its traffic envelope
  (``pipelines.tuner.tune``): up at once on a burst the plan did not absorb, down after a hold;
- turns each stage's tuned instances into a **demand floor** for the scaler: the stage's queries
  form the query group of its model, accuracy floor and planned budget's latency class, and the
  group is provisioned for at least instances times one instance's planned capacity. The scaler's one
  program (``modelless.scaling``) then chooses variants and workers for it, as for any group:
  one solver, not two.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aws_lambda_powertools import Logger

from modelless.exceptions import ModellessError
from modelless.pipelines.tuner import StageDecision, StageState, TunerConfig, envelope, tune
from modelless.query_load import group_of
from modelless.types import QueryTargets

if TYPE_CHECKING:  # the planner needs the solver (scipy), imported where a plan is made
    from modelless.pipelines.planner import PipelinePlan
    from modelless.pipelines.service import PipelineService

logger = Logger(service="pipelines", child=True)

HISTORY_S = 60.0  # the tuner's longest window


class ArrivalLog:
    """When each stage of each pipeline last ran, over the tuner's longest window (bounded)."""

    def __init__(self, history_s: float = HISTORY_S, max_per_stage: int = 100_000) -> None:
        self._history_s = history_s
        self._max = max_per_stage
        self._lock = threading.Lock()
        self._arrivals: dict[tuple[str, str], dict[str, deque[float]]] = {}

    def record(self, app_id: str, pipeline: str, stages: list[str], at: float) -> None:
        """One query of the pipeline, arrived at ``at``, whose ``stages`` ran."""
        with self._lock:
            log = self._arrivals.setdefault((app_id, pipeline), {})
            for stage in ["", *stages]:  # "": the pipeline's own arrivals
                times = log.setdefault(stage, deque(maxlen=self._max))
                times.append(at)

    def forget(self, app_id: str, pipeline: str) -> None:
        with self._lock:
            self._arrivals.pop((app_id, pipeline), None)

    def recent(self, now: float) -> dict[tuple[str, str], dict[str, list[float]]]:
        """Per pipeline with arrivals within the history, per stage ("" the pipeline itself),
        the sorted arrival times within it."""
        found: dict[tuple[str, str], dict[str, list[float]]] = {}
        with self._lock:
            for key, log in list(self._arrivals.items()):
                for times in log.values():
                    while times and times[0] < now - self._history_s:
                        times.popleft()
                if not log.get(""):
                    del self._arrivals[key]
                    continue
                # Sorted, and none after ``now`` (a clock behind the recorder's).
                found[key] = {
                    stage: (ordered := sorted(times))[: bisect_right(ordered, now)]
                    for stage, times in log.items()
                }
        return found


@dataclass(frozen=True)
class AutopilotConfig:
    tuner: TunerConfig = field(default_factory=TunerConfig)
    replan_every_s: float = 30.0  # re-plans at most this often (the planner is the slow loop)
    min_arrivals: int = 5  # a pipeline with fewer in the history is not planned for yet


@dataclass
class _Piloted:
    plan: PipelinePlan
    planned_at: float
    state: dict[str, StageState]
    decisions: list[StageDecision] = field(default_factory=list)


class PipelineAutopilot:
    def __init__(
        self,
        service: PipelineService,
        config: AutopilotConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._service = service
        self._config = config or AutopilotConfig()
        self._clock = clock
        self._piloted: dict[tuple[str, str], _Piloted] = {}
        # When a pipeline's last plan came out infeasible: it is not planned again sooner than
        # ``replan_every_s`` after (a plan solves many splits; a tick must not redo that each time).
        self._refused_at: dict[tuple[str, str], float] = {}

    def floors(self, now: float | None = None) -> dict[str, float]:
        """One tick: query group key -> the QPS the scaler must provision it for at least."""
        now = self._clock() if now is None else now
        floors: dict[str, float] = {}
        recent = self._service.arrivals.recent(now)
        for key in list(self._piloted):
            if key not in recent:  # no traffic over the history: nothing to hold for it
                del self._piloted[key]
        for (app_id, name), arrivals in recent.items():
            try:
                piloted = self._pilot(app_id, name, arrivals, now)
            except ModellessError as error:  # deleted meanwhile, its models gone: skip this tick
                logger.info("pipeline not piloted", extra={"pipeline": name, "reason": error.message})
                self._piloted.pop((app_id, name), None)
                continue
            if piloted is None:
                continue
            spec = self._service.get(app_id, name)
            for stage_plan in piloted.plan.stages:
                decided = next((d for d in piloted.decisions if d.stage == stage_plan.stage), None)
                state = piloted.state.get(stage_plan.stage)
                if decided is None or state is None:
                    continue
                stage = spec.stage(stage_plan.stage)
                floor = spec.accuracy if stage.accuracy is None else stage.accuracy
                group = group_of(QueryTargets(app_id, stage_plan.budget_ms, floor, stage.model)).key
                floors[group] = floors.get(group, 0.0) + decided.instances * state.capacity_qps
        return floors

    def decisions(self) -> dict[tuple[str, str], list[StageDecision]]:
        """The last tick's decisions per pipeline (for reports and tests)."""
        return {key: list(p.decisions) for key, p in self._piloted.items()}

    def plan_of(self, app_id: str, name: str) -> PipelinePlan | None:
        piloted = self._piloted.get((app_id, name))
        return None if piloted is None else piloted.plan

    def _pilot(
        self, app_id: str, name: str, arrivals: Mapping[str, list[float]], now: float
    ) -> _Piloted | None:
        pipeline_arrivals = arrivals.get("", [])
        if len(pipeline_arrivals) < self._config.min_arrivals:
            return None
        key = (app_id, name)
        piloted = self._piloted.get(key)
        if piloted is None:
            refused = self._refused_at.get(key)
            if refused is not None and now - refused < self._config.replan_every_s:
                return None
            piloted = self._replan(app_id, name, arrivals, now)
            if piloted is None:
                self._refused_at[key] = now
                return None
            self._refused_at.pop(key, None)
        stage_arrivals = {stage: arrivals.get(stage, []) for stage in piloted.state}
        state, decisions, replans = tune(piloted.state, stage_arrivals, now, self._config.tuner)
        piloted.state, piloted.decisions = state, decisions
        if replans and now - piloted.planned_at >= self._config.replan_every_s:
            logger.info(
                "pipeline re-planned: its workload's shape changed",
                extra={"pipeline": name, "why": [f"{r.stage}: {r.reason}" for r in replans]},
            )
            replanned = self._replan(app_id, name, arrivals, now)
            if replanned is not None:
                replanned.decisions = decisions
                piloted = replanned
        self._piloted[key] = piloted
        return piloted

    def _replan(
        self, app_id: str, name: str, arrivals: Mapping[str, list[float]], now: float
    ) -> _Piloted | None:
        times = arrivals.get("", [])
        span = max(1.0, min(HISTORY_S, now - times[0])) if times else HISTORY_S
        qps = len(times) / span
        plan = self._service.plan(app_id, name, qps)
        if not plan.feasible:
            logger.warning(
                "no feasible plan for the pipeline's load; the scaler serves its stages as plain groups",
                extra={"pipeline": name, "qps": round(qps, 2), "why": plan.explanation[-3:]},
            )
            return None
        state: dict[str, StageState] = {}
        windows = self._config.tuner.windows_s
        for stage_plan in plan.stages:
            choices = stage_plan.choices
            instances = sum(c.instances for c in choices)
            if instances <= 0:
                continue  # served by Lambda in the plan: nothing to hold instances for
            capacity = sum(c.capacity_qps * c.instances for c in choices) / instances
            throughput = sum(c.throughput_qps * c.instances for c in choices) / instances
            # What the plan absorbs per window: its load's rate over each window, or what was
            # seen in it when planning, whichever is more.
            seen = envelope(arrivals.get(stage_plan.stage, []), now, windows)
            planned = {w: max(seen.get(w, 0), int(stage_plan.load_qps * w)) for w in windows}
            state[stage_plan.stage] = StageState(
                instances,
                planned,
                capacity,
                instances,
                budget_ms=stage_plan.budget_ms,
                throughput_qps=throughput,
            )
        return _Piloted(plan, now, state)
