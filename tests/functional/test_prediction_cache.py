"""The prediction cache on real parts: both backends' LRU by bytes (Redis: the Lua scripts);
real worker processes answering a miss, then the cache answering the same input with the worker
gone; two gateways sharing one Redis cache; a re-registered model missing; a cache that cannot be
reached answering as a miss; and an offline job and online queries sharing their answers.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from infra.local.ports import free_port
from modelless.cache.base import PredictionCache, entry_size
from modelless.cache.memory import InMemoryPredictionCache
from modelless.cache.predictions import CachedPredictions
from modelless.cache.redis import RedisPredictionCache
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import LIVE_STATE_TTL_S, Dispatcher
from modelless.exceptions import ServiceUnavailableError, StoreUnavailableError
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.child_processes import ChildProcessRunner
from modelless.offline.jobs import JobSpec, output_key
from modelless.offline.runner import RunOutcome
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalWorkerPool
from modelless.selection import InfaasPolicy
from modelless.types import ModelRecord, QueryTargets, Registration, Tier, VariantProfile
from tests.conftest import service_url
from tests.functional.offline_fixtures import Buckets, offline_service, redis_url
from tests.functional.workers_kit import (
    APP,
    MODEL,
    expected_logits,
    make_variant,
    publish_linear_model,
    sample_inputs,
    start_worker,
)

ENTRY_LIMIT = 64 * 1024


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[PredictionCache]:
    """Both backends, a budget of three 10-byte entries under one-character keys."""
    budget = 3 * entry_size("a", bytes(10))
    cache: PredictionCache
    if request.param == "memory":
        cache = InMemoryPredictionCache(budget)
    else:
        base = service_url("MODELLESS_TEST_REDIS_URL")
        cache = RedisPredictionCache.from_url(f"{base}?prefix=test-cache-{uuid.uuid4().hex[:12]}:", budget)
    try:
        yield cache
    finally:
        cache.clear()
        cache.close()


def shared_cache(store: RedisMetadataStore) -> CachedPredictions:
    """A Redis cache in the test's namespace (what a gateway or a runner process opens)."""
    url = f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={store.keys.prefix}"
    return CachedPredictions(RedisPredictionCache.from_url(url, 1 << 20), ENTRY_LIMIT)


def dispatcher_with(
    store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    predictions: CachedPredictions,
    live_state_ttl_s: float = LIVE_STATE_TTL_S,
) -> Dispatcher:
    return Dispatcher(
        store,
        InfaasPolicy(DEFAULT_POOLS),
        invoker,
        None,
        live_state_ttl_s=live_state_ttl_s,
        predictions=predictions,
    )


NAMED = QueryTargets(app_id=APP, model_name=MODEL, latency_ms=2000.0)


# --- the backends ----------------------------------------------------------------------------------


def test_the_least_recently_used_entry_is_evicted_first(backend: PredictionCache) -> None:
    backend.put({"a": bytes(10), "b": bytes(10), "c": bytes(10)})
    assert backend.get(["a"]) == [bytes(10)]  # a used: b is now the least recently used

    backend.put({"d": bytes(10)})

    assert backend.get(["a", "b", "c", "d"]) == [bytes(10), None, bytes(10), bytes(10)]
    stats = backend.stats()
    assert (stats.entries, stats.bytes_used, stats.evictions) == (3, 3 * entry_size("a", bytes(10)), 1)


def test_a_rewrite_is_counted_once_and_a_large_entry_makes_room(backend: PredictionCache) -> None:
    backend.put({"a": bytes(10), "b": bytes(10)})
    backend.put({"a": bytes(10)})
    assert backend.stats().bytes_used == 2 * entry_size("a", bytes(10))

    backend.put({"c": bytes(25)})  # needs both others' room: b (older) goes, then a

    assert backend.get(["a", "b", "c"]) == [None, None, bytes(25)]
    stats = backend.stats()
    assert (stats.entries, stats.bytes_used, stats.evictions) == (1, entry_size("c", bytes(25)), 2)


def test_counters_and_clear(backend: PredictionCache) -> None:
    backend.put({"a": bytes(1)})
    backend.record(hits=1, misses=3)
    stats = backend.stats()
    assert (stats.hits, stats.misses, stats.hit_rate) == (1, 3, 0.25)
    backend.clear()
    assert backend.get(["a"]) == [None]
    stats = backend.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.bytes_used) == (0, 0, 0, 0)


def test_concurrent_writers_keep_the_byte_count_true_and_within_budget() -> None:
    """Four gateways' worth of writers at once on one Redis cache: each write and its evictions
    are one script, so the bytes counted are the bytes held, and never over the budget."""
    base = service_url("MODELLESS_TEST_REDIS_URL")
    url = f"{base}?prefix=test-cache-{uuid.uuid4().hex[:12]}:"
    budget = 20 * entry_size("w0-000", bytes(50))
    caches = [RedisPredictionCache.from_url(url, budget) for _ in range(4)]

    def write(index: int) -> None:
        for item in range(60):
            caches[index].put({f"w{index}-{item:03d}": bytes(50), f"x{index}-{item:03d}": bytes(30)})

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(write, range(4)))
        keys = [f"{kind}{i}-{item:03d}" for kind in "wx" for i in range(4) for item in range(60)]
        held = {k: v for k, v in zip(keys, caches[0].get(keys), strict=True) if v is not None}
        stats = caches[0].stats()
        assert stats.bytes_used == sum(entry_size(k, v) for k, v in held.items()) <= budget
        assert stats.entries == len(held) > 0
        assert stats.evictions == len(keys) - len(held)
    finally:
        caches[0].clear()
        for cache in caches:
            cache.close()


def test_an_unreachable_redis_fails_fast_with_the_stores_outage_error() -> None:
    cache = RedisPredictionCache.from_url(f"redis://127.0.0.1:{free_port()}/0", 1 << 20)
    try:
        for _ in range(2):  # the first call finds it down; the second fails at once
            with pytest.raises(StoreUnavailableError):
                cache.get(["a"])
    finally:
        cache.close()


# --- queries on real workers -----------------------------------------------------------------------


def test_a_miss_runs_on_the_worker_and_the_repeat_is_answered_with_the_worker_gone(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    publish_linear_model(redis_store, make_variant())
    worker = start_worker(pool, redis_store)
    predictions = shared_cache(redis_store)
    dispatcher = dispatcher_with(redis_store, invoker, predictions)
    inputs = sample_inputs(3)

    miss = dispatcher.online_query(NAMED, inputs)
    pool.kill(worker.worker_id)  # nothing can run a query now
    hit = dispatcher.online_query(NAMED, inputs)

    assert (miss.cached, miss.tier) == (False, Tier.WORKER)
    assert (hit.cached, hit.tier, hit.worker_id) == (True, Tier.CACHE, None)
    np.testing.assert_allclose(hit.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert hit.decision.variant.variant_id == miss.decision.variant.variant_id
    # Each row is its own entry: a batch of rows answered before is a hit in any order...
    assert dispatcher.online_query(dataclasses.replace(NAMED, batch=2), inputs[[2, 0]]).cached
    # ...and an input never seen needs the worker, which is gone.
    with pytest.raises(ServiceUnavailableError):
        dispatcher.online_query(NAMED, sample_inputs(4)[3:])
    stats = predictions.stats()
    assert (stats.backend, stats.hits, stats.entries) == ("redis", 2, 3)
    predictions.close()


def test_two_gateways_share_one_redis_cache(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    publish_linear_model(redis_store, make_variant())
    start_worker(pool, redis_store)
    first, second = shared_cache(redis_store), shared_cache(redis_store)
    inputs = sample_inputs(2)

    computed = dispatcher_with(redis_store, invoker, first).online_query(NAMED, inputs)
    answered = dispatcher_with(redis_store, invoker, second).online_query(NAMED, inputs)

    assert not computed.cached and answered.cached
    np.testing.assert_array_equal(answered.outputs, computed.outputs)
    first.close()
    second.close()


def test_a_re_registered_model_is_a_miss(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = make_variant()
    publish_linear_model(redis_store, variant)
    start_worker(pool, redis_store)
    predictions = shared_cache(redis_store)
    # The generation is read with the live state (a snapshot at most LIVE_STATE_TTL_S old); a
    # registration takes far longer than that, here no time at all: every decision reads it.
    dispatcher = dispatcher_with(redis_store, invoker, predictions, live_state_ttl_s=0.0)
    inputs = sample_inputs(1)
    assert not dispatcher.online_query(NAMED, inputs).cached
    assert dispatcher.online_query(NAMED, inputs).cached

    record = redis_store.get_model(APP, MODEL)
    assert record is not None
    redis_store.delete_model(APP, MODEL)
    register_again(redis_store, record, variant)
    again = dispatcher.online_query(NAMED, inputs)

    assert not again.cached and again.tier is Tier.WORKER
    assert dispatcher.online_query(NAMED, inputs).cached
    predictions.close()


def register_again(store: RedisMetadataStore, record: ModelRecord, variant: VariantProfile) -> None:
    """The same model, its same variant, under a new registration (as register_model writes it)."""
    registration = Registration(f"reg-{uuid.uuid4().hex[:8]}", APP, MODEL)
    fresh = dataclasses.replace(record, registration_id=registration.registration_id, ready=False)
    store.add_model(fresh, registration)
    store.publish_variants(dataclasses.replace(fresh, ready=True), [variant], registration)


def test_an_unreachable_cache_answers_every_query_as_a_miss(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    publish_linear_model(redis_store, make_variant())
    start_worker(pool, redis_store)
    down = CachedPredictions(
        RedisPredictionCache.from_url(f"redis://127.0.0.1:{free_port()}/0", 1 << 20), ENTRY_LIMIT
    )
    dispatcher = dispatcher_with(redis_store, invoker, down)
    inputs = sample_inputs(2)

    results = [dispatcher.online_query(NAMED, inputs) for _ in range(2)]

    assert [(r.cached, r.tier) for r in results] == [(False, Tier.WORKER)] * 2
    for result in results:
        np.testing.assert_allclose(result.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    down.close()


# --- offline jobs and online queries share it -------------------------------------------------------


def test_an_offline_job_and_online_queries_share_their_answers(
    redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile, invoker: HttpWorkerInvoker
) -> None:
    keys = buckets.upload_inputs("in/", 4)
    inputs = sample_inputs(4)
    predictions = shared_cache(redis_store)
    dispatcher = dispatcher_with(redis_store, invoker, predictions)
    online_first = dispatcher.online_query(NAMED, inputs[:1])  # computed online: input 0
    assert not online_first.cached

    service = offline_service(redis_store)
    service.predictions = shared_cache(redis_store)  # a runner of its own, on the same Redis
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        assert service.run(job.job_id).outcome is RunOutcome.COMPLETED
    finally:
        service.close()
        service.predictions.close()

    results = [buckets.read_json(output_key("in/", "out/", key)) for key in keys]
    assert [r["cached"] for r in results] == [True, False, False, False]  # input 0: the online answer
    assert {r["variant"] for r in results} == {served.variant_id}
    for result, row in zip(results, inputs, strict=True):
        np.testing.assert_allclose(result["outputs"], expected_logits(row[None]), rtol=1e-5, atol=1e-5)
    # Inputs 1-3, computed by the job: online queries for them are answered from the cache.
    later = [dispatcher.online_query(NAMED, inputs[i : i + 1]) for i in range(1, 4)]
    assert [r.cached for r in later] == [True, True, True]
    stats = predictions.stats()
    assert (stats.hits, stats.misses) == (1 + 3, 1 + 3)  # offline: 1 hit, 3 misses; online: 3 and 1
    predictions.close()


def test_a_job_in_a_runner_process_of_its_own_shares_the_cache_through_redis(
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    served: VariantProfile,
    invoker: HttpWorkerInvoker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded stack with Redis runs each job in a child process
    (``MODELLESS_OFFLINE_RUNNER=auto``): the child opens the cache its settings name (the
    metadata store's Redis), the very one the gateway's queries use."""
    monkeypatch.setenv("MODELLESS_PREDICTION_CACHE_ENABLED", "true")  # the child inherits it
    keys = buckets.upload_inputs("in/", 3)
    inputs = sample_inputs(3)
    predictions = shared_cache(redis_store)
    dispatcher = dispatcher_with(redis_store, invoker, predictions)
    assert not dispatcher.online_query(NAMED, inputs[2:3]).cached  # computed online: input 2

    service = offline_service(redis_store)
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        report = ChildProcessRunner(redis_url(redis_store))(job.job_id)
    finally:
        service.close()

    assert report.outcome is RunOutcome.COMPLETED
    results = [buckets.read_json(output_key("in/", "out/", key)) for key in keys]
    assert [r["cached"] for r in results] == [False, False, True]
    assert [dispatcher.online_query(NAMED, inputs[i : i + 1]).cached for i in range(3)] == [True] * 3
    predictions.close()
