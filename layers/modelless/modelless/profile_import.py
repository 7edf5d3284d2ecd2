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

from modelless.exceptions import InvalidInputError, NotFoundError, NotReadyError
from modelless.metadata.base import MetadataStore
from modelless.pools.catalog import Placement, PoolKind, PoolSpec, lambda_threads
from modelless.repository.base import ModelRepository
from modelless.types import VariantProfile
from modelless.variant_profiling import model_prefix, variant_id
from variants.recipes import ACCURACY_METRICS, Recipe

REQUIRED = ("recipe", "pool", "latency_p50_ms", "latency_p99_ms", "load_latency_ms", "accuracy", "hardware")


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
    where = f"profile {index}"
    missing = [name for name in REQUIRED if name not in entry]
    if missing:
        raise InvalidInputError(f"{where} lacks {missing}")
    try:
        recipe = Recipe.parse(str(entry["recipe"]))
    except ValueError as error:
        raise InvalidInputError(f"{where}: {error}") from error
    pool = pools.get(str(entry["pool"]))
    if pool is None:
        raise InvalidInputError(f"{where}: unknown pool {entry['pool']!r}; pools are {sorted(pools)}")
    key = f"{model_prefix(app_id, model_name)}variants/{recipe.name}.onnx"
    if not repository.exists(key):
        raise InvalidInputError(f"{where}: the model has no {recipe.name} artifact to serve")
    memory_mb = _count(entry.get("memory_mb", 0), f"{where}: memory_mb")
    if pool.kind is PoolKind.LAMBDA:
        if memory_mb <= 0:
            raise InvalidInputError(f"{where}: a Lambda profile needs memory_mb")
        threads = lambda_threads(memory_mb)
    else:
        threads = _positive_int(entry.get("threads", 1), f"{where}: threads")
    placement = Placement(pool, threads, memory_mb)
    p50 = _latency_table(entry["latency_p50_ms"], f"{where}: latency_p50_ms")
    p99 = _latency_table(entry["latency_p99_ms"], f"{where}: latency_p99_ms")
    if set(p50) != set(p99) or 1 not in p99:
        raise InvalidInputError(f"{where}: p50 and p99 tables need the same batch sizes, batch 1 included")
    if any(p50[n] > p99[n] for n in p50):
        raise InvalidInputError(f"{where}: a median latency above its p99")
    accuracy = _number(entry["accuracy"], f"{where}: accuracy")
    if not 0 <= accuracy <= 1:
        raise InvalidInputError(f"{where}: accuracy must lie in [0, 1]")
    metric = str(entry.get("accuracy_metric", "top1"))
    if metric not in ACCURACY_METRICS:
        raise InvalidInputError(f"{where}: accuracy_metric must be one of {list(ACCURACY_METRICS)}")
    measured_saturation = max(batch * 1000 / p50[batch] for batch in p50)
    saturation = _number(entry.get("saturation_qps", measured_saturation), f"{where}: saturation_qps")
    best_batch = _count(entry.get("max_useful_batch", max(p50)), f"{where}: max_useful_batch")
    if best_batch not in p50:
        raise InvalidInputError(
            f"{where}: max_useful_batch must be one of the profiled batch sizes {sorted(p50)}"
        )
    return VariantProfile(
        variant_id=variant_id(app_id, model_name, recipe.name, placement.name),
        app_id=app_id,
        model_name=model_name,
        pool=pool.name,
        precision=recipe.precision,
        opt_level=recipe.opt_level,
        threads=threads,
        artifact_key=key,
        size_bytes=len(repository.get(key)),
        load_latency_ms=_number(entry["load_latency_ms"], f"{where}: load_latency_ms"),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        peak_memory_mb=_number(entry.get("peak_memory_mb", 0.0), f"{where}: peak_memory_mb"),
        accuracy=accuracy,
        price_per_second=placement.price_per_second,
        request_price=pool.request_price,
        hardware=str(entry["hardware"])[:200],
        measured_on_target=True,
        memory_mb=memory_mb,
        saturation_qps=round(saturation, 1),
        max_useful_batch=best_batch,
        accuracy_metric=metric,
        accuracy_examples=_count(entry.get("accuracy_examples", 0), f"{where}: accuracy_examples"),
        imported=True,
    )


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number; got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise InvalidInputError(f"{what} must be a finite, non-negative number; got {value!r}")
    return number


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative integer; got {value!r}")
    return value


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidInputError(f"{what} must be a positive integer; got {value!r}")
    return value


def _latency_table(raw: Any, what: str) -> dict[int, float]:
    if not isinstance(raw, dict) or not raw:
        raise InvalidInputError(f"{what} must map batch sizes to milliseconds")
    table: dict[int, float] = {}
    for batch, value in raw.items():
        try:
            size = int(batch)
        except (TypeError, ValueError):
            raise InvalidInputError(f"{what}: batch size {batch!r} is not an integer") from None
        if size <= 0:
            raise InvalidInputError(f"{what}: batch size {size} must be positive")
        latency = _number(value, f"{what}[{size}]")
        if latency <= 0:
            raise InvalidInputError(f"{what}[{size}] must be positive")
        table[size] = latency
    return table
