"""Real worker processes and the local Lambda tier: start-up, state reports into Redis, correct
inference, failure of a worker mid-query and the dispatcher's retry on the Lambda tier.

Every wait is bounded; every pool, tier and invoker is closed by its fixture.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort
import pytest

import modelless.metadata.redis as redis_backend
import modelless.pools.lambda_local as lambda_local
from modelless.dispatcher import Dispatcher
from modelless.exceptions import ModellessError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.catalog import CPU_POOL, DEFAULT_POOLS
from modelless.pools.invokers import HttpWorkerInvoker, WorkerUnreachableError
from modelless.pools.lambda_local import LAMBDA_TIER_ID, LocalLambdaTier
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.runtime import decode_array, encode_array
from modelless.selection import InfaasPolicy
from modelless.types import (
    InstanceState,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
    Tier,
    VariantProfile,
    WorkerState,
)
from tests.models import digits, linear_model

APP = "workers-app"
MODEL = "linear"
ARTIFACT_KEY = f"apps/{APP}/{MODEL}/variants/fp32-basic.onnx"
REPORT_WITHIN_S = 3.0
INVOKE_TIMEOUT_S = 20.0

T = TypeVar("T")


# --- helpers ----------------------------------------------------------------------------------


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll ``probe`` until it returns something other than None/False, for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def make_variant(pool: str = "cpu", artifact_key: str = ARTIFACT_KEY, suffix: str = "") -> VariantProfile:
    return VariantProfile(
        variant_id=f"{APP}/{MODEL}/fp32-basic{suffix}/{pool}",
        app_id=APP,
        model_name=MODEL,
        pool=pool,
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=artifact_key,
        size_bytes=len(linear_model()),
        load_latency_ms=20.0,
        # Generous on purpose: a slow first run on a busy CI machine must not read as Interfered.
        latency_p50_ms={1: 2.0, 2: 2.0, 4: 3.0, 8: 4.0},
        latency_p99_ms={1: 5.0, 2: 5.0, 4: 6.0, 8: 8.0},
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )


def sample_inputs(count: int = 4) -> np.ndarray:
    inputs, _ = digits()
    return np.ascontiguousarray(inputs[:count])


def expected_logits(inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(linear_model(), providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(None, {"input": inputs})[0]
    return logits


def payload(variant: VariantProfile, inputs: np.ndarray) -> dict[str, Any]:
    return {
        "variant_id": variant.variant_id,
        "variant": variant.to_json(),
        "inputs_npy_b64": encode_array(inputs),
        "correlation_id": "functional-test",
    }


def reported(store: RedisMetadataStore, worker_id: str) -> WorkerState | None:
    return next((w for w in store.list_workers() if w.worker_id == worker_id), None)


def reported_after(store: RedisMetadataStore, worker_id: str, after: float) -> WorkerState | None:
    """The worker's state if it reported after ``after`` (a ``reported_at`` time)."""
    state = reported(store, worker_id)
    return state if state is not None and state.reported_at > after else None


# --- fixtures ---------------------------------------------------------------------------------


@dataclass
class Setup:
    repository_url: str
    tmp: Path


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    repository = LocalModelRepository(tmp_path / "repo")
    repository.put(ARTIFACT_KEY, linear_model())
    return Setup(str(tmp_path / "repo"), tmp_path)


@pytest.fixture
def pool(setup: Setup, redis_store: RedisMetadataStore) -> Iterator[LocalWorkerPool]:
    # The workers report into the same Redis namespace as the test's store.
    report_url = f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={redis_store.keys.prefix}"
    workers = LocalWorkerPool(
        CPU_POOL,
        setup.repository_url,
        report_url=report_url,
        report_token="",
        log_dir=setup.tmp / "logs",
        cache_dir=setup.tmp / "cache",
    )
    try:
        yield workers
    finally:
        processes = [child.process for child in workers.workers().values()]
        workers.close()
        assert all(p.poll() is not None for p in processes), "a worker process outlived its pool"


@pytest.fixture
def invoker() -> Iterator[HttpWorkerInvoker]:
    client = HttpWorkerInvoker()
    try:
        yield client
    finally:
        client.close()


def make_tier(setup: Setup, concurrency: int) -> LocalLambdaTier:
    return LocalLambdaTier(
        setup.repository_url,
        log_dir=setup.tmp / "lambda-logs",
        cache_dir=setup.tmp / "lambda-cache",
        concurrency=concurrency,
    )


@pytest.fixture
def tier(setup: Setup) -> Iterator[LocalLambdaTier]:
    lambda_tier = make_tier(setup, concurrency=2)
    try:
        yield lambda_tier
    finally:
        processes = [c.child.process for c in lambda_tier._containers]
        lambda_tier.close()
        assert all(p.poll() is not None for p in processes), "a Lambda container outlived its tier"


@pytest.fixture
def single_tier(setup: Setup) -> Iterator[LocalLambdaTier]:
    lambda_tier = make_tier(setup, concurrency=1)
    try:
        yield lambda_tier
    finally:
        lambda_tier.close()


def start_worker(pool: LocalWorkerPool, store: RedisMetadataStore) -> WorkerState:
    pool.scale_to(1)
    [worker_id] = pool.workers()
    return wait_for(lambda: reported(store, worker_id), REPORT_WITHIN_S, f"{worker_id}'s first report")


# --- pool workers -----------------------------------------------------------------------------


def test_worker_starts_and_reports_its_state(pool: LocalWorkerPool, redis_store: RedisMetadataStore) -> None:
    state = start_worker(pool, redis_store)

    child = pool.workers()[state.worker_id]
    assert child.alive()
    assert child.started_ms > 0
    assert state.pool == "cpu"
    assert state.address == child.address
    assert state.free_slots == 2
    assert state.utilisation == 0.0
    assert state.instances == ()
    assert time.time() - state.reported_at < REPORT_WITHIN_S
    assert [w.worker_id for w in redis_store.list_workers("cpu")] == [state.worker_id]
    assert redis_store.list_workers("lambda-cpu") == []


def test_worker_keeps_reporting(pool: LocalWorkerPool, redis_store: RedisMetadataStore) -> None:
    first = start_worker(pool, redis_store)

    later = wait_for(
        lambda: reported_after(redis_store, first.worker_id, first.reported_at),
        REPORT_WITHIN_S,
        "a second report",
    )

    assert later.worker_id == first.worker_id


def test_worker_invocation_returns_correct_logits_and_reports_an_active_instance(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    idle = start_worker(pool, redis_store)
    variant = make_variant()
    inputs = sample_inputs(4)

    first = invoker.invoke(idle.address, payload(variant, inputs), INVOKE_TIMEOUT_S)
    second = invoker.invoke(idle.address, payload(variant, inputs[:1]), INVOKE_TIMEOUT_S)

    np.testing.assert_allclose(
        decode_array(first["outputs_npy_b64"]), expected_logits(inputs), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        decode_array(second["outputs_npy_b64"]), expected_logits(inputs[:1]), rtol=1e-5, atol=1e-5
    )
    assert first["batch"] == 4 and second["batch"] == 1
    assert first["load_ms"] > 0  # the first invocation loaded the variant...
    assert second["load_ms"] == 0  # ...the second found it loaded
    assert first["inference_ms"] > 0

    def active_report() -> WorkerState | None:
        state = reported(redis_store, idle.worker_id)
        if state is None or not state.instances:
            return None
        return state

    busy = wait_for(active_report, REPORT_WITHIN_S, "a report showing the loaded variant")
    [instance] = busy.instances
    assert instance.variant_id == variant.variant_id
    assert instance.state is InstanceState.ACTIVE
    assert instance.qps > 0
    assert instance.queue_length == 0
    assert instance.latency_p99_ms >= instance.latency_p50_ms > 0
    assert busy.free_slots == idle.free_slots - 1
    assert 0 <= busy.utilisation <= 1


def test_worker_answers_a_missing_artifact_with_not_found_and_keeps_serving(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    state = start_worker(pool, redis_store)
    missing = make_variant(artifact_key=f"apps/{APP}/{MODEL}/variants/missing.onnx", suffix="-missing")

    with pytest.raises(ModellessError) as raised:
        invoker.invoke(state.address, payload(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)
    assert raised.value.code == "not_found"
    assert raised.value.status_code == 404

    body = invoker.invoke(state.address, payload(make_variant(), sample_inputs(2)), INVOKE_TIMEOUT_S)
    np.testing.assert_allclose(
        decode_array(body["outputs_npy_b64"]), expected_logits(sample_inputs(2)), rtol=1e-5, atol=1e-5
    )


def test_failed_load_is_not_reported_as_a_loaded_instance(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    state = start_worker(pool, redis_store)
    missing = make_variant(artifact_key=f"apps/{APP}/{MODEL}/variants/missing.onnx", suffix="-missing")
    with pytest.raises(ModellessError):
        invoker.invoke(state.address, payload(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)
    before = reported(redis_store, state.worker_id)
    assert before is not None

    after = wait_for(
        lambda: reported_after(redis_store, state.worker_id, before.reported_at),
        REPORT_WITHIN_S,
        "a report after the failed load",
    )

    assert [i.variant_id for i in after.instances] == []
    assert after.free_slots == state.free_slots


def test_killed_worker_is_unreachable_and_its_state_goes_stale(
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A shorter staleness window than production's, so the test need not wait 10 s.
    monkeypatch.setattr(redis_backend, "WORKER_STALE_AFTER_S", 1.5)
    state = start_worker(pool, redis_store)
    invoker.invoke(state.address, payload(make_variant(), sample_inputs(1)), INVOKE_TIMEOUT_S)

    pool.kill(state.worker_id)

    assert state.worker_id not in pool.workers()
    with pytest.raises(WorkerUnreachableError):
        invoker.invoke(state.address, payload(make_variant(), sample_inputs(1)), 5.0)
    wait_for(lambda: reported(redis_store, state.worker_id) is None, 5.0, "the dead worker to go stale")
    assert redis_store.list_workers("cpu") == []


# --- the dispatcher's retry on the Lambda tier ------------------------------------------------


def publish_linear_model(store: RedisMetadataStore, variant: VariantProfile) -> None:
    inputs = sample_inputs(1)
    model = ModelRecord(
        app_id=APP,
        model_name=MODEL,
        input_name="input",
        input_shape=list(inputs.shape[1:]),
        input_dtype="float32",
        num_classes=10,
        registration_id="reg-linear",
        artifact_key=f"apps/{APP}/{MODEL}/source.onnx",
    )
    registration = Registration("reg-linear", APP, MODEL)
    store.add_model(model, registration)
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [variant.variant_id]
    store.publish_variants(ModelRecord(**{**model.__dict__, "ready": True}), [variant], registration)


def test_dispatcher_retries_on_the_lambda_tier_when_the_worker_dies(
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    tier: LocalLambdaTier,
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    worker = start_worker(pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, tier, extra_workers=None)
    targets = QueryTargets(app_id=APP, min_accuracy=0.5)
    inputs = sample_inputs(3)

    healthy = dispatcher.online_query(targets, inputs)
    assert healthy.tier is Tier.WORKER
    assert healthy.worker_id == worker.worker_id
    assert not healthy.retried
    np.testing.assert_allclose(healthy.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert tier.size == 0

    pool.kill(worker.worker_id)  # its last report is still fresh: selection still picks it
    assert reported(redis_store, worker.worker_id) is not None
    retried = dispatcher.online_query(targets, inputs)

    assert retried.retried
    assert retried.tier is Tier.LAMBDA
    assert retried.worker_id is None
    assert retried.decision.worker_id == worker.worker_id  # what selection chose before it failed
    assert retried.cold_start
    assert retried.timings_ms["cold_start_ms"] > 0
    np.testing.assert_allclose(retried.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert tier.size == 1


def test_dispatcher_does_not_hide_a_dead_worker_without_a_lambda_tier(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    worker = start_worker(pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None)

    pool.kill(worker.worker_id)

    with pytest.raises(WorkerUnreachableError):
        dispatcher.online_query(QueryTargets(app_id=APP), sample_inputs(1))


# --- the local Lambda tier --------------------------------------------------------------------


def test_lambda_tier_cold_start_then_warm(tier: LocalLambdaTier) -> None:
    variant = make_variant(pool="lambda-cpu")
    inputs = sample_inputs(2)

    cold = tier.invoke(payload(variant, inputs), INVOKE_TIMEOUT_S)
    warm = tier.invoke(payload(variant, inputs), INVOKE_TIMEOUT_S)

    assert cold["cold_start"] is True
    assert cold["init_ms"] > 0
    assert cold["load_ms"] > 0
    assert warm["cold_start"] is False
    assert warm["init_ms"] == 0
    assert warm["load_ms"] == 0  # the container kept the loaded session
    for body in (cold, warm):
        np.testing.assert_allclose(
            decode_array(body["outputs_npy_b64"]), expected_logits(inputs), rtol=1e-5, atol=1e-5
        )
    assert tier.size == 1
    assert tier.cold_starts == 1


def test_lambda_tier_honours_its_concurrency_limit(single_tier: LocalLambdaTier) -> None:
    variant = make_variant(pool="lambda-cpu")
    inputs = [sample_inputs(1), sample_inputs(3)]
    results: list[dict[str, Any] | None] = [None, None]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def call(index: int) -> None:
        try:
            barrier.wait(5)
            results[index] = single_tier.invoke(payload(variant, inputs[index]), INVOKE_TIMEOUT_S)
        except BaseException as error:  # re-raised in the test thread below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(INVOKE_TIMEOUT_S * 2)

    assert not any(t.is_alive() for t in threads), "an invocation hung"
    assert errors == []
    assert all(r is not None for r in results)
    assert sorted(bool(r["cold_start"]) for r in results if r is not None) == [False, True]
    for body, batch in zip(results, inputs, strict=True):
        assert body is not None
        np.testing.assert_allclose(
            decode_array(body["outputs_npy_b64"]), expected_logits(batch), rtol=1e-5, atol=1e-5
        )
    assert single_tier.size == 1
    assert single_tier.cold_starts == 1


def test_lambda_tier_concurrency_limit_holds_while_a_container_is_being_registered(
    single_tier: LocalLambdaTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Widen the window between the end of the first spawn and the new container's registration,
    # as a slow scheduler would: the first container's construction waits (bounded) until a
    # second one is constructed, which must not happen under a limit of one.
    real_container = lambda_local._Container
    calls: list[int] = []
    in_window = threading.Event()
    second_built = threading.Event()

    def slow_container(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            in_window.set()
            second_built.wait(2.0)
        else:
            second_built.set()
        return real_container(*args, **kwargs)

    monkeypatch.setattr(lambda_local, "_Container", slow_container)
    variant = make_variant(pool="lambda-cpu")
    results: list[dict[str, Any]] = []

    def call() -> None:
        results.append(single_tier.invoke(payload(variant, sample_inputs(1)), INVOKE_TIMEOUT_S))

    first = threading.Thread(target=call, daemon=True)
    first.start()
    assert in_window.wait(INVOKE_TIMEOUT_S), "the first container never started"
    second = threading.Thread(target=call, daemon=True)
    second.start()
    first.join(INVOKE_TIMEOUT_S)
    second.join(INVOKE_TIMEOUT_S)

    assert len(results) == 2
    assert single_tier.cold_starts == 1
    assert single_tier.size == 1


def test_lambda_tier_state_reports_warm_variants(tier: LocalLambdaTier) -> None:
    empty = tier.state()
    assert empty.worker_id == LAMBDA_TIER_ID
    assert empty.pool == "lambda-cpu"
    assert empty.instances == ()
    assert empty.free_slots == tier.concurrency
    assert empty.utilisation == 0.0
    variant = make_variant(pool="lambda-cpu")

    tier.invoke(payload(variant, sample_inputs(1)), INVOKE_TIMEOUT_S)
    warm = tier.state()

    assert [i.variant_id for i in warm.instances] == [variant.variant_id]
    assert warm.instances[0].state is InstanceState.ACTIVE
    assert warm.free_slots == tier.concurrency - 1
    assert warm.utilisation == 0.0  # nothing is running now
    assert time.time() - warm.reported_at < 1.0


def test_lambda_tier_maps_a_missing_artifact_to_not_found(tier: LocalLambdaTier) -> None:
    missing = make_variant(pool="lambda-cpu", artifact_key="apps/nope/missing.onnx", suffix="-missing")

    with pytest.raises(ModellessError) as raised:
        tier.invoke(payload(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)

    assert raised.value.code == "not_found"
    assert raised.value.status_code == 404
    # The container survives a refused invocation and serves the next one warm.
    body = tier.invoke(payload(make_variant(pool="lambda-cpu"), sample_inputs(1)), INVOKE_TIMEOUT_S)
    assert body["cold_start"] is False
    assert tier.size == 1
