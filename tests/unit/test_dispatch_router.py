"""The Dispatcher (``modelless.dispatch.router``): a decision by the policy over the profile cache
and the live view, run where it says; the errors that say why nothing qualified."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.exceptions import (
    NotFoundError,
    NotReadyError,
    ServiceUnavailableError,
    TargetsUnreachableError,
)
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.selection import InfaasPolicy
from modelless.types import Decision, LambdaTierState, Tier
from tests.unit.dispatch_kit import (
    APP,
    LAMBDA_OUT,
    WORKER_OUT,
    CountingStore,
    FakeLambda,
    FakeWorkers,
    StateCountingStore,
    batch_of_one,
    live_worker,
    make_instance,
    make_variant,
    model_record,
    queued,
    resnet_like,
    seed,
    snapshot_dispatcher,
    targets,
)
from tests.waiting import scaled, wait_for


def test_dispatcher_sends_a_worker_decision_to_the_worker_address() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one(), correlation_id="corr-1")

    assert len(workers.calls) == 1 and lambda_tier.calls == []
    address, invocation = workers.calls[0]
    assert address == "http://w1"
    assert invocation.variant_id == "v"
    assert invocation.variant == make_variant("v")
    np.testing.assert_array_equal(invocation.inputs, batch_of_one())
    assert invocation.correlation_id == "corr-1"
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


def test_dispatcher_spills_to_the_lambda_tier_a_query_an_instances_queue_would_make_late() -> None:
    store = InMemoryMetadataStore()
    seed(store, [resnet_like()])
    store.put_worker_state(live_worker("w1", queued("v", 7), free_slots=0))  # 7 x 7 ms ahead
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=50, accuracy=0.5), batch_of_one())

    assert result.tier is Tier.LAMBDA and workers.calls == []


def test_dispatcher_without_a_lambda_tier_fails_503_when_nothing_has_room() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("full", free_slots=0))
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, None)

    with pytest.raises(ServiceUnavailableError) as caught:
        dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    assert caught.value.status_code == 503
    assert "no Lambda tier is configured" in caught.value.message
    assert workers.calls == []


def test_dispatcher_without_a_lambda_tier_serves_on_a_queued_instance_late_rather_than_refuse() -> None:
    store = InMemoryMetadataStore()
    seed(store, [resnet_like()])
    store.put_worker_state(live_worker("w1", queued("v", 7), free_slots=0))
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, None)

    result = dispatcher.online_query(targets(latency=50, accuracy=0.5), batch_of_one())

    assert result.tier is Tier.WORKER and result.worker_id == "w1"
    assert result.decision.expected_latency_ms == 7.5 + 7 * 7.0
    assert "the quickest, late" in result.decision.reason


# The local tier's view with every container busy and a cold start far past a 50 ms budget.
ALL_CONTAINERS_BUSY = LambdaTierState(idle_by_memory={}, default_memory_mb=1769, cold_start_ms=5_000.0)


def test_dispatcher_answering_late_from_a_queue_warms_a_container_for_the_next_query() -> None:
    # Every container is busy and a cold start would take far longer than the worker's queue:
    # the query goes, late, to the queue, and a warm-up starts a container for the next one
    # (before, only a refusal warmed anything, so a burst's Lambda capacity never grew).
    store = InMemoryMetadataStore()
    seed(store, [resnet_like()])
    store.put_worker_state(live_worker("w1", queued("v", 7), free_slots=0))
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier, lambda_state=lambda: ALL_CONTAINERS_BUSY
    )

    result = dispatcher.online_query(targets(latency=50, accuracy=0.5), batch_of_one())

    assert (result.tier, result.worker_id) == (Tier.WORKER, "w1")
    assert result.decision.expected_latency_ms > 50
    warm_up = wait_for(
        lambda: lambda_tier.calls[0] if lambda_tier.calls else None, scaled(5.0), "the warm-up"
    )
    assert warm_up.variant_id == "v"
    assert warm_up.correlation_id.startswith("warmup-")


class WarmupCountingPolicy(InfaasPolicy):
    """The policy, counting the warm-ups it is asked for (the Dispatcher asks synchronously)."""

    def __init__(self) -> None:
        super().__init__(DEFAULT_POOLS)
        self.warmups = 0

    def warmup(self, *args: Any, **kwargs: Any) -> Decision | None:
        self.warmups += 1
        return super().warmup(*args, **kwargs)


@pytest.mark.parametrize(("queued_ahead", "warmups"), [(2, 0), (7, 1)])
def test_dispatcher_asks_for_a_warm_up_only_when_it_answers_late(queued_ahead: int, warmups: int) -> None:
    # 2 queued: 7.5 + 2 x 7 ms meets the 50 ms budget; 7 queued does not.
    store = InMemoryMetadataStore()
    seed(store, [resnet_like()])
    store.put_worker_state(live_worker("w1", queued("v", queued_ahead), free_slots=0))
    policy = WarmupCountingPolicy()
    dispatcher = Dispatcher(
        store,
        policy,
        FakeWorkers(WORKER_OUT),
        FakeLambda(LAMBDA_OUT),
        lambda_state=lambda: ALL_CONTAINERS_BUSY,
    )

    result = dispatcher.online_query(targets(latency=50, accuracy=0.5), batch_of_one())

    assert (result.tier, result.worker_id) == (Tier.WORKER, "w1")
    assert policy.warmups == warmups


def test_dispatcher_without_a_lambda_tier_prefers_a_worker_with_room_to_a_spill() -> None:
    # The quickest variant's workers are full; a slower one has a worker with room.
    store = InMemoryMetadataStore()
    quick, slower = make_variant("quick", p99=1.0, load_ms=5.0), make_variant("slower", p99=4.0, load_ms=5.0)
    slower = dataclasses.replace(slower, pool="gpu")
    seed(store, [quick, slower])
    store.put_worker_state(live_worker("cpu-full", free_slots=0))
    store.put_worker_state(dataclasses.replace(live_worker("gpu-1", free_slots=1), pool="gpu"))
    with_tier = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    )
    without = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None)

    spilled = with_tier.select(targets(latency=20, accuracy=0.5))
    placed = without.select(targets(latency=20, accuracy=0.5))

    assert (spilled.variant.variant_id, spilled.tier) == ("quick", Tier.LAMBDA)
    assert (placed.variant.variant_id, placed.tier, placed.worker_id) == ("slower", Tier.WORKER, "gpu-1")


def test_dispatcher_miss_from_a_snapshot_is_decided_again_on_a_fresh_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("low", accuracy=0.7)])
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.2)
    dispatcher.select(targets(accuracy=0.5))

    # A model published after the snapshot: its first query must not be refused.
    seed(store, [make_variant("high", model="m2", accuracy=0.95)], name="m2")
    clock.now += 0.05
    assert dispatcher.select(targets(accuracy=0.9)).variant.variant_id == "high"
    assert store.state_reads == 2

    # A real miss reads the store again too, then says why.
    clock.now += 0.05
    with pytest.raises(TargetsUnreachableError):
        dispatcher.select(targets(accuracy=0.99))
    assert store.state_reads == 3


def test_dispatcher_clear_caches_makes_the_next_decision_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    store = CountingStore()
    seed(store, [make_variant("v")])
    dispatcher, _ = snapshot_dispatcher(monkeypatch, store)
    dispatcher.select(targets(accuracy=0.5))
    dispatcher.select(targets(accuracy=0.5))
    assert store.candidate_reads == 1

    dispatcher.clear_caches()
    dispatcher.select(targets(accuracy=0.5))
    assert store.candidate_reads == 2


def test_dispatcher_unknown_model_is_not_found() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None)

    with pytest.raises(NotFoundError) as caught:
        dispatcher.online_query(targets(model="nope"), batch_of_one())
    assert caught.value.status_code == 404
    assert "nope" in caught.value.message
    with pytest.raises(NotFoundError):
        dispatcher.profiles.input_contract(APP, "nope")


def test_dispatcher_app_without_models_is_not_found() -> None:
    dispatcher = Dispatcher(
        InMemoryMetadataStore(), InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None
    )
    with pytest.raises(NotFoundError):
        dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    with pytest.raises(NotFoundError):
        dispatcher.profiles.input_contract(APP, None)


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
