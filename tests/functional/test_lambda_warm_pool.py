"""The scaler's Lambda warm pool over the real local Lambda tier: containers (real processes)
started ahead of a burst, each holding the variant, so that concurrent queries start none."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.warm import InvokingWarmPool
from modelless.runtime import outputs_of
from modelless.types import InstanceState
from tests.functional.workers_kit import (
    INVOKE_TIMEOUT_S,
    expected_logits,
    make_variant,
    payload,
    publish_linear_model,
    sample_inputs,
)
from tests.waiting import scaled, wait_for


def test_the_warm_pool_starts_its_containers_before_the_burst_that_needs_them(tier: LocalLambdaTier) -> None:
    variant = make_variant(pool="lambda-cpu")
    store = InMemoryMetadataStore()
    publish_linear_model(store, variant)
    warm_pool = InvokingWarmPool(tier, store)
    try:
        warm_pool.keep_warm({variant.variant_id: tier.concurrency}, {variant.variant_id: variant})

        def warm_and_idle() -> bool:
            state = tier.state()
            return (
                tier.size == tier.concurrency
                and tier.cold_starts == tier.concurrency
                and [(i.variant_id, i.state, i.queue_length) for i in state.instances]
                == [(variant.variant_id, InstanceState.ACTIVE, 0)]
            )

        wait_for(warm_and_idle, scaled(60.0), f"{tier.concurrency} warm, idle containers")
        # The burst: as many queries at once as there are containers; none waits for a start.
        inputs = sample_inputs(1)
        with ThreadPoolExecutor(tier.concurrency) as burst:
            bodies = list(
                burst.map(
                    lambda _: tier.invoke(payload(variant, inputs), INVOKE_TIMEOUT_S), range(tier.concurrency)
                )
            )
        assert [body["cold_start"] for body in bodies] == [False] * tier.concurrency
        assert [body["load_ms"] for body in bodies] == [0] * tier.concurrency  # each held the variant
        for body in bodies:
            np.testing.assert_allclose(outputs_of(body), expected_logits(inputs), rtol=1e-5, atol=1e-5)
        assert tier.cold_starts == tier.concurrency
    finally:
        warm_pool.close()
