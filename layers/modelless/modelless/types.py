"""The domain's records: what the stores keep and what selection reasons about.

Plain dataclasses with explicit JSON round-trips, so that every store backend keeps the same
bytes and no store ever unpickles anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Tier(StrEnum):
    """Where a query ran: a provisioned worker of a pool, or the burst-absorbing Lambda tier; or
    nowhere, answered from the prediction cache (a query's tier only, never a decision's)."""

    WORKER = "worker"
    LAMBDA = "lambda"
    CACHE = "cache"


class InstanceState(StrEnum):
    """INFaaS Figure 4. Inactive variants have no instance; the others are per loaded instance."""

    INACTIVE = "inactive"
    ACTIVE = "active"
    OVERLOADED = "overloaded"
    INTERFERED = "interfered"


class RegistrationStatus(StrEnum):
    QUEUED = "queued"
    GENERATING = "generating"
    PROFILING = "profiling"
    READY = "ready"
    FAILED = "failed"


def _int_keys(table: dict[Any, float]) -> dict[int, float]:
    # JSON object keys are strings; batch sizes are ints everywhere else.
    return {int(batch): float(value) for batch, value in table.items()}


@dataclass(frozen=True)
class VariantProfile:
    """One servable variant of a model and what profiling measured about it."""

    variant_id: str
    app_id: str
    model_name: str
    pool: str
    precision: str  # "fp32" | "int8"
    opt_level: str  # onnxruntime graph optimisation level the artifact was saved at
    threads: int
    artifact_key: str
    size_bytes: int
    load_latency_ms: float
    latency_p50_ms: dict[int, float]  # batch size -> median inference latency
    latency_p99_ms: dict[int, float]
    peak_memory_mb: float
    accuracy: float
    price_per_second: float  # price of the resources one running instance holds
    request_price: float  # per-invocation price (the Lambda tier's request fee; 0 elsewhere)
    hardware: str  # where the numbers were measured
    measured_on_target: bool  # False when the pool's real hardware is not this machine
    memory_mb: int = 0  # the Lambda function's memory size (its threads follow it); 0 elsewhere
    saturation_qps: float = 0.0  # one instance's throughput at its best batch size
    max_useful_batch: int = 0  # the largest batch size that still raised throughput
    accuracy_metric: str = "top1"
    accuracy_examples: int = 0  # validation examples the accuracy was measured on
    imported: bool = False  # measured elsewhere and imported (a pool this machine lacks)
    # The accuracy's 95 % confidence interval (Wilson, from accuracy_examples); differences inside
    # it are ties for pruning and selection.
    accuracy_low: float = 0.0
    accuracy_high: float = 1.0
    # Share of validation examples whose top-1 answer equals the registered model's (None: not measured).
    agreement: float | None = None
    profile_runs: int = 0  # timed runs behind the latency tables, all batch sizes together
    p50_ci_pct: float = 0.0  # half-width of the batch-1 p50's 95 % confidence interval, in %
    contended: bool = False  # measured while other profiles ran beside it

    @property
    def max_batch(self) -> int:
        return max(self.latency_p99_ms)

    def latency_ms(self, batch: int) -> float:
        """Profiled p99 latency for ``batch`` inputs (next profiled batch size up)."""
        return self._at_batch(self.latency_p99_ms, batch)

    def median_ms(self, batch: int) -> float:
        """Profiled median latency for ``batch`` inputs (next profiled batch size up)."""
        return self._at_batch(self.latency_p50_ms, batch)

    def _at_batch(self, table: dict[int, float], batch: int) -> float:
        for size in sorted(table):
            if size >= batch:
                return table[size]
        raise ValueError(f"batch {batch} exceeds the largest profiled batch {self.max_batch}")

    def cost_per_query(self, batch: int = 1) -> float:
        return self.price_per_second * self.latency_ms(batch) / 1000.0 + self.request_price

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> VariantProfile:
        data = json.loads(raw)
        data["latency_p50_ms"] = _int_keys(data["latency_p50_ms"])
        data["latency_p99_ms"] = _int_keys(data["latency_p99_ms"])
        return cls(**data)


@dataclass(frozen=True)
class TensorSpec:
    """One model input: its name, its shape without the batch dimension and its numpy dtype."""

    name: str
    shape: list[int]
    dtype: str  # numpy dtype name: "float32", "int64", ...


@dataclass(frozen=True)
class ModelRecord:
    """A registered model: its input contract and the state of its registration.

    ``input_name``/``input_shape``/``input_dtype`` describe the first input; ``inputs`` lists every
    input (empty in records written before models could take several: then the first is all).
    A batch for a one-input model is an array [batch, *shape]; for a model with several inputs it
    is a numpy structured array [batch] with one field per input (see ``modelless.inputs.tensors``).
    """

    app_id: str
    model_name: str
    input_name: str
    input_shape: list[int]  # without the batch dimension
    input_dtype: str
    num_classes: int
    registration_id: str
    artifact_key: str
    ready: bool = False
    inputs: list[TensorSpec] = field(default_factory=list)
    # How image bytes (JPEG/PNG) sent to this model become its input tensor; None: tensors only.
    preprocessing: dict[str, Any] | None = None
    # The registered (FP32) artifact's own measured accuracy: queries naming the model, or giving
    # no accuracy target, are served within a tolerance of it. None until profiled.
    reference_accuracy: float | None = None

    @property
    def input_specs(self) -> list[TensorSpec]:
        return self.inputs or [TensorSpec(self.input_name, list(self.input_shape), self.input_dtype)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ModelRecord:
        data = json.loads(raw)
        data["inputs"] = [TensorSpec(**spec) for spec in data.get("inputs") or []]
        return cls(**data)


@dataclass
class Registration:
    """Progress of one registration: variant generation and profiling run in the background."""

    registration_id: str
    app_id: str
    model_name: str
    status: RegistrationStatus = RegistrationStatus.QUEUED
    total: int = 0
    done: int = 0
    message: str = ""
    created_at: float = 0.0
    finished_at: float | None = None
    variant_ids: list[str] = field(default_factory=list)
    pruned: int = 0  # generated variants dropped as dominated by another of the same pool
    # Per recipe (e.g. "int8_all"): queued | profiling | ready | pruned | failed.
    variants: dict[str, str] = field(default_factory=dict)
    prune_reasons: dict[str, str] = field(default_factory=dict)  # variant id -> why it was dropped
    eta_s: float | None = None  # seconds until every variant is profiled, estimated as they finish
    first_servable_at: float | None = None  # when the first variant could answer queries

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Registration:
        data = json.loads(raw)
        data["status"] = RegistrationStatus(data["status"])
        return cls(**data)


@dataclass(frozen=True)
class InstanceStats:
    """What a worker's monitoring loop observed of one loaded variant instance."""

    variant_id: str
    state: InstanceState
    qps: float
    latency_p50_ms: float
    latency_p99_ms: float
    queue_length: int
    utilisation: float = 0.0  # share of the window this instance spent running inference
    batch_limit: int = 1  # rows its batcher takes per run now (AIMD within its budget cap); 1: none
    # The parallelism configuration the worker's tuner runs it with (modelless.tuning; 0: not
    # tuned) and its measured run time over the profile's under it (0: not measured yet): what
    # the scaler plans the variant's capacity with (modelless.tuning.capacity).
    intra_threads: int = 0
    inter_threads: int = 0
    concurrency: int = 0
    latency_scale: float = 0.0


@dataclass(frozen=True)
class WorkerState:
    """A worker's last report: identity, address, load and its loaded variant instances."""

    worker_id: str
    pool: str
    address: str
    utilisation: float  # 0..1, share of the worker's compute in use
    free_slots: int  # how many more variant instances it can load
    reported_at: float
    instances: tuple[InstanceStats, ...] = ()
    # Offline batch work (docs/ARCHITECTURE.md §6) is recorded apart from online queries: its share of the
    # worker's compute (already part of ``utilisation``), and the worst online instance's p99
    # latency over its profile (queueing included: what offline work would make online queries
    # wait). The offline throttle judges a worker on these two.
    offline_utilisation: float = 0.0
    online_latency_ratio: float = 0.0

    @property
    def online_utilisation(self) -> float:
        """The share of the worker's compute that online queries use."""
        return max(0.0, self.utilisation - self.offline_utilisation)

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerState:
        data = json.loads(raw)
        data["instances"] = tuple(
            InstanceStats(**{**item, "state": InstanceState(item["state"])}) for item in data["instances"]
        )
        return cls(**data)


@dataclass(frozen=True)
class QueryTargets:
    """What a query asks for. ``model_name`` set means the developer named the model."""

    app_id: str
    latency_ms: float | None = None
    min_accuracy: float = 0.0
    model_name: str | None = None
    batch: int = 1


@dataclass(frozen=True)
class Decision:
    """Selection's answer: which variant, where, and why."""

    variant: VariantProfile
    tier: Tier
    worker_id: str | None
    state: InstanceState  # the variant's state when chosen (ACTIVE, or INACTIVE needing a load)
    expected_latency_ms: float
    reason: str
    worker_address: str | None = None


class JobStatus(StrEnum):
    """An offline job's life: queued until a runner takes it, running (paused while online
    traffic needs its worker), then completed, or failed (refused, or its variant vanished)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in {JobStatus.COMPLETED, JobStatus.FAILED}


@dataclass
class OfflineJob:
    """An offline batch job over S3 objects (INFaaS ``offline_query``): what was asked, and the
    runner's last word on it. Per-input progress (done markers, errors) is kept apart, in the
    store's per-job sets, so that the runner never rewrites this record per item."""

    job_id: str
    app_id: str
    input_path: str  # s3://bucket/prefix: every object whose key starts with the prefix
    output_path: str  # s3://bucket/prefix: one result object per input, plus the summary
    min_accuracy: float = 0.0
    model_name: str | None = None
    source: str = "api"  # "api", or the s3:// URL of the object whose event started the job
    status: JobStatus = JobStatus.QUEUED
    message: str = ""
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    total: int = 0  # inputs listed when the job first ran (0 until then)
    done: int = 0  # as of the last record update; the store's done set is authoritative
    errors: int = 0
    variant_id: str | None = None  # pinned at the first run: every output comes from one variant
    batch: int = 0  # input rows per inference run
    paused: bool = False
    pause_reason: str = ""
    runs: int = 0  # how many times a runner took the job up (1 + resumes)
    active_s: float = 0.0  # seconds spent running (paused time excluded), over all runs
    heartbeat_at: float | None = None  # the runner's last sign of life (every second while it runs)
    summary_key: str | None = None  # s3:// URL of the summary object, once written
    restarts: int = 0  # how often its runner died mid-run and was started again by its launcher
    runner_failure: str = ""  # how its runner last died, and when (empty: it never did)
    pipeline: str | None = None  # the job runs the app's pipeline of this name (modelless.pipelines)
    # A pipeline job's variant per stage, pinned at its first run (``variant_id``: its entry's).
    stage_variants: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> OfflineJob:
        data = json.loads(raw)
        data["status"] = JobStatus(data["status"])
        return cls(**data)


@dataclass(frozen=True)
class LambdaTierState:
    """What a Lambda tier that sees its containers tells selection, besides the variants warm
    and idle in some container (its ``WorkerState``: those are its Active instances; a variant
    whose every container is busy is Overloaded there).

    ``idle_by_memory``: idle containers per memory size (MB; a container serves one size, as a
    Lambda function has one): a query there pays its variant's load at most, no process start.
    ``cold_start_ms``: what starting a new container is expected to take before the variant's
    load (the tier's measured mean). ``full``: every container the tier may run is busy or
    starting (its concurrency limit): no cold start is on offer, a query there waits for a
    container to finish."""

    idle_by_memory: Mapping[int, int]
    default_memory_mb: int
    cold_start_ms: float
    full: bool = False

    def has_idle(self, variant: VariantProfile) -> bool:
        """Whether a query for ``variant`` would find an idle container (no cold start)."""
        return self.idle_by_memory.get(variant.memory_mb or self.default_memory_mb, 0) > 0
