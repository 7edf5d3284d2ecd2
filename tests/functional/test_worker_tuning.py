"""The parallelism tuner (modelless.tuning, RRL) on real worker processes: a switch of
configuration under concurrent load drops no query and every reply is still right; a worker run
with ``--tune`` tunes its instance under live traffic, reports the configuration it reached, and
the scaler plans the variant with that capacity; ``POST /configure`` refuses bad input.

Every wait is bounded; every worker is stopped by its fixture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.processes import ChildProcess, spawn
from modelless.query_load import QueryGroup
from modelless.repository.local import LocalModelRepository
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Invocation
from modelless.tuning.base import ParallelConfig
from modelless.tuning.capacity import clamped_scale
from modelless.types import QueryTargets
from tests.functional.workers_kit import (
    APP,
    ARTIFACT_KEY,
    INVOKE_TIMEOUT_S,
    Load,
    expected_logits,
    make_variant,
    publish_linear_model,
    report_url_of,
    reported,
    sample_inputs,
)
from tests.models import linear_model
from tests.unit.test_scaler import FakeProvider
from tests.waiting import scaled, wait_for

VARIANT = make_variant()
CALLERS = 6
SWITCHES = [
    ParallelConfig(2, 1, 1),
    ParallelConfig(1, 1, 2),
    ParallelConfig(2, 2, 1),
    ParallelConfig(1, 2, 2),
    ParallelConfig(1, 1, 1),
    ParallelConfig(2, 1, 2),
]


@pytest.fixture
def repository_url(tmp_path: Path) -> str:
    LocalModelRepository(tmp_path / "repo").put(ARTIFACT_KEY, linear_model())
    return str(tmp_path / "repo")


def start(
    spawned: list[ChildProcess], tmp: Path, repository_url: str, report_url: str, name: str, *extra: str
) -> ChildProcess:
    child = spawn(
        name,
        "modelless.worker",
        [
            *("--worker-id", name, "--pool", "cpu", "--repository", repository_url),
            *("--cache-dir", str(tmp / "cache"), "--report-url", report_url, *extra),
        ],
        tmp / "logs",
        env={"OMP_NUM_THREADS": "1"},
    )
    spawned.append(child)
    return child


def stats(address: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{address}/stats", timeout=5.0).json()
    return body


def configure(address: str, body: object) -> httpx.Response:
    return httpx.post(f"{address}/configure", json=body, timeout=scaled(INVOKE_TIMEOUT_S))


def correct_caller(invoker: HttpWorkerInvoker, address: str, rows: int = 2) -> Any:
    inputs = sample_inputs(rows)
    wanted = expected_logits(inputs)

    def call() -> bool:
        invocation = Invocation(VARIANT, inputs, "functional-test", deadline_ms=200.0)
        reply = invoker.invoke(address, invocation, INVOKE_TIMEOUT_S)
        np.testing.assert_allclose(reply.outputs, wanted, rtol=1e-5, atol=1e-5)
        return True

    return call


def more_than(load: Load, count: int) -> Callable[[], bool]:
    """Whether ``count`` more calls than now have finished."""
    start = load.count()
    return lambda: load.count() >= start + count


def test_switching_configuration_under_load_drops_no_query(
    tmp_path: Path, repository_url: str, redis_store: RedisMetadataStore, spawned: list[ChildProcess]
) -> None:
    worker = start(spawned, tmp_path, repository_url, report_url_of(redis_store), "tuning-switch")
    invoker = HttpWorkerInvoker()
    try:
        load = Load(CALLERS, correct_caller(invoker, worker.address))
        try:
            for config in SWITCHES:
                # Traffic flows on the old configuration, then the switch lands mid-stream.
                wait_for(more_than(load, 20), 10.0, "queries between switches")
                answer = configure(
                    worker.address, {"variant_id": VARIANT.variant_id, "config": config.to_dict()}
                )
                assert answer.status_code == 200, answer.text
                assert answer.json()["config"] == config.to_dict()
                current = stats(worker.address)
                assert current["configs"][VARIANT.variant_id] == config.to_dict()
                assert current["batching"][VARIANT.variant_id]["runners"] == config.concurrency
            wait_for(more_than(load, 20), 10.0, "queries on the last configuration")
        finally:
            load.stop()
    finally:
        invoker.close()
    assert load.errors == [], f"{len(load.errors)} queries failed across the switches: {load.errors[:3]}"
    assert len(load.results) >= 20 * (len(SWITCHES) + 1)
    # The last configuration is what the worker reports for the instance.
    last = SWITCHES[-1]
    state = wait_for(
        lambda: next(
            (
                w
                for w in [reported(redis_store, "tuning-switch")]
                if w is not None and w.instances and w.instances[0].intra_threads == last.intra
            ),
            None,
        ),
        5.0,
        "a report of the last configuration",
    )
    [instance] = state.instances
    assert (instance.intra_threads, instance.inter_threads, instance.concurrency) == (2, 1, 2)


def test_configure_refuses_bad_input_and_unknown_instances(
    tmp_path: Path, repository_url: str, redis_store: RedisMetadataStore, spawned: list[ChildProcess]
) -> None:
    worker = start(spawned, tmp_path, repository_url, report_url_of(redis_store), "tuning-bad")
    unknown = configure(worker.address, {"variant_id": VARIANT.variant_id, "config": {"intra": 2}})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    invoker = HttpWorkerInvoker()
    try:
        correct_caller(invoker, worker.address)()  # loads it
    finally:
        invoker.close()
    for bad in (
        {"variant_id": VARIANT.variant_id, "config": {"intra": 0}},
        {"variant_id": VARIANT.variant_id, "config": {"threads": 2}},
        {"variant_id": VARIANT.variant_id, "config": "fast"},
        {"variant_id": 7, "config": {"intra": 1}},
    ):
        answer = configure(worker.address, bad)
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["code"] == "invalid_input"
    assert stats(worker.address)["configs"][VARIANT.variant_id] == ParallelConfig().to_dict()


def test_a_tuning_worker_tunes_under_load_and_the_scaler_plans_with_what_it_reached(
    tmp_path: Path, repository_url: str, redis_store: RedisMetadataStore, spawned: list[ChildProcess]
) -> None:
    publish_linear_model(redis_store, VARIANT)
    worker = start(
        spawned,
        tmp_path,
        repository_url,
        report_url_of(redis_store),
        "tuning-live",
        *("--tune", "region", "--tune-window-s", "0.5", "--tune-min-queries", "10"),
    )
    invoker = HttpWorkerInvoker()
    try:
        load = Load(CALLERS, correct_caller(invoker, worker.address))
        try:
            tuned = wait_for(
                # Converged and measured under where it settled: with the load stopped no window
                # completes, so a switch to a configuration not measured yet would stay unmeasured.
                lambda: (
                    (t := stats(worker.address)["tuning"].get(VARIANT.variant_id))
                    and t["trials"] >= 3
                    and t["converged"]
                    and t["latency_scale"] > 0
                    and t
                ),
                60.0,
                "three tuning windows and the tuner's convergence",
            )
        finally:
            load.stop()
    finally:
        invoker.close()
    assert load.errors == [], f"{len(load.errors)} queries failed while tuning: {load.errors[:3]}"
    assert tuned["policy"] == "region" and len(tuned["history"]) >= 3
    tried = {tuple(sorted(t["config"].items())) for t in tuned["history"]}
    assert len(tried) >= 2, "the tuner never left the configuration it started on"
    config = ParallelConfig.from_dict(tuned["config"])

    # The worker reports the configuration it runs and its measured slowdown under it...
    def reporting_tuned() -> Any:
        state = reported(redis_store, "tuning-live")
        if state is None or not state.instances or state.instances[0].latency_scale <= 0:
            return None
        return state.instances[0]

    instance = wait_for(reporting_tuned, 15.0, "a report of the tuned instance")
    assert instance.intra_threads >= 1 and instance.concurrency >= 1 and instance.latency_scale > 0

    # ...and the scaler plans the variant with it: its CPU demand is the configuration's threads,
    # its capacity the profile's scaled by what was measured.
    now = time.time()
    group = QueryGroup(APP, None, 0.0, 200.0)
    for second in range(int(now) - 10, int(now)):
        redis_store.add_load({group.key: 50}, second)
    scaler = Scaler(
        redis_store,
        FakeProvider({"cpu": 1}),
        DEFAULT_POOLS,
        ScalerConfig(window_s=10, max_workers={"cpu": 4}, provision_for_envelope=False),
    )
    snapshot = scaler.build_problem(time.time())
    [planned] = [v for v in snapshot.problem.variants if v.id == VARIANT.variant_id]
    reported_now = reported(redis_store, "tuning-live")
    assert reported_now is not None
    [latest] = reported_now.instances
    threads = latest.intra_threads * latest.inter_threads * latest.concurrency
    assert planned.demand["vcpu"] == threads
    scaled_p99 = VARIANT.latency_p99_ms[1] * clamped_scale(latest.latency_scale)
    assert snapshot.profiles[VARIANT.variant_id].latency_p99_ms[1] == pytest.approx(scaled_p99, rel=1e-3)

    # ...and so does a gateway's selection: a query sent to the tuned instance expects its runs
    # as measured, not as profiled. Once the worker's reports show nothing queued (the load has
    # stopped; its monitor's window lags by a few seconds), that is the scaled p99 alone.
    def idle() -> bool:
        state = reported(redis_store, "tuning-live")
        return state is not None and all(i.queue_length == 0 for i in state.instances)

    wait_for(idle, 15.0, "the worker's reports to show its queue empty")
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), HttpWorkerInvoker(), None)
    budget_ms = VARIANT.latency_p99_ms[1] * 20  # beyond the clamp: the instance qualifies at any scale
    decision = dispatcher.select(QueryTargets(VARIANT.app_id, budget_ms, 0.0, VARIANT.model_name, 1))
    assert decision.worker_id == "tuning-live" and decision.variant.variant_id == VARIANT.variant_id
    assert decision.expected_latency_ms == pytest.approx(scaled_p99, rel=1e-3)
    assert config.threads >= 1
