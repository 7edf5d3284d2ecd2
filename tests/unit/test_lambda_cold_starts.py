"""Selection with the Lambda tier's containers in view: a cold start counts.

Two overlapping queries to a warm Lambda variant would start a second container, whose cold start
breaks a tight budget. Where the tier reports its idle containers (the local tier does), a query
whose budget a cold start would break goes to a worker's instance that meets it, then to a warm
idle container, and only then to a cold one, and a decision that needs a cold start expects it.
Without that view (AWS), the tier is taken as warm, as before.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS, LAMBDA_MB_PER_VCPU
from modelless.dispatch import Dispatcher
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.lambda_local import (
    LAMBDA_TIER_ID,
    UNMEASURED_COLD_START_MS,
    LocalLambdaTier,
    _Container,
)
from modelless.pools.processes import ChildProcess
from modelless.selection import NO_LAMBDA_TIER, InfaasPolicy, queue_wait_ms
from modelless.types import InstanceState, LambdaTierState, QueryTargets, Tier, VariantProfile, WorkerState
from tests.unit.dispatch_kit import (
    LAMBDA,
    LAMBDA_OUT,
    WORKER_OUT,
    FakeLambda,
    FakeWorkers,
    batch_of_one,
    live_worker,
    make_instance,
    make_variant,
    make_worker,
    seed,
    targets,
)

COLD_START_MS = 300.0
POLICY = InfaasPolicy(DEFAULT_POOLS)


def on_worker() -> VariantProfile:
    return make_variant("on-worker", p99=2.0, load_ms=20.0, price_per_second=1.0)


def on_lambda() -> VariantProfile:
    # Cheaper than the worker's variant: with every container taken as warm, it is the choice.
    return make_variant("on-lambda", pool=LAMBDA, p99=2.0, load_ms=20.0, price_per_second=0.1)


def tier(*instances: tuple[str, InstanceState], free_slots: int = 1) -> WorkerState:
    """The tier as ``LocalLambdaTier.state`` reports it."""
    return make_worker(
        LAMBDA_TIER_ID,
        *(make_instance(variant_id, state) for variant_id, state in instances),
        pool=LAMBDA,
        free_slots=free_slots,
        address="",
    )


def tier_state(idle: int, full: bool = False) -> LambdaTierState:
    idle_by_memory = {LAMBDA_MB_PER_VCPU: idle} if idle else {}
    return LambdaTierState(idle_by_memory, LAMBDA_MB_PER_VCPU, COLD_START_MS, full)


def test_a_tight_query_prefers_a_workers_instance_to_a_warm_container() -> None:
    worker, function = on_worker(), on_lambda()
    workers = [
        make_worker("w1", make_instance(worker.variant_id)),
        tier((function.variant_id, InstanceState.ACTIVE)),
    ]
    tight = targets(latency=50.0)  # a cold start (300 ms) would break it

    chosen = POLICY.get_variant(tight, [worker, function], workers, lambda_tier=tier_state(idle=1))

    assert (chosen.variant, chosen.tier, chosen.worker_id) == (worker, Tier.WORKER, "w1")
    # Without the tier's view (AWS): the tier is taken as warm, the cheapest wins, as before.
    assert POLICY.get_variant(tight, [worker, function], workers).variant == function


def test_a_loose_query_still_takes_the_cheapest_warm_container() -> None:
    worker, function = on_worker(), on_lambda()
    workers = [
        make_worker("w1", make_instance(worker.variant_id)),
        tier((function.variant_id, InstanceState.ACTIVE)),
    ]

    chosen = POLICY.get_variant(targets(latency=5000.0), [worker, function], workers, tier_state(idle=1))

    assert (chosen.variant, chosen.tier) == (function, Tier.LAMBDA)
    assert chosen.expected_latency_ms == function.latency_ms(1)


def test_a_tight_query_takes_a_warm_idle_container_when_no_worker_instance_meets_it() -> None:
    worker, function = on_worker(), on_lambda()
    workers = [make_worker("w1", free_slots=0), tier((function.variant_id, InstanceState.ACTIVE))]

    chosen = POLICY.get_variant(targets(latency=50.0), [worker, function], workers, tier_state(idle=1))

    assert (chosen.variant, chosen.tier, chosen.state) == (function, Tier.LAMBDA, InstanceState.ACTIVE)


def test_while_its_containers_are_busy_a_worker_load_beats_a_cold_start() -> None:
    # The warm container is running the first of two overlapping queries (Overloaded in the
    # tier's report); a worker has a free slot: loading there (20 ms) beats a new container.
    worker, function = on_worker(), on_lambda()
    workers = [make_worker("w1", free_slots=1), tier((function.variant_id, InstanceState.OVERLOADED))]
    tight = targets(latency=100.0)

    chosen = POLICY.get_variant(tight, [worker, function], workers, lambda_tier=tier_state(idle=0))

    assert (chosen.variant, chosen.tier, chosen.worker_id) == (worker, Tier.WORKER, "w1")
    assert chosen.expected_latency_ms == worker.load_latency_ms + worker.latency_ms(1)
    # Taken as warm (no view), the cheaper Lambda variant would start a second container.
    assert POLICY.get_variant(tight, [worker, function], workers).tier is Tier.LAMBDA


def test_a_decision_needing_a_cold_start_expects_it_and_is_served_late_rather_than_refused() -> None:
    function = on_lambda()
    workers = [tier(free_slots=1)]
    cold = function.load_latency_ms + function.latency_ms(1)

    loose = POLICY.get_variant(targets(latency=5000.0), [function], workers, lambda_tier=tier_state(idle=0))
    tight = POLICY.get_variant(targets(latency=100.0), [function], workers, lambda_tier=tier_state(idle=0))

    assert loose.tier is Tier.LAMBDA and loose.expected_latency_ms == pytest.approx(cold + COLD_START_MS)
    assert "cold start" in loose.reason
    # Nothing else can take it: the cold start is a transient, the query is served late.
    assert tight.tier is Tier.LAMBDA and tight.expected_latency_ms > 100.0


def test_an_idle_container_of_the_variants_memory_size_means_no_cold_start() -> None:
    function = on_lambda()
    bigger = LambdaTierState({2 * LAMBDA_MB_PER_VCPU: 1}, LAMBDA_MB_PER_VCPU, COLD_START_MS)

    warm = POLICY.get_variant(targets(latency=5000.0), [function], [tier()], lambda_tier=tier_state(idle=1))
    other_size = POLICY.get_variant(targets(latency=5000.0), [function], [tier()], lambda_tier=bigger)

    assert warm.expected_latency_ms == function.load_latency_ms + function.latency_ms(1)  # a load only
    assert other_size.expected_latency_ms == warm.expected_latency_ms + COLD_START_MS
    assert bigger.has_idle(dataclasses.replace(function, memory_mb=2 * LAMBDA_MB_PER_VCPU))
    assert not bigger.has_idle(function)  # no memory size of its own: the tier's default


class FakeTier(FakeLambda):
    """A Lambda tier that sees its containers, like the local one."""

    def __init__(self, outputs: np.ndarray, state: LambdaTierState) -> None:
        super().__init__(outputs)
        self.state = state
        self.reads = 0

    def tier_state(self) -> LambdaTierState:
        self.reads += 1
        return self.state


def test_the_dispatcher_reads_the_tiers_containers_on_every_decision() -> None:
    worker, function = on_worker(), on_lambda()
    store = InMemoryMetadataStore()
    seed(store, [worker, function])
    store.put_worker_state(live_worker("w1", make_instance(worker.variant_id)))
    lambda_tier = FakeTier(LAMBDA_OUT, tier_state(idle=1))
    tier_report = tier((function.variant_id, InstanceState.ACTIVE))
    dispatcher = Dispatcher(
        store,
        InfaasPolicy(DEFAULT_POOLS),
        FakeWorkers(WORKER_OUT),
        lambda_tier,
        extra_workers=lambda: [tier_report],
    )
    tight = QueryTargets(app_id=worker.app_id, latency_ms=50.0)

    result = dispatcher.online_query(tight, batch_of_one())

    assert result.tier is Tier.WORKER and lambda_tier.reads == 1
    assert lambda_tier.calls == []
    # A tier that cannot see its containers (AWS) is taken as warm: the cheaper warm function.
    warm_everywhere = Dispatcher(
        store,
        InfaasPolicy(DEFAULT_POOLS),
        FakeWorkers(WORKER_OUT),
        FakeLambda(LAMBDA_OUT),
        extra_workers=lambda: [tier_report],
    )
    assert warm_everywhere.online_query(tight, batch_of_one()).tier is Tier.LAMBDA


# --- the local tier's view of its containers (no processes: containers stood in for) -----------


class StandInChild:
    """Where a container's process would be: alive, started in a known time."""

    def __init__(self, started_ms: float) -> None:
        self.started_ms = started_ms

    def alive(self) -> bool:
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        pass


Container = tuple[set[str], bool, float]  # (variants held, busy, measured start in ms)
StandIn = Callable[..., LocalLambdaTier]


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    """Makes tiers holding stand-in containers; closes them afterwards."""
    made: list[LocalLambdaTier] = []

    def make(*containers: Container) -> LocalLambdaTier:
        lambda_tier = LocalLambdaTier(
            "unused", "unused", tmp_path / "logs", tmp_path / "cache", concurrency=4
        )
        for variants, busy, started_ms in containers:
            child = cast(ChildProcess, StandInChild(started_ms))
            lambda_tier._containers.append(
                _Container(child, LAMBDA_MB_PER_VCPU, busy=busy, variants=variants)
            )
            lambda_tier._cold_start_ms.append(started_ms)
        made.append(lambda_tier)
        return lambda_tier

    yield make
    for lambda_tier in made:
        lambda_tier.close()


def test_the_local_tier_reports_a_variant_active_only_while_a_container_holding_it_is_idle(
    stand_in: StandIn,
) -> None:
    lambda_tier = stand_in(({"a", "b"}, True, 400.0), ({"b"}, False, 600.0))

    state = lambda_tier.state()
    seen = lambda_tier.tier_state()

    states = {i.variant_id: (i.state, i.queue_length) for i in state.instances}
    assert states == {"a": (InstanceState.OVERLOADED, 1), "b": (InstanceState.ACTIVE, 1)}
    assert state.free_slots == 2
    assert seen.idle_by_memory == {LAMBDA_MB_PER_VCPU: 1}
    assert seen.cold_start_ms == 500.0  # the mean of the measured starts


def test_an_invocation_takes_an_idle_container_that_holds_its_variant(stand_in: StandIn) -> None:
    lambda_tier = stand_in(({"a"}, False, 400.0), ({"b"}, False, 400.0))
    lambda_tier._containers[1].last_used += 10.0  # the other one was used last

    container, cold = lambda_tier._acquire(LAMBDA_MB_PER_VCPU, time.monotonic() + 1.0, "a")

    assert container is lambda_tier._containers[0] and not cold
    other, _ = lambda_tier._acquire(LAMBDA_MB_PER_VCPU, time.monotonic() + 1.0, "c")
    assert other is lambda_tier._containers[1]  # none holds it: the warmest idle one


def test_the_local_tier_is_full_once_every_container_it_may_run_is_busy(stand_in: StandIn) -> None:
    # Concurrency 4: an idle container would give its place up to a new one, so only busy ones count.
    assert not stand_in(({"a"}, True, 400.0), ({"b"}, True, 400.0), ({"c"}, False, 400.0)).tier_state().full
    four_busy = stand_in(*[({"a"}, True, 400.0)] * 4)
    assert four_busy.tier_state().full


def test_an_unmeasured_tier_assumes_a_cold_start_until_it_has_measured_one(stand_in: StandIn) -> None:
    assert stand_in().tier_state().cold_start_ms == UNMEASURED_COLD_START_MS


def overloaded(variant: VariantProfile, queued: int) -> WorkerState:
    """A worker whose one instance of ``variant`` is Overloaded with ``queued`` queries on it."""
    instance = make_instance(variant.variant_id, InstanceState.OVERLOADED)
    return make_worker("w1", dataclasses.replace(instance, queue_length=queued), free_slots=0)


def test_an_overloaded_instance_answers_late_rather_than_wait_for_a_full_tiers_container() -> None:
    # The pool's one instance is saturated and the Lambda tier is at its concurrency limit, its
    # containers busy: a query there would wait for one of them, for as long as it runs.
    variant = on_worker()
    worker = overloaded(variant, queued=8)
    workers = [worker, tier(free_slots=0)]

    for tier_view in (tier_state(idle=0, full=True), NO_LAMBDA_TIER):
        chosen = POLICY.get_variant(targets(latency=50.0), [variant], workers, lambda_tier=tier_view)

        assert (chosen.tier, chosen.worker_id, chosen.state) == (Tier.WORKER, "w1", InstanceState.ACTIVE)
        wait = queue_wait_ms(variant, 8, worker.instances[0].batch_limit)
        assert chosen.expected_latency_ms == pytest.approx(variant.latency_ms(1) + wait)
        assert "the quickest, late" in chosen.reason


def test_a_burst_on_an_overloaded_instance_spills_while_the_tier_can_take_it() -> None:
    variant = on_worker()
    # A warm idle container meets the budget: the burst spills there.
    spill = [overloaded(variant, queued=8), tier((variant.variant_id, InstanceState.ACTIVE))]
    chosen = POLICY.get_variant(targets(latency=50.0), [variant], spill, lambda_tier=tier_state(idle=1))
    assert (chosen.tier, chosen.worker_id) == (Tier.LAMBDA, LAMBDA_TIER_ID)
    # No idle container, but room for a new one: a cold start, late, absorbs the burst (the next
    # queries find the container warm) rather than queueing it on the instance.
    cold = [overloaded(variant, queued=8), tier(free_slots=1)]
    chosen = POLICY.get_variant(targets(latency=50.0), [variant], cold, lambda_tier=tier_state(idle=0))
    assert chosen.tier is Tier.LAMBDA
    expected_cold = variant.load_latency_ms + variant.latency_ms(1) + COLD_START_MS
    assert chosen.expected_latency_ms == pytest.approx(expected_cold)
