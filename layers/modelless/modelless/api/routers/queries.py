"""online_query: the system picks the variant, the worker and the tier."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from modelless.api.dependencies import KeyDep, ServicesDep
from modelless.api.schemas import OnlineQuery, QueryReply
from modelless.api.services import Services
from modelless.auth import authorize_app
from modelless.exceptions import InvalidInputError
from modelless.observability import record_query
from modelless.types import QueryTargets
from modelless.validation import check_name, check_targets, query_inputs

router = APIRouter(prefix="/v1", tags=["queries"])


@router.post("/online_query")
async def online_query(body: OnlineQuery, request: Request, services: ServicesDep, key: KeyDep) -> QueryReply:
    # One hop to the thread pool for everything that may wait: the key's and the model's lookups
    # in the metadata store, and the dispatch to a worker or the Lambda tier.
    return await run_in_threadpool(answer_query, services, body, key, request.state.correlation_id)


def answer_query(services: Services, body: OnlineQuery, key: str | None, correlation_id: str) -> QueryReply:
    authorize_app(services.store, key, body.appID)
    check_targets(body.latency, body.accuracy)
    if body.modelName is None and body.latency is None and body.accuracy is None:
        raise InvalidInputError("give either modelName, or a latency and/or accuracy target")
    if body.modelName is not None:
        check_name("modelName", body.modelName)
    contract = services.dispatcher.profiles.input_contract(body.appID, body.modelName)
    inputs = query_inputs(body.inputs, contract, services.settings.max_batch)
    targets = QueryTargets(
        app_id=body.appID,
        latency_ms=body.latency,
        min_accuracy=body.accuracy or 0.0,
        model_name=body.modelName,
        batch=int(inputs.shape[0]),
    )
    result = services.dispatcher.online_query(targets, inputs, correlation_id)
    record_query(result)
    outputs = result.outputs.astype(np.float64)
    return QueryReply(
        queryId=result.query_id,
        outputs=outputs.round(6).tolist(),
        predictions=np.argmax(outputs, axis=1).astype(int).tolist(),
        model=result.decision.variant.model_name,
        variant=result.decision.variant.variant_id,
        tier=result.tier.value,
        worker=result.worker_id,
        variantState=result.decision.state.value,
        coldStart=result.cold_start,
        retried=result.retried,
        reason=result.decision.reason,
        expectedLatencyMs=round(result.decision.expected_latency_ms, 3),
        timingsMs=result.timings_ms,
    )
