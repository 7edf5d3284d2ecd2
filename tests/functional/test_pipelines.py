"""Pipelines on real worker processes and a real Redis (InferLine): a sequential pipeline and a
conditional cascade of real digits models, each stage served by a worker process, the answers
the real models' own; the Redis pipeline store shared by every gateway (specs, and branch
counts that concurrent queries never lose)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.exceptions import ConflictError, InvalidInputError, NotFoundError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pipelines.autopilot import AutopilotConfig, PipelineAutopilot
from modelless.pipelines.factory import pipeline_store_for
from modelless.pipelines.redis import RedisPipelineStore
from modelless.pipelines.service import PipelineService
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.store import BranchCount
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalPoolProvider, LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.selection import InfaasPolicy
from tests.functional.workers_kit import classes_of, publish_model, report_url_of, start_worker, worker_pool
from tests.models import digits, hidden_model, linear_model
from tests.waiting import scaled, wait_for

APP = "pipeline-app"
SLO_MS = 2000.0  # room for the first queries' loads on a busy machine


@dataclass
class Served:
    store: RedisMetadataStore
    repository: LocalModelRepository
    pool: LocalWorkerPool
    pipelines: PipelineService


@pytest.fixture
def served(tmp_path: Path, redis_store: RedisMetadataStore) -> Iterator[Served]:
    repository = LocalModelRepository(tmp_path / "repo")
    invoker = HttpWorkerInvoker()
    with worker_pool(str(tmp_path / "repo"), report_url_of(redis_store), tmp_path, slots=4) as pool:
        dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None)
        service = PipelineService(
            pipeline_store_for(redis_store), redis_store, dispatcher, max_batch=16, pools=DEFAULT_POOLS
        )
        try:
            served = Served(redis_store, repository, pool, service)
            publish_model(
                served.store, served.repository, APP, "linear", linear_model(), accuracy=0.86, p99_ms=5.0
            )
            publish_model(
                served.store, served.repository, APP, "hidden", hidden_model(), accuracy=0.93, p99_ms=8.0
            )
            start_worker(pool, redis_store)
            yield served
        finally:
            service.close()
            invoker.close()


def confidence_of(model: bytes, inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": inputs})[0].astype(np.float64)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    confidence: np.ndarray = (shifted / shifted.sum(axis=1, keepdims=True)).max(axis=1)
    return confidence


def rows(count: int, start: int = 0) -> np.ndarray:
    return np.ascontiguousarray(digits()[0][-400 + start :][:count])


SEQUENTIAL = PipelineSpec.model_validate(
    {
        "name": "sequential",
        "stages": [{"name": "first", "model": "linear"}, {"name": "second", "model": "hidden"}],
        "edges": [{"source": "first", "target": "second"}],
        "latencySlo": SLO_MS,
        "accuracy": 0.8,
    }
)
THRESHOLD = 0.17  # about the median confidence of the linear model (a least-squares fit) on the sample
CASCADE = PipelineSpec.model_validate(
    {
        "name": "cascade",
        "stages": [{"name": "cheap", "model": "linear"}, {"name": "expensive", "model": "hidden"}],
        "edges": [
            {
                "source": "cheap",
                "target": "expensive",
                "when": {"kind": "confidence_below", "threshold": THRESHOLD},
            }
        ],
        "latencySlo": SLO_MS,
    }
)


def test_a_sequential_pipeline_runs_its_stages_on_a_real_worker(served: Served) -> None:
    served.pipelines.register(APP, SEQUENTIAL)
    inputs = rows(4)

    run = served.pipelines.query(APP, "sequential", inputs.tolist())

    assert [s.ran for s in run.stages] == [True, True]
    for stage, model in zip(run.stages, ("linear", "hidden"), strict=True):
        assert stage.result is not None and stage.result.tier.value == "worker"
        assert stage.result.worker_id in served.pool.workers()
        assert stage.result.decision.variant.model_name == model
        assert stage.result.timings_ms["inference_ms"] > 0
    assert run.stages[0].predictions == classes_of(linear_model(), inputs)
    assert run.answered_by == "second"
    assert [int(c) for c in run.outputs.argmax(axis=1)] == classes_of(hidden_model(), inputs)
    # The second stage began after the first answered, and the whole took at least both.
    first, second = (s.result for s in run.stages)
    assert first is not None and second is not None
    assert run.total_ms >= first.timings_ms["total_ms"] + second.timings_ms["total_ms"] - 1.0


def test_a_cascade_escalates_exactly_the_unsure_queries_and_counts_its_branch(served: Served) -> None:
    served.pipelines.register(APP, CASCADE)
    queries = [rows(1, start) for start in range(12)]
    unsure = [bool(confidence_of(linear_model(), q)[0] < THRESHOLD) for q in queries]
    assert any(unsure) and not all(unsure), "the sample should hold both kinds"

    with ThreadPoolExecutor(4) as pool:  # concurrent queries: no branch count is lost
        runs = list(pool.map(lambda q: served.pipelines.query(APP, "cascade", q.tolist()), queries))

    for run, escalated, query in zip(runs, unsure, queries, strict=True):
        assert [s.ran for s in run.stages] == [True, escalated]
        model = hidden_model() if escalated else linear_model()
        assert [int(c) for c in run.outputs.argmax(axis=1)] == classes_of(model, query)
    # Another gateway (a second store on the same Redis) sees the spec and the measured branch.
    other = RedisPipelineStore(served.store)
    assert other.get(APP, "cascade") == CASCADE
    assert other.branches(APP, "cascade") == {"cheap->expensive": BranchCount(len(queries), sum(unsure))}


def test_the_redis_store_refuses_what_the_service_must_and_forgets_on_delete(served: Served) -> None:
    served.pipelines.register(APP, SEQUENTIAL)
    with pytest.raises(ConflictError):
        served.pipelines.register(APP, SEQUENTIAL)
    unknown = SEQUENTIAL.model_copy(
        update={
            "name": "unknown",
            "stages": [SEQUENTIAL.stages[0].model_copy(update={"model": "missing"})],
            "edges": [],
        }
    )
    with pytest.raises(InvalidInputError):
        served.pipelines.register(APP, unknown)
    served.pipelines.query(APP, "sequential", rows(1).tolist())
    assert [s.name for s in served.pipelines.store.list(APP)] == ["sequential"]

    served.pipelines.delete(APP, "sequential")

    assert served.pipelines.store.list(APP) == []
    assert served.pipelines.branches(APP, "sequential") == {}
    with pytest.raises(NotFoundError):
        served.pipelines.query(APP, "sequential", rows(1).tolist())


def test_the_planner_and_tuner_drive_the_live_scaler_onto_real_workers(
    served: Served, redis_store: RedisMetadataStore
) -> None:
    """A cascade's queries on a real worker: the autopilot plans at their measured rate and
    branch probability, its stages become demand floors of the scaler's one program, and the
    scaler's tick places instances of both stages' models on the real pool's worker."""
    served.pipelines.register(APP, CASCADE)
    inputs = rows(40)
    for index in range(len(inputs)):
        served.pipelines.query(APP, "cascade", inputs[index : index + 1].tolist())
    probability = served.pipelines.branches(APP, "cascade")["cheap->expensive"].probability
    assert probability is not None and 0 < probability < 1

    pilot = PipelineAutopilot(served.pipelines, AutopilotConfig(min_arrivals=5))
    floors = pilot.floors()
    plan = pilot.plan_of(APP, "cascade")
    assert plan is not None and plan.feasible, plan
    assert {s.stage for s in plan.stages} == {"cheap", "expensive"}
    expensive = next(s for s in plan.stages if s.stage == "expensive")
    assert expensive.probability == pytest.approx(probability)  # measured, not assumed
    assert len(floors) == 2 and all(qps > 0 for qps in floors.values())

    provider = LocalPoolProvider({"cpu": served.pool}, forget=redis_store.remove_worker)
    scaler = Scaler(
        redis_store,
        provider,
        DEFAULT_POOLS,
        ScalerConfig(
            window_s=10, min_workers={"cpu": 1}, max_workers={"cpu": 1}, provision_for_envelope=False
        ),
        demand_floors=pilot.floors,
    )
    report = scaler.tick()

    assert report.floors_qps.keys() == floors.keys()
    assigned = provider.assignments["cpu"]
    models = {variant.split("/")[1] for variant, count in assigned.items() if count > 0}
    assert models == {"linear", "hidden"}, report.summary()
    wait_for(
        lambda: {i.variant_id.split("/")[1] for w in redis_store.list_workers("cpu") for i in w.instances},
        scaled(30.0),
        "the worker to report both stages' models loaded",
        until=lambda loaded: {"linear", "hidden"} <= loaded,
    )
