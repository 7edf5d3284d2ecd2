"""The prediction cache (``modelless.cache``; Clipper §4.2): the in-memory backend's LRU by bytes,
the row digests, what a lookup may answer, and the Dispatcher answering from it (a hit skips
selection and inference; a re-registered model misses; a failing cache never fails a query)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient

from modelless import cli
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.cache.base import CacheStats, entry_key, entry_size, row_digests
from modelless.cache.factory import open_prediction_cache
from modelless.cache.memory import InMemoryPredictionCache
from modelless.cache.predictions import CachedPredictions, CachedRow, choose_hit, decode_row, encode_row
from modelless.catalog import DEFAULT_POOLS
from modelless.client import Client
from modelless.config import Settings
from modelless.dispatch import Dispatcher
from modelless.exceptions import TargetsUnreachableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.repository.local import LocalModelRepository
from modelless.selection import InfaasPolicy
from modelless.types import Tier, VariantProfile
from tests.input_models import token_inputs
from tests.unit.dispatch_kit import (
    LAMBDA_OUT,
    WORKER_OUT,
    FakeLambda,
    FakeWorkers,
    live_worker,
    make_instance,
    make_variant,
    model_record,
    seed,
    targets,
)
from tests.unit.test_api import ADMIN, ADMIN_KEY, Api, InProcessLambda, make_settings
from tests.unit.test_api_query_inputs import tokens_app

# --- the in-memory backend: LRU by bytes ----------------------------------------------------------


def value(n: int) -> bytes:
    return bytes(n)


def test_memory_cache_evicts_least_recently_used_first_to_stay_within_its_bytes() -> None:
    size = entry_size("a", value(10))  # every key here is one character
    cache = InMemoryPredictionCache(max_bytes=3 * size)
    cache.put({"a": value(10), "b": value(10), "c": value(10)})
    assert cache.get(["a"]) == [value(10)]  # a is now the most recently used: b is the oldest

    cache.put({"d": value(10)})

    assert cache.get(["a", "b", "c", "d"]) == [value(10), None, value(10), value(10)]
    stats = cache.stats()
    assert (stats.entries, stats.bytes_used, stats.evictions) == (3, 3 * size, 1)


def test_memory_cache_counts_bytes_not_entries_and_a_rewrite_once() -> None:
    cache = InMemoryPredictionCache(max_bytes=entry_size("a", value(50)) + entry_size("b", value(5)))
    cache.put({"a": value(50), "b": value(5)})
    cache.put({"a": value(50)})  # the same key again: counted once
    assert cache.stats().bytes_used == entry_size("a", value(50)) + entry_size("b", value(5))

    cache.put({"c": value(40)})  # needs room: b (the least recently used) goes, then a

    assert cache.get(["a", "b", "c"]) == [None, None, value(40)]
    assert cache.stats().bytes_used == entry_size("c", value(40))
    assert cache.stats().evictions == 2


def test_memory_cache_drops_an_entry_larger_than_its_whole_budget_at_once() -> None:
    cache = InMemoryPredictionCache(max_bytes=10)
    cache.put({"big": value(100)})
    assert cache.get(["big"]) == [None]
    assert cache.stats() == CacheStats("memory", 0, 0, 1, 0, 0, 10)


def test_memory_cache_counts_hits_and_misses_and_clear_resets_everything() -> None:
    cache = InMemoryPredictionCache(max_bytes=1000)
    cache.put({"a": value(1)})
    cache.record(hits=3, misses=1)
    assert cache.stats().hit_rate == 0.75
    cache.clear()
    assert cache.stats() == CacheStats("memory", 0, 0, 0, 0, 0, 1000)
    assert cache.stats().hit_rate == 0.0


# --- keys, digests and entries ---------------------------------------------------------------------


def test_row_digests_are_per_row_and_stable_across_batches() -> None:
    batch = np.arange(12, dtype=np.float32).reshape(3, 4)
    digests = row_digests(batch)
    assert len(set(digests)) == 3
    assert row_digests(batch[1:2]) == [digests[1]]  # a row alone, or in a batch: the same entry
    assert row_digests(batch.copy()) == digests
    assert row_digests(np.asfortranarray(batch)) == digests  # memory layout is not the input


def test_row_digests_tell_dtype_and_shape_apart() -> None:
    row = np.zeros((1, 2, 3), dtype=np.float32)
    assert row_digests(row) != row_digests(row.astype(np.float64))
    assert row_digests(row) != row_digests(row.reshape(1, 3, 2))  # the same bytes, another shape
    assert row_digests(row) != row_digests(row.view(np.int32))  # the same bytes, another dtype


def test_row_digests_of_structured_rows_name_their_fields() -> None:
    one = np.zeros(2, dtype=[("a", np.float32), ("b", np.int64)])
    other = np.zeros(2, dtype=[("x", np.float32), ("b", np.int64)])
    assert len(row_digests(one)) == 2
    assert row_digests(one) != row_digests(other)


def test_a_row_round_trips_with_the_variant_that_computed_it() -> None:
    outputs = np.array([0.25, 0.5, -1.0], dtype=np.float32)
    row = decode_row(encode_row(outputs, "app/m/fp32"))
    assert row.variant_id == "app/m/fp32"
    assert row.outputs.dtype == np.float32
    np.testing.assert_array_equal(row.outputs, outputs)


def test_entry_keys_carry_the_generation() -> None:
    assert entry_key("app", "m", "reg-1", "d") != entry_key("app", "m", "reg-2", "d")


# --- what a lookup may answer ---------------------------------------------------------------------


def rows(*variants: str | None) -> list[CachedRow | None]:
    return [
        None if v is None else CachedRow(np.full(2, float(i), np.float32), v) for i, v in enumerate(variants)
    ]


def test_a_hit_needs_every_row_of_one_model() -> None:
    admits = {"m1/v", "m2/v"}.__contains__
    partial = {"m1": rows("m1/v", None), "m2": rows(None, "m2/v")}
    assert choose_hit(partial, admits) is None  # each row cached, but not both for one model
    hit = choose_hit({"m1": rows("m1/v", None), "m2": rows("m2/v", "m2/v")}, admits)
    assert hit is not None and hit.model_name == "m2"
    assert hit.variant_ids == ("m2/v", "m2/v")
    np.testing.assert_array_equal(hit.outputs, [[0.0, 0.0], [1.0, 1.0]])


def test_a_hit_takes_only_admitted_variants_and_the_first_model_that_has_them() -> None:
    cached = {"best": rows("best/int8"), "other": rows("other/fp32")}
    assert choose_hit(cached, {"other/fp32"}.__contains__).model_name == "other"  # type: ignore[union-attr]
    assert choose_hit(cached, {"best/int8", "other/fp32"}.__contains__).model_name == "best"  # type: ignore[union-attr]
    assert choose_hit(cached, set[str]().__contains__) is None


def test_the_settings_choose_the_backend() -> None:
    assert open_prediction_cache(Settings(metadata_url="memory://", prediction_cache_enabled=False)) is None
    assert open_prediction_cache(Settings(metadata_url="memory://", prediction_cache_max_bytes=0)) is None
    backend = open_prediction_cache(Settings(metadata_url="memory://", prediction_cache_enabled=True))
    assert isinstance(backend, InMemoryPredictionCache)
    with pytest.raises(ValueError, match="unsupported prediction cache URL"):
        open_prediction_cache(Settings(prediction_cache_url="s3://nope", prediction_cache_enabled=True))


def test_rows_over_the_entry_limit_are_not_cached() -> None:
    backend = InMemoryPredictionCache(max_bytes=1 << 20)
    small = CachedPredictions(backend, max_entry_bytes=64)
    small.remember("app", "m", "g", ["d"], np.zeros((1, 1000), np.float32), "v")
    assert backend.stats().entries == 0


# --- the Dispatcher answering from the cache ------------------------------------------------------


def cached_dispatcher(
    store: InMemoryMetadataStore, backend: object | None = None
) -> tuple[Dispatcher, FakeWorkers, FakeLambda, CachedPredictions]:
    predictions = CachedPredictions(backend or InMemoryPredictionCache(1 << 20), 1 << 16)  # type: ignore[arg-type]
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier, predictions=predictions, live_state_ttl_s=0
    )
    return dispatcher, workers, lambda_tier, predictions


def one_input(seed_value: float = 1.0) -> np.ndarray:
    return np.full((1, 4), seed_value, dtype=np.float32)


def measured(variant: VariantProfile, precision: str, accuracy: float) -> VariantProfile:
    """A profile with a measured accuracy (its interval +-0.01), so that the reference rule holds."""
    return dataclasses.replace(
        variant,
        precision=precision,
        accuracy=accuracy,
        accuracy_examples=1000,
        accuracy_low=accuracy - 0.01,
        accuracy_high=accuracy + 0.01,
    )


def test_a_repeated_query_is_answered_from_the_cache_without_selection_or_inference() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, workers, _, predictions = cached_dispatcher(store)

    first = dispatcher.online_query(targets(latency=10, model="m"), one_input(), correlation_id="q1")
    second = dispatcher.online_query(targets(latency=10, model="m"), one_input(), correlation_id="q2")

    assert len(workers.calls) == 1
    assert (first.cached, first.tier) == (False, Tier.WORKER)
    assert "cache_ms" in first.timings_ms
    assert (second.cached, second.tier, second.worker_id) == (True, Tier.CACHE, None)
    assert second.query_id == "q2"
    assert second.decision.variant.variant_id == "v"
    np.testing.assert_array_equal(second.outputs, first.outputs)
    assert second.timings_ms["selection_ms"] == 0.0 and second.timings_ms["inference_ms"] == 0.0
    assert second.timings_ms["total_ms"] >= second.timings_ms["cache_ms"]
    stats = predictions.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)


def test_another_input_or_a_partly_cached_batch_is_a_miss() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, workers, _, _ = cached_dispatcher(store)
    dispatcher.online_query(targets(latency=10, model="m"), one_input(1.0))

    other = dispatcher.online_query(targets(latency=10, model="m"), one_input(2.0))
    workers.outputs = np.zeros((2, 10), np.float32)
    both = dispatcher.online_query(
        targets(latency=10, model="m", batch=2), np.concatenate([one_input(1.0), one_input(3.0)])
    )

    assert not other.cached and not both.cached
    assert len(workers.calls) == 3


def test_a_re_registered_model_misses_what_its_former_registration_computed() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, workers, _, _ = cached_dispatcher(store)
    dispatcher.online_query(targets(latency=10, model="m"), one_input())

    store.delete_model("app", "m")
    record, registration = model_record("m", ready=False)
    record = dataclasses.replace(record, registration_id="reg-again")
    registration = dataclasses.replace(registration, registration_id="reg-again")
    store.add_model(record, registration)
    store.publish_variants(dataclasses.replace(record, ready=True), [make_variant("v")], registration)
    again = dispatcher.online_query(targets(latency=10, model="m"), one_input())
    repeated = dispatcher.online_query(targets(latency=10, model="m"), one_input())

    assert not again.cached and len(workers.calls) == 2
    assert repeated.cached  # what the new registration computed is cached in turn


def test_a_target_only_query_takes_an_entry_its_accuracy_admits() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v", accuracy=0.8)])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, workers, _, _ = cached_dispatcher(store)
    dispatcher.online_query(targets(latency=10, model="m"), one_input())

    admitted = dispatcher.online_query(targets(latency=10, accuracy=0.7), one_input())
    assert admitted.cached and len(workers.calls) == 1
    with pytest.raises(TargetsUnreachableError):  # no variant reaches 0.9: selection says so
        dispatcher.online_query(targets(latency=10, accuracy=0.9), one_input())
    assert len(workers.calls) == 1


def test_an_unfaithful_variants_answer_never_serves_a_query_held_to_the_reference() -> None:
    """An INT8 variant far below its model's FP32 accuracy may answer a query that asks only for
    0.5; a query naming the model (held to the reference accuracy) must not get its answer."""
    store = InMemoryMetadataStore()
    fp32 = measured(make_variant("m/fp32", price_per_second=10.0), "fp32", 0.9)
    int8 = measured(make_variant("m/int8", price_per_second=1.0), "int8", 0.6)
    seed(store, [fp32, int8])
    store.put_worker_state(live_worker("w1", make_instance("m/int8"), make_instance("m/fp32")))
    dispatcher, workers, _, _ = cached_dispatcher(store)

    cheap = dispatcher.online_query(targets(latency=10, accuracy=0.5), one_input())
    assert cheap.decision.variant.variant_id == "m/int8"
    named = dispatcher.online_query(targets(latency=10, model="m"), one_input())
    assert not named.cached and named.decision.variant.variant_id == "m/fp32"
    loose = dispatcher.online_query(targets(latency=10, accuracy=0.5), one_input())
    assert loose.cached and loose.decision.variant.variant_id == "m/fp32"  # the FP32 answer now
    assert len(workers.calls) == 2


class FailingCache:
    """A backend that is down: every call raises."""

    kind: ClassVar[str] = "failing"
    max_bytes = 1 << 20

    def __init__(self) -> None:
        self.calls = 0

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self.calls += 1
        raise ConnectionError("cache down")

    def put(self, entries: Mapping[str, bytes]) -> None:
        self.calls += 1
        raise ConnectionError("cache down")

    def record(self, hits: int, misses: int) -> None:
        self.calls += 1
        raise ConnectionError("cache down")

    def stats(self) -> CacheStats:
        raise ConnectionError("cache down")

    def clear(self) -> None:
        raise ConnectionError("cache down")

    def close(self) -> None:
        pass


def test_a_failing_cache_never_fails_a_query() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    backend = FailingCache()
    dispatcher, workers, _, _ = cached_dispatcher(store, backend)

    results = [dispatcher.online_query(targets(latency=10, model="m"), one_input()) for _ in range(2)]

    assert [r.cached for r in results] == [False, False]
    assert len(workers.calls) == 2
    assert backend.calls >= 4  # looked up and written each time, failing each time


# --- over the API: the reply says so, the stats endpoint, the client and the CLI ------------------


@pytest.fixture
def cached_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """test_api.py's in-process API (real services, the real runtime as the Lambda tier), with
    the prediction cache on (the tests' environment turns it off)."""
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    settings = make_settings(tmp_path, prediction_cache_enabled=True)
    services = build_services(settings, store=store, lambda_tier=lambda_tier)
    built = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)
    monkeypatch.setattr(services.registrar._background, "submit", lambda *args, **kwargs: None)
    try:
        yield built
    finally:
        built.client.close()
        services.close()


def test_a_repeated_query_over_the_api_is_answered_from_the_cache_and_says_so(
    cached_api: Api, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tokens_app(cached_api)
    ids, mask = token_inputs(2)
    body = {"appID": "inputs", "modelName": "tokens", "inputs": {"ids": ids.tolist(), "mask": mask.tolist()}}

    first = cached_api.client.post("/v1/online_query", json=body, headers=key).json()
    refused = cached_api.client.post("/v1/online_query", json={**body, "inputs": [[1.5]]}, headers=key)
    second = cached_api.client.post("/v1/online_query", json=body, headers=key).json()

    assert refused.status_code == 400  # bad input: refused before the cache, counted nowhere
    assert (first["cached"], first["tier"]) == (False, "lambda")
    assert (second["cached"], second["tier"], second["variantState"]) == (True, "cache", "cached")
    assert second["queryId"] and second["queryId"] != first["queryId"]
    assert second["outputs"] == first["outputs"] and second["predictions"] == first["predictions"]
    assert second["variant"] == first["variant"]
    assert second["timingsMs"]["inference_ms"] == 0.0 and "cache_ms" in second["timingsMs"]
    assert len(cached_api.lambda_tier.calls) == 1
    stats = cached_api.client.get("/v1/cache", headers=ADMIN).json()
    assert {k: stats[k] for k in ("enabled", "backend", "hits", "misses", "hitRate", "entries")} == {
        "enabled": True,
        "backend": "memory",
        "hits": 1,
        "misses": 1,
        "hitRate": 0.5,
        "entries": 2,
    }
    assert cached_api.client.get("/v1/cache", headers=key).status_code == 401  # the admin key only

    # The CLI, through the Python client, on the in-process app.
    def in_process_admin(args: object) -> Client:
        admin = Client("http://testserver", admin_key=ADMIN_KEY)
        admin._http.close()
        admin._http = cast(Any, TestClient(cached_api.client.app))  # closed with the client
        return admin

    monkeypatch.setattr(cli, "_client", in_process_admin)
    cli.main(["cache"])
    assert "1 hits, 1 misses (hit rate 50.0%); 2 entries" in capsys.readouterr().out
    cli.main(["cache", "--clear"])
    assert "0 hits, 0 misses" in capsys.readouterr().out
