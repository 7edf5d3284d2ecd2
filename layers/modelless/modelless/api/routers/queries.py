"""online_query: the system picks the variant, the worker and the tier.

One endpoint, several bodies (docs/QUERIES.md): JSON (``OnlineQuery``: app, targets and inputs in
the body); or the inputs alone, binary (an ``.npy`` array, an ``.npz`` with one array per input
name, a PNG or JPEG image for a model with a preprocessing recipe) with the app and targets in the
query string (``?appID=…&latency=…&accuracy=…&modelName=…``). The route reads the body itself,
so that reading and decoding it are timed (``timingsMs.decode_ms``) and a binary body never goes
through JSON parsing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from modelless.api.deadlines import ReplyDeadline
from modelless.api.dependencies import KeyDep, ServicesDep
from modelless.api.openapi import AUTHENTICATED, error_responses
from modelless.api.schemas import (
    EnsembleReply,
    OnlineQuery,
    QueryAccuracy,
    QueryLatencyMs,
    QueryReply,
    request_error,
)
from modelless.api.services import Services
from modelless.exceptions import InvalidInputError, PayloadTooLargeError
from modelless.inputs.bodies import BodyKind, binary_inputs, body_kind, query_inputs
from modelless.observability.metrics import cache_stats_reporter, record_query
from modelless.tracing import APP, CACHE_HIT, COLD_START, MODEL, TIER, VARIANT, enabled, span
from modelless.types import QueryTargets
from modelless.validation import MAX_LATENCY_MS, NAME_SCHEMA, check_name

router = APIRouter(prefix="/v1", tags=["queries"])


class QueryParameters(BaseModel):
    """A binary query's app and targets, from its query string (what a JSON body holds besides
    its inputs)."""

    model_config = ConfigDict(extra="forbid")
    appID: str
    # Text by nature, read only as a JSON number is written: "true", "nan" or "1e999" is a 400.
    latency: QueryLatencyMs | None = None
    accuracy: QueryAccuracy | None = None
    modelName: str | None = Field(default=None, description="name the model instead of targets")


_BINARY = {"schema": {"type": "string", "format": "binary"}}
ONLINE_QUERY_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": schema,
            "description": f"{description} (binary bodies only; a JSON body holds it instead)",
        }
        for name, schema, description in (
            ("appID", {"type": "string", **NAME_SCHEMA}, "the application; required with a binary body"),
            (
                "latency",
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_LATENCY_MS},
                "latency budget in milliseconds",
            ),
            ("accuracy", {"type": "number", "minimum": 0, "maximum": 1}, "minimum top-1 accuracy in [0, 1]"),
            ("modelName", {"type": "string", **NAME_SCHEMA}, "name the model instead of targets"),
        )
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": OnlineQuery.model_json_schema()},
            "application/x-npy": _BINARY,
            "application/x-npz": _BINARY,
            "image/jpeg": _BINARY,
            "image/png": _BINARY,
            "application/octet-stream": _BINARY,
        },
    },
}
ONLINE_QUERY_DESCRIPTION = """\
Run a query on the variant, worker and tier the system picks for its targets.

The body is either JSON (`appID`, targets and `inputs` as nested lists, or an object of them by
input name for a model with several inputs), or the inputs alone with `appID`, `latency`,
`accuracy` and `modelName` in the query string:

- `application/x-npy`: one `.npy` array [batch, *shape] (or one example [*shape]) for a one-input model;
- `application/x-npz` (or `application/zip`): an `.npz` with one array per input name;
- `image/jpeg`, `image/png`: one image, decoded with the model's preprocessing recipe;
- `application/octet-stream`: any of these, recognised by its first bytes.

The body counts against `MODELLESS_MAX_QUERY_BYTES` (413 beyond it); other content types are 415.
"""


@router.post(
    "/online_query",
    description=ONLINE_QUERY_DESCRIPTION,
    openapi_extra=ONLINE_QUERY_OPENAPI,
    responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413, 415, 422),
)
async def online_query(request: Request, services: ServicesDep, key: KeyDep) -> QueryReply:
    reading = time.perf_counter()
    try:
        body = await request.body()
    except ClientDisconnect as error:
        # The body-limit middleware cut an oversized body off (and has answered 413 already), or
        # the client went away: nobody reads what is raised here.
        raise PayloadTooLargeError(
            "request body was cut off before its end", limit=services.settings.max_query_bytes
        ) from error
    # One hop to the thread pool for everything that may wait or take CPU: the key's and the
    # model's lookups in the metadata store, decoding the body, and the dispatch to a worker or
    # the Lambda tier. The reply comes by the query's deadline, whether or not that thread does.
    deadline = ReplyDeadline(reading)
    return await deadline.wait(
        run_in_threadpool(
            answer_query,
            services,
            request.headers.get("content-type"),
            body,
            dict(request.query_params),
            key,
            request.state.correlation_id,
            reading,
            deadline,
        ),
        f"query {request.state.correlation_id}",
    )


def answer_query(
    services: Services,
    content_type: str | None,
    body: bytes,
    parameters: dict[str, str],
    key: str | None,
    correlation_id: str,
    reading: float,
    deadline: ReplyDeadline | None = None,
) -> QueryReply:
    """``reading``: the ``perf_counter`` at which the route began reading the body: the query's
    arrival, where its clock starts; from it to the batch's existence is ``decode_ms``.
    ``deadline`` hears the query's targets as soon as they are read. Traced as one
    ``modelless.query`` span (modelless.tracing), whose children are the query's stages."""
    with span("modelless.query", {"modelless.correlation_id": correlation_id}) as query_span:
        reply = _answer_query(
            services, content_type, body, parameters, key, correlation_id, reading, deadline
        )
        if enabled():
            query_span.set_attributes(
                {
                    MODEL: reply.model,
                    VARIANT: reply.variant,
                    TIER: reply.tier,
                    CACHE_HIT: reply.cached,
                    COLD_START: reply.coldStart,
                }
            )
        return reply


def _answer_query(
    services: Services,
    content_type: str | None,
    body: bytes,
    parameters: dict[str, str],
    key: str | None,
    correlation_id: str,
    reading: float,
    deadline: ReplyDeadline | None,
) -> QueryReply:
    kind = body_kind(content_type, body)
    query = _json_query(body, parameters) if kind is BodyKind.JSON else _query_parameters(parameters)
    services.keys.authorize(key, query.appID)
    if query.modelName is None and query.latency is None and query.accuracy is None:
        raise InvalidInputError("give either modelName, or a latency and/or accuracy target")
    if query.modelName is not None:
        check_name("modelName", query.modelName)
    with span("modelless.decode", {APP: query.appID, "modelless.body": kind.value}):
        contract = services.dispatcher.profiles.input_contract(query.appID, query.modelName)
        max_batch = services.settings.max_batch
        if isinstance(query, OnlineQuery):
            inputs = query_inputs(query.inputs, contract, max_batch)
        else:
            inputs = binary_inputs(kind, body, contract, max_batch)
    decode_ms = (time.perf_counter() - reading) * 1000
    targets = QueryTargets(
        app_id=query.appID,
        latency_ms=query.latency,
        min_accuracy=query.accuracy or 0.0,
        model_name=query.modelName,
        batch=int(inputs.shape[0]),
    )
    if deadline is not None:
        deadline.know(targets)
    # By the app's selection policy (INFaaS's getVariant, or Exp3/Exp4 from feedback).
    answer = services.feedback.answer(targets, inputs, correlation_id, decode_ms=decode_ms, received=reading)
    result = answer.result
    for served in answer.served:  # an ensemble's members, each as the query it ran
        record_query(served)
    cache = services.dispatcher.cache  # its hit rate and size, as EMF metrics once a minute
    cache_stats_reporter.maybe_report(None if cache is None else cache.predictions)
    outputs = answer.outputs.astype(np.float64)
    return QueryReply(
        queryId=result.query_id,
        outputs=outputs.round(6).tolist(),
        predictions=answer.predictions,
        model=result.decision.variant.model_name,
        variant=result.decision.variant.variant_id,
        tier=result.tier.value,
        worker=result.worker_id,
        variantState="cached" if result.cached else result.decision.state.value,
        coldStart=result.cold_start,
        retried=result.retried,
        cached=result.cached,
        reason=result.decision.reason,
        expectedLatencyMs=round(result.decision.expected_latency_ms, 3),
        timingsMs=result.timings_ms,
        policy=answer.policy.value,
        ensemble=None if answer.ensemble is None else EnsembleReply(**dataclasses.asdict(answer.ensemble)),
    )


def _json_query(body: bytes, parameters: dict[str, str]) -> OnlineQuery:
    if parameters:
        # Two places for one target would leave one of them silently ignored.
        raise InvalidInputError(
            "a JSON query gives its appID and targets in the body, not in the query string "
            f"(got {sorted(parameters)})",
            parameters=sorted(parameters),
        )
    try:
        return OnlineQuery.model_validate_json(body)
    except ValidationError as error:
        raise request_error(error, "body") from None


def _query_parameters(parameters: dict[str, str]) -> QueryParameters:
    try:
        return QueryParameters.model_validate(parameters)
    except ValidationError as error:
        raise request_error(error, "query") from None
