"""The scaler's Lambda warm pool over the real local Lambda tier: containers (real processes)
started ahead of a burst, each holding the variant, so that concurrent queries start none."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.warm import InvokingWarmPool
from modelless.types import InstanceState
from tests.functional.workers_kit import (
    INVOKE_TIMEOUT_S,
    expected_logits,
    invocation_of,
    make_variant,
    publish_linear_model,
    sample_inputs,
)
from tests.waiting import scaled, wait_for


def test_the_warm_pool_starts_its_containers_before_the_burst_that_needs_them(tier: LocalLambdaTier) -> None:
    # Two variants of one memory size: every warm container holds both.
    variants = [make_variant(pool="lambda-cpu"), make_variant(pool="lambda-cpu", suffix="-b")]
    store = InMemoryMetadataStore()
    publish_linear_model(store, *variants)
    warm_pool = InvokingWarmPool(tier, store, capacity=tier.concurrency)
    try:
        warm_pool.keep_warm(
            {v.variant_id: tier.concurrency for v in variants}, {v.variant_id: v for v in variants}
        )

        def warm_and_idle() -> bool:
            state = tier.state()
            return (
                tier.size == tier.concurrency
                and tier.cold_starts == tier.concurrency
                and sorted((i.variant_id, i.state, i.queue_length) for i in state.instances)
                == sorted((v.variant_id, InstanceState.ACTIVE, 0) for v in variants)
            )

        wait_for(
            warm_and_idle, scaled(60.0), f"{tier.concurrency} warm, idle containers holding both variants"
        )
        inputs = sample_inputs(1)
        for variant in variants:
            # A burst: as many queries at once as there are containers; none waits for a start
            # or a load.
            with ThreadPoolExecutor(tier.concurrency) as burst:
                replies = list(
                    burst.map(
                        lambda _, v=variant: tier.invoke(invocation_of(v, inputs), INVOKE_TIMEOUT_S),
                        range(tier.concurrency),
                    )
                )
            assert [(reply.cold_start, reply.load_ms) for reply in replies] == [(False, 0)] * tier.concurrency
            for reply in replies:
                np.testing.assert_allclose(reply.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
        assert tier.cold_starts == tier.concurrency
    finally:
        warm_pool.close()
