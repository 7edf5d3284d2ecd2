"""InfaasPolicy.get_variant (INFaaS §4.1) on hand-built profiles, and the Dispatcher around it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import modelless.dispatcher as dispatcher_module
from modelless.dispatcher import Dispatcher
from modelless.exceptions import (
    NotFoundError,
    NotReadyError,
    ServiceUnavailableError,
    TargetsUnreachableError,
)
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.pools.invokers import WorkerUnreachableError
from modelless.runtime import decode_array, encode_array
from modelless.selection import InfaasPolicy, closest_variant
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
    Tier,
    VariantProfile,
    WorkerState,
)

APP = "app"
CPU = "cpu"
LAMBDA = "lambda-cpu"


# --- factories --------------------------------------------------------------------------------


def make_variant(
    variant_id: str,
    *,
    model: str = "m",
    pool: str = CPU,
    accuracy: float = 0.9,
    p99: float | dict[int, float] = 1.0,
    load_ms: float = 10.0,
    price_per_second: float = 1.0,
    request_price: float = 0.0,
    max_batch: int = 8,
    app: str = APP,
) -> VariantProfile:
    """A profile whose p99 at batch 1 is ``p99`` (and twice that at ``max_batch``), unless a
    whole table is given."""
    if isinstance(p99, dict):
        table = dict(p99)
    else:
        table = {1: p99} if max_batch == 1 else {1: p99, max_batch: p99 * 2}
    return VariantProfile(
        variant_id=variant_id,
        app_id=app,
        model_name=model,
        pool=pool,
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key=f"apps/{app}/{model}/variants/{variant_id}.onnx",
        size_bytes=1000,
        load_latency_ms=load_ms,
        latency_p50_ms={b: v / 2 for b, v in table.items()},
        latency_p99_ms=table,
        peak_memory_mb=10.0,
        accuracy=accuracy,
        price_per_second=price_per_second,
        request_price=request_price,
        hardware="test",
        measured_on_target=True,
    )


def make_instance(variant_id: str, state: InstanceState = InstanceState.ACTIVE) -> InstanceStats:
    return InstanceStats(variant_id, state, qps=1.0, latency_p50_ms=1.0, latency_p99_ms=1.0, queue_length=0)


def make_worker(
    worker_id: str,
    *instances: InstanceStats,
    pool: str = CPU,
    utilisation: float = 0.1,
    free_slots: int = 2,
    address: str | None = None,
    reported_at: float = 0.0,
) -> WorkerState:
    return WorkerState(
        worker_id=worker_id,
        pool=pool,
        address=address if address is not None else f"http://{worker_id}",
        utilisation=utilisation,
        free_slots=free_slots,
        reported_at=reported_at,
        instances=tuple(instances),
    )


def targets(
    latency: float | None = None, accuracy: float = 0.0, model: str | None = None, batch: int = 1
) -> QueryTargets:
    return QueryTargets(app_id=APP, latency_ms=latency, min_accuracy=accuracy, model_name=model, batch=batch)


@pytest.fixture
def policy() -> InfaasPolicy:
    return InfaasPolicy(DEFAULT_POOLS)


# --- Active instances -------------------------------------------------------------------------


def test_active_instance_preferred_over_a_faster_inactive_variant(policy: InfaasPolicy) -> None:
    fast_inactive = make_variant("fast", p99=0.5, load_ms=1.0, price_per_second=0.1)
    loaded = make_variant("loaded", p99=5.0, load_ms=50.0, price_per_second=10.0)
    workers = [make_worker("w1", make_instance("loaded"))]

    decision = policy.get_variant(targets(latency=20), [fast_inactive, loaded], workers)

    assert decision.variant.variant_id == "loaded"
    assert decision.state is InstanceState.ACTIVE
    assert decision.tier is Tier.WORKER
    assert decision.worker_id == "w1"
    assert decision.worker_address == "http://w1"
    assert decision.expected_latency_ms == 5.0


def test_among_active_the_cheapest_meeting_the_latency_wins(policy: InfaasPolicy) -> None:
    too_slow = make_variant("too-slow", p99=30.0, price_per_second=0.001)  # cheapest, misses budget
    mid = make_variant("mid", p99=5.0, price_per_second=1.0)
    pricey = make_variant("pricey", p99=2.0, price_per_second=5.0)
    workers = [
        make_worker("w1", make_instance("too-slow"), make_instance("pricey")),
        make_worker("w2", make_instance("mid")),
    ]

    decision = policy.get_variant(targets(latency=10), [too_slow, mid, pricey], workers)

    assert decision.variant.variant_id == "mid"
    assert decision.worker_id == "w2"
    assert decision.state is InstanceState.ACTIVE


def test_cost_per_query_counts_the_request_fee(policy: InfaasPolicy) -> None:
    # Same per-second price and latency: the per-request fee decides.
    with_fee = make_variant("with-fee", request_price=0.01)
    without_fee = make_variant("without-fee")
    workers = [make_worker("w1", make_instance("with-fee"), make_instance("without-fee"))]

    decision = policy.get_variant(targets(latency=10), [with_fee, without_fee], workers)

    assert decision.variant.variant_id == "without-fee"


def test_among_workers_running_the_same_variant_the_least_utilised_wins(policy: InfaasPolicy) -> None:
    v = make_variant("v")
    workers = [
        make_worker("busy", make_instance("v"), utilisation=0.7),
        make_worker("idle", make_instance("v"), utilisation=0.2, address="http://10.0.0.2:9000"),
        make_worker("mid", make_instance("v"), utilisation=0.4),
    ]

    decision = policy.get_variant(targets(latency=10), [v], workers)

    assert decision.worker_id == "idle"
    assert decision.worker_address == "http://10.0.0.2:9000"


@pytest.mark.parametrize("bad_state", [InstanceState.OVERLOADED, InstanceState.INTERFERED])
def test_overloaded_and_interfered_instances_are_skipped(
    policy: InfaasPolicy, bad_state: InstanceState
) -> None:
    cheap = make_variant("cheap", price_per_second=0.01)
    healthy = make_variant("healthy", price_per_second=5.0)
    workers = [
        make_worker("w-bad", make_instance("cheap", bad_state), utilisation=0.0),
        make_worker("w-ok", make_instance("healthy"), utilisation=0.9),
    ]

    decision = policy.get_variant(targets(latency=10), [cheap, healthy], workers)

    assert decision.variant.variant_id == "healthy"
    assert decision.worker_id == "w-ok"
    assert decision.state is InstanceState.ACTIVE


@pytest.mark.parametrize("bad_state", [InstanceState.OVERLOADED, InstanceState.INTERFERED])
def test_only_unhealthy_instances_means_a_new_instance_elsewhere(
    policy: InfaasPolicy, bad_state: InstanceState
) -> None:
    v = make_variant("v", p99=1.0, load_ms=5.0)
    workers = [
        make_worker("holder", make_instance("v", bad_state), utilisation=0.0, free_slots=3),
        make_worker("other", utilisation=0.5, free_slots=1),
    ]

    decision = policy.get_variant(targets(latency=10), [v], workers)

    assert decision.state is InstanceState.INACTIVE
    assert decision.worker_id == "other"  # never a second copy on the worker that already holds it
    assert decision.expected_latency_ms == 6.0


def test_active_instance_on_a_lambda_pool_worker_runs_on_the_lambda_tier(policy: InfaasPolicy) -> None:
    v = make_variant("v", pool=LAMBDA)
    workers = [make_worker("lambda-tier", make_instance("v"), pool=LAMBDA, address="")]

    decision = policy.get_variant(targets(latency=10), [v], workers)

    assert decision.tier is Tier.LAMBDA
    assert decision.state is InstanceState.ACTIVE
    assert decision.worker_address is None


# --- Inactive variants ------------------------------------------------------------------------


def test_inactive_chooses_the_lowest_load_plus_inference_latency_within_budget(policy: InfaasPolicy) -> None:
    slow_load = make_variant("slow-load", p99=1.0, load_ms=50.0, price_per_second=0.01)  # 51 ms
    quick = make_variant("quick", p99=5.0, load_ms=10.0, price_per_second=3.0)  # 15 ms
    quicker_but_over = make_variant("over", p99=100.0, load_ms=0.0)  # 100 ms > budget
    workers = [make_worker("w1", free_slots=1)]

    decision = policy.get_variant(targets(latency=60), [slow_load, quick, quicker_but_over], workers)

    assert decision.variant.variant_id == "quick"
    assert decision.state is InstanceState.INACTIVE
    assert decision.expected_latency_ms == 15.0


def test_inactive_load_latency_counts_against_the_budget(policy: InfaasPolicy) -> None:
    # 2 ms inference would meet 10 ms, but not with a 20 ms load first.
    v = make_variant("v", p99=2.0, load_ms=20.0)
    with pytest.raises(TargetsUnreachableError):
        policy.get_variant(targets(latency=10), [v], [make_worker("w1")])


def test_inactive_is_placed_on_the_least_utilised_worker_of_its_pool_with_room(policy: InfaasPolicy) -> None:
    v = make_variant("v", pool=CPU)
    workers = [
        make_worker("full", utilisation=0.0, free_slots=0),
        make_worker("holds-it", make_instance("v", InstanceState.OVERLOADED), utilisation=0.01),
        make_worker("other-pool", pool="gpu", utilisation=0.0),
        make_worker("busy", utilisation=0.8, free_slots=1),
        make_worker("light", utilisation=0.3, free_slots=1, address="http://light:1"),
    ]

    decision = policy.get_variant(targets(latency=100), [v], workers)

    assert decision.tier is Tier.WORKER
    assert decision.worker_id == "light"
    assert decision.worker_address == "http://light:1"
    assert decision.state is InstanceState.INACTIVE


def test_inactive_spills_to_the_lambda_tier_when_no_worker_of_the_pool_has_room(
    policy: InfaasPolicy,
) -> None:
    v = make_variant("v", pool=CPU)
    workers = [
        make_worker("full", free_slots=0),
        make_worker("gpu-worker", pool="gpu", free_slots=4),
    ]

    decision = policy.get_variant(targets(latency=100), [v], workers)

    assert decision.tier is Tier.LAMBDA
    assert decision.worker_id is None
    assert decision.worker_address is None
    assert decision.state is InstanceState.INACTIVE
    assert "spilled to the Lambda tier" in decision.reason


def test_no_workers_at_all_spills_to_the_lambda_tier(policy: InfaasPolicy) -> None:
    decision = policy.get_variant(targets(accuracy=0.5), [make_variant("v")], [])
    assert decision.tier is Tier.LAMBDA
    assert decision.worker_id is None


def test_lambda_pool_variants_go_to_the_lambda_tier_even_when_workers_have_room(
    policy: InfaasPolicy,
) -> None:
    v = make_variant("v", pool=LAMBDA, load_ms=1.0)
    workers = [make_worker("w1", pool=CPU, free_slots=4), make_worker("w2", pool=LAMBDA, free_slots=4)]

    decision = policy.get_variant(targets(latency=100), [v], workers)

    assert decision.tier is Tier.LAMBDA
    assert decision.worker_id is None
    assert "spilled" not in decision.reason


# --- filters ----------------------------------------------------------------------------------


def test_accuracy_filter_skips_cheaper_inaccurate_variants(policy: InfaasPolicy) -> None:
    inaccurate = make_variant("inaccurate", accuracy=0.80, price_per_second=0.01)
    accurate = make_variant("accurate", accuracy=0.95, price_per_second=9.0)
    workers = [make_worker("w1", make_instance("inaccurate"), make_instance("accurate"))]

    assert policy.get_variant(targets(accuracy=0.9), [inaccurate, accurate], workers).variant is accurate
    assert policy.get_variant(targets(accuracy=0.8), [inaccurate, accurate], workers).variant is inaccurate


def test_named_model_filter(policy: InfaasPolicy) -> None:
    other_model = make_variant("a-cheap", model="a", price_per_second=0.01)
    named = make_variant("b-pricey", model="b", price_per_second=9.0)
    workers = [make_worker("w1", make_instance("a-cheap"), make_instance("b-pricey"))]

    assert policy.get_variant(targets(model="b"), [other_model, named], workers).variant is named
    assert policy.get_variant(targets(), [other_model, named], workers).variant is other_model


def test_batch_larger_than_max_batch_is_excluded(policy: InfaasPolicy) -> None:
    small = make_variant("small", max_batch=4, price_per_second=0.01)
    large = make_variant("large", max_batch=16, price_per_second=9.0)
    workers = [make_worker("w1", make_instance("small"), make_instance("large"))]

    assert policy.get_variant(targets(batch=4), [small, large], workers).variant is small
    assert policy.get_variant(targets(batch=5), [small, large], workers).variant is large


def test_batch_latency_is_the_next_profiled_batch_size_up(policy: InfaasPolicy) -> None:
    v = make_variant("v", p99={1: 1.0, 4: 3.0, 8: 6.0})
    workers = [make_worker("w1", make_instance("v"))]

    decision = policy.get_variant(targets(latency=5, batch=3), [v], workers)
    assert decision.expected_latency_ms == 3.0
    # batch 5 lands on the 8-row, 6 ms, over a 5 ms budget (and loading does not help).
    with pytest.raises(TargetsUnreachableError):
        policy.get_variant(targets(latency=5, batch=5), [v], workers)


# --- unreachable targets ----------------------------------------------------------------------


def test_unreachable_accuracy_names_the_closest_variant(policy: InfaasPolicy) -> None:
    fast_low = make_variant("fast-low", accuracy=0.80, p99=1.0)
    slow_high = make_variant("slow-high", accuracy=0.93, p99=50.0, load_ms=100.0)

    with pytest.raises(TargetsUnreachableError) as caught:
        policy.get_variant(targets(latency=5, accuracy=0.95), [fast_low, slow_high], [])

    error = caught.value
    assert error.status_code == 422
    # Accuracy shortfall counts first: 0.02 short beats 0.15 short however slow it is.
    closest = error.details["closest"]
    assert closest["variant"] == "slow-high"
    assert closest["model"] == "m"
    assert closest["accuracy"] == 0.93
    assert closest["latency_ms"] == 50.0
    assert closest["cold_latency_ms"] == 150.0
    assert error.details["requested"] == {"accuracy": 0.95, "latency_ms": 5, "model": None, "batch": 1}
    assert "slow-high" in error.message


def test_unreachable_latency_names_the_least_overshooting_variant(policy: InfaasPolicy) -> None:
    a = make_variant("a", p99=12.0, load_ms=100.0)
    b = make_variant("b", p99=20.0, load_ms=0.0)

    with pytest.raises(TargetsUnreachableError) as caught:
        policy.get_variant(targets(latency=10), [a, b], [])

    assert caught.value.details["closest"]["variant"] == "a"


def test_closest_variant_accuracy_shortfall_before_latency_overshoot() -> None:
    accurate_slow = make_variant("accurate-slow", accuracy=0.94, p99=1000.0)
    fast_inaccurate = make_variant("fast-inaccurate", accuracy=0.90, p99=1.0)
    assert closest_variant(targets(latency=2, accuracy=0.95), [fast_inaccurate, accurate_slow]) is (
        accurate_slow
    )


def test_closest_variant_ties_on_accuracy_are_broken_by_latency_overshoot() -> None:
    # Both meet the accuracy (gap 0): the smaller relative latency overshoot wins.
    near = make_variant("z-near", accuracy=0.99, p99=11.0)
    far = make_variant("a-far", accuracy=0.99, p99=30.0)
    assert closest_variant(targets(latency=10, accuracy=0.9), [far, near]) is near


def test_closest_variant_ignores_variants_that_cannot_take_the_batch() -> None:
    small = make_variant("small", accuracy=0.99, max_batch=2)
    big = make_variant("big", accuracy=0.5, max_batch=32)
    assert closest_variant(targets(accuracy=0.99, batch=8), [small, big]) is big
    assert closest_variant(targets(batch=64), [small, big]) is None


def test_unreachable_batch_error_without_a_closest_variant(policy: InfaasPolicy) -> None:
    with pytest.raises(TargetsUnreachableError) as caught:
        policy.get_variant(targets(batch=64), [make_variant("v", max_batch=8)], [])
    assert "closest" not in caught.value.details
    assert "batch of 64" in caught.value.message


def test_warmup_names_the_cheapest_variant_that_meets_the_targets_once_loaded(policy: InfaasPolicy) -> None:
    cheap = make_variant("cheap", p99=2.0, load_ms=50.0, price_per_second=0.1)
    pricey = make_variant("pricey", p99=2.0, load_ms=1.0, price_per_second=5.0)
    too_slow = make_variant("too-slow", p99=20.0, price_per_second=0.0)

    warm = policy.warmup(targets(latency=10), [cheap, pricey, too_slow], [make_worker("w1")])

    assert warm is not None
    assert warm.variant is cheap
    assert warm.worker_id == "w1"
    assert policy.warmup(targets(latency=1), [cheap, pricey, too_slow], []) is None


# --- Dispatcher -------------------------------------------------------------------------------


def reply(outputs: np.ndarray, **extra: Any) -> dict[str, Any]:
    """A compute reply in the runtime's invocation format."""
    return {
        "outputs_npy_b64": encode_array(outputs),
        "batch": int(outputs.shape[0]),
        "queue_ms": 0.25,
        "inference_ms": 1.5,
        "load_ms": 0.0,
        **extra,
    }


class FakeWorkers:
    """A WorkerInvoker: records calls, answers with fixed outputs or raises a given error."""

    def __init__(self, outputs: np.ndarray, error: Exception | None = None) -> None:
        self.outputs = outputs
        self.error = error
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def invoke(self, address: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls.append((address, payload))
        if self.error is not None:
            raise self.error
        return reply(self.outputs)


class FakeLambda:
    """A LambdaInvoker: records calls, answers as a cold start."""

    def __init__(self, outputs: np.ndarray) -> None:
        self.outputs = outputs
        self.calls: list[dict[str, Any]] = []

    def invoke(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls.append(payload)
        return reply(self.outputs, cold_start=True, init_ms=7.0)


class CountingStore(InMemoryMetadataStore):
    """Counts the reads of static profiles (the dispatcher reads an app's profiles as a whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.candidate_reads = 0

    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]:
        self.candidate_reads += 1
        return super().list_variants(app_id, model_name)


class FakeClock:
    """Stands in for the dispatcher's ``time`` module: a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.perf_counter = time.perf_counter

    def monotonic(self) -> float:
        return self.now


WORKER_OUT = np.arange(10, dtype=np.float32).reshape(1, 10)
LAMBDA_OUT = np.arange(10, dtype=np.float32)[::-1].reshape(1, 10).copy()


def model_record(name: str = "m", ready: bool = True) -> tuple[ModelRecord, Registration]:
    registration = Registration(f"reg-{name}", APP, name, status=RegistrationStatus.QUEUED)
    record = ModelRecord(
        app_id=APP,
        model_name=name,
        input_name="input",
        input_shape=[4],
        input_dtype="float32",
        num_classes=10,
        registration_id=registration.registration_id,
        artifact_key=f"apps/{APP}/{name}/source.onnx",
        ready=ready,
    )
    return record, registration


def seed(store: InMemoryMetadataStore, variants: Sequence[VariantProfile], name: str = "m") -> None:
    record, registration = model_record(name, ready=False)
    store.add_model(record, registration)
    store.publish_variants(dataclasses.replace(record, ready=True), list(variants), registration)


def live_worker(worker_id: str, *instances: InstanceStats, free_slots: int = 2) -> WorkerState:
    # The store only lists workers that reported within the last few seconds.
    return make_worker(worker_id, *instances, free_slots=free_slots, reported_at=time.time())


def batch_of_one() -> np.ndarray:
    return np.zeros((1, 4), dtype=np.float32)


def test_dispatcher_sends_a_worker_decision_to_the_worker_address() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one(), correlation_id="corr-1")

    assert len(workers.calls) == 1 and lambda_tier.calls == []
    address, payload = workers.calls[0]
    assert address == "http://w1"
    assert payload["variant_id"] == "v"
    assert VariantProfile.from_json(payload["variant"]) == make_variant("v")
    np.testing.assert_array_equal(decode_array(payload["inputs_npy_b64"]), batch_of_one())
    assert payload["correlation_id"] == "corr-1"
    assert result.tier is Tier.WORKER
    assert result.worker_id == "w1"
    assert result.retried is False
    assert result.cold_start is False
    assert result.query_id == "corr-1"
    np.testing.assert_array_equal(result.outputs, WORKER_OUT)
    assert result.timings_ms["inference_ms"] == 1.5
    assert result.timings_ms["queue_ms"] == 0.25
    assert set(result.timings_ms) == {
        "selection_ms",
        "queue_ms",
        "load_ms",
        "cold_start_ms",
        "inference_ms",
        "transport_ms",
        "total_ms",
    }
    assert result.timings_ms["selection_ms"] >= 0


def test_dispatcher_spill_runs_on_the_lambda_tier() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])  # no worker reports: nowhere to load it
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())

    assert workers.calls == []
    assert len(lambda_tier.calls) == 1
    assert result.tier is Tier.LAMBDA
    assert result.worker_id is None
    assert result.cold_start is True
    assert result.timings_ms["cold_start_ms"] == 7.0
    np.testing.assert_array_equal(result.outputs, LAMBDA_OUT)


def test_dispatcher_retries_an_unreachable_worker_on_the_lambda_tier() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, error=WorkerUnreachableError("connection refused"))
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one())

    assert len(workers.calls) == 1
    assert len(lambda_tier.calls) == 1
    assert lambda_tier.calls[0] == workers.calls[0][1]  # the same payload, not re-encoded
    assert result.retried is True
    assert result.tier is Tier.LAMBDA
    assert result.worker_id is None
    assert result.decision.worker_id == "w1"
    np.testing.assert_array_equal(result.outputs, LAMBDA_OUT)


def test_dispatcher_without_a_lambda_tier_fails_503_when_the_worker_is_unreachable() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, error=WorkerUnreachableError("connection refused"))
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, None)

    with pytest.raises(ServiceUnavailableError) as caught:
        dispatcher.online_query(targets(latency=10), batch_of_one())
    assert caught.value.status_code == 503


def test_dispatcher_without_a_lambda_tier_fails_503_when_nothing_has_room() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("full", free_slots=0))
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, None)

    with pytest.raises(ServiceUnavailableError) as caught:
        dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    assert caught.value.status_code == 503
    assert workers.calls == []


def test_dispatcher_does_not_retry_other_worker_errors() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, error=RuntimeError("model crashed"))
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    with pytest.raises(RuntimeError):
        dispatcher.online_query(targets(latency=10), batch_of_one())
    assert lambda_tier.calls == []


def test_dispatcher_remembers_its_own_loads_until_the_worker_reports_them() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", free_slots=1))
    store.put_worker_state(live_worker("w2", free_slots=1))
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, FakeLambda(LAMBDA_OUT))

    first = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    second = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())

    assert first.decision.state is InstanceState.INACTIVE
    assert second.decision.state is InstanceState.ACTIVE
    assert second.worker_id == first.worker_id  # no second copy loaded on the other worker


def test_dispatcher_unknown_model_is_not_found() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None)

    with pytest.raises(NotFoundError) as caught:
        dispatcher.online_query(targets(model="nope"), batch_of_one())
    assert caught.value.status_code == 404
    assert "nope" in caught.value.message
    with pytest.raises(NotFoundError):
        dispatcher.input_contract(APP, "nope")


def test_dispatcher_app_without_models_is_not_found() -> None:
    dispatcher = Dispatcher(
        InMemoryMetadataStore(), InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None
    )
    with pytest.raises(NotFoundError):
        dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    with pytest.raises(NotFoundError):
        dispatcher.input_contract(APP, None)


@pytest.mark.parametrize("named", [True, False])
def test_dispatcher_model_still_profiling_is_not_ready(named: bool) -> None:
    store = InMemoryMetadataStore()
    record, registration = model_record("m", ready=False)
    store.add_model(record, registration)
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, FakeLambda(LAMBDA_OUT))

    with pytest.raises(NotReadyError) as caught:
        dispatcher.online_query(targets(accuracy=0.5, model="m" if named else None), batch_of_one())
    assert caught.value.status_code == 409
    assert workers.calls == []


def test_dispatcher_unreachable_targets_name_the_closest_of_all_variants() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("low", accuracy=0.7), make_variant("high", accuracy=0.9)])
    dispatcher = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    )

    with pytest.raises(TargetsUnreachableError) as caught:
        dispatcher.online_query(targets(accuracy=0.99), batch_of_one())
    assert caught.value.details["closest"]["variant"] == "high"


def test_dispatcher_candidates_cache_honours_the_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(dispatcher_module, "time", clock)
    store = CountingStore()
    seed(store, [make_variant("v")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None, cache_ttl_s=60)
    version = store.profiles_version(APP)
    query = targets(accuracy=0.5)

    first = dispatcher.candidates(query, version)
    clock.now += 59
    second = dispatcher.candidates(query, version)
    assert store.candidate_reads == 1
    assert first is second

    clock.now += 2  # 61 s after the first read: expired
    dispatcher.candidates(query, version)
    assert store.candidate_reads == 2


def test_dispatcher_candidates_cache_is_revalidated_by_the_profiles_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatcher_module, "time", FakeClock())
    store = CountingStore()
    seed(store, [make_variant("v1")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None, cache_ttl_s=60)
    query = targets(accuracy=0.5)

    before = dispatcher.candidates(query, store.profiles_version(APP))
    seed(store, [make_variant("v2", model="m2")], name="m2")  # bumps the version
    after = dispatcher.candidates(query, store.profiles_version(APP))

    assert [v.variant_id for v in before] == ["v1"]
    assert [v.variant_id for v in after] == ["v1", "v2"]
    assert store.candidate_reads == 2


def test_dispatcher_candidates_cache_is_keyed_by_accuracy_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher_module, "time", FakeClock())
    store = CountingStore()
    seed(store, [make_variant("low", accuracy=0.6), make_variant("high", accuracy=0.95)])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None)
    version = store.profiles_version(APP)

    assert [v.variant_id for v in dispatcher.candidates(targets(accuracy=0.5), version)] == ["high", "low"]
    assert [v.variant_id for v in dispatcher.candidates(targets(accuracy=0.9), version)] == ["high"]
    assert dispatcher.candidates(targets(accuracy=0.5, model="other"), version) == []
    # One read of the app's profiles serves every target: the lists share its objects.
    assert store.candidate_reads == 1
