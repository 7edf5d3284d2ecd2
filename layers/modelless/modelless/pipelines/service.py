"""Pipelines as the API serves them: register (a valid DAG over the app's registered models),
look up, delete, and query (docs/PIPELINES.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modelless.catalog import PoolSpec
from modelless.dispatch.router import Dispatcher
from modelless.exceptions import ConflictError, InvalidInputError, NotFoundError, PlannerUnavailableError
from modelless.inputs.bodies import query_inputs
from modelless.metadata.base import MetadataStore
from modelless.pipelines.autopilot import ArrivalLog
from modelless.pipelines.executor import PipelineExecutor, PipelineRun
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.store import BranchCount, PipelineStore

if TYPE_CHECKING:
    # The planner needs the solver (scipy), which the gateway's Lambda package leaves out: it is
    # imported where a plan is asked for, not with the API.
    from modelless.pipelines.planner import PipelinePlan


class PipelineService:
    def __init__(
        self,
        store: PipelineStore,
        metadata: MetadataStore,
        dispatcher: Dispatcher,
        max_batch: int,
        pools: Mapping[str, PoolSpec],
    ) -> None:
        self.store = store
        self._metadata = metadata
        self._dispatcher = dispatcher
        self._max_batch = max_batch
        self._pools = pools
        self.executor = PipelineExecutor(dispatcher, store, max_batch, self._expected_ms)
        # When each stage ran: the tuner's envelopes (modelless.pipelines.autopilot).
        self.arrivals = ArrivalLog()
        # This gateway's latest plan per pipeline: its budgets are what a stage's query leaves
        # for the stages after it.
        self._plans: dict[tuple[str, str], PipelinePlan] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.executor.close()

    def register(self, app_id: str, spec: PipelineSpec) -> PipelineSpec:
        """Store a new pipeline: a valid DAG whose every model is registered in the app (still
        being profiled is fine: a query waits for nothing, it is refused as any query is).
        A name the app already uses is a 409; nothing is stored on any error."""
        spec.validate_dag()
        unknown = [m for m in spec.models() if self._metadata.get_model(app_id, m) is None]
        if unknown:
            raise InvalidInputError(
                f"pipeline {spec.name!r} names models not registered in app {app_id!r}: {unknown}",
                models=unknown,
            )
        if not self.store.create(app_id, spec):
            raise ConflictError(f"app {app_id!r} has a pipeline named {spec.name!r}", pipeline=spec.name)
        return spec

    def get(self, app_id: str, name: str) -> PipelineSpec:
        spec = self.store.get(app_id, name)
        if spec is None:
            raise NotFoundError(f"app {app_id!r} has no pipeline named {name!r}", pipeline=name)
        return spec

    def delete(self, app_id: str, name: str) -> None:
        with self._lock:
            self._plans.pop((app_id, name), None)
        self.arrivals.forget(app_id, name)
        if not self.store.delete(app_id, name):
            raise NotFoundError(f"app {app_id!r} has no pipeline named {name!r}", pipeline=name)

    def branches(self, app_id: str, name: str) -> dict[str, BranchCount]:
        return self.store.branches(app_id, name)

    def query(
        self, app_id: str, name: str, raw_inputs: Any, query_id: str = "", received: float | None = None
    ) -> PipelineRun:
        """One online query: ``raw_inputs`` as an online query's JSON ``inputs``, checked against
        the entry stage's model."""
        arrived = time.time()
        spec = self.get(app_id, name)
        contract = self._dispatcher.profiles.input_contract(app_id, spec.stage(spec.entry).model)
        inputs = query_inputs(raw_inputs, contract, self._max_batch)
        run = self.executor.run(app_id, spec, inputs, query_id, received)
        self.arrivals.record(app_id, name, [s.stage for s in run.stages if s.ran], arrived)
        return run

    def plan(self, app_id: str, name: str, qps: float, lambda_allowed: bool = False) -> PipelinePlan:
        """The planner's plan for ``qps`` arrivals (``modelless.pipelines.planner``), over the
        app's profiles and the pipeline's measured branch probabilities. A feasible plan's
        budgets guide this gateway's queries of the pipeline from then on."""
        spec = self.get(app_id, name)
        branches = {edge: count.probability for edge, count in self.store.branches(app_id, name).items()}
        profiles = self._metadata.list_variants(app_id)
        try:
            from modelless.pipelines.planner import plan_pipeline
        except ImportError as error:  # the gateway's Lambda package: no solver in it
            raise PlannerUnavailableError(
                "the pipeline planner needs the solver (scipy), which this deployment's gateway does "
                "not carry: ask the embedded stack, or run the planner where the scaler runs",
                missing=error.name or "scipy",
            ) from None
        plan = plan_pipeline(spec, profiles, self._pools, qps, branches, lambda_allowed=lambda_allowed)
        if plan.feasible:
            with self._lock:
                self._plans[(app_id, name)] = plan
        return plan

    def _expected_ms(self, app_id: str, spec: PipelineSpec, batch: int) -> Mapping[str, float]:
        """Per stage, the latency to leave for it: its planned budget, else its fastest
        qualifying variant's p99."""
        with self._lock:
            plan = self._plans.get((app_id, spec.name))
        if plan is not None and plan.budgets().keys() == {s.name for s in spec.stages}:
            return plan.budgets()
        return self.executor.fastest_latencies(app_id, spec, batch)
