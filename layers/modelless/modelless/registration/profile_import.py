"""Profiles measured elsewhere: a pool this machine does not have (a real GPU, an Inferentia
chip) is profiled where it exists and the numbers imported here, marked ``imported``.

An imported profile names one of the model's generated artifacts (its recipe) and a pool of
the catalog; everything else it states is checked for sense before it is stored. It may also be
a CPU or Lambda pool's, measured on the real thing (a deployed Lambda function, say): it then
replaces the profile measured here under the same variant id, and says it was imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from modelless.catalog import Placement, PoolKind, PoolSpec, lambda_threads
from modelless.exceptions import InvalidInputError, NotFoundError, NotReadyError
from modelless.metadata.base import MetadataStore
from modelless.registration.profiling import model_prefix, variant_id
from modelless.repository.base import ModelRepository
from modelless.types import VariantProfile
from modelless.validation import MAX_LATENCY_MS, MIN_LATENCY_MS
from variants.recipes import ACCURACY_METRICS, Recipe

REQUIRED = ("recipe", "pool", "latency_p50_ms", "latency_p99_ms", "load_latency_ms", "accuracy", "hardware")
# What an imported profile may state: beyond these a number is a mistake (a unit slip, a typo),
# and selection's and the scaler's arithmetic on it (rates, costs, budgets) would overflow or mislead.
MAX_PROFILE_BATCH = 4096
MIN_LAMBDA_MEMORY_MB = 128  # Lambda's own range of function memory
MAX_LAMBDA_MEMORY_MB = 10_240
MAX_THREADS = 256
MAX_PEAK_MEMORY_MB = 1024 * 1024  # a TiB
MAX_SATURATION_QPS = 1e10  # above any profile's batch / latency at these bounds (4096 / 1 us)
MAX_ACCURACY_EXAMPLES = 10**9


def digits_up_to(high: int) -> str:
    """A regular expression for the decimal integers 1 to ``high`` (no leading zero): a JSON
    object's keys are text, so a schema bounds a batch size written as one by its digits."""
    text = str(high)
    shorter = [f"[1-9][0-9]{{0,{len(text) - 2}}}"] if len(text) > 1 else []
    same_length = []
    for position, digit in enumerate(map(int, text)):
        lowest = 1 if position == 0 else 0
        if digit > lowest:
            rest = "[0-9]" * (len(text) - position - 1)
            same_length.append(f"{text[:position]}[{lowest}-{digit - 1}]{rest}")
    return f"^({'|'.join([*shorter, *same_length, text])})$"


def _number_schema(
    low: float, high: float, *, integer: bool = False, exclusive_low: bool = False
) -> dict[str, Any]:
    bound = {"exclusiveMinimum": low} if exclusive_low else {"minimum": low}
    return {"type": "integer" if integer else "number", **bound, "maximum": high}


# A latency table: batch size (the key, digits) -> milliseconds.
_LATENCY_TABLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "propertyNames": {"pattern": digits_up_to(MAX_PROFILE_BATCH)},
    "additionalProperties": _number_schema(MIN_LATENCY_MS, MAX_LATENCY_MS),
    "description": "batch size -> milliseconds (batch 1 included; p50 and p99 name the same sizes)",
}
# What ``_profile`` reads, stated for the OpenAPI document (the checks it makes that a schema
# cannot, such as a median below its p99, are its own).
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": list(REQUIRED),
    "properties": {
        "recipe": {"type": "string", "description": "the variant's recipe, e.g. fp16-all"},
        "pool": {"type": "string", "description": "a pool of this deployment"},
        "hardware": {"type": "string", "description": "what it was measured on"},
        "threads": _number_schema(1, MAX_THREADS, integer=True),
        "memory_mb": _number_schema(0, MAX_LAMBDA_MEMORY_MB, integer=True),
        "latency_p50_ms": _LATENCY_TABLE_SCHEMA,
        "latency_p99_ms": _LATENCY_TABLE_SCHEMA,
        "load_latency_ms": _number_schema(0, MAX_LATENCY_MS),
        "accuracy": _number_schema(0, 1),
        "accuracy_metric": {"type": "string", "enum": list(ACCURACY_METRICS)},
        "accuracy_examples": _number_schema(0, MAX_ACCURACY_EXAMPLES, integer=True),
        "peak_memory_mb": _number_schema(0, MAX_PEAK_MEMORY_MB),
        "saturation_qps": _number_schema(0, MAX_SATURATION_QPS),
        "max_useful_batch": _number_schema(0, MAX_PROFILE_BATCH, integer=True),
    },
}


def import_profiles(
    store: MetadataStore,
    repository: ModelRepository,
    pools: Mapping[str, PoolSpec],
    app_id: str,
    model_name: str,
    entries: list[dict[str, Any]],
) -> list[VariantProfile]:
    model = store.get_model(app_id, model_name)
    if model is None:
        raise NotFoundError(f"model {model_name!r} is not registered in app {app_id!r}")
    if not model.ready:
        raise NotReadyError(f"model {model_name!r} is still being registered; import once it is ready")
    if not entries:
        raise InvalidInputError("no profiles to import")
    profiles = [_profile(repository, pools, app_id, model_name, index, e) for index, e in enumerate(entries)]
    registration = store.get_registration(model.registration_id)
    if registration is None:
        raise NotFoundError(f"registration {model.registration_id!r} of model {model_name!r} is gone")
    registration.variant_ids = sorted(set(registration.variant_ids) | {p.variant_id for p in profiles})
    store.publish_variants(model, profiles, registration)
    return profiles


def _profile(
    repository: ModelRepository,
    pools: Mapping[str, PoolSpec],
    app_id: str,
    model_name: str,
    index: int,
    entry: dict[str, Any],
) -> VariantProfile:
    """One imported profile, checked field by field in the order a caller is told of the first
    mistake: its shape, recipe and pool, the artifact it names, where it runs, its latencies,
    accuracy and capacity, then the numbers it is stored with."""
    where = f"profile {index}"
    _check_shape(entry, where)
    recipe, pool = _recipe_and_pool(entry, pools, where)
    key = _artifact_key(repository, app_id, model_name, recipe, where)
    placement = _placement(entry, pool, where)
    p50, p99 = _latency_tables(entry, where)
    accuracy, metric = _accuracy(entry, where)
    saturation, best_batch = _capacity(entry, p50, where)
    return VariantProfile(
        variant_id=variant_id(app_id, model_name, recipe.name, placement.name),
        app_id=app_id,
        model_name=model_name,
        pool=pool.name,
        precision=recipe.precision,
        opt_level=recipe.opt_level,
        threads=placement.threads,
        artifact_key=key,
        size_bytes=len(repository.get(key)),
        load_latency_ms=_number(entry["load_latency_ms"], f"{where}: load_latency_ms", 0.0, MAX_LATENCY_MS),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        peak_memory_mb=_number(
            entry.get("peak_memory_mb", 0.0), f"{where}: peak_memory_mb", 0.0, MAX_PEAK_MEMORY_MB
        ),
        accuracy=accuracy,
        price_per_second=placement.price_per_second,
        request_price=pool.request_price,
        hardware=_text(entry["hardware"], f"{where}: hardware")[:200],
        measured_on_target=True,
        memory_mb=placement.memory_mb,
        saturation_qps=round(saturation, 1),
        max_useful_batch=best_batch,
        accuracy_metric=metric,
        accuracy_examples=_count(
            entry.get("accuracy_examples", 0), f"{where}: accuracy_examples", MAX_ACCURACY_EXAMPLES
        ),
        imported=True,
    )


def _check_shape(entry: Any, where: str) -> None:
    """A JSON object with every required field (the API hands on whatever the body held)."""
    if not isinstance(entry, Mapping):
        raise InvalidInputError(f"{where} must be a JSON object; got {type(entry).__name__}")
    missing = [name for name in REQUIRED if name not in entry]
    if missing:
        raise InvalidInputError(f"{where} lacks {missing}")


def _recipe_and_pool(
    entry: Mapping[str, Any], pools: Mapping[str, PoolSpec], where: str
) -> tuple[Recipe, PoolSpec]:
    """The recipe the profile names, and its pool, which must be one of this deployment's."""
    try:
        recipe = Recipe.parse(_text(entry["recipe"], f"{where}: recipe"))
    except ValueError as error:
        raise InvalidInputError(f"{where}: {error}") from error
    pool = pools.get(_text(entry["pool"], f"{where}: pool"))
    if pool is None:
        raise InvalidInputError(f"{where}: unknown pool {entry['pool']!r}; pools are {sorted(pools)}")
    return recipe, pool


def _artifact_key(
    repository: ModelRepository, app_id: str, model_name: str, recipe: Recipe, where: str
) -> str:
    """The model's generated artifact of ``recipe``: an imported profile serves only what exists."""
    key = f"{model_prefix(app_id, model_name)}variants/{recipe.name}.onnx"
    if not repository.exists(key):
        raise InvalidInputError(f"{where}: the model has no {recipe.name} artifact to serve")
    return key


def _placement(entry: Mapping[str, Any], pool: PoolSpec, where: str) -> Placement:
    """Where an instance runs: on Lambda its memory size (which sets its threads, as Lambda's
    vCPUs follow memory); elsewhere its threads."""
    memory_mb = _count(entry.get("memory_mb", 0), f"{where}: memory_mb", MAX_LAMBDA_MEMORY_MB)
    if pool.kind is PoolKind.LAMBDA:
        if memory_mb <= 0:
            raise InvalidInputError(f"{where}: a Lambda profile needs memory_mb")
        if memory_mb < MIN_LAMBDA_MEMORY_MB:
            raise InvalidInputError(
                f"{where}: memory_mb must lie in [{MIN_LAMBDA_MEMORY_MB}, {MAX_LAMBDA_MEMORY_MB}] "
                f"(Lambda's memory sizes); got {memory_mb}"
            )
        threads = lambda_threads(memory_mb)
    else:
        threads = _positive_int(entry.get("threads", 1), f"{where}: threads", MAX_THREADS)
    return Placement(pool, threads, memory_mb)


def _latency_tables(entry: Mapping[str, Any], where: str) -> tuple[dict[int, float], dict[int, float]]:
    """The p50 and p99 tables: the same batch sizes, batch 1 among them, no median above its p99."""
    p50 = _latency_table(entry["latency_p50_ms"], f"{where}: latency_p50_ms")
    p99 = _latency_table(entry["latency_p99_ms"], f"{where}: latency_p99_ms")
    if set(p50) != set(p99) or 1 not in p99:
        raise InvalidInputError(f"{where}: p50 and p99 tables need the same batch sizes, batch 1 included")
    if any(p50[n] > p99[n] for n in p50):
        raise InvalidInputError(f"{where}: a median latency above its p99")
    return p50, p99


def _accuracy(entry: Mapping[str, Any], where: str) -> tuple[float, str]:
    """The accuracy and the metric it was measured with (top-1 unless stated)."""
    accuracy = _number(entry["accuracy"], f"{where}: accuracy", 0.0, 1.0)
    metric = _text(entry.get("accuracy_metric", "top1"), f"{where}: accuracy_metric")
    if metric not in ACCURACY_METRICS:
        raise InvalidInputError(f"{where}: accuracy_metric must be one of {list(ACCURACY_METRICS)}")
    return accuracy, metric


def _capacity(entry: Mapping[str, Any], p50: Mapping[int, float], where: str) -> tuple[float, int]:
    """The saturation rate and the largest useful batch: as stated, else what the median table
    implies (its best throughput, its largest batch size)."""
    measured_saturation = max(batch * 1000 / p50[batch] for batch in p50)
    saturation = _number(
        entry.get("saturation_qps", measured_saturation), f"{where}: saturation_qps", 0.0, MAX_SATURATION_QPS
    )
    best_batch = _count(
        entry.get("max_useful_batch", max(p50)), f"{where}: max_useful_batch", MAX_PROFILE_BATCH
    )
    if best_batch not in p50:
        raise InvalidInputError(
            f"{where}: max_useful_batch must be one of the profiled batch sizes {sorted(p50)}"
        )
    return saturation, best_batch


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string; got {value!r}"[:300])
    return value


def _number(value: Any, what: str, low: float, high: float) -> float:
    """A JSON number (never a boolean nor a numeric string), finite, within [low, high]."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidInputError(f"{what} must be a number; got {value!r}"[:300])
    try:
        number = float(value)  # an integer past float's range raises here
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InvalidInputError(f"{what} must be a finite number; got {_shown(value)}")
    if not low <= number <= high:
        raise InvalidInputError(f"{what} must lie in [{_shown(low)}, {_shown(high)}]; got {_shown(value)}")
    return number


def _count(value: Any, what: str, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative integer; got {value!r}"[:300])
    if value > high:
        raise InvalidInputError(f"{what} must be at most {high}; got {_shown(value)}")
    return value


def _positive_int(value: Any, what: str, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidInputError(f"{what} must be a positive integer; got {value!r}"[:300])
    if value > high:
        raise InvalidInputError(f"{what} must be at most {high}; got {_shown(value)}")
    return value


def _latency_table(raw: Any, what: str) -> dict[int, float]:
    if not isinstance(raw, dict) or not raw:
        raise InvalidInputError(f"{what} must map batch sizes to milliseconds")
    table: dict[int, float] = {}
    for batch, value in raw.items():
        size = _batch_size(batch, what)
        table[size] = _number(value, f"{what}[{size}]", MIN_LATENCY_MS, MAX_LATENCY_MS)
    return table


def _batch_size(raw: Any, what: str) -> int:
    """A table's batch size: a JSON object's key, so digits in a string (an int from Python)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        size = raw
    elif isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_PROFILE_BATCH)):
        size = int(raw)
    else:
        raise InvalidInputError(f"{what}: batch size {raw!r} is not an integer"[:300])
    if not 1 <= size <= MAX_PROFILE_BATCH:
        raise InvalidInputError(f"{what}: batch size {_shown(size)} must lie in [1, {MAX_PROFILE_BATCH}]")
    return size


def _shown(value: float) -> str:
    """A number as a message shows it: whole numbers without '.0', huge ones abbreviated."""
    text = str(int(value)) if isinstance(value, int) or float(value).is_integer() else repr(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
