"""Request and reply bodies (camelCase on the wire, as INFaaS's API names them)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from modelless.numbers import Accuracy, LatencyMs
from modelless.registration.profile_import import PROFILE_SCHEMA
from modelless.validation import NAME_SCHEMA

# A number as JSON writes one: what a query string's value must look like to be read as a number.
NUMBER_TEXT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def number_text(value: object) -> object:
    """A number in a query string, where every value is text, read only when it is written as JSON
    writes a number (``50``, ``0.9``, ``1e3``): ``true``, ``nan``, ``inf``, ``0x10`` or `` 5`` are
    refused, never coerced. What it reads is then held to the field's own bounds (``1e999`` is
    infinite: refused there)."""
    if isinstance(value, str):
        if not NUMBER_TEXT.fullmatch(value):
            raise ValueError(f"must be a number such as 50 or 0.9, got {value[:40]!r}")
        return float(value)
    return value


QueryLatencyMs = Annotated[LatencyMs, BeforeValidator(number_text)]
QueryAccuracy = Annotated[Accuracy, BeforeValidator(number_text)]

# The ``s3://`` URIs a request names, as ``S3Uri.parse`` and ``S3Path.parse`` read them.
S3_URI_SCHEMA: dict[str, Any] = {"pattern": r"^s3://[A-Za-z0-9.-]{1,63}/"}
BUCKET_SCHEMA: dict[str, Any] = {"pattern": r"^[A-Za-z0-9.-]{1,63}$"}


def present(field: str) -> dict[str, Any]:
    """JSON Schema for "``field`` is given, and not null" (null counts as absent in these bodies)."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


class ErrorBody(BaseModel):
    code: str = Field(description="what went wrong, for programs: not_found, store_unavailable, …")
    message: str = Field(description="what went wrong, for people")
    details: dict[str, Any] | None = Field(
        default=None, description="facts about it where there are some (a limit, a field, retry_after_s)"
    )


class ErrorResponse(BaseModel):
    """Every error reply of the API, whatever its status."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"error": {"code": "not_found", "message": "model 'resnet' is not registered in app 'shop'"}},
                {
                    "error": {
                        "code": "store_unavailable",
                        "message": "the metadata store does not answer; try again shortly",
                        "details": {"retry_after_s": 2},
                    }
                },
            ]
        }
    )
    error: ErrorBody


class CreateApp(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"appID": "shop"}, {"appID": "shop", "offlineBuckets": ["shop-batch"]}]
        },
    )
    appID: str = Field(description="name of the application", json_schema_extra=NAME_SCHEMA)
    offlineBuckets: list[Annotated[str, Field(json_schema_extra=BUCKET_SCHEMA)]] | None = Field(
        default=None, description="S3 buckets its offline jobs may use (default: the deployment's)"
    )


class AppCreated(BaseModel):
    appID: str
    apiKey: str = Field(description="shown once; only a hash is stored")


class OnlineQuery(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # A query names its model, or states a latency and/or an accuracy target.
            "anyOf": [present("modelName"), present("latency"), present("accuracy")],
            "examples": [
                {"appID": "shop", "inputs": [[0.0, 0.5, 1.0, 0.25]], "latency": 50, "accuracy": 0.8},
                {"appID": "shop", "inputs": [0.0, 0.5, 1.0, 0.25], "modelName": "resnet"},
            ],
        },
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    inputs: Any = Field(
        description="one input [*shape] or a batch [n, *shape] of numbers; for a model with several "
        "inputs, an object of them by input name ({name: [n, *shape]}). Binary bodies (.npy, .npz, "
        "images) carry the inputs alone: see the endpoint's description"
    )
    latency: LatencyMs | None = None
    accuracy: Accuracy | None = None
    modelName: str | None = Field(
        default=None, description="name the model instead of targets", json_schema_extra=NAME_SCHEMA
    )


class EnsembleReply(BaseModel):
    """An Exp4 ensemble's part in a reply (docs/QUERIES.md, "Selection from feedback")."""

    members: list[str] = Field(description="the models whose answers were combined")
    missing: list[str] = Field(description="members with no answer by the query's deadline (late or failed)")
    weights: dict[str, float] = Field(description="each answering member's share of the vote")
    confidence: list[float] = Field(description="per row, the vote share of the winning class")


class QueryReply(BaseModel):
    queryId: str
    outputs: list[list[float]]
    predictions: list[int]
    model: str
    variant: str
    tier: str
    worker: str | None
    variantState: str
    coldStart: bool
    retried: bool
    cached: bool = Field(
        default=False,
        description='answered from the prediction cache (tier "cache"): no selection, no inference; '
        "variant names the variant that computed it (docs/QUERIES.md)",
    )
    reason: str
    expectedLatencyMs: float
    timingsMs: dict[str, float] = Field(
        description="the server's time per stage, in ms: decode_ms (reading and decoding the body), "
        "cache_ms (the prediction cache's lookup), selection_ms, queue_ms, load_ms, cold_start_ms, "
        "inference_ms, transport_ms and total_ms; a cache hit's skipped stages are 0"
    )
    policy: str = Field(
        default="infaas", description="the app's selection policy that answered: infaas, exp3 or exp4"
    )
    ensemble: EnsembleReply | None = Field(
        default=None, description="exp4 only: the members asked, and how their answers were combined"
    )


class ImportProfiles(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "appID": "shop",
                    "modelName": "resnet",
                    "profiles": [
                        {
                            "recipe": "fp16-all",
                            "pool": "gpu",
                            "threads": 1,
                            "latency_p50_ms": {"1": 2.0, "8": 5.0},
                            "latency_p99_ms": {"1": 3.0, "8": 7.5},
                            "load_latency_ms": 900.0,
                            "accuracy": 0.76,
                            "hardware": "NVIDIA T4",
                        }
                    ],
                }
            ]
        },
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    modelName: str = Field(json_schema_extra=NAME_SCHEMA)
    profiles: list[dict[str, Any]] = Field(
        description="each: recipe, pool, threads or memory_mb, latency_p50_ms, latency_p99_ms "
        "({batch: ms}), load_latency_ms, accuracy, hardware; optional peak_memory_mb, saturation_qps",
        min_length=1,
        json_schema_extra={"items": PROFILE_SCHEMA},
    )


class RegisterModel(BaseModel):
    """register_model's fields, as a JSON body (s3:// URIs only) or as multipart form fields
    beside the uploaded files (``model``, ``valSet``, ``modelData``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "appID": "shop",
                    "modelName": "resnet",
                    "modelUri": "s3://shop-models/resnet.onnx",
                    "valSetUri": "s3://shop-models/resnet-val.npz",
                }
            ]
        },
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    modelName: str = Field(json_schema_extra=NAME_SCHEMA)
    metric: str = Field(default="top1", description="accuracy metric: top1 or top5")
    modelUri: str | None = Field(
        default=None, description="s3://bucket/key of the model (.onnx, or a zip/tar with its external data)"
    )
    valSetUri: str | None = Field(default=None, description="s3://bucket/key of the validation set (.npz)")
    modelDataUri: str | None = Field(
        default=None, description="s3://bucket/key of the model's external data file (x.onnx.data)"
    )
    preprocessing: dict[str, Any] | None = Field(
        default=None, description="how image bytes become the model's input (docs/REGISTRATION.md)"
    )


class RegistrationReply(BaseModel):
    registrationId: str
    appID: str
    modelName: str
    status: str
    done: int
    total: int
    message: str
    variantIds: list[str]
    pruned: int
    statusUrl: str
    variants: dict[str, str] = Field(
        default_factory=dict, description="per recipe: queued, profiling, ready, pruned or failed"
    )
    pruneReasons: dict[str, str] = Field(default_factory=dict, description="pruned variant id -> why")
    etaSeconds: float | None = Field(default=None, description="until every variant is profiled")
    createdAt: float = Field(default=0.0, description="when the registration was accepted (epoch s)")
    firstServableAt: float | None = Field(
        default=None, description="when the first variant could answer queries (epoch s)"
    )
    finishedAt: float | None = None


class OfflineQuery(BaseModel):
    """INFaaS ``offline_query(inputPath, outputPath, appID, accuracy)`` or ``(…, modelName)``, or
    every input through one of the app's pipelines (``pipeline``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # A job names its model or a pipeline, or states an accuracy target.
            "anyOf": [present("modelName"), present("accuracy"), present("pipeline")],
            "examples": [
                {
                    "appID": "shop",
                    "inputPath": "s3://shop-batch/in/",
                    "outputPath": "s3://shop-batch/out/",
                    "accuracy": 0.75,
                }
            ],
        },
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    inputPath: str = Field(
        description="s3://bucket/prefix: every object under it is an input", json_schema_extra=S3_URI_SCHEMA
    )
    outputPath: str = Field(
        description="s3://bucket/prefix: results and the summary go here", json_schema_extra=S3_URI_SCHEMA
    )
    accuracy: Accuracy | None = None
    modelName: str | None = Field(
        default=None, description="name the model instead of an accuracy", json_schema_extra=NAME_SCHEMA
    )
    pipeline: str | None = Field(
        default=None,
        description="run every input through the app's pipeline of this name (each row on its own path)",
        json_schema_extra=NAME_SCHEMA,
    )


class JobReply(BaseModel):
    jobId: str
    appID: str
    status: str
    done: int
    total: int
    errors: int
    succeeded: int
    throughput: float = Field(description="inputs per second since the job started, pauses included")
    elapsedSeconds: float
    activeSeconds: float = Field(description="seconds spent running, pauses excluded")
    paused: bool
    pauseReason: str
    variant: str | None
    pipeline: str | None = Field(default=None, description="the pipeline every input runs through")
    stageVariants: dict[str, str] = Field(
        default_factory=dict, description="a pipeline job's variant per stage, pinned at its first run"
    )
    inputPath: str
    outputPath: str
    summaryPath: str | None
    message: str
    source: str
    runs: int
    health: str = Field(
        description='"ok", or "stalled": running, but its runner has shown no life for heartbeatAgeS '
        "seconds (dead, hung or cut off); message then says when the job resumes by itself"
    )
    heartbeatAgeS: float | None = Field(
        description="seconds since its runner's last heartbeat (running jobs only)"
    )
    restarts: int = Field(description="how often its runner died mid-run and was started again")
    lastRunnerFailure: str | None = Field(description="how its runner last died, and when")
    createdAt: float
    startedAt: float | None
    finishedAt: float | None
    errorSamples: list[dict[str, str]] = Field(description="some failed inputs and why")
    statusUrl: str


class OfflineBuckets(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"buckets": ["shop-batch"]}]})
    buckets: list[Annotated[str, Field(json_schema_extra=BUCKET_SCHEMA)]] = Field(
        description="S3 buckets the app's offline jobs may read and write"
    )


# --- feedback and selection from it (Clipper §5; docs/QUERIES.md) -------------------------------
SelectionPolicy = Literal["infaas", "exp3", "exp4"]


class Feedback(BaseModel):
    """The truth about an answered query: its label (one for every row, or one per row), or a
    reward in [0, 1] for the reply as a whole."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # A label (or one per row) or a reward: exactly one of them.
            "oneOf": [present("label"), present("reward")],
            "examples": [
                {"appID": "shop", "queryId": "3f2a9c0e", "label": 7},
                {"appID": "shop", "queryId": "3f2a9c0e", "label": [7, 1]},
                {"appID": "shop", "queryId": "3f2a9c0e", "reward": 0.5},
            ],
        },
    )
    appID: str = Field(json_schema_extra=NAME_SCHEMA)
    queryId: str = Field(min_length=1, max_length=200, description="the queryId of the query's reply")
    label: (
        Annotated[int, Field(strict=True, ge=0)]
        | Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1)]
        | None
    ) = Field(
        default=None,
        description="the true class (below the model's class count), or one per row of the query's batch",
    )
    reward: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)] | None = Field(
        default=None, description="how good the reply was, in [0, 1] (instead of a label)"
    )


class FeedbackReply(BaseModel):
    queryId: str
    appID: str
    policy: str = Field(description="the policy that answered the query (the one that learns from it)")
    rewards: dict[str, float] = Field(description="per model that answered, the reward it was counted with")
    duplicate: bool = Field(description="this feedback was given before: nothing changed")


class SetSelection(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"policy": "exp3"}]})
    policy: SelectionPolicy


class SelectionReply(BaseModel):
    appID: str
    policy: str


class ModelFeedback(BaseModel):
    model: str
    feedbacks: int
    accuracy: float | None = Field(description="mean reward over every feedback")
    recentAccuracy: float | None = Field(description="mean reward over the recent feedbacks")
    recentFeedbacks: int
    exp3Weight: float = Field(description="the model's share of the Exp3 weights")
    exp4Weight: float = Field(description="the model's share of the Exp4 weights")


class FeedbackStats(BaseModel):
    appID: str
    policy: str
    models: list[ModelFeedback]


class CacheStatsReply(BaseModel):
    """The prediction cache's state (``GET /v1/cache``): shared by every gateway and offline
    runner of a Redis-backed deployment, so these are the deployment's numbers."""

    enabled: bool
    backend: str | None = Field(description="memory or redis; None when the cache is off")
    hits: int = Field(description="lookups (queries, offline inputs) answered whole from the cache")
    misses: int = Field(description="lookups that ran inference")
    hitRate: float = Field(description="hits / (hits + misses); 0 before any lookup")
    entries: int = Field(description="cached rows")
    bytesUsed: int = Field(description="keys and values held, as the budget counts them")
    maxBytes: int = Field(description="MODELLESS_PREDICTION_CACHE_MAX_BYTES")
    evictions: int = Field(description="entries dropped, least recently used first, to stay within maxBytes")


def request_error(error: ValidationError, where: str) -> RequestValidationError:
    """A pydantic ``ValidationError`` of what a route parses itself (``where``: "body" or
    "query") in the app's one 400 shape for a malformed request, as FastAPI's own checks give it
    (``app._validation_error``)."""
    return RequestValidationError(
        [{**problem, "loc": (where, *problem["loc"])} for problem in error.errors(include_context=False)]
    )
