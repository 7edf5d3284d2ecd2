"""The live view of the workers (``modelless.dispatch.live_view``): the snapshot of the store and
its TTL, this gateway's recent variant loads and queries in flight laid over it, hold-outs."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import SATURATED_IN_FLIGHT, Dispatcher
from modelless.dispatch.live_view import FAILED_WORKER_HOLD_S, RECENT_LOAD_S, with_in_flight
from modelless.exceptions import WorkerUnreachableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.selection import InfaasPolicy
from modelless.types import InstanceState, Tier
from tests.unit.dispatch_kit import (
    LAMBDA_OUT,
    WORKER_OUT,
    BlockingWorkers,
    FakeLambda,
    FakeWorkers,
    StateCountingStore,
    batch_of_one,
    live_worker,
    make_instance,
    make_variant,
    make_worker,
    resnet_like,
    seed,
    snapshot_dispatcher,
    targets,
)


@pytest.fixture
def policy() -> InfaasPolicy:
    return InfaasPolicy(DEFAULT_POOLS)


def test_dispatcher_reads_the_live_state_at_most_once_per_snapshot_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.25)

    reads = []
    for _ in range(5):  # 0, 0.125, 0.25, 0.375, 0.5 s (exact in binary: no rounding at the edge)
        assert dispatcher.select(targets(latency=10)).worker_id == "w1"
        reads.append(store.state_reads)
        clock.now += 0.125
    assert reads == [1, 1, 2, 2, 3]


def test_dispatcher_with_no_snapshot_ttl_reads_the_live_state_every_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, _ = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.0)

    for expected in (1, 2, 3):
        dispatcher.select(targets(latency=10))
        assert store.state_reads == expected


def test_dispatcher_sees_new_reports_once_its_snapshot_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.25)
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"

    # w1 reports its instance Overloaded, w2 a healthy one.
    store.put_worker_state(live_worker("w1", make_instance("v", InstanceState.OVERLOADED)))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    clock.now += 0.125
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"  # the snapshot, 0.125 s old
    clock.now += 0.125
    assert dispatcher.select(targets(latency=10)).worker_id == "w2"  # 0.25 s: read again


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


def test_dispatcher_own_loads_are_laid_over_the_snapshot_until_they_expire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", free_slots=1))
    store.put_worker_state(live_worker("w2", free_slots=1))
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.2)

    first = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    assert first.decision.state is InstanceState.INACTIVE
    clock.now += 0.05  # same snapshot: the load is known only to this dispatcher
    second = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    assert (second.decision.state, second.worker_id) == (InstanceState.ACTIVE, first.worker_id)
    assert store.state_reads == 1

    # Each tick the snapshot is read again; the worker never reports the instance.
    for _ in range(int(RECENT_LOAD_S / 0.25) - 1):
        clock.now += 0.25
        assert dispatcher.select(targets(accuracy=0.5)).state is InstanceState.ACTIVE
    clock.now += 0.25  # past RECENT_LOAD_S: the load is forgotten (a new one is needed)
    again = dispatcher.select(targets(accuracy=0.5))
    assert again.state is InstanceState.INACTIVE
    assert dispatcher.live_view._recent_loads == {}


def test_dispatcher_own_load_is_dropped_once_the_worker_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", free_slots=1))
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.2)
    dispatcher.online_query(targets(accuracy=0.5), batch_of_one())

    store.put_worker_state(live_worker("w1", make_instance("v"), free_slots=0))
    clock.now += 0.2
    [worker] = dispatcher.live_view.live_workers()
    assert [i.variant_id for i in worker.instances] == ["v"]  # reported once, not twice
    assert worker.free_slots == 0


def test_dispatcher_leaves_a_failed_worker_out_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": WorkerUnreachableError("connection refused")})
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, workers=workers)
    assert dispatcher.online_query(targets(latency=10), batch_of_one()).worker_id == "w2"

    # w1's report is still fresh in the store, but this dispatcher does not send it queries...
    clock.now += FAILED_WORKER_HOLD_S / 2
    assert dispatcher.select(targets(latency=10)).worker_id == "w2"
    # ...though it still lists it (the workers as reported)...
    assert {w.worker_id for w in dispatcher.live_view.live_workers()} == {"w1", "w2"}
    # ...and its own recent loads, laid over the reports, do not bring it back either.
    dispatcher.live_view.loaded("w2", "other")  # at clock.now
    assert dispatcher.select(targets(latency=10)).worker_id == "w2"
    # Until the hold has passed: a worker that is back must get queries again.
    clock.now += FAILED_WORKER_HOLD_S
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"
    assert dispatcher.live_view._held_out == {}


def test_the_gateways_own_queries_in_flight_count_as_queued(policy: InfaasPolicy) -> None:
    reported = make_worker("w1", make_instance("v"), free_slots=0)  # idle at its last report
    overlaid = with_in_flight(reported, {("w1", "v"): 7})
    assert overlaid.instances[0].state is InstanceState.ACTIVE  # not saturated yet

    decision = policy.get_variant(targets(latency=50), [resnet_like()], [overlaid])

    assert decision.tier is Tier.LAMBDA and decision.state is InstanceState.INACTIVE  # no room


def test_own_queries_saturate_a_batching_instance_at_two_of_its_batches() -> None:
    batching = dataclasses.replace(make_instance("v"), batch_limit=16)
    worker = live_worker("w1", batching)
    below = with_in_flight(worker, {("w1", "v"): SATURATED_IN_FLIGHT})
    assert below.instances[0].state is InstanceState.ACTIVE  # a batch-1 instance would be saturated
    assert below.instances[0].queue_length == SATURATED_IN_FLIGHT
    at = with_in_flight(worker, {("w1", "v"): 32})
    assert at.instances[0].state is InstanceState.OVERLOADED


def test_dispatcher_spills_a_burst_at_once_when_its_own_queries_saturate_an_instance() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))  # reported Active, with no room
    workers, lambda_tier = BlockingWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)
    burst = [
        threading.Thread(target=dispatcher.online_query, args=(targets(accuracy=0.5), batch_of_one()))
        for _ in range(SATURATED_IN_FLIGHT)
    ]
    for thread in burst:
        thread.start()
    for _ in burst:
        assert workers.entered.acquire(timeout=10)

    # The worker still reports its instance Active, but our own queries saturate it: spill.
    spilled = dispatcher.online_query(targets(accuracy=0.5), batch_of_one())
    assert spilled.tier is Tier.LAMBDA and not spilled.retried
    assert spilled.decision.tier is Tier.LAMBDA  # chosen there, not retried there

    workers.release.set()
    for thread in burst:
        thread.join(10)
    # Once the queries are answered the instance takes queries again.
    assert dispatcher.online_query(targets(accuracy=0.5), batch_of_one()).tier is Tier.WORKER


def test_dispatcher_spreads_queries_over_equal_instances_by_its_own_queries_in_flight() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    # Two workers reporting the same instance equally idle: the report alone would send
    # every query of the next second to the same one.
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = BlockingWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, FakeLambda(LAMBDA_OUT))
    first = threading.Thread(target=dispatcher.online_query, args=(targets(accuracy=0.5), batch_of_one()))
    first.start()
    assert workers.entered.acquire(timeout=10)

    second = dispatcher.select(targets(accuracy=0.5))

    workers.release.set()
    first.join(10)
    first_worker = workers.calls[0][0].removeprefix("http://")
    assert {first_worker, second.worker_id} == {"w1", "w2"}  # the second goes to the idle one
