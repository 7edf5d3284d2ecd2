"""A plan that moves a busy instance's slot to another variant, applied to real worker processes.

Under model-less traffic every loaded instance keeps receiving queries, so an unload that waits
for an idle instance never happens and the planned variant is never placed. The placer drains
the busy instance instead: its worker stops taking queries for it (503, retried by the
dispatcher elsewhere), finishes those it holds, frees the slot, and the planned variant is loaded
there. Not one query fails, and the drained variant is not loaded back on demand by queries sent
from a gateway's older view.

Every wait is bounded; every process is stopped by its fixture. Timings are never asserted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher, QueryResult
from modelless.exceptions import InvalidInputError, ServiceUnavailableError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalPoolProvider, LocalWorkerPool
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Reply
from modelless.types import QueryTargets, VariantProfile, WorkerState
from modelless.worker.server import Worker
from tests.functional.workers_kit import (
    APP,
    INVOKE_TIMEOUT_S,
    REPORT_WITHIN_S,
    Load,
    Setup,
    expected_logits,
    gate_worker_runs,
    invocation_of,
    make_variant,
    publish_linear_model,
    report_url_of,
    reported,
    sample_inputs,
    served,
    worker_pool,
)
from tests.waiting import scaled, wait_for

PLACED_WITHIN_S = 20.0


def stats(address: str) -> dict[str, Any]:
    reply: dict[str, Any] = httpx.get(f"{address}/stats", timeout=5.0).json()
    return reply


def qps_of(address: str, variant_id: str) -> float:
    state = WorkerState.from_json(stats(address)["state"])
    return next((i.qps for i in state.instances if i.variant_id == variant_id), 0.0)


@pytest.fixture
def one_slot_workers(setup: Setup, redis_store: RedisMetadataStore) -> Iterator[LocalWorkerPool]:
    with worker_pool(setup.repository_url, report_url_of(redis_store), setup.tmp, slots=1) as workers:
        workers.scale_to(2)
        for worker_id in workers.workers():
            wait_for(partial(reported, redis_store, worker_id), REPORT_WITHIN_S, f"{worker_id}'s report")
        yield workers


def variants() -> tuple[VariantProfile, VariantProfile, VariantProfile]:
    """Three variants of the linear model: ``busy`` the fastest (so the cheapest: model-less
    queries all go to it while it is loaded), ``kept`` and ``planned`` as profiled."""
    busy = make_variant(suffix="-busy")
    faster = {batch: latency * 0.6 for batch, latency in busy.latency_p99_ms.items()}
    busy = replace(busy, latency_p99_ms=faster)
    return busy, make_variant(suffix="-kept"), make_variant(suffix="-planned")


def test_a_busy_surplus_instance_is_drained_for_the_planned_variant_and_no_query_fails(
    one_slot_workers: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    busy, kept, planned = variants()
    profiles = {v.variant_id: v for v in (busy, kept, planned)}
    publish_linear_model(redis_store, busy, kept, planned)
    provider = LocalPoolProvider({"cpu": one_slot_workers}, forget=redis_store.remove_worker)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None)
    addresses = {worker_id: child.address for worker_id, child in one_slot_workers.workers().items()}
    inputs = sample_inputs(1)
    expected = expected_logits(inputs)
    targets = QueryTargets(app_id=APP, min_accuracy=0.5, latency_ms=1000.0)
    try:
        provider.assign("cpu", {busy.variant_id: 1, kept.variant_id: 1}, profiles)
        assert provider.shortfall["cpu"] == {}
        [busy_worker] = [w for w, a in addresses.items() if stats(a)["loaded"] == [busy.variant_id]]

        def both_reported() -> bool:
            states = [reported(redis_store, worker_id) for worker_id in addresses]
            return all(state is not None and state.instances for state in states)

        wait_for(both_reported, REPORT_WITHIN_S, "both instances in the workers' reports")

        load = Load(3, lambda: dispatcher.online_query(targets, inputs), pause_s=0.005)
        try:
            wait_for(
                lambda: qps_of(addresses[busy_worker], busy.variant_id) > 0,
                REPORT_WITHIN_S * 3,
                "steady queries on the busy instance",
            )
            # The plan moves the busy instance's slot to another variant. Applied as the scaler
            # applies a plan, tick after tick, until it is placed.
            plan = {kept.variant_id: 1, planned.variant_id: 1}

            def placed() -> bool:
                provider.assign("cpu", plan, profiles)
                return provider.shortfall["cpu"] == {}

            wait_for(placed, PLACED_WITHIN_S, "the planned variant to be placed", interval_s=0.5)
            assert stats(addresses[busy_worker])["loaded"] == [planned.variant_id]
            # Queries keep flowing for a while, some routed from views older than the drain.
            answered = len(load.results)
            wait_for(lambda: len(load.results) > answered + 50, PLACED_WITHIN_S, "more answers")
        finally:
            load.stop()

        assert load.errors == [], load.errors[:3]
        results = [r for r in load.results if isinstance(r, QueryResult)]
        assert len(results) == len(load.results)
        for result in results:
            np.testing.assert_allclose(result.outputs, expected, rtol=1e-5, atol=1e-5)
        # The drained variant was not loaded back on demand: the slot holds what the plan wants.
        loaded = sorted(variant for address in addresses.values() for variant in stats(address)["loaded"])
        assert loaded == sorted(plan)
    finally:
        provider.close()


# --- the worker's drain, in process ------------------------------------------------------------


def test_a_draining_instance_refuses_new_queries_finishes_its_own_then_frees_its_slot(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = gate_worker_runs(monkeypatch)
    worker = Worker("drain-0", "cpu", 1, setup.repository_url, setup.tmp / "cache")
    variant, other, inputs = make_variant(), make_variant(suffix="-other"), sample_inputs(2)
    outcome: list[Reply] = []
    request = threading.Thread(target=lambda: outcome.append(served(worker, invocation_of(variant, inputs))))
    request.start()
    assert entered.wait(scaled(INVOKE_TIMEOUT_S)), "the request never ran"

    reply = worker.unload({"variant_id": variant.variant_id, "wait_s": 0.05, "reserve": True})

    assert reply == {"unloaded": False, "draining": True}  # a query is still running on it
    draining = worker.monitor.snapshot(0.0)
    assert draining.instances == ()  # out of the reports: selection stops choosing it...
    assert draining.free_slots == 0  # ...but its slot is not free until its query is done
    with pytest.raises(ServiceUnavailableError) as refused:  # new queries: a retryable 503
        served(worker, invocation_of(variant, inputs))
    assert refused.value.code == "instance_draining"
    assert refused.value.status_code == 503

    release.set()
    request.join(scaled(INVOKE_TIMEOUT_S))
    [answered] = outcome  # the query it held is answered
    np.testing.assert_allclose(answered.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    freed = worker.monitor.snapshot(0.0)
    assert freed.free_slots == 1 and worker.runtime.loaded_ids == []
    # The slot was reserved for another variant: shortly after, a query for the drained one is
    # still refused rather than loading it back on demand...
    with pytest.raises(ServiceUnavailableError, match="just unloaded"):
        served(worker, invocation_of(variant, inputs))
    # ...and the freed slot takes the plan's variant.
    assert worker.load({"variant": other.to_json()})["loaded"] == other.variant_id
    assert worker.runtime.loaded_ids == [other.variant_id]


def test_a_drain_that_reserves_nothing_lets_the_next_query_load_the_variant_again(setup: Setup) -> None:
    # Nothing waits for the slot (the plan wants fewer instances, not others): a later query for
    # the variant loads it on demand, as for any variant no worker holds, rather than failing.
    worker = Worker("drain-3", "cpu", 1, setup.repository_url, setup.tmp / "cache")
    variant, inputs = make_variant(), sample_inputs(1)
    served(worker, invocation_of(variant, inputs))

    assert worker.unload({"variant_id": variant.variant_id}) == {"unloaded": True, "draining": False}
    assert worker.runtime.loaded_ids == []

    reply = served(worker, invocation_of(variant, inputs))
    np.testing.assert_allclose(reply.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert worker.runtime.loaded_ids == [variant.variant_id]


def test_a_plan_wanting_a_draining_variant_again_keeps_it(setup: Setup) -> None:
    worker = Worker("drain-1", "cpu", 1, setup.repository_url, setup.tmp / "cache")
    variant, inputs = make_variant(), sample_inputs(1)
    served(worker, invocation_of(variant, inputs))
    worker._admit(variant.variant_id)  # a query in flight on it, as far as the drain can tell
    try:
        assert worker.unload({"variant_id": variant.variant_id})["draining"] is True
        worker.load({"variant": variant.to_json()})
    finally:
        worker._leave(variant.variant_id)
    state = worker.monitor.snapshot(0.0)
    assert [i.variant_id for i in state.instances] == [variant.variant_id]
    assert worker.runtime.loaded_ids == [variant.variant_id]
    assert served(worker, invocation_of(variant, inputs)).batch == len(inputs)  # served, not refused


def test_unload_refuses_nonsense_options(setup: Setup) -> None:
    worker = Worker("drain-2", "cpu", 1, setup.repository_url, setup.tmp / "cache")
    for wait in (-1, "soon", float("nan"), True):
        with pytest.raises(InvalidInputError, match="wait_s"):
            worker.unload({"variant_id": "x", "wait_s": wait})
    with pytest.raises(InvalidInputError, match="reserve"):
        worker.unload({"variant_id": "x", "reserve": "yes"})
