"""InfaasPolicy.get_variant (INFaaS §4.1) on hand-built profiles, and the Dispatcher around it."""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import modelless.dispatcher as dispatcher_module
from modelless.dispatcher import SATURATED_IN_FLIGHT, Dispatcher
from modelless.exceptions import (
    DeadlineExceededError,
    ModellessError,
    NotFoundError,
    NotReadyError,
    QueryFailedError,
    ServiceUnavailableError,
    TargetsUnreachableError,
    WorkerBusyError,
    WorkerUnreachableError,
)
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.pools.invokers import raise_for_worker_error
from modelless.runtime import decode_array, encode_array
from modelless.selection import (
    Candidates,
    InfaasPolicy,
    closest_variant,
    queue_wait_ms,
    unreachable_error,
)
from modelless.types import (
    Decision,
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


# --- What is queued on an Active instance ------------------------------------------------------


def resnet_like(variant_id: str = "v", load_ms: float = 10.0, **kwargs: Any) -> VariantProfile:
    """~7 ms a query (the cost study's heavy model): median 7.0 ms, p99 7.5 ms at batch 1;
    batches of 4 and 8 take 14 and 24 ms at the median."""
    profile = make_variant(variant_id, p99={1: 7.5, 4: 15.0, 8: 26.0}, load_ms=load_ms, **kwargs)
    return dataclasses.replace(profile, latency_p50_ms={1: 7.0, 4: 14.0, 8: 24.0})


def queued(variant_id: str, queue_length: int, batch_limit: int = 1) -> InstanceStats:
    return dataclasses.replace(make_instance(variant_id), queue_length=queue_length, batch_limit=batch_limit)


def test_an_instance_whose_queue_breaks_the_budget_is_skipped_for_a_new_instance(
    policy: InfaasPolicy,
) -> None:
    # Seven queries ahead, not yet saturated (that takes eight): 7 x 7 ms + 7.5 ms > 50 ms.
    workers = [make_worker("busy", queued("v", 7), free_slots=0), make_worker("spare", free_slots=1)]

    decision = policy.get_variant(targets(latency=50), [resnet_like()], workers)

    assert decision.state is InstanceState.INACTIVE
    assert decision.worker_id == "spare"
    assert decision.expected_latency_ms == 17.5  # load + inference


def test_an_instance_whose_queue_breaks_the_budget_is_skipped_for_another_instance(
    policy: InfaasPolicy,
) -> None:
    workers = [
        make_worker("busy", queued("v", 7), utilisation=0.1),
        make_worker("calmer", queued("v", 2), utilisation=0.9),
    ]

    decision = policy.get_variant(targets(latency=50), [resnet_like()], workers)

    assert (decision.worker_id, decision.state) == ("calmer", InstanceState.ACTIVE)
    assert decision.expected_latency_ms == 7.5 + 2 * 7.0


def test_a_queue_within_the_budget_keeps_the_instance_and_counts_in_its_expected_latency(
    policy: InfaasPolicy,
) -> None:
    workers = [make_worker("w1", queued("v", 6)), make_worker("spare", free_slots=2)]

    decision = policy.get_variant(targets(latency=50), [resnet_like()], workers)

    assert (decision.worker_id, decision.state) == ("w1", InstanceState.ACTIVE)
    assert decision.expected_latency_ms == 7.5 + 6 * 7.0
    assert "queue included" in decision.reason


@pytest.mark.parametrize(
    ("batch_limit", "queue_length", "wait_ms"),
    [
        (4, 8, 2 * 14.0),  # two runs of 4 at batch 4's median
        (3, 8, 3 * 14.0),  # three runs of 3, each at the next profiled size up (4)
        (64, 20, 3 * 24.0),  # the batch limit within the profile: runs of 8
        (0, 3, 3 * 7.0),  # a report of 0 rows: one at a time
    ],
)
def test_a_batching_instance_works_its_queue_off_a_batch_per_run(
    policy: InfaasPolicy, batch_limit: int, queue_length: int, wait_ms: float
) -> None:
    workers = [make_worker("w1", queued("v", queue_length, batch_limit))]

    decision = policy.get_variant(targets(latency=200), [resnet_like()], workers)

    assert decision.expected_latency_ms == 7.5 + wait_ms
    assert queue_wait_ms(resnet_like(), queue_length, batch_limit) == wait_ms


def test_the_gateways_own_queries_in_flight_count_as_queued(policy: InfaasPolicy) -> None:
    reported = make_worker("w1", make_instance("v"), free_slots=0)  # idle at its last report
    overlaid = Dispatcher._with_in_flight(reported, {("w1", "v"): 7})
    assert overlaid.instances[0].state is InstanceState.ACTIVE  # not saturated yet

    decision = policy.get_variant(targets(latency=50), [resnet_like()], [overlaid])

    assert decision.tier is Tier.LAMBDA and decision.state is InstanceState.INACTIVE  # no room


def test_a_cheaper_queued_instance_within_the_budget_still_wins(policy: InfaasPolicy) -> None:
    cheap = resnet_like("cheap", price_per_second=0.5)
    pricey = resnet_like("pricey", price_per_second=2.0)
    workers = [make_worker("w1", queued("cheap", 3)), make_worker("w2", make_instance("pricey"))]

    decision = policy.get_variant(targets(latency=50), [cheap, pricey], workers)

    assert decision.variant.variant_id == "cheap"
    assert decision.expected_latency_ms == 7.5 + 3 * 7.0


def test_when_every_instance_is_queued_past_the_budget_and_nothing_else_fits_the_quickest_answers_late(
    policy: InfaasPolicy,
) -> None:
    # A new instance would take its 200 ms load: nothing answers within 50 ms now.
    variant = resnet_like(load_ms=200.0)
    workers = [make_worker("w1", queued("v", 9)), make_worker("w2", queued("v", 7), free_slots=1)]

    decision = policy.get_variant(targets(latency=50), [variant], workers)

    assert (decision.worker_id, decision.state) == ("w2", InstanceState.ACTIVE)
    assert decision.expected_latency_ms == 7.5 + 7 * 7.0
    assert "the quickest, late" in decision.reason


def test_a_queue_never_breaks_a_query_without_a_latency_target(policy: InfaasPolicy) -> None:
    workers = [make_worker("w1", queued("v", 7)), make_worker("spare", free_slots=1)]

    decision = policy.get_variant(targets(), [resnet_like()], workers)

    assert (decision.worker_id, decision.state) == ("w1", InstanceState.ACTIVE)


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


def test_an_accelerator_variant_with_no_room_is_never_spilled_to_the_lambda_tier(
    policy: InfaasPolicy,
) -> None:
    # The Lambda tier has no GPU: the GPU profile would not hold there. The next variant in
    # load+inference order is taken instead, and with none left the targets are unreachable.
    fast_gpu = make_variant("gpu-v", pool="gpu", load_ms=1.0)
    slower_cpu = make_variant("cpu-v", pool=CPU, load_ms=5.0)
    full_gpu = [make_worker("gpu-full", pool="gpu", free_slots=0)]

    decision = policy.get_variant(targets(latency=100), [fast_gpu, slower_cpu], full_gpu)
    assert decision.variant.variant_id == "cpu-v" and decision.tier is Tier.LAMBDA
    with pytest.raises(TargetsUnreachableError):
        policy.get_variant(targets(latency=100), [fast_gpu], full_gpu)
    assert policy.warmup(targets(latency=100), [fast_gpu], full_gpu) is None


def test_a_worker_variant_warm_on_the_lambda_tier_is_priced_at_lambdas_price(policy: InfaasPolicy) -> None:
    # A cheap CPU variant once spilled to the Lambda tier must not look cheaper there than a
    # slightly dearer CPU variant on a worker: on the Lambda tier it pays Lambda's price.
    cheap = make_variant("cheap", pool=CPU, price_per_second=1e-6, p99=100.0)
    dearer = make_variant("dearer", pool=CPU, price_per_second=2e-6, p99=100.0)
    workers = [
        make_worker("w1", make_instance("dearer"), pool=CPU),
        make_worker("lambda-tier", make_instance("cheap"), pool=LAMBDA, address=""),
    ]

    decision = policy.get_variant(targets(latency=500), [cheap, dearer], workers)

    assert decision.variant.variant_id == "dearer" and decision.tier is Tier.WORKER


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

    def __init__(
        self,
        outputs: np.ndarray,
        error: Exception | None = None,
        errors: dict[str, Exception] | None = None,
        hang: set[str] | None = None,
    ) -> None:
        self.outputs = outputs
        self.error = error
        self.errors = errors or {}  # per worker address
        self.hang = hang or set()  # addresses that never answer: the call waits out its timeout
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.timeouts: list[float] = []

    def invoke(self, address: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls.append((address, payload))
        self.timeouts.append(timeout_s)
        if address in self.hang:
            # As a socket read timing out (never early): capped here, so that a missing bound
            # fails the test instead of holding it for 30 s.
            threading.Event().wait(min(timeout_s, HUNG_WAIT_CAP_S) + 0.001)
            raise WorkerUnreachableError(f"worker {address} did not answer: TimeoutError('timed out')")
        error = self.errors.get(address, self.error)
        if error is not None:
            raise error
        return reply(self.outputs)


class FakeLambda:
    """A LambdaInvoker: records calls, answers as a cold start."""

    def __init__(self, outputs: np.ndarray) -> None:
        self.outputs = outputs
        self.calls: list[dict[str, Any]] = []
        self.timeouts: list[float] = []

    def invoke(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls.append(payload)
        self.timeouts.append(timeout_s)
        return reply(self.outputs, cold_start=True, init_ms=7.0)


class CountingStore(InMemoryMetadataStore):
    """Counts the reads of static profiles (the dispatcher reads an app's profiles as a whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.candidate_reads = 0

    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]:
        self.candidate_reads += 1
        return super().list_variants(app_id, model_name)


class StateCountingStore(InMemoryMetadataStore):
    """Counts the live-state reads (one store round trip each in Redis)."""

    def __init__(self) -> None:
        super().__init__()
        self.state_reads = 0

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        self.state_reads += 1
        return super().selection_state(app_id)


class FakeClock:
    """Stands in for the dispatcher's ``time`` module: a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.perf_counter = time.perf_counter
        self.time = time.time  # wall clock: load counting only

    def monotonic(self) -> float:
        return self.now


HUNG_WAIT_CAP_S = 3.0  # a hung fake worker holds a call this long at most, whatever its timeout
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
    first, retry = workers.calls[0][1], lambda_tier.calls[0]
    assert retry["variant"] == first["variant"] and retry["inputs_npy_b64"] == first["inputs_npy_b64"]
    assert retry["correlation_id"] == first["correlation_id"]
    # The budget left is measured again for the retry, not carried over from the first try.
    assert retry["deadline_ms"] < first["deadline_ms"] <= 10
    assert result.retried is True
    assert result.tier is Tier.LAMBDA
    assert result.worker_id is None
    assert result.decision.tier is Tier.LAMBDA  # the decision that served it...
    assert "w1" in result.decision.reason and "connection refused" in result.decision.reason  # ...and why
    np.testing.assert_array_equal(result.outputs, LAMBDA_OUT)


def test_dispatcher_retries_on_another_live_instance_before_the_lambda_tier() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    # Equal instances: w1 wins the tie, and is the one that fails.
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": WorkerUnreachableError("connection refused")})
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one())

    assert [address for address, _ in workers.calls] == ["http://w1", "http://w2"]
    assert lambda_tier.calls == []
    assert result.retried and result.tier is Tier.WORKER and result.worker_id == "w2"
    assert result.decision.state is InstanceState.ACTIVE
    np.testing.assert_array_equal(result.outputs, WORKER_OUT)


def test_dispatcher_retry_skips_an_instance_that_misses_the_remaining_budget() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("fast", p99=1.0), make_variant("slow", p99=8.0)])
    store.put_worker_state(live_worker("w1", make_instance("fast")))
    store.put_worker_state(live_worker("w2", make_instance("slow")))
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": WorkerUnreachableError("connection refused")})
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=5), batch_of_one())

    assert [address for address, _ in workers.calls] == ["http://w1"]  # w2's 8 ms would miss 5 ms
    assert result.retried and result.tier is Tier.LAMBDA
    assert lambda_tier.calls[0]["variant_id"] == "fast"


def test_dispatcher_retries_a_worker_that_answers_503() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    with pytest.raises(WorkerBusyError) as busy:
        raise_for_worker_error(503, {"error": {"code": "batch_timeout", "message": "batch did not complete"}})
    workers = FakeWorkers(WORKER_OUT, error=busy.value)
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one())

    assert busy.value.status_code == 503 and busy.value.code == "batch_timeout"
    assert result.retried and result.tier is Tier.LAMBDA
    np.testing.assert_array_equal(result.outputs, LAMBDA_OUT)


def test_dispatcher_does_not_retry_a_worker_that_failed_the_model() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    with pytest.raises(ModellessError) as crashed:
        raise_for_worker_error(500, {"error": {"code": "worker_error", "message": "ValueError: bad"}})
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT, error=crashed.value), lambda_tier
    )

    with pytest.raises(ModellessError) as raised:
        dispatcher.online_query(targets(latency=10), batch_of_one())

    assert raised.value.status_code == 502  # the same error would come from anywhere else
    assert lambda_tier.calls == []


def test_dispatcher_bounds_an_attempt_by_the_budget_and_retries_a_hung_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatcher_module, "ATTEMPT_GRACE_S", 0.05)
    monkeypatch.setattr(dispatcher_module, "DEADLINE_GRACE_S", 2.0)
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, hang={"http://w1"})
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=10), batch_of_one())

    hung_timeout, retry_timeout = workers.timeouts
    assert hung_timeout <= 0.010 + 0.05 + 1e-9  # the budget + the attempt's grace, not 30 s
    assert 0 < retry_timeout <= 0.010 + 0.05 + 1e-9  # what is left, bounded again
    assert result.retried and result.tier is Tier.WORKER and result.worker_id == "w2"
    assert lambda_tier.calls == []


def test_dispatcher_gives_a_load_until_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # A load's time varies with the repository and the machine, and it serves later queries too:
    # it is not cut at the attempt's grace like a live instance that does not answer.
    monkeypatch.setattr(dispatcher_module, "ATTEMPT_GRACE_S", 0.05)
    monkeypatch.setattr(dispatcher_module, "DEADLINE_GRACE_S", 2.0)
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1"))  # room, no instance: the query loads one
    workers = FakeWorkers(WORKER_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, FakeLambda(LAMBDA_OUT))

    result = dispatcher.online_query(targets(latency=50), batch_of_one())

    assert result.decision.state is InstanceState.INACTIVE and not result.retried
    [timeout] = workers.timeouts
    assert 0.050 + 0.05 < timeout <= 0.050 + 2.0


def test_dispatcher_fails_clearly_when_no_time_is_left_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hung worker's attempt may run past the query's whole deadline: nothing is left after it.
    monkeypatch.setattr(dispatcher_module, "ATTEMPT_GRACE_S", 1.0)
    monkeypatch.setattr(dispatcher_module, "DEADLINE_GRACE_S", 0.05)
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, hang={"http://w1"})
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    with pytest.raises(DeadlineExceededError) as raised:
        dispatcher.online_query(targets(latency=10), batch_of_one())

    assert workers.timeouts[0] <= 0.010 + 0.05 + 1e-9  # bounded by the deadline
    assert [address for address, _ in workers.calls] == ["http://w1"]
    assert lambda_tier.calls == []
    assert raised.value.status_code == 503
    assert raised.value.code == "deadline_exceeded"
    assert "w1" in raised.value.message and "did not answer" in raised.value.message


def test_dispatcher_bounds_the_lambda_retry_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher_module, "DEADLINE_GRACE_S", 0.5)
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    lambda_tier = FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(
        store,
        InfaasPolicy(DEFAULT_POOLS),
        FakeWorkers(WORKER_OUT, error=WorkerUnreachableError("connection refused")),
        lambda_tier,
    )

    dispatcher.online_query(targets(latency=10), batch_of_one())

    [timeout] = lambda_tier.timeouts
    assert 0 < timeout <= 0.010 + 0.5


def test_dispatcher_leaves_a_failed_worker_out_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": WorkerUnreachableError("connection refused")})
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, workers=workers)
    assert dispatcher.online_query(targets(latency=10), batch_of_one()).worker_id == "w2"

    # w1's report is still fresh in the store, but this dispatcher does not send it queries...
    clock.now += dispatcher_module.FAILED_WORKER_HOLD_S / 2
    assert dispatcher.select(targets(latency=10)).worker_id == "w2"
    # ...though it still lists it (the workers as reported)...
    assert {w.worker_id for w in dispatcher.live_workers()} == {"w1", "w2"}
    # ...and its own recent loads, laid over the reports, do not bring it back either.
    dispatcher._recent_loads[("w2", "other")] = clock.now
    assert dispatcher.select(targets(latency=10)).worker_id == "w2"
    # Until the hold has passed: a worker that is back must get queries again.
    clock.now += dispatcher_module.FAILED_WORKER_HOLD_S
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"
    assert dispatcher._held_out == {}


def test_dispatcher_does_not_hold_out_a_worker_that_answered_503() -> None:
    # Alive, only busy: its reports say how busy; leaving it out (with no other worker, sending
    # everything to the Lambda tier) would turn one refusal into seconds of spills.
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    store.put_worker_state(live_worker("w2", make_instance("v")))
    busy = WorkerBusyError("batch did not complete")
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": busy})
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, FakeLambda(LAMBDA_OUT))

    assert dispatcher.online_query(targets(latency=10), batch_of_one()).worker_id == "w2"
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"


def test_dispatcher_without_a_lambda_tier_fails_503_when_the_worker_is_unreachable() -> None:
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, error=WorkerUnreachableError("connection refused"))
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, None)

    with pytest.raises(QueryFailedError) as caught:
        dispatcher.online_query(targets(latency=10), batch_of_one())
    assert caught.value.status_code == 503
    assert caught.value.code == "compute_unavailable"
    # It names what failed and why nothing else was tried.
    assert "w1" in caught.value.message and "connection refused" in caught.value.message
    assert "no Lambda tier" in caught.value.message
    assert caught.value.details["attempts"] == ["v on worker w1 (http://w1) failed: connection refused"]


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


# --- Candidates: the per-batch index the policy decides on ------------------------------------


def test_candidates_behave_as_an_immutable_list_of_their_profiles() -> None:
    a, b = make_variant("a"), make_variant("b")
    candidates = Candidates([a, b])

    assert len(candidates) == 2
    assert list(candidates) == [a, b]
    assert candidates[1] is b
    assert candidates == [a, b] and candidates == (a, b) and candidates == Candidates([a, b])
    assert candidates != [b, a]
    assert Candidates([]) == [] and not Candidates([])


def test_candidates_table_orders_by_the_inactive_key_and_is_built_once_per_batch() -> None:
    slow_load = make_variant("slow-load", p99=1.0, load_ms=50.0)
    quick = make_variant("quick", p99=5.0, load_ms=5.0, price_per_second=2.0)
    quick_cheap = make_variant("quick-cheap", p99=5.0, load_ms=5.0, price_per_second=1.0)
    small = make_variant("small", p99=0.1, load_ms=0.1, max_batch=1)
    candidates = Candidates([slow_load, quick, quick_cheap, small])

    table = candidates.at_batch(1)
    assert [s.variant.variant_id for s in table.by_cold] == ["small", "quick-cheap", "quick", "slow-load"]
    assert table.get("quick") == (quick, 5.0, quick.cost_per_query(1), 10.0)
    assert table.get("unknown") is None
    assert candidates.at_batch(1) is table

    at_four = candidates.at_batch(4)  # "small" cannot take a batch of 4
    assert [s.variant.variant_id for s in at_four.by_cold] == ["quick-cheap", "quick", "slow-load"]
    assert at_four.get("small") is None
    assert at_four.get("quick") == (
        quick,
        quick.latency_ms(4),
        quick.cost_per_query(4),
        quick.load_latency_ms + quick.latency_ms(4),
    )


def test_candidate_subsets_filter_the_parents_table_in_order() -> None:
    parent = Candidates(
        [
            make_variant("a-low", model="a", accuracy=0.7, p99=1.0),
            make_variant("a-high", model="a", accuracy=0.95, p99=3.0),
            make_variant("b-high", model="b", accuracy=0.9, p99=2.0),
        ]
    )
    accurate = parent.subset(0.9)
    named = parent.subset(0.5, "a")

    assert [v.variant_id for v in accurate] == ["a-high", "b-high"]
    assert [s.variant.variant_id for s in accurate.at_batch(1).by_cold] == ["b-high", "a-high"]
    assert [s.variant.variant_id for s in named.at_batch(1).by_cold] == ["a-low", "a-high"]
    # The subset's entries are the parent's, computed once; it answers only for its own.
    assert accurate.at_batch(1).get("a-high") is parent.at_batch(1).get("a-high")
    assert accurate.at_batch(1).get("a-low") is None
    assert named.at_batch(1).get("b-high") is None

    # A subset of a subset holds what both admit.
    narrowest = accurate.subset(0.5, "b")
    assert list(narrowest) == [parent[2]]
    assert [s.variant.variant_id for s in narrowest.at_batch(1).by_cold] == ["b-high"]
    assert narrowest.at_batch(1).get("a-high") is None
    assert accurate.subset(0.0, "a").at_batch(1).get("a-low") is None


# The policy before it decided on an index: the reference the indexed one must agree with.
def reference_get_variant(
    policy: InfaasPolicy,
    targets: QueryTargets,
    candidates: Sequence[VariantProfile],
    workers: Sequence[WorkerState],
) -> Decision:
    budget = targets.latency_ms if targets.latency_ms is not None else math.inf
    eligible = [
        v
        for v in candidates
        if v.accuracy >= targets.min_accuracy
        and v.max_batch >= targets.batch
        and (targets.model_name is None or v.model_name == targets.model_name)
    ]
    eligible_ids = {v.variant_id: v for v in eligible}

    def on_lambda(pool: str) -> bool:
        spec = DEFAULT_POOLS.get(pool)
        return spec is not None and spec.kind.value == "lambda"

    active = []
    queued_out = []  # met the budget idle, but not behind their queues
    overloaded_out = []  # Overloaded on a worker: the late answer only where nothing else fits
    for worker in workers:
        for instance in worker.instances:
            variant = eligible_ids.get(instance.variant_id)
            overloaded = instance.state is InstanceState.OVERLOADED and not on_lambda(worker.pool)
            if (
                variant is not None
                and (instance.state is InstanceState.ACTIVE or overloaded)
                and variant.latency_ms(targets.batch) <= budget
            ):
                # The queue ahead, run by run at the instance's batch size (within the profile).
                runs_of = min(max(1, instance.batch_limit), max(variant.latency_p50_ms))
                runs = -(-instance.queue_length // runs_of)
                median = variant.latency_p50_ms[min(b for b in variant.latency_p50_ms if b >= runs_of)]
                expected = variant.latency_ms(targets.batch) + runs * median
                if overloaded:
                    overloaded_out.append((expected, worker, variant))  # only when nothing fits
                elif expected <= budget:
                    active.append((variant, worker, instance, expected))
                else:
                    queued_out.append((expected, worker, variant))

    def cost(variant: VariantProfile, worker: WorkerState) -> float:
        if on_lambda(worker.pool) and not on_lambda(variant.pool):
            lam = DEFAULT_POOLS[LAMBDA]
            price = lam.instance_price_per_second(1, min(lam.memory_options_mb))
            return price * variant.latency_ms(targets.batch) / 1000 + lam.request_price
        return variant.cost_per_query(targets.batch)

    if active:
        variant, worker, _, expected = min(
            active,
            key=lambda p: (
                cost(p[0], p[1]),
                p[0].latency_ms(targets.batch),
                p[2].queue_length,
                p[1].utilisation,
                p[1].worker_id,
            ),
        )
        spec = DEFAULT_POOLS.get(worker.pool)
        return Decision(
            variant=variant,
            tier=Tier.LAMBDA if spec is not None and spec.kind.value == "lambda" else Tier.WORKER,
            worker_id=worker.worker_id,
            state=InstanceState.ACTIVE,
            expected_latency_ms=expected,
            worker_address=worker.address or None,
            reason=(
                f"cheapest active variant meeting accuracy>={targets.min_accuracy:g} and "
                f"latency<={budget:g} ms, queue included; least-loaded worker running it"
            ),
        )
    inactive = [v for v in eligible if v.load_latency_ms + v.latency_ms(targets.batch) <= budget]
    reason = "no active variant meets the targets; inactive variant with the lowest load+inference latency"
    for variant in sorted(
        inactive,
        key=lambda v: (
            v.load_latency_ms + v.latency_ms(targets.batch),
            v.cost_per_query(targets.batch),
            v.variant_id,
        ),
    ):
        expected = variant.load_latency_ms + variant.latency_ms(targets.batch)
        spec = DEFAULT_POOLS.get(variant.pool)
        if spec is not None and spec.kind.value == "lambda":
            return Decision(variant, Tier.LAMBDA, None, InstanceState.INACTIVE, expected, reason)
        with_room = [
            w
            for w in workers
            if w.pool == variant.pool
            and w.free_slots > 0
            and all(i.variant_id != variant.variant_id for i in w.instances)
        ]
        if with_room:
            worker = min(with_room, key=lambda w: (w.utilisation, w.worker_id))
            return Decision(
                variant,
                Tier.WORKER,
                worker.worker_id,
                InstanceState.INACTIVE,
                expected,
                reason,
                worker.address,
            )
        if spec is not None and spec.device != "cpu":
            continue  # the Lambda tier cannot run an accelerator variant
        return Decision(
            variant,
            Tier.LAMBDA,
            None,
            InstanceState.INACTIVE,
            expected,
            f"{reason}; no worker of pool {variant.pool!r} has room, spilled to the Lambda tier",
        )
    if queued_out or overloaded_out:
        expected, worker, variant = min(queued_out + overloaded_out, key=lambda q: (q[0], q[1].worker_id))
        spec = DEFAULT_POOLS.get(worker.pool)
        return Decision(
            variant=variant,
            tier=Tier.LAMBDA if spec is not None and spec.kind.value == "lambda" else Tier.WORKER,
            worker_id=worker.worker_id,
            state=InstanceState.ACTIVE,
            expected_latency_ms=expected,
            worker_address=worker.address or None,
            reason=(
                f"no variant meeting accuracy>={targets.min_accuracy:g} and latency<={budget:g} ms "
                "answers within the budget now (queued past it, overloaded or cold): the quickest, late"
            ),
        )
    raise unreachable_error(targets, candidates)


def random_case(rng: random.Random) -> tuple[list[VariantProfile], list[WorkerState], QueryTargets]:
    """Few distinct values, so that ties (cost, latency, utilisation) are common."""
    variants = []
    for index in range(rng.choice([0, *range(3, 13)])):
        sizes = sorted(rng.sample([1, 2, 4, 8], rng.randint(1, 4)))
        base = rng.choice([0.5, 1.0, 2.0, 4.0])
        variants.append(
            make_variant(
                f"v{index}",
                model=rng.choice(["a", "b"]),
                pool=rng.choice([CPU, CPU, "gpu", LAMBDA]),
                accuracy=rng.choice([0.7, 0.8, 0.9]),
                p99={b: base * b for b in sizes},
                load_ms=rng.choice([0.0, 2.0, 5.0]),
                price_per_second=rng.choice([1.0, 2.0]),
                request_price=rng.choice([0.0, 0.0, 0.001]),
            )
        )
    states = [InstanceState.ACTIVE, InstanceState.ACTIVE, InstanceState.OVERLOADED, InstanceState.INTERFERED]
    ids = [v.variant_id for v in variants] + ["unknown"]
    workers = [
        make_worker(
            f"w{index}",
            *(
                dataclasses.replace(
                    make_instance(variant_id, rng.choice(states)),
                    queue_length=rng.choice([0, 0, 1, 3, 8]),
                    batch_limit=rng.choice([1, 1, 2, 3, 16]),
                )
                for variant_id in rng.sample(ids, rng.randint(0, min(3, len(ids))))
            ),
            pool=rng.choice([CPU, "gpu", LAMBDA]),
            utilisation=rng.choice([0.1, 0.5]),
            free_slots=rng.randint(0, 2),
        )
        for index in range(rng.randint(0, 5))
    ]
    query = targets(
        latency=rng.choice([None, 1.0, 3.0, 6.0, 12.0, 24.0]),
        accuracy=rng.choice([0.0, 0.75, 0.85, 0.9, 0.95]),
        model=rng.choice([None, None, "a"]),
        batch=rng.choice([1, 1, 1, 2, 3, 8, 16]),
    )
    return variants, workers, query


def decide(
    decide_with: Any,
    policy: InfaasPolicy,
    query: QueryTargets,
    candidates: Sequence[VariantProfile],
    workers: Any,
) -> Decision | tuple[str, dict[str, Any]]:
    try:
        result: Decision = decide_with(query, candidates, workers)
        return result
    except TargetsUnreachableError as error:
        return error.message, error.details


def test_indexed_policy_decides_exactly_as_the_reference(policy: InfaasPolicy) -> None:
    rng = random.Random(4)
    for _ in range(3000):
        variants, workers, query = random_case(rng)
        expected = decide(lambda *a: reference_get_variant(policy, *a), policy, query, variants, workers)
        # A plain list, the app's index and a target's subset of it: the same decision.
        assert decide(policy.get_variant, policy, query, variants, workers) == expected
        app = Candidates(variants)
        assert decide(policy.get_variant, policy, query, app, workers) == expected
        # A target's subset, also for queries other than the one it was cut for.
        subset = app.subset(rng.choice([0.0, 0.8, query.min_accuracy]), rng.choice([None, query.model_name]))
        assert decide(policy.get_variant, policy, query, subset, workers) == decide(
            lambda *a: reference_get_variant(policy, *a), policy, query, list(subset), workers
        )


# --- Dispatcher: the live-state snapshot and the recent-load overlay ---------------------------


def snapshot_dispatcher(
    monkeypatch: pytest.MonkeyPatch, store: InMemoryMetadataStore, **kwargs: Any
) -> tuple[Dispatcher, FakeClock]:
    clock = FakeClock()
    monkeypatch.setattr(dispatcher_module, "time", clock)
    workers = kwargs.pop("workers", FakeWorkers(WORKER_OUT))
    lambda_tier = kwargs.pop("lambda_tier", FakeLambda(LAMBDA_OUT))
    return Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier, **kwargs), clock


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
    for _ in range(int(dispatcher_module.RECENT_LOAD_S / 0.25) - 1):
        clock.now += 0.25
        assert dispatcher.select(targets(accuracy=0.5)).state is InstanceState.ACTIVE
    clock.now += 0.25  # past RECENT_LOAD_S: the load is forgotten (a new one is needed)
    again = dispatcher.select(targets(accuracy=0.5))
    assert again.state is InstanceState.INACTIVE
    assert dispatcher._recent_loads == {}


def test_dispatcher_own_load_is_dropped_once_the_worker_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", free_slots=1))
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.2)
    dispatcher.online_query(targets(accuracy=0.5), batch_of_one())

    store.put_worker_state(live_worker("w1", make_instance("v"), free_slots=0))
    clock.now += 0.2
    [worker] = dispatcher.live_workers()
    assert [i.variant_id for i in worker.instances] == ["v"]  # reported once, not twice
    assert worker.free_slots == 0


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


def test_dispatcher_decides_a_retry_on_a_fresh_read_of_the_live_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StateCountingStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    workers = FakeWorkers(WORKER_OUT, errors={"http://w1": WorkerUnreachableError("connection refused")})
    dispatcher, clock = snapshot_dispatcher(monkeypatch, store, live_state_ttl_s=0.2, workers=workers)
    assert dispatcher.select(targets(latency=10)).worker_id == "w1"  # the snapshot knows w1 only
    store.put_worker_state(live_worker("w2", make_instance("v")))  # reported since

    clock.now += 0.01
    result = dispatcher.online_query(targets(latency=10), batch_of_one())

    assert result.retried and result.worker_id == "w2"  # not the Lambda tier, as the snapshot says
    assert store.state_reads == 2
    clock.now += 0.01
    dispatcher.select(targets(latency=10))
    assert store.state_reads == 2  # later decisions use that fresh read, not the one that named w1


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


def test_dispatcher_per_target_lists_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher_module, "MAX_CACHED_TARGETS", 3)
    store = CountingStore()
    seed(store, [make_variant("v", accuracy=0.95)])
    dispatcher, _ = snapshot_dispatcher(monkeypatch, store)

    for accuracy in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
        assert dispatcher.select(targets(accuracy=accuracy)).variant.variant_id == "v"
        assert len(dispatcher._cache) <= 3
    assert store.candidate_reads == 1  # the app's parsed profiles outlive the target lists


class BlockingWorkers(FakeWorkers):
    """A WorkerInvoker whose calls wait until released: queries outstanding on the worker."""

    def __init__(self, outputs: np.ndarray) -> None:
        super().__init__(outputs)
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def invoke(self, address: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.entered.release()
        assert self.release.wait(10), "never released"
        return super().invoke(address, payload, timeout_s)


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


def test_own_queries_saturate_a_batching_instance_at_two_of_its_batches() -> None:
    batching = dataclasses.replace(make_instance("v"), batch_limit=16)
    worker = live_worker("w1", batching)
    below = Dispatcher._with_in_flight(worker, {("w1", "v"): SATURATED_IN_FLIGHT})
    assert below.instances[0].state is InstanceState.ACTIVE  # a batch-1 instance would be saturated
    assert below.instances[0].queue_length == SATURATED_IN_FLIGHT
    at = Dispatcher._with_in_flight(worker, {("w1", "v"): 32})
    assert at.instances[0].state is InstanceState.OVERLOADED


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


def test_dispatcher_spills_to_the_lambda_tier_a_query_an_instances_queue_would_make_late() -> None:
    store = InMemoryMetadataStore()
    seed(store, [resnet_like()])
    store.put_worker_state(live_worker("w1", queued("v", 7), free_slots=0))  # 7 x 7 ms ahead
    workers, lambda_tier = FakeWorkers(WORKER_OUT), FakeLambda(LAMBDA_OUT)
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier)

    result = dispatcher.online_query(targets(latency=50, accuracy=0.5), batch_of_one())

    assert result.tier is Tier.LAMBDA and workers.calls == []


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
