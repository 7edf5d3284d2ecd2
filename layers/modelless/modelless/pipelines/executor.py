"""Running one query through a pipeline: each stage is an ordinary online query of its model
through the Dispatcher (getVariant picks its variant, worker and tier), stage after stage along
the DAG, with the stages that become ready together (a fan-out) running side by side.

A stage's latency budget is what remains of the end-to-end SLO once the stages still to run
after it are set aside: the SLO, less the time spent so far, less the longest path of expected
latencies below it (``expected_ms``: the plan's, else the fastest qualifying variant's p99). A
stage whose share is smaller than its own expected latency is still asked for that: the query
goes on and its reply says the SLO was missed, rather than failing a stage that could answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from modelless.dispatch.router import Dispatcher, QueryResult
from modelless.exceptions import ModellessError
from modelless.inputs.bodies import query_inputs
from modelless.pipelines.spec import REQUEST_INPUT, PipelineSpec
from modelless.pipelines.store import PipelineStore
from modelless.types import QueryTargets

# Expected latency (ms) per stage for a batch of this many rows.
ExpectedLatency = Callable[[str, PipelineSpec, int], Mapping[str, float]]
MAX_PARALLEL_STAGES = 8


@dataclass(frozen=True)
class StageRun:
    stage: str
    model: str
    ran: bool
    skipped_because: str | None = None
    budget_ms: float | None = None  # the latency target the stage's query was given
    expected_ms: float | None = None
    started_ms: float | None = None  # since the pipeline query's arrival
    result: QueryResult | None = None

    @property
    def predictions(self) -> list[int] | None:
        return None if self.result is None else [int(c) for c in self.result.outputs.argmax(axis=1)]


@dataclass(frozen=True)
class PipelineRun:
    query_id: str
    pipeline: str
    stages: list[StageRun]
    answered_by: str  # the stage whose outputs are the pipeline's answer
    outputs: np.ndarray
    total_ms: float
    slo_ms: float
    branches: dict[str, bool] = field(default_factory=dict)  # edge -> taken, for sources that ran

    @property
    def met_slo(self) -> bool:
        return self.total_ms <= self.slo_ms


@dataclass(frozen=True)
class _Query:
    """One pipeline query as its stages read it: the entry stage's batch, when the end-to-end
    clock started (``perf_counter``), and per stage the expected latency and the longest path of
    expected latencies after it, which its budget is cut from."""

    app_id: str
    spec: PipelineSpec
    inputs: np.ndarray
    query_id: str
    started: float
    expected: dict[str, float]
    after: dict[str, float]


class PipelineExecutor:
    def __init__(
        self,
        dispatcher: Dispatcher,
        store: PipelineStore,
        max_batch: int,
        expected_ms: ExpectedLatency | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._store = store
        self._max_batch = max_batch
        self._expected_ms = expected_ms or self.fastest_latencies
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_STAGES, thread_name_prefix="pipeline-stage")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def fastest_latencies(self, app_id: str, spec: PipelineSpec, batch: int) -> dict[str, float]:
        """Per stage, the p99 at ``batch`` of its model's fastest variant meeting its accuracy
        floor (the profile cache's view: no store round trip while it is fresh)."""
        version = self._dispatcher.live_view.view(app_id)[0]
        expected: dict[str, float] = {}
        for stage in spec.stages:
            targets = QueryTargets(app_id, min_accuracy=_floor(spec, stage.name), model_name=stage.model)
            candidates = self._dispatcher.profiles.candidates(targets, version)
            expected[stage.name] = min((v.latency_ms(batch) for v in candidates), default=0.0)
        return expected

    def run(
        self,
        app_id: str,
        spec: PipelineSpec,
        inputs: np.ndarray,
        query_id: str = "",
        received: float | None = None,
    ) -> PipelineRun:
        """Serve one query through ``spec``. ``inputs``: the entry stage's batch (checked against
        its model's contract); ``received``: the query's arrival (``perf_counter``), where the
        end-to-end clock starts."""
        query_id = query_id or uuid.uuid4().hex
        started = time.perf_counter() if received is None else received
        expected = dict(self._expected_ms(app_id, spec, int(inputs.shape[0])))
        query = _Query(app_id, spec, inputs, query_id, started, expected, spec.longest_path_after(expected))
        order = spec.topological_order()
        branches: dict[str, bool] = {}
        runs = self._run_stages(query, order, branches)
        total_ms = (time.perf_counter() - started) * 1000
        answered_by = _answering_stage(spec, order, runs)
        answer = runs[answered_by].result
        assert answer is not None  # the entry always runs
        self._store.count_branches(app_id, spec.name, branches)
        return PipelineRun(
            query_id=query_id,
            pipeline=spec.name,
            stages=[runs[n] for n in order],
            answered_by=answered_by,
            outputs=answer.outputs,
            total_ms=round(total_ms, 3),
            slo_ms=spec.latencySlo,
            branches=branches,
        )

    def _run_stages(self, query: _Query, order: list[str], branches: dict[str, bool]) -> dict[str, StageRun]:
        """Every stage, run or skipped, wave by wave along the DAG (``branches``: each edge whose
        source ran, taken or not). A wave's stages only read the waves before it, so they run
        side by side; a wave of one runs on this thread (no hand-off to pay)."""
        runs: dict[str, StageRun] = {}
        pending = list(order)
        while pending:
            # The stages whose predecessors have all settled: they go now, side by side.
            ready = [n for n in pending if query.spec.predecessors(n) <= runs.keys()]
            to_run: list[str] = []
            for name in ready:
                pending.remove(name)
                reason = self._why_skipped(query.spec, name, runs, branches)
                if reason is None:
                    to_run.append(name)
                else:
                    runs[name] = StageRun(name, query.spec.stage(name).model, False, reason)
            if len(to_run) == 1:
                runs[to_run[0]] = self._run_stage(query, runs, to_run[0])
            elif to_run:
                stage_runs = self._pool.map(lambda name: self._run_stage(query, runs, name), to_run)
                for name, stage_run in zip(to_run, stage_runs, strict=True):
                    runs[name] = stage_run
        return runs

    def _run_stage(self, query: _Query, runs: Mapping[str, StageRun], name: str) -> StageRun:
        """One stage's online query, its latency target what remains of the SLO once the stages
        after it are set aside (never less than its own expected latency: a late answer beats a
        stage refused); skipped when the stage it reads from did not run."""
        spec, stage = query.spec, query.spec.stage(name)
        stage_inputs = self._stage_inputs(query, runs, name)
        if stage_inputs is None:
            return StageRun(name, stage.model, False, f"its input stage {stage.input!r} did not run")
        begun = time.perf_counter()
        elapsed_ms = (begun - query.started) * 1000
        budget = max(spec.latencySlo - elapsed_ms - query.after[name], query.expected[name])
        targets = QueryTargets(
            app_id=query.app_id,
            latency_ms=budget,
            min_accuracy=_floor(spec, name),
            model_name=stage.model,
            batch=int(stage_inputs.shape[0]),
        )
        try:
            result = self._dispatcher.online_query(targets, stage_inputs, f"{query.query_id}.{name}")
        except ModellessError as error:
            error.within(f"pipeline {spec.name!r}, stage {name!r}", stage=name)
            raise
        return StageRun(
            name,
            stage.model,
            True,
            None,
            round(budget, 3),
            round(query.expected[name], 3),
            round(elapsed_ms, 3),
            result,
        )

    def _stage_inputs(self, query: _Query, runs: Mapping[str, StageRun], name: str) -> np.ndarray | None:
        """What the stage reads: the request's batch, or its input stage's outputs checked against
        the stage's model's contract; None when that stage did not run."""
        stage = query.spec.stage(name)
        if stage.input == REQUEST_INPUT:
            return query.inputs
        source = runs[stage.input].result
        if source is None:
            return None
        contract = self._dispatcher.profiles.input_contract(query.app_id, stage.model)
        return query_inputs(source.outputs.astype(np.float32).tolist(), contract, self._max_batch)

    @staticmethod
    def _why_skipped(
        spec: PipelineSpec, name: str, runs: Mapping[str, StageRun], branches: dict[str, bool]
    ) -> str | None:
        """None when the stage runs (the entry; else one of its incoming edges is taken); records
        each incoming edge whose source ran as taken or not."""
        incoming = spec.incoming(name)
        if not incoming:
            return None
        taken = False
        for edge in incoming:
            source = runs[edge.source].result
            if source is None:
                continue
            branches[edge.key] = edge.when.holds(source.outputs)
            taken |= branches[edge.key]
        if taken:
            return None
        if not branches.keys() & {e.key for e in incoming}:
            return "none of its predecessors ran"
        return "no incoming edge's condition held"


def _floor(spec: PipelineSpec, stage: str) -> float:
    own = spec.stage(stage).accuracy
    return spec.accuracy if own is None else own


def _answering_stage(spec: PipelineSpec, order: list[str], runs: Mapping[str, StageRun]) -> str:
    """The pipeline's answer: the last stage (in topological order) that ran — for a cascade,
    the expensive model when it was called, else the cheap one."""
    return next(name for name in reversed(order) if runs[name].ran)
