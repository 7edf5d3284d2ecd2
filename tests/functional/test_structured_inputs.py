"""A model of two int64 inputs (token ids and a mask) served for real: its batches travel as
structured arrays through a worker process (batched with each other) and the local Lambda tier,
and come back with exactly the logits the model gives; no float32 cast anywhere on the way."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.inputs.tensors import batch_dtype, from_feeds
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Reply
from modelless.types import QueryTargets, Registration, RegistrationStatus, Tier, VariantProfile
from tests.functional.workers_kit import (
    APP,
    INVOKE_TIMEOUT_S,
    Setup,
    invocation_of,
    make_variant,
    start_worker,
)
from tests.input_models import TOKEN_SPECS, token_inputs, token_logits, token_model, token_record
from tests.waiting import scaled

TOKENS_KEY = f"apps/{APP}/tokens/variants/fp32-basic.onnx"


def tokens_variant(setup: Setup, pool: str) -> VariantProfile:
    LocalModelRepository(Path(setup.repository_url)).put(TOKENS_KEY, token_model())
    return dataclasses.replace(
        make_variant(pool=pool, artifact_key=TOKENS_KEY),
        variant_id=f"{APP}/tokens/fp32-basic/{pool}",
        model_name="tokens",
        size_bytes=len(token_model()),
    )


def structured(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return from_feeds({"ids": ids, "mask": mask}, TOKEN_SPECS)


def assert_token_logits(reply: Reply, ids: np.ndarray, mask: np.ndarray) -> None:
    np.testing.assert_allclose(reply.outputs, token_logits(ids, mask), rtol=1e-5)


CALLERS = 16
CALLS_PER_CALLER = 4


def test_concurrent_structured_int64_batches_share_batches_on_a_worker_process(
    setup: Setup, pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    worker = start_worker(pool, redis_store)
    variant = tokens_variant(setup, "cpu")
    invoker.invoke(
        worker.address, invocation_of(variant, structured(*token_inputs(1))), INVOKE_TIMEOUT_S
    )  # load
    replies: list[tuple[np.ndarray, np.ndarray, Reply]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CALLERS)

    def caller(index: int) -> None:
        try:
            barrier.wait(INVOKE_TIMEOUT_S)
            for call in range(CALLS_PER_CALLER):
                ids, mask = token_inputs(1 + (index + call) % 3, seed=index * 100 + call)
                reply = invoker.invoke(
                    worker.address, invocation_of(variant, structured(ids, mask)), INVOKE_TIMEOUT_S
                )
                with lock:
                    replies.append((ids, mask, reply))
        except BaseException as error:  # reported by the test thread below
            errors.append(error)

    # Concurrent requests for one variant go through its batcher, which concatenates the
    # structured batches of the requests it runs together and splits the outputs back.
    callers = [threading.Thread(target=caller, args=(index,), daemon=True) for index in range(CALLERS)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(scaled(INVOKE_TIMEOUT_S * 2))
    assert not any(thread.is_alive() for thread in callers), "a caller hung"
    assert errors == []

    assert len(replies) == CALLERS * CALLS_PER_CALLER
    for ids, mask, reply in replies:
        assert_token_logits(reply, ids, mask)
        assert reply.batch >= len(ids)
    assert any(reply.batch > len(ids) for ids, _, reply in replies), "no request shared a batch"


def test_structured_int64_batch_runs_on_the_local_lambda_tier(setup: Setup, tier: LocalLambdaTier) -> None:
    variant = tokens_variant(setup, "lambda-cpu")
    ids, mask = token_inputs(3)
    batch = structured(ids, mask)
    assert batch.dtype == batch_dtype(TOKEN_SPECS)

    reply = tier.invoke(invocation_of(variant, batch), INVOKE_TIMEOUT_S)

    assert reply.cold_start is True
    assert reply.batch == 3
    assert_token_logits(reply, ids, mask)


def test_dispatcher_serves_a_two_input_model_on_a_worker(
    setup: Setup,
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    tier: LocalLambdaTier,
) -> None:
    variant = tokens_variant(setup, "cpu")
    record = token_record(APP, "tokens", artifact_key=TOKENS_KEY, ready=False)
    registration = Registration(record.registration_id, APP, "tokens")
    redis_store.add_model(record, registration)
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [variant.variant_id]
    redis_store.publish_variants(dataclasses.replace(record, ready=True), [variant], registration)
    worker = start_worker(pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, tier)
    ids, mask = token_inputs(4, seed=11)

    result = dispatcher.online_query(QueryTargets(APP, model_name="tokens", batch=4), structured(ids, mask))

    assert result.tier is Tier.WORKER and result.worker_id == worker.worker_id
    np.testing.assert_allclose(result.outputs, token_logits(ids, mask), rtol=1e-5)
