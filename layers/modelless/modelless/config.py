"""Settings: one typed object, read from the environment (``MODELLESS_*``) with the embedded
defaults, once per process (``get_settings``).

A value that cannot be used stops the process at once with a ``SettingsError`` that names the
variable, what it must be and what it was: ``MODELLESS_MAX_BATCH must be an integer, got 'abc'``.
Tests and the embedded stack build their own: ``Settings(max_batch=8)`` (the environment fills
the rest) or ``settings.with_overrides(max_batch=8)``.

``ClientSettings`` holds the command-line tool's own few (the server URL, the keys, the state
directory); nothing here imports more than pydantic-settings, so the CLI runs without the
server's dependencies.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

import pydantic_settings
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from modelless.exceptions import SettingsError

MiB = 1024 * 1024
ENV_PREFIX = "MODELLESS_"
# Room in a register_model body for its form fields and multipart boundaries.
REGISTER_FRAMING_BYTES = 64 * 1024
# A validation set's arrays, unpacked, may be this many times the file's own limit by default:
# room for a well-compressed set, none for a decompression bomb.
VALSET_UNPACK_FACTOR = 4
# Variables of the Lambda runtime a setting falls back to (read with the MODELLESS_* ones).
LAMBDA_FUNCTION_NAME = "AWS_LAMBDA_FUNCTION_NAME"

# How long after a good read the gateway may answer for the metadata store while it is unreachable
# (``Settings.stale_cache_max_age_s``; the caches' own default where none is given).
STALE_CACHE_MAX_AGE_S = 300.0


class _EnvSettings(BaseSettings):
    """What both settings objects share: the ``MODELLESS_`` prefix, immutability, and errors that
    name the environment variable."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, populate_by_name=True)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise SettingsError(describe(type(self), error)) from None
        except pydantic_settings.SettingsError as error:  # a source that could not parse a value
            raise SettingsError(str(error)) from None

    def with_overrides(self, **changes: Any) -> Self:
        """A copy with ``changes``, validated as the environment's values are (every field is
        given, so nothing is taken from the environment again)."""
        return type(self)(**{**self.model_dump(), **changes})


class Settings(_EnvSettings):
    """The server side's settings: the gateway, the functions, the workers' stores and the
    embedded stack. Each field ``name`` is read from ``MODELLESS_NAME``."""

    metadata_url: str = "memory://"
    repository_url: str = ".modelless/repo"
    cache_dir: Path = Path("/tmp/modelless-cache")
    admin_key: str = ""
    # Registration limits (docs/REGISTRATION.md). Uploads are streamed to disk, never held in
    # memory: a model from any source (an upload, an archive's contents with its external data, an
    # s3:// object) may be this large, after which one self-contained ONNX file must stay under
    # protobuf's 2 GB.
    max_model_bytes: int = 1024 * MiB
    max_valset_bytes: int = 256 * MiB
    # A validation set's arrays once unpacked (an .npz may be deflated: a few MB can stand for
    # gigabytes), checked against what the archive declares before anything is inflated; 0:
    # VALSET_UNPACK_FACTOR times max_valset_bytes (``valset_unpacked_limit``).
    max_valset_unpacked_bytes: int = Field(default=0, ge=0)
    # The memory (address space) of the child process that checks and test-runs a model; 0:
    # derived from the registration's files (``modelless.registration.ingest.ingest_memory_limit``).
    max_ingest_memory_bytes: int = Field(default=0, ge=0)
    # How long register_model and offline_query remember an Idempotency-Key and their reply.
    idempotency_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    # The whole register_model request body; 0: the model and validation set limits plus framing
    # (``register_body_limit``). Set where a proxy carries less (AWS: API Gateway hands Lambda at
    # most 6 MB, base64-encoded), so that larger uploads are refused naming the s3:// way instead.
    max_register_body_bytes: int = 0
    # An online query's body, JSON or binary: a full batch (max_batch) of 224x224x3 float32 as
    # .npy is 64 x 602 KB = 38.5 MiB; the rest is room for framing and other input sizes. (In AWS,
    # API Gateway and Lambda cap a request at 6 MB first: see docs/QUERIES.md.)
    max_query_bytes: int = 48 * MiB
    max_batch: int = 64
    # The gateway caches static profiles until their version changes; this TTL is a safety net.
    profile_cache_ttl_s: float = 60.0
    # The metadata store (docs/PERSISTENCE.md). A Redis command not answered within
    # metadata_timeout_s (a connection not made within metadata_connect_timeout_s) is an outage:
    # the store counts as down, and calls fail at once, until a probe finds it answering again.
    metadata_timeout_s: float = Field(default=1.0, gt=0)
    metadata_connect_timeout_s: float = Field(default=1.0, gt=0)
    # During an outage the gateway answers the apps it knows from its last good reads of their API
    # keys, profiles and workers, each for at most this long after it was read (0: never).
    stale_cache_max_age_s: float = Field(default=STALE_CACHE_MAX_AGE_S, ge=0)
    # The marker the store must hold (the embedded stack writes one and sets this); a store
    # without it was emptied since: /health/ready answers 503 store_emptied. Empty: not checked.
    metadata_epoch: str = ""
    # Profiling (docs/VARIANTS.md): per batch size, timed runs go on until the 95 % confidence
    # interval of the median is within +-profile_stability_pct, with at least profile_min_runs,
    # at most profile_runs, and past the minimum for at most profile_batch_budget_s seconds.
    profile_runs: int = 200
    profile_min_runs: int = 10
    profile_stability_pct: float = 3.0
    profile_batch_budget_s: float = 3.0
    # Batch sizes stop doubling once a median passes this (or throughput stops rising by 5 %).
    profile_latency_ceiling_ms: float = 2000.0
    # Screening: before the full profiles, each precision's optimisation levels are timed at
    # batch 1; a level more than this % slower than its precision's fastest is not profiled
    # further (pruned, with the reason). 0 profiles every level in full.
    profile_screen_pct: float = Field(default=10.0, ge=0.0)
    # Accuracy passes run this many at once (timing passes always run alone).
    profile_parallelism: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    # Queries naming a model, or giving no accuracy target, are served only by variants whose
    # accuracy interval reaches within this of the model's reference (FP32) accuracy.
    accuracy_tolerance: float = Field(default=0.02, ge=0.0, le=1.0)

    # --- the prediction cache (Clipper §4.2; docs/QUERIES.md) ----------------------------------
    # Per (model, input row): a query whose every row is cached for one model is answered without
    # selection or inference. Empty URL: follow the metadata store (redis:// -> the same Redis,
    # shared by every gateway and offline runner; memory:// -> this process's memory).
    prediction_cache_enabled: bool = True
    prediction_cache_url: str = ""
    # Keys and values together (not the backend's own overhead); least recently used go first.
    prediction_cache_max_bytes: int = Field(default=64 * MiB, ge=0)
    # One row's cached outputs at most (larger rows are computed every time, never cached).
    prediction_cache_max_entry_bytes: int = Field(default=1 * MiB, ge=0)

    @property
    def register_body_limit(self) -> int:
        """A registration's body: ``max_register_body_bytes`` where set, else the model (its
        external data included), the validation set, and room for multipart framing."""
        if self.max_register_body_bytes > 0:
            return self.max_register_body_bytes
        return self.max_model_bytes + self.max_valset_bytes + REGISTER_FRAMING_BYTES

    @property
    def valset_unpacked_limit(self) -> int:
        """A validation set's arrays, unpacked: ``max_valset_unpacked_bytes`` where set, else
        ``VALSET_UNPACK_FACTOR`` times the file's own limit."""
        return self.max_valset_unpacked_bytes or VALSET_UNPACK_FACTOR * self.max_valset_bytes

    @property
    def register_body_setting(self) -> str:
        """The variable(s) ``register_body_limit`` comes from, for messages that refuse a body."""
        if self.max_register_body_bytes > 0:
            return variable_name(Settings, "max_register_body_bytes")
        return f"{variable_name(Settings, 'max_model_bytes')} + {variable_name(Settings, 'max_valset_bytes')}"

    # In AWS: the cpu_worker function the dispatcher invokes for the Lambda tier, one name, or one
    # per memory size ("1769=name-a,3538=name-b"; see modelless.pools.invokers.lambda_functions).
    lambda_function: str = ""
    # In AWS: the registrar function the gateway hands registrations to (asynchronous invoke).
    # Empty: variants are generated and profiled in a background thread of this process.
    registrar_function: str = ""
    # In AWS: the Secrets Manager secret (name or ARN) holding the admin key, read once per gateway
    # container in place of admin_key (template.yaml deploys it so).
    admin_key_secret: str = ""

    # --- offline jobs (docs/ARCHITECTURE.md §6) ------------------------------------------------
    # In AWS: the offline function the gateway hands jobs to (asynchronous invoke). Empty: jobs
    # run in a background thread of this process (the embedded stack).
    offline_function: str = ""
    # This Lambda function's own name, set by the Lambda runtime (AWS_LAMBDA_FUNCTION_NAME); empty
    # elsewhere. The offline function hands its unfinished jobs to itself when offline_function
    # names none (``offline_function_or_own``).
    function_name: str = Field(default="", validation_alias=LAMBDA_FUNCTION_NAME)
    # Buckets every app's offline jobs may use when the admin set none for the app (comma list).
    offline_buckets: Annotated[tuple[str, ...], NoDecode] = ()
    # Objects created under these prefixes become inputs of the watch's one standing job (JSON list
    # of {"prefix": "s3://b/p/", "appID", "outputPath", and "accuracy" or "modelName"};
    # docs/OFFLINE.md); manifests (*.job.json) always start a job of their own.
    offline_watches: str = "[]"
    # INFaaS pauses offline work when its worker's utilisation passes 40 % (§6.3.2).
    offline_pause_utilisation: float = 0.40
    offline_resume_utilisation: float = 0.30
    # ...or when online p99 on the worker passes this many times its profile (queueing included).
    offline_pause_latency_ratio: float = 2.0
    offline_resume_latency_ratio: float = 1.5
    # Rows per offline inference run, at most; fewer where the variant's profiled latency for the
    # run would pass offline_run_ms (an online query may wait behind one run).
    offline_max_batch: int = 32
    offline_run_ms: float = 10.0
    # A job runner's lease, renewed every second (``offline.runner``): how long the job of a runner
    # that died unwatched (a gateway thread, a Lambda invocation) waits before another may take it.
    offline_lease_s: float = 10.0
    # Embedded stack: how often the supervisor looks for unfinished jobs that nobody holds.
    offline_resume_every_s: float = 1.0
    offline_max_input_bytes: int = 16 * MiB
    offline_max_inputs: int = 100000
    # The embedded stack polls this SQS queue (fed by S3 event notifications) for events that
    # start jobs; in AWS the offline function is the queue's (or the bucket's) target instead.
    offline_queue_url: str = ""
    # Where the embedded stack runs a job: "thread" (a background thread of the gateway process),
    # "process" (a child process per job, followed from such a thread: its CPU and GIL apart from
    # online queries; Redis only), or "auto": process with Redis, thread with the in-memory store.
    offline_runner: str = "auto"
    # Jobs run at once in the embedded stack's background threads.
    offline_concurrency: int = 1

    # --- the scaler function (modelless.entrypoints.scaler) --------------------------------------
    # Pool -> its EC2 Auto Scaling group's name (JSON object).
    pool_groups: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # Pool -> the most and the fewest workers the scaler keeps (JSON objects); only the pools
    # listed in max_workers are managed.
    max_workers: Annotated[dict[str, int], NoDecode] = Field(default_factory=lambda: {"cpu": 4})
    min_workers: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    # Each invocation ticks this often until the next one is due (modelless.scaling.ticks's
    # DEFAULT_PERIOD_S; ScheduledTicks refuses a period over its 60 s schedule).
    scaler_period_s: float = 10.0
    # A Lambda container's cold start before the variant loads, as measured for this deployment
    # (CloudWatch's Init Duration): a group whose budget it does not fit has its sub-second
    # bursts provisioned on workers (modelless.scaling.envelope).
    lambda_init_ms: float = Field(default=500.0, ge=0)

    # What a value must be, where its type alone does not say it well (see ``describe``).
    EXPECTED: ClassVar[Mapping[str, str]] = {
        "offline_buckets": "a comma-separated list of bucket names",
        "pool_groups": 'a JSON object of pool name to Auto Scaling group name, e.g. {"cpu": "asg-name"}',
        "max_workers": 'a JSON object of pool name to worker count, e.g. {"cpu": 4}',
        "min_workers": 'a JSON object of pool name to worker count, e.g. {"cpu": 1}',
    }

    @field_validator("offline_buckets", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(b.strip() for b in value.split(",") if b.strip())
        return value

    @field_validator("pool_groups", "max_workers", "min_workers", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("not JSON") from None
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
        return value

    def offline_function_or_own(self) -> Settings:
        """These settings with ``offline_function`` naming this function itself when none is set
        (the offline function in Lambda: a job left unfinished is handed to a new invocation)."""
        if self.offline_function or not self.function_name:
            return self
        return self.with_overrides(offline_function=self.function_name)


class ClientSettings(_EnvSettings):
    """The command-line tool's settings (``modelless.cli``); the options it is given come first."""

    url: str = ""  # MODELLESS_URL: the server, else the embedded stack's stack.json says
    api_key: str = ""  # MODELLESS_API_KEY: the app key, else the one create-app saved
    admin_key: str = ""  # MODELLESS_ADMIN_KEY, else the embedded stack's
    state_dir: Path = Path(".modelless")  # MODELLESS_STATE_DIR: credentials.json, stack.json


def get_settings() -> Settings:
    """The process's settings, read once: every later call returns the same object.

    The cache is keyed on the variables settings come from, so a process whose environment is
    changed (a test, a host that sets them before it loads a function) reads them again; in a
    Lambda container, a worker or the embedded stack they are read once."""
    return _settings(_environment())


def get_client_settings() -> ClientSettings:
    """The command-line tool's settings, read once per environment (as ``get_settings``)."""
    return _client_settings(_environment())


def _environment() -> frozenset[tuple[str, str]]:
    return frozenset(
        (name, value)
        for name, value in os.environ.items()
        if name.upper().startswith(ENV_PREFIX) or name.upper() == LAMBDA_FUNCTION_NAME
    )


@functools.lru_cache(maxsize=8)
def _settings(environment: frozenset[tuple[str, str]]) -> Settings:
    return Settings()


@functools.lru_cache(maxsize=8)
def _client_settings(environment: frozenset[tuple[str, str]]) -> ClientSettings:
    return ClientSettings()


# --- errors that name the variable -----------------------------------------------------------------

_EXPECTED_BY_ERROR = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "path_type": "a path",
    "dict_type": "a JSON object",
    "tuple_type": "a list",
}
_UNITS = {"_s": "seconds", "_ms": "milliseconds", "_bytes": "bytes"}


def variable_name(settings: type[BaseSettings], field: str) -> str:
    """The environment variable a field is read from."""
    info = settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    return f"{ENV_PREFIX}{field.upper()}"


def describe(settings: type[BaseSettings], error: ValidationError) -> str:
    """One clause per bad value: the variable, what it must be, what it was."""
    expected: Mapping[str, str] = getattr(settings, "EXPECTED", {})
    aliases = {info.validation_alias: name for name, info in settings.model_fields.items()}
    clauses = []
    for problem in error.errors(include_url=False):
        field = str(problem["loc"][0]) if problem["loc"] else ""
        field = str(aliases.get(field, field))
        name = variable_name(settings, field)
        if problem["type"] == "extra_forbidden":
            clauses.append(f"{name} is not a setting")
            continue
        inner = "".join(f"[{json.dumps(part)}]" for part in problem["loc"][1:])
        got = f"got {_shown(problem['input'])}"
        if problem["type"] == "value_error":  # a validator's own reason
            reason = problem.get("ctx", {}).get("error", problem["msg"])
            clauses.append(f"{name} must be {expected.get(field, 'valid')} ({reason}), {got}")
        elif inner and field in expected:  # one entry of a JSON object
            clauses.append(f"{name} must be {expected[field]}: {inner} must be {_kind(problem)}, {got}")
        else:
            clauses.append(f"{name}{inner} must be {_kind(problem, field)}, {got}")
    return "; ".join(clauses)


def _kind(problem: Any, field: str = "") -> str:
    """What a value must be, from pydantic's error type (and the field's unit, by its name)."""
    kind = _EXPECTED_BY_ERROR.get(problem["type"])
    if kind is None:
        return str(problem["msg"]).removeprefix("Input should be ").rstrip(".")
    unit = next((unit for suffix, unit in _UNITS.items() if field.endswith(suffix)), None)
    if unit is not None and kind in {"an integer", "a number"}:
        return f"{'a whole number' if kind == 'an integer' else 'a number'} of {unit}"
    return kind


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
