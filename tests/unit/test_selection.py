"""InfaasPolicy.get_variant (INFaaS §4.1) on hand-built profiles, and the Candidates index it
decides on. The Dispatcher around it: tests/unit/test_dispatch_*.py."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.exceptions import TargetsUnreachableError
from modelless.selection import (
    Candidates,
    InfaasPolicy,
    closest_variant,
    needs_warming,
    queue_wait_ms,
    unreachable_error,
)
from modelless.tuning.capacity import MAX_SCALE
from modelless.types import (
    Decision,
    InstanceState,
    InstanceStats,
    QueryTargets,
    Tier,
    VariantProfile,
    WorkerState,
)
from tests.unit.dispatch_kit import (
    CPU,
    LAMBDA,
    make_instance,
    make_variant,
    make_worker,
    queued,
    resnet_like,
    targets,
)


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


def test_an_active_lambda_instance_is_not_delayed_by_its_busy_containers(policy: InfaasPolicy) -> None:
    # The tier reports its busy containers as the instance's queue; an Active one has an idle
    # container holding the variant, so a query there waits for none of them. Counted as a
    # queue, 7 busy containers would make it 7.5 + 7 x 7 ms and send the query, late, to the
    # worker's queue below.
    v = resnet_like("v")
    workers = [
        make_worker("w1", queued("v", 7), free_slots=0),
        make_worker("lambda-tier", queued("v", 7), pool=LAMBDA, address=""),
    ]

    decision = policy.get_variant(targets(latency=50, accuracy=0.5), [v], workers)

    assert (decision.tier, decision.state) == (Tier.LAMBDA, InstanceState.ACTIVE)
    assert decision.expected_latency_ms == 7.5
    assert not needs_warming(decision, targets(latency=50, accuracy=0.5))


# --- What is queued on an Active instance ------------------------------------------------------


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


# --- Tuned instances (modelless.tuning): the latency the worker measured, not the profile's ------


def tuned(instance: InstanceStats, latency_scale: float, concurrency: int = 1) -> InstanceStats:
    """``instance`` as a worker reports it once its tuner measured it under a configuration."""
    return dataclasses.replace(
        instance, intra_threads=2, inter_threads=1, concurrency=concurrency, latency_scale=latency_scale
    )


def test_a_tuned_instance_measured_slower_is_skipped_when_its_scaled_latency_breaks_the_budget(
    policy: InfaasPolicy,
) -> None:
    # 7.5 ms profiled, measured 2x slower: 15 ms > 10 ms, though the profile alone meets it.
    workers = [make_worker("slow", tuned(make_instance("v"), 2.0)), make_worker("spare", free_slots=1)]

    decision = policy.get_variant(targets(latency=10), [resnet_like(load_ms=1.0)], workers)

    assert (decision.worker_id, decision.state) == ("spare", InstanceState.INACTIVE)


def test_the_instance_measured_faster_is_preferred_and_its_expected_latency_scaled(
    policy: InfaasPolicy,
) -> None:
    workers = [
        make_worker("as-profiled", make_instance("v"), utilisation=0.0),
        make_worker("faster", tuned(make_instance("v"), 0.5), utilisation=0.9),
    ]

    decision = policy.get_variant(targets(latency=50), [resnet_like()], workers)

    assert (decision.worker_id, decision.state) == ("faster", InstanceState.ACTIVE)
    assert decision.expected_latency_ms == 7.5 * 0.5


def test_a_reported_scale_is_clamped_as_the_scaler_clamps_it(policy: InfaasPolicy) -> None:
    workers = [make_worker("w1", tuned(make_instance("v"), 1000.0))]

    decision = policy.get_variant(targets(), [resnet_like()], workers)

    assert decision.expected_latency_ms == 7.5 * MAX_SCALE


def test_concurrent_runs_shorten_a_tuned_instances_queue_wait(policy: InfaasPolicy) -> None:
    # Six queued at one run at a time: 6 x 7 ms; two runs at once, each 1.5x slower: 3 x 10.5 ms.
    workers = [make_worker("w1", tuned(queued("v", 6), 1.5, concurrency=2))]

    decision = policy.get_variant(targets(latency=50), [resnet_like()], workers)

    assert decision.expected_latency_ms == 7.5 * 1.5 + 3 * 7.0 * 1.5
    assert queue_wait_ms(resnet_like(), 6, 1, 1.5, 2) == 3 * 7.0 * 1.5
    assert queue_wait_ms(resnet_like(), 7, 1, 1.0, 2) == 4 * 7.0  # a round of two runs, rounded up


def test_an_instance_not_yet_measured_is_taken_as_profiled(policy: InfaasPolicy) -> None:
    # A configuration reported but no scale measured yet (0): the profile, its concurrency unused.
    plain = [make_worker("w1", queued("v", 6))]
    unmeasured = [make_worker("w1", tuned(queued("v", 6), 0.0, concurrency=4))]

    assert policy.get_variant(targets(latency=50), [resnet_like()], unmeasured) == policy.get_variant(
        targets(latency=50), [resnet_like()], plain
    )


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
                # The queue ahead, run by run at the instance's batch size (within the profile);
                # none on the Lambda tier, whose "queue" is its busy containers.
                runs_of = min(max(1, instance.batch_limit), max(variant.latency_p50_ms))
                runs = 0 if on_lambda(worker.pool) else -(-instance.queue_length // runs_of)
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


# --- queries held to the registered model: the accuracy tolerance, agreement ------------------


def measured(
    variant_id: str,
    precision: str,
    accuracy: float,
    p99: float,
    examples: int = 1000,
    agreement: float | None = None,
    model: str = "m",
) -> VariantProfile:
    """A profile as registration writes it: an accuracy with its Wilson interval."""
    from variants.stats import wilson_interval

    low, high = wilson_interval(round(accuracy * examples), examples)
    return dataclasses.replace(
        make_variant(variant_id, model=model, accuracy=accuracy, p99=p99),
        precision=precision,
        accuracy_examples=examples,
        accuracy_low=low,
        accuracy_high=high,
        agreement=agreement,
    )


def vit_like() -> list[VariantProfile]:
    """The issue's ViT: FP32 at 0.80, INT8 collapsed to 0.16 and faster, INT8 static close to FP32."""
    return [
        measured("fp32", "fp32", 0.80, p99=10.0, agreement=1.0),
        measured("int8-collapsed", "int8", 0.16, p99=3.0, agreement=0.15),
        measured("int8-static", "int8-static", 0.785, p99=5.0, agreement=0.93),
    ]


@pytest.mark.parametrize(
    "query", [targets(), targets(model="m"), targets(latency=100), targets(model="m", latency=100)]
)
def test_named_model_and_no_target_queries_never_get_a_collapsed_variant(
    policy: InfaasPolicy, query: QueryTargets
) -> None:
    candidates = Candidates(vit_like(), accuracy_tolerance=0.02)

    decision = policy.get_variant(query, candidates, [])
    from_plain_list = policy.get_variant(query, vit_like(), [])  # the default tolerance, 0.02

    # 0.785 [0.759, 0.810] reaches 0.80 - 0.02: it may serve, and it is the faster of the two.
    assert decision.variant.variant_id == from_plain_list.variant.variant_id == "int8-static"
    held = candidates.subset(query.min_accuracy, query.model_name)
    assert [v.variant_id for v in held] == ["fp32", "int8-static"]


def test_an_accuracy_target_is_a_trade_off_the_query_asked_for(policy: InfaasPolicy) -> None:
    # With a target, the target decides: the collapsed variant meets accuracy >= 0.1.
    decision = policy.get_variant(targets(accuracy=0.1), Candidates(vit_like()), [])
    assert decision.variant.variant_id == "int8-collapsed"


def test_the_tolerance_is_a_setting(policy: InfaasPolicy) -> None:
    strict = Candidates(vit_like(), accuracy_tolerance=0.0)
    # 0.785's interval tops at ~0.810 >= 0.80: still in; with only 100 examples it is wider still.
    assert policy.get_variant(targets(model="m"), strict, []).variant.variant_id == "int8-static"
    narrow = [
        measured("fp32", "fp32", 0.80, p99=10.0, examples=100_000),
        measured("int8-static", "int8-static", 0.785, p99=5.0, examples=100_000),
    ]
    assert policy.get_variant(targets(model="m"), Candidates(narrow, 0.0), []).variant.variant_id == "fp32"
    assert (
        policy.get_variant(targets(model="m"), Candidates(narrow, 0.02), []).variant.variant_id
        == "int8-static"
    )


def test_a_policy_given_its_tolerance_reads_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import modelless.config

    def no_settings() -> None:
        raise AssertionError("a policy given its tolerance read the settings")

    monkeypatch.setattr(modelless.config, "get_settings", no_settings)
    narrow = [
        measured("fp32", "fp32", 0.80, p99=10.0, examples=100_000),
        measured("int8-static", "int8-static", 0.785, p99=5.0, examples=100_000),
    ]
    strict, loose = InfaasPolicy(DEFAULT_POOLS, 0.0), InfaasPolicy(DEFAULT_POOLS, 0.02)
    assert strict.get_variant(targets(model="m"), narrow, []).variant.variant_id == "fp32"
    assert loose.get_variant(targets(model="m"), Candidates(narrow), []).variant.variant_id == "int8-static"
    assert strict.warmup(targets(model="m", latency=100), narrow, [make_worker("w1")]) is not None
    # A list's own tolerance goes first: the policy's is for the lists that carry none.
    assert strict.get_variant(targets(model="m"), Candidates(narrow, 0.02), []).variant.variant_id == (
        "int8-static"
    )


def test_a_policy_without_a_tolerance_holds_to_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from modelless.config import get_settings

    narrow = [
        measured("fp32", "fp32", 0.80, p99=10.0, examples=100_000),
        measured("int8-static", "int8-static", 0.785, p99=5.0, examples=100_000),
    ]
    monkeypatch.setenv("MODELLESS_ACCURACY_TOLERANCE", "0.0")
    assert get_settings().accuracy_tolerance == 0.0
    assert (
        InfaasPolicy(DEFAULT_POOLS).get_variant(targets(model="m"), narrow, []).variant.variant_id == "fp32"
    )


def test_the_reference_is_per_model_and_comes_from_the_registered_precision() -> None:
    variants = [
        *vit_like(),
        measured("b-fp32", "fp32", 0.60, p99=1.0, model="b"),
        measured("b-int8", "int8", 0.50, p99=0.5, model="b"),
        make_variant("hand-made", model="c", accuracy=0.1),  # no measured profile: no reference
    ]
    candidates = Candidates(variants, accuracy_tolerance=0.02)

    assert dict(candidates.references()) == {"m": 0.80, "b": 0.60}
    no_target = [v.variant_id for v in candidates.subset(0.0)]
    assert no_target == ["fp32", "int8-static", "b-fp32", "hand-made"]
    # A subset (which may have left FP32 out) holds its variants to the whole list's references.
    assert candidates.subset(0.85).references() is candidates.references()
    assert [v.variant_id for v in candidates.subset(0.7).subset(0.0, "m")] == ["fp32", "int8-static"]


def test_warmup_is_held_to_the_reference_too(policy: InfaasPolicy) -> None:
    worker = make_worker("w1")
    decision = policy.warmup(targets(model="m", latency=100), vit_like(), [worker])
    assert decision is not None and decision.variant.variant_id != "int8-collapsed"


def test_among_equally_fast_variants_the_one_closer_to_the_original_wins(policy: InfaasPolicy) -> None:
    closer = measured("z-closer", "int8", 0.80, p99=2.0, agreement=0.99)
    farther = measured("a-farther", "int8", 0.80, p99=2.0, agreement=0.90)

    inactive = policy.get_variant(targets(accuracy=0.5), [farther, closer], [])
    workers = [make_worker("w1", make_instance("a-farther"), make_instance("z-closer"))]
    active = policy.get_variant(targets(accuracy=0.5), [farther, closer], workers)

    assert inactive.variant is closer  # (the id alone would pick a-farther)
    assert active.variant is closer and active.state is InstanceState.ACTIVE
