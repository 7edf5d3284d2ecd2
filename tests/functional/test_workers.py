"""Real worker processes and the local Lambda tier: start-up, state reports into Redis, correct
inference; a worker that dies or hangs mid-query and the dispatcher's retry on another worker or
the Lambda tier (or its clear 503); the Lambda tier's bounded cold starts; unloads racing a
request; the worker's command line (bind one address, advertise another, a fixed port).

Every wait is bounded; every pool, tier and invoker is closed by its fixture.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import modelless.metadata.redis as redis_backend
import modelless.pools.lambda_local as lambda_local
import modelless.worker.server as worker_server
from infra.local.ports import free_port
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import DEADLINE_GRACE_S, Dispatcher, QueryResult
from modelless.exceptions import (
    ModellessError,
    QueryFailedError,
    ServiceUnavailableError,
    WorkerUnreachableError,
)
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.lambda_local import LAMBDA_TIER_ID, LocalLambdaTier
from modelless.pools.local import LocalWorkerPool
from modelless.pools.processes import ChildProcess, spawn
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Reply
from modelless.types import (
    InstanceState,
    QueryTargets,
    Tier,
    VariantProfile,
    WorkerState,
)
from modelless.worker.server import Worker, advertise_host_for, http_address
from tests.functional.workers_kit import (
    APP,
    INVOKE_TIMEOUT_S,
    MODEL,
    REPORT_WITHIN_S,
    Setup,
    expected_logits,
    gate_worker_runs,
    invocation_of,
    make_variant,
    publish_linear_model,
    reported,
    reported_after,
    sample_inputs,
    served,
    start_worker,
)
from tests.waiting import scaled, wait_for

# --- pool workers -----------------------------------------------------------------------------


def test_worker_starts_and_reports_its_state(pool: LocalWorkerPool, redis_store: RedisMetadataStore) -> None:
    state = start_worker(pool, redis_store)

    child = pool.workers()[state.worker_id]
    assert child.alive()
    assert child.started_ms > 0
    assert state.pool == "cpu"
    assert state.address == child.address
    assert state.free_slots == 2
    assert state.utilisation == 0.0
    assert state.instances == ()
    assert time.time() - state.reported_at < REPORT_WITHIN_S
    assert [w.worker_id for w in redis_store.list_workers("cpu")] == [state.worker_id]
    assert redis_store.list_workers("lambda-cpu") == []


def test_worker_keeps_reporting(pool: LocalWorkerPool, redis_store: RedisMetadataStore) -> None:
    first = start_worker(pool, redis_store)

    later = wait_for(
        lambda: reported_after(redis_store, first.worker_id, first.reported_at),
        REPORT_WITHIN_S,
        "a second report",
    )

    assert later.worker_id == first.worker_id


def test_worker_invocation_returns_correct_logits_and_reports_an_active_instance(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    idle = start_worker(pool, redis_store)
    variant = make_variant()
    inputs = sample_inputs(4)

    first = invoker.invoke(idle.address, invocation_of(variant, inputs), INVOKE_TIMEOUT_S)
    second = invoker.invoke(idle.address, invocation_of(variant, inputs[:1]), INVOKE_TIMEOUT_S)

    np.testing.assert_allclose(first.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second.outputs, expected_logits(inputs[:1]), rtol=1e-5, atol=1e-5)
    assert first.batch == 4 and second.batch == 1
    assert first.load_ms > 0  # the first invocation loaded the variant...
    assert second.load_ms == 0  # ...the second found it loaded
    assert first.inference_ms > 0

    def active_report() -> WorkerState | None:
        state = reported(redis_store, idle.worker_id)
        if state is None or not state.instances:
            return None
        return state

    busy = wait_for(active_report, REPORT_WITHIN_S, "a report showing the loaded variant")
    [instance] = busy.instances
    assert instance.variant_id == variant.variant_id
    assert instance.state is InstanceState.ACTIVE
    assert instance.qps > 0
    assert instance.queue_length == 0
    assert instance.latency_p99_ms >= instance.latency_p50_ms > 0
    assert busy.free_slots == idle.free_slots - 1
    assert 0 <= busy.utilisation <= 1


def test_worker_answers_a_missing_artifact_with_not_found_and_keeps_serving(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    state = start_worker(pool, redis_store)
    missing = make_variant(artifact_key=f"apps/{APP}/{MODEL}/variants/missing.onnx", suffix="-missing")

    with pytest.raises(ModellessError) as raised:
        invoker.invoke(state.address, invocation_of(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)
    assert raised.value.code == "not_found"
    assert raised.value.status_code == 404

    reply = invoker.invoke(state.address, invocation_of(make_variant(), sample_inputs(2)), INVOKE_TIMEOUT_S)
    np.testing.assert_allclose(reply.outputs, expected_logits(sample_inputs(2)), rtol=1e-5, atol=1e-5)


def test_failed_load_is_not_reported_as_a_loaded_instance(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    state = start_worker(pool, redis_store)
    missing = make_variant(artifact_key=f"apps/{APP}/{MODEL}/variants/missing.onnx", suffix="-missing")
    with pytest.raises(ModellessError):
        invoker.invoke(state.address, invocation_of(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)
    before = reported(redis_store, state.worker_id)
    assert before is not None

    after = wait_for(
        lambda: reported_after(redis_store, state.worker_id, before.reported_at),
        REPORT_WITHIN_S,
        "a report after the failed load",
    )

    assert [i.variant_id for i in after.instances] == []
    assert after.free_slots == state.free_slots


def test_killed_worker_is_unreachable_and_its_state_goes_stale(
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A shorter staleness window than production's, so the test need not wait 10 s.
    monkeypatch.setattr(redis_backend, "WORKER_STALE_AFTER_S", 1.5)
    state = start_worker(pool, redis_store)
    invoker.invoke(state.address, invocation_of(make_variant(), sample_inputs(1)), INVOKE_TIMEOUT_S)

    pool.kill(state.worker_id)

    assert state.worker_id not in pool.workers()
    with pytest.raises(WorkerUnreachableError):
        invoker.invoke(state.address, invocation_of(make_variant(), sample_inputs(1)), 5.0)
    wait_for(lambda: reported(redis_store, state.worker_id) is None, 5.0, "the dead worker to go stale")
    assert redis_store.list_workers("cpu") == []


def test_a_worker_sent_sigterm_withdraws_its_report_before_it_exits(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore
) -> None:
    """Issue 33: after SIGTERM a stale record stayed in Redis (until it aged out, and for
    ``list_worker_reports``, the pool providers' view, for good). Sent from outside the pool, as
    systemd or an operator would, so that nothing but the worker itself removes it."""
    state = start_worker(pool, redis_store)
    child = pool.workers()[state.worker_id]

    child.process.send_signal(signal.SIGTERM)

    assert child.process.wait(scaled(10)) == 0
    assert [w.worker_id for w in redis_store.list_worker_reports()] == []


# --- the dispatcher's retry on the Lambda tier ------------------------------------------------


def test_dispatcher_retries_on_the_lambda_tier_when_the_worker_dies(
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    tier: LocalLambdaTier,
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    worker = start_worker(pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, tier, extra_workers=None)
    targets = QueryTargets(app_id=APP, min_accuracy=0.5)
    inputs = sample_inputs(3)

    healthy = dispatcher.online_query(targets, inputs)
    assert healthy.tier is Tier.WORKER
    assert healthy.worker_id == worker.worker_id
    assert not healthy.retried
    np.testing.assert_allclose(healthy.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert tier.size == 0

    pool.kill(worker.worker_id)  # its last report is still fresh: selection still picks it
    assert reported(redis_store, worker.worker_id) is not None
    retried = dispatcher.online_query(targets, inputs)

    assert retried.retried
    assert retried.tier is Tier.LAMBDA
    assert retried.worker_id is None
    assert retried.decision.tier is Tier.LAMBDA  # the decision that served it, and why:
    assert worker.worker_id in retried.decision.reason  # the worker selection chose before it failed
    assert retried.cold_start
    assert retried.timings_ms["cold_start_ms"] > 0
    np.testing.assert_allclose(retried.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert tier.size == 1


def test_dispatcher_does_not_hide_a_dead_worker_without_a_lambda_tier(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    worker = start_worker(pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None)

    pool.kill(worker.worker_id)

    with pytest.raises(QueryFailedError) as raised:
        dispatcher.online_query(QueryTargets(app_id=APP), sample_inputs(1))
    assert raised.value.status_code == 503
    assert worker.worker_id in raised.value.message and "did not answer" in raised.value.message


def start_two_workers_running(
    pool: LocalWorkerPool, store: RedisMetadataStore, invoker: HttpWorkerInvoker, variant: VariantProfile
) -> dict[str, ChildProcess]:
    """Two workers, each with a loaded instance of ``variant`` that its report shows."""
    pool.scale_to(2)
    children = pool.workers()
    for child in children.values():
        invoker.invoke(child.address, invocation_of(variant, sample_inputs(1)), INVOKE_TIMEOUT_S)

    def running(worker_id: str) -> Callable[[], bool]:
        def probe() -> bool:
            state = reported(store, worker_id)
            return state is not None and [i.variant_id for i in state.instances] == [variant.variant_id]

        return probe

    for worker_id in children:
        wait_for(running(worker_id), REPORT_WITHIN_S, f"{worker_id} to report its instance")
    return children


def test_dispatcher_retries_on_another_worker_when_the_chosen_one_dies(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    children = start_two_workers_running(pool, redis_store, invoker, variant)
    # No Lambda tier: only the other worker can answer. The query is decided on the snapshot the
    # test's own selection saw (a fresher report could tip the choice to the other worker).
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None, live_state_ttl_s=60.0)
    targets = QueryTargets(app_id=APP, latency_ms=500.0, min_accuracy=0.5)
    chosen = dispatcher.select(targets).worker_id
    assert chosen in children
    [other] = [worker_id for worker_id in children if worker_id != chosen]

    pool.kill(chosen)  # its last report is still fresh: selection still picks it
    inputs = sample_inputs(3)
    result = dispatcher.online_query(targets, inputs)

    assert result.retried
    assert result.tier is Tier.WORKER and result.worker_id == other
    assert chosen in result.decision.reason
    np.testing.assert_allclose(result.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)


def test_dispatcher_moves_a_query_off_a_hung_worker_within_its_budget_and_grace(
    pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = make_variant(pool="cpu")
    publish_linear_model(redis_store, variant)
    children = start_two_workers_running(pool, redis_store, invoker, variant)
    # Decided on the snapshot the test's own selection saw (a fresher report could tip the choice).
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None, live_state_ttl_s=60.0)
    targets = QueryTargets(app_id=APP, latency_ms=200.0, min_accuracy=0.5)
    chosen = dispatcher.select(targets).worker_id
    assert chosen is not None
    [other] = [worker_id for worker_id in children if worker_id != chosen]
    hung = children[chosen].process

    # Stopped, not dead: it accepts the connection and never answers (a hung worker).
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        inputs = sample_inputs(2)
        outcome: list[object] = []
        query = threading.Thread(target=lambda: outcome.append(dispatcher.online_query(targets, inputs)))
        query.start()
        # Bounded by the budget and the attempt's grace, then the retry: far under 30 s.
        query.join(DEADLINE_GRACE_S + 5.0)
        assert not query.is_alive(), "the query stayed with the hung worker"
    finally:
        os.kill(hung.pid, signal.SIGCONT)

    [result] = outcome
    assert isinstance(result, QueryResult)
    assert result.retried and result.tier is Tier.WORKER and result.worker_id == other
    assert "did not answer" in result.decision.reason
    np.testing.assert_allclose(result.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)


# --- the local Lambda tier --------------------------------------------------------------------


def test_lambda_tier_cold_start_then_warm(tier: LocalLambdaTier) -> None:
    variant = make_variant(pool="lambda-cpu")
    inputs = sample_inputs(2)

    cold = tier.invoke(invocation_of(variant, inputs), INVOKE_TIMEOUT_S)
    warm = tier.invoke(invocation_of(variant, inputs), INVOKE_TIMEOUT_S)

    assert cold.cold_start is True
    assert cold.init_ms > 0
    assert cold.load_ms > 0
    assert warm.cold_start is False
    assert warm.init_ms == 0
    assert warm.load_ms == 0  # the container kept the loaded session
    for reply in (cold, warm):
        np.testing.assert_allclose(reply.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    assert tier.size == 1
    assert tier.cold_starts == 1


def test_lambda_tier_honours_its_concurrency_limit(single_tier: LocalLambdaTier) -> None:
    variant = make_variant(pool="lambda-cpu")
    inputs = [sample_inputs(1), sample_inputs(3)]
    results: list[Reply | None] = [None, None]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def call(index: int) -> None:
        try:
            barrier.wait(scaled(5))
            results[index] = single_tier.invoke(invocation_of(variant, inputs[index]), INVOKE_TIMEOUT_S)
        except BaseException as error:  # re-raised in the test thread below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(scaled(INVOKE_TIMEOUT_S * 2))

    assert not any(t.is_alive() for t in threads), "an invocation hung"
    assert errors == []
    assert all(r is not None for r in results)
    assert sorted(r.cold_start for r in results if r is not None) == [False, True]
    for reply, batch in zip(results, inputs, strict=True):
        assert reply is not None
        np.testing.assert_allclose(reply.outputs, expected_logits(batch), rtol=1e-5, atol=1e-5)
    assert single_tier.size == 1
    assert single_tier.cold_starts == 1


def test_lambda_tier_concurrency_limit_holds_while_a_container_is_being_registered(
    single_tier: LocalLambdaTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Widen the window between the end of the first spawn and the new container's registration,
    # as a slow scheduler would: the first container's construction waits (bounded) until a
    # second one is constructed, which must not happen under a limit of one.
    real_container = lambda_local._Container
    calls: list[int] = []
    in_window = threading.Event()
    second_built = threading.Event()

    def slow_container(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            in_window.set()
            second_built.wait(2.0)
        else:
            second_built.set()
        return real_container(*args, **kwargs)

    monkeypatch.setattr(lambda_local, "_Container", slow_container)
    variant = make_variant(pool="lambda-cpu")
    results: list[Reply] = []

    def call() -> None:
        results.append(single_tier.invoke(invocation_of(variant, sample_inputs(1)), INVOKE_TIMEOUT_S))

    first = threading.Thread(target=call, daemon=True)
    first.start()
    assert in_window.wait(scaled(INVOKE_TIMEOUT_S)), "the first container never started"
    second = threading.Thread(target=call, daemon=True)
    second.start()
    first.join(scaled(INVOKE_TIMEOUT_S))
    second.join(scaled(INVOKE_TIMEOUT_S))

    assert len(results) == 2
    assert single_tier.cold_starts == 1
    assert single_tier.size == 1


def test_lambda_tier_state_reports_warm_variants(tier: LocalLambdaTier) -> None:
    empty = tier.state()
    assert empty.worker_id == LAMBDA_TIER_ID
    assert empty.pool == "lambda-cpu"
    assert empty.instances == ()
    assert empty.free_slots == tier.concurrency
    assert empty.utilisation == 0.0
    variant = make_variant(pool="lambda-cpu")

    tier.invoke(invocation_of(variant, sample_inputs(1)), INVOKE_TIMEOUT_S)
    warm = tier.state()

    assert [i.variant_id for i in warm.instances] == [variant.variant_id]
    assert warm.instances[0].state is InstanceState.ACTIVE
    assert warm.free_slots == tier.concurrency - 1
    assert warm.utilisation == 0.0  # nothing is running now
    assert time.time() - warm.reported_at < 1.0


def test_lambda_tier_maps_a_missing_artifact_to_not_found(tier: LocalLambdaTier) -> None:
    missing = make_variant(pool="lambda-cpu", artifact_key="apps/nope/missing.onnx", suffix="-missing")

    with pytest.raises(ModellessError) as raised:
        tier.invoke(invocation_of(missing, sample_inputs(1)), INVOKE_TIMEOUT_S)

    assert raised.value.code == "not_found"
    assert raised.value.status_code == 404
    # The container survives a refused invocation and serves the next one warm.
    reply = tier.invoke(invocation_of(make_variant(pool="lambda-cpu"), sample_inputs(1)), INVOKE_TIMEOUT_S)
    assert reply.cold_start is False
    assert tier.size == 1


def test_lambda_tier_never_holds_an_invocation_past_its_time_for_a_cold_start(
    tier: LocalLambdaTier,
) -> None:
    variant = make_variant(pool="lambda-cpu")

    # A process start (interpreter, onnxruntime) takes far longer than 50 ms.
    with pytest.raises(ServiceUnavailableError, match="still starting"):
        tier.invoke(invocation_of(variant, sample_inputs(1)), 0.05)

    # The container it started still joins the tier, idle, and serves the next invocation warm.
    wait_for(lambda: tier.size == 1, INVOKE_TIMEOUT_S, "the abandoned cold start to join the tier")
    reply = tier.invoke(invocation_of(variant, sample_inputs(1)), INVOKE_TIMEOUT_S)
    assert reply.cold_start is False
    assert tier.cold_starts == 1


# --- the worker server: instances and unloads, its command line ---------------------------------


def test_a_request_finishing_after_its_variant_was_unloaded_does_not_bring_it_back(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch run waits on a gate, so that the unload lands while the request is in flight.
    entered, release = gate_worker_runs(monkeypatch)
    worker = Worker("race-0", "cpu", 2, setup.repository_url, setup.tmp / "cache")
    variant, inputs = make_variant(), sample_inputs(2)
    outcome: list[Reply] = []
    request = threading.Thread(target=lambda: outcome.append(served(worker, invocation_of(variant, inputs))))
    request.start()
    assert entered.wait(scaled(INVOKE_TIMEOUT_S)), "the request never ran"
    # Loaded: the instance is shown (and holds a slot) from its load, not from its first answer.
    loaded = worker.monitor.snapshot(time.time())
    assert [i.variant_id for i in loaded.instances] == [variant.variant_id]
    assert loaded.free_slots == 1

    worker.unload({"variant_id": variant.variant_id})
    release.set()
    request.join(scaled(INVOKE_TIMEOUT_S))

    [reply] = outcome  # the request in flight is still answered...
    np.testing.assert_allclose(reply.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    after = worker.monitor.snapshot(time.time())  # ...without bringing the instance back
    assert after.instances == ()
    assert after.free_slots == 2
    assert worker.runtime.loaded_ids == []


def test_advertised_host_is_the_given_one_else_the_bound_one() -> None:
    assert advertise_host_for("127.0.0.1", None) == "127.0.0.1"
    assert advertise_host_for("0.0.0.0", "10.0.1.23") == "10.0.1.23"
    assert advertise_host_for("127.0.0.1", "worker-3.internal") == "worker-3.internal"
    for wildcard in ("0.0.0.0", "::", ""):
        with pytest.raises(ValueError, match="--advertise-host"):
            advertise_host_for(wildcard, None)
    with pytest.raises(ValueError, match="not an address"):
        advertise_host_for("0.0.0.0", "0.0.0.0")
    assert http_address("10.0.1.23", 8500) == "http://10.0.1.23:8500"
    assert http_address("fd00::17", 8500) == "http://[fd00::17]:8500"


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--host", "0.0.0.0"], "--advertise-host"),
        (["--port", "70000"], "outside 0-65535"),
        (["--port", "http"], "not a port number"),
    ],
)
def test_worker_command_line_refuses_what_it_cannot_serve_with(
    flags: list[str], complaint: str, setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        worker_server.main(
            ["--worker-id", "cli-0", "--repository", setup.repository_url, "--report-url", "x", *flags]
        )
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err


def test_worker_binds_every_interface_on_a_fixed_port_and_reports_the_advertised_address(
    setup: Setup, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker, tmp_path: Path
) -> None:
    port = free_port()
    report_url = f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={redis_store.keys.prefix}"
    child = spawn(
        "ec2-0",
        "modelless.worker",
        [
            *("--worker-id", "ec2-0", "--pool", "cpu", "--repository", setup.repository_url),
            *("--cache-dir", str(tmp_path / "cache"), "--report-url", report_url),
            *("--host", "0.0.0.0", "--port", str(port), "--advertise-host", "127.0.0.1"),
        ],
        tmp_path / "logs",
        env={"OMP_NUM_THREADS": "1"},
    )
    try:
        assert child.port == port
        state = wait_for(lambda: reported(redis_store, "ec2-0"), REPORT_WITHIN_S, "the worker's first report")
        assert state.address == f"http://127.0.0.1:{port}"
        inputs = sample_inputs(2)
        reply = invoker.invoke(state.address, invocation_of(make_variant(), inputs), INVOKE_TIMEOUT_S)
        np.testing.assert_allclose(reply.outputs, expected_logits(inputs), rtol=1e-5, atol=1e-5)
    finally:
        child.stop()
    assert not child.alive()
