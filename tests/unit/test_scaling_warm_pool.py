"""The Lambda warm pool: how many containers the scaler keeps warm per variant for the bursts a
cold start cannot take in time, and that each tick tells the pool (on a fake clock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import poisson

from modelless.catalog import DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.warm import InvokingWarmPool
from modelless.query_load import PEAK_SLICE_S
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.scaling.problem import lambda_choice
from modelless.scaling.warm_pool import WARM_QUANTILE, WarmDemand, burst_rate, containers_for, warm_containers
from modelless.serving.invocation import Invocation, Reply
from modelless.types import VariantProfile
from tests.unit.test_scaler import GROUP, FakeProvider, profile, store  # noqa: F401 (a fixture)


class RecordingWarmPool:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, int], dict[str, VariantProfile]]] = []

    def keep_warm(self, containers: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        self.calls.append((dict(containers), dict(profiles)))


@pytest.mark.parametrize("offered", [0.01, 0.3, 1.0, 4.0, 37.5, 400.0])
def test_the_containers_are_the_busy_ones_poisson_quantile_and_one_for_the_arrival(offered: float) -> None:
    busy = containers_for(offered) - 1
    assert poisson.cdf(busy, offered) >= WARM_QUANTILE > poisson.cdf(busy - 1, offered)


def test_no_load_needs_no_container_and_any_load_at_least_one() -> None:
    assert containers_for(0.0) == 0 and containers_for(-1.0) == 0 and containers_for(float("nan")) == 0
    assert containers_for(1e-6) == 1


def test_a_burst_rate_is_the_busiest_slice_per_second_never_below_the_mean() -> None:
    assert burst_rate([0, 3, 1], 2.0) == pytest.approx(3 / PEAK_SLICE_S)
    assert burst_rate([], 2.0) == 2.0 and burst_rate([0, 0], 0.0) == 0.0


def test_one_memory_sizes_variants_share_its_containers_sized_for_their_loads_together() -> None:
    demands = [
        WarmDemand("v", 1769, 100.0, 0.02),
        WarmDemand("v", 1769, 50.0, 0.02),
        WarmDemand("w", 1769, 10.0, 0.1),
        WarmDemand("big", 3538, 20.0, 0.1),
    ]
    wanted = warm_containers(demands)
    small, large = containers_for(3.0 + 1.0), containers_for(2.0)
    assert wanted == {"v": small, "w": small, "big": large}  # pooled: fewer than apart
    assert small < containers_for(3.0) + containers_for(1.0)
    assert warm_containers([WarmDemand("idle", 1769, 0.0, 0.05)]) == {}
    capped = warm_containers(demands, limit=6)
    assert capped["v"] == capped["w"] and capped["v"] + capped["big"] <= 6 and capped["big"] >= 1
    assert capped["v"] > capped["big"]


def test_the_lambda_choice_is_the_cheapest_within_the_budget_then_the_quicker() -> None:
    slow_cheap = profile("slow", "lambda-cpu", 40.0)
    quick = profile("quick", "lambda-cpu", 5.0)
    assert lambda_choice([slow_cheap, quick], 50.0) == quick  # cheaper per query: it runs shorter
    assert lambda_choice([slow_cheap, quick], 4.0) is None
    assert lambda_choice([slow_cheap], 50.0) == slow_cheap


def clumped(store: InMemoryMetadataStore, qps: int, clump: int, start: int = 1000, seconds: int = 60) -> None:  # noqa: F811
    for second in range(start, start + seconds):
        store.add_load({GROUP.key: qps}, second, {GROUP.key: clump})


def test_each_tick_keeps_warm_what_the_clumps_need_where_a_cold_start_misses_the_budget(
    store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    clumped(store, qps=20, clump=8)  # 20 q/s, 8 of them in one 100 ms slice each second
    pools = {}
    for init_ms in (500.0, 5.0):  # a cold start that does not fit the 50 ms budget, and one that does
        pool = pools[init_ms] = RecordingWarmPool()
        config = ScalerConfig(window_s=30, max_workers={"cpu": 4}, lambda_init_ms=init_ms)
        scaler = Scaler(store, FakeProvider({"cpu": 0}), DEFAULT_POOLS, config, warm_pool=pool)
        report = scaler.tick(now=1060.5)
        assert pool.calls == [(report.lambda_warm, pool.calls[0][1])]
    ((late, profiles),) = pools[500.0].calls
    lambda_variant = "app/m/fast/lambda-cpu"
    seconds = profiles[lambda_variant].latency_ms(1) / 1000
    assert late == {lambda_variant: containers_for(8 / PEAK_SLICE_S * seconds)}
    assert pools[5.0].calls == [({}, {})]  # a cold start fits: Lambda grows with the burst itself


def test_the_warm_pool_follows_the_clumps_down_when_they_stop(store: InMemoryMetadataStore) -> None:  # noqa: F811
    clumped(store, qps=20, clump=20, start=1000, seconds=60)
    clumped(store, qps=1, clump=1, start=1060, seconds=120)
    pool = RecordingWarmPool()
    config = ScalerConfig(window_s=30, max_workers={"cpu": 4}, lambda_init_ms=500.0)
    scaler = Scaler(store, FakeProvider({"cpu": 0}), DEFAULT_POOLS, config, warm_pool=pool)
    busy = scaler.tick(now=1060.5).lambda_warm
    quiet = scaler.tick(now=1180.5).lambda_warm  # past the envelope's 60 s history
    assert sum(busy.values()) > sum(quiet.values()) >= 1
    assert scaler.tick(now=1180.5).summary()["lambda_warm"] == quiet
    assert len(pool.calls) == 3


class BlockingLambda:
    """Counts warm-up invocations; each holds its container until released, as concurrent
    invocations on Lambda each hold their own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.invocations: list[Invocation] = []
        self.in_flight = 0
        self.most_at_once = 0
        self.release = threading.Event()
        self.fail = False

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        with self.lock:
            self.invocations.append(invocation)
            self.in_flight += 1
            self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            self.release.wait(5.0)
            if self.fail:
                raise RuntimeError("throttled")
            return Reply(np.zeros((invocation.rows, 10), dtype=np.float32), batch=invocation.rows)
        finally:
            with self.lock:
                self.in_flight -= 1


def settle(tier: BlockingLambda, count: int) -> None:
    deadline = time.monotonic() + 10.0
    while len(tier.invocations) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_invoking_pool_warms_containers_at_once_and_again_only_when_due(
    store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    variant = profile("fast", "lambda-cpu", 2.0)
    tier, clock = BlockingLambda(), [0.0]
    pool = InvokingWarmPool(tier, store, refresh_s=240.0, clock=lambda: clock[0])
    try:
        pool.keep_warm({variant.variant_id: 3}, {variant.variant_id: variant})
        settle(tier, 3)
        assert tier.most_at_once == 3  # together: three containers, not one three times
        tier.release.set()
        warm_up = tier.invocations[0]
        assert warm_up.variant_id == variant.variant_id and warm_up.correlation_id.startswith("warmup-")
        assert warm_up.inputs.shape == (1, 1, 8, 8)  # the model's own input
        clock[0] = 100.0
        pool.keep_warm({variant.variant_id: 3}, {variant.variant_id: variant})  # warm still
        pool.keep_warm({variant.variant_id: 2}, {variant.variant_id: variant})
        assert len(tier.invocations) == 3
        pool.keep_warm({variant.variant_id: 5}, {variant.variant_id: variant})  # more: at once
        settle(tier, 8)
        clock[0] = 400.0  # due again
        pool.keep_warm({variant.variant_id: 5}, {variant.variant_id: variant})
        settle(tier, 13)
        assert len(tier.invocations) == 13
        pool.keep_warm({}, {})  # no longer needed: forgotten, warmed afresh if asked again
        pool.keep_warm({variant.variant_id: 1}, {variant.variant_id: variant})
        settle(tier, 14)
        assert len(tier.invocations) == 14
    finally:
        tier.release.set()
        pool.close()


def test_a_failed_warm_up_is_tried_again_on_the_next_tick(store: InMemoryMetadataStore) -> None:  # noqa: F811
    variant = profile("fast", "lambda-cpu", 2.0)
    tier = BlockingLambda()
    tier.fail = True
    tier.release.set()
    pool = InvokingWarmPool(tier, store, clock=lambda: 0.0)
    try:
        pool.keep_warm({variant.variant_id: 1}, {variant.variant_id: variant})
        settle(tier, 1)
        deadline = time.monotonic() + 10.0
        while pool._warmed and time.monotonic() < deadline:  # the failure is seen in the background
            time.sleep(0.01)
        pool.keep_warm({variant.variant_id: 1}, {variant.variant_id: variant})
        settle(tier, 2)
        assert len(tier.invocations) == 2
    finally:
        pool.close()


def test_the_invoking_pool_warms_one_sizes_variants_in_turn_within_the_tiers_containers(
    store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    fast, slow = profile("fast", "lambda-cpu", 2.0), profile("slow", "lambda-cpu", 20.0)
    tier = BlockingLambda()
    pool = InvokingWarmPool(tier, store, capacity=4, clock=lambda: 0.0)
    try:
        pool.keep_warm({fast.variant_id: 9, slow.variant_id: 9}, {p.variant_id: p for p in (fast, slow)})
        settle(tier, 4)
        assert [i.variant_id for i in tier.invocations] == [fast.variant_id] * 4  # the first round
        assert len({i.correlation_id for i in tier.invocations}) == 4
        tier.release.set()  # the round answers: the next variant's round, on the same containers
        settle(tier, 8)
        assert [i.variant_id for i in tier.invocations[4:]] == [slow.variant_id] * 4
        assert tier.most_at_once <= 4
    finally:
        tier.release.set()
        pool.close()


def test_settle_waits_for_the_rounds_in_flight_and_says_how_many_are_not_answered(
    store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    # The scaling function calls it before Lambda freezes its container (a frozen round would
    # send its warm-ups only once thawed).
    fast, other = profile("fast", "lambda-cpu", 2.0), profile("other", "lambda-cpu", 2.0)
    other = replace(other, memory_mb=fast.memory_mb * 2)  # a round of its own
    tier = BlockingLambda()
    pool = InvokingWarmPool(tier, store, clock=lambda: 0.0)
    try:
        assert pool.settle(0.0) == 0  # nothing in flight
        pool.keep_warm({fast.variant_id: 2, other.variant_id: 1}, {p.variant_id: p for p in (fast, other)})
        settle(tier, 3)
        assert pool.settle(0.05) == 2  # both rounds wait on their invocations
        tier.release.set()
        assert pool.settle(10.0) == 0
        assert len(tier.invocations) == 3 and tier.in_flight == 0
    finally:
        tier.release.set()
        pool.close()
