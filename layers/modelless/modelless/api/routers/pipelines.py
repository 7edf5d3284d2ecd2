"""Pipelines: DAGs of an app's models served under one end-to-end latency SLO (InferLine;
docs/PIPELINES.md). Each call is the app's own: its API key (or the admin key)."""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from modelless.api.dependencies import KeyDep, ServicesDep
from modelless.api.openapi import AUTHENTICATED, NamePath, NameQuery, error_responses
from modelless.api.routers.feedback import _authorize_app
from modelless.api.services import Services
from modelless.pipelines.executor import PipelineRun
from modelless.pipelines.spec import PipelineSpec
from modelless.validation import NAME_SCHEMA, check_name

router = APIRouter(prefix="/v1", tags=["pipelines"])


class RegisterPipeline(PipelineSpec):
    """A pipeline's spec, with the app it belongs to."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "appID": "shop",
                    "name": "cascade",
                    "stages": [{"name": "fast", "model": "mobilenet"}, {"name": "exact", "model": "resnet"}],
                    "edges": [
                        {
                            "source": "fast",
                            "target": "exact",
                            "when": {"kind": "confidence_below", "threshold": 0.8},
                        }
                    ],
                    "latencySlo": 200,
                    "accuracy": 0.7,
                }
            ]
        }
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    name: str = Field(json_schema_extra=NAME_SCHEMA)


class PipelineReply(BaseModel):
    appID: str
    pipeline: PipelineSpec
    entry: str
    order: list[str] = Field(description="the stages in the order they may run")
    branchProbabilities: dict[str, float | None] = Field(
        description="per edge, the share of queries whose source ran that took it (None: no query yet)"
    )


class PipelineList(BaseModel):
    appID: str
    pipelines: list[PipelineReply]


class PipelineQuery(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"appID": "shop", "inputs": [[0.0, 0.5, 1.0, 0.25]]}]}
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    inputs: Any = Field(description="the entry stage's inputs, as an online query's JSON inputs")


class StageReply(BaseModel):
    stage: str
    model: str
    ran: bool
    skippedBecause: str | None = None
    variant: str | None = None
    tier: str | None = None
    worker: str | None = None
    budgetMs: float | None = Field(default=None, description="the latency target the stage was given")
    expectedLatencyMs: float | None = None
    startedMs: float | None = Field(default=None, description="when it began, since the query's arrival")
    timingsMs: dict[str, float] | None = None
    predictions: list[int] | None = None


class PipelineQueryReply(BaseModel):
    queryId: str
    pipeline: str
    answeredBy: str = Field(description="the stage whose outputs are the answer (the last one that ran)")
    outputs: list[list[float]]
    predictions: list[int]
    stages: list[StageReply]
    totalMs: float = Field(description="end to end, from the query's arrival to its answer")
    sloMs: float
    metSlo: bool


@router.post(
    "/pipelines", status_code=201, responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413)
)
def register_pipeline(body: RegisterPipeline, services: ServicesDep, key: KeyDep) -> PipelineReply:
    """A new pipeline of the app: stages over its registered models, edges between them (always,
    or on a condition over the source's answer), an end-to-end latency SLO and an accuracy floor.
    An invalid DAG or an unknown model is a 400; a name in use a 409."""
    _authorize_app(services, key, body.appID)
    spec = PipelineSpec.model_validate(body.model_dump(exclude={"appID"}))
    return _reply(services, body.appID, services.pipelines.register(body.appID, spec))


@router.get("/pipelines", responses=error_responses(*AUTHENTICATED, 400, 403, 404))
def list_pipelines(appID: NameQuery, services: ServicesDep, key: KeyDep) -> PipelineList:
    _authorize_app(services, key, appID)
    return PipelineList(
        appID=appID, pipelines=[_reply(services, appID, s) for s in services.pipelines.store.list(appID)]
    )


@router.get("/pipelines/{name}", responses=error_responses(*AUTHENTICATED, 400, 403, 404))
def get_pipeline(name: NamePath, appID: NameQuery, services: ServicesDep, key: KeyDep) -> PipelineReply:
    _authorize_app(services, key, appID)
    check_name("pipeline", name)
    return _reply(services, appID, services.pipelines.get(appID, name))


@router.delete("/pipelines/{name}", status_code=204, responses=error_responses(*AUTHENTICATED, 400, 403, 404))
def delete_pipeline(name: NamePath, appID: NameQuery, services: ServicesDep, key: KeyDep) -> Response:
    _authorize_app(services, key, appID)
    check_name("pipeline", name)
    services.pipelines.delete(appID, name)
    return Response(status_code=204)


MAX_PLAN_QPS = 1_000_000.0


@router.get("/pipelines/{name}/plan", responses=error_responses(*AUTHENTICATED, 400, 403, 404, 501))
def plan_pipeline(
    name: NamePath,
    appID: NameQuery,
    qps: Annotated[float, Query(gt=0, le=MAX_PLAN_QPS, description="the arrival rate to plan for")],
    services: ServicesDep,
    key: KeyDep,
    lambdaAllowed: bool = False,
) -> dict[str, Any]:
    """The planner's choice for ``qps`` arrivals: per stage, its share of the SLO, its variants
    (pool, precision, batch size, instances) and the load they serve, with the plan's cost and,
    in words, why. ``lambdaAllowed``: let the plan leave load to the Lambda tier."""
    _authorize_app(services, key, appID)
    check_name("pipeline", name)
    return dataclasses.asdict(services.pipelines.plan(appID, name, qps, lambdaAllowed))


@router.post(
    "/pipelines/{name}/query", responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413, 422)
)
def query_pipeline(
    name: NamePath, body: PipelineQuery, request: Request, services: ServicesDep, key: KeyDep
) -> PipelineQueryReply:
    """One online query through the pipeline: each stage that runs is an online query of its
    model (the system picks its variant, worker and tier) within its share of the SLO."""
    received = time.perf_counter()
    services.keys.authorize(key, body.appID)
    check_name("pipeline", name)
    run = services.pipelines.query(
        body.appID, name, body.inputs, getattr(request.state, "correlation_id", ""), received
    )
    return query_reply(run)


def query_reply(run: PipelineRun) -> PipelineQueryReply:
    return PipelineQueryReply(
        queryId=run.query_id,
        pipeline=run.pipeline,
        answeredBy=run.answered_by,
        outputs=run.outputs.astype(float).round(6).tolist(),
        predictions=[int(c) for c in run.outputs.argmax(axis=1)],
        stages=[
            StageReply(
                stage=s.stage,
                model=s.model,
                ran=s.ran,
                skippedBecause=s.skipped_because,
                variant=None if s.result is None else s.result.decision.variant.variant_id,
                tier=None if s.result is None else s.result.tier.value,
                worker=None if s.result is None else s.result.worker_id,
                budgetMs=s.budget_ms,
                expectedLatencyMs=s.expected_ms,
                startedMs=s.started_ms,
                timingsMs=None if s.result is None else s.result.timings_ms,
                predictions=s.predictions,
            )
            for s in run.stages
        ],
        totalMs=run.total_ms,
        sloMs=run.slo_ms,
        metSlo=run.met_slo,
    )


def _reply(services: Services, app_id: str, spec: PipelineSpec) -> PipelineReply:
    counts = services.pipelines.branches(app_id, spec.name)
    return PipelineReply(
        appID=app_id,
        pipeline=spec,
        entry=spec.entry,
        order=spec.topological_order(),
        branchProbabilities={
            e.key: (counts[e.key].probability if e.key in counts else None) for e in spec.edges
        },
    )
