"""A query's attempts (``modelless.dispatch.attempts``): retries on another instance or the Lambda
tier, each attempt bounded by the budget and the deadline, and the errors that name them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import modelless.dispatch.attempts as attempts_module
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.exceptions import (
    DeadlineExceededError,
    ModellessError,
    QueryFailedError,
    ServiceUnavailableError,
    WorkerBusyError,
    WorkerUnreachableError,
)
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.invokers import raise_for_worker_error
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Invocation, Reply
from modelless.types import InstanceState, Tier
from tests.unit.dispatch_kit import (
    LAMBDA_OUT,
    WORKER_OUT,
    FakeLambda,
    FakeWorkers,
    StateCountingStore,
    batch_of_one,
    live_worker,
    make_instance,
    make_variant,
    seed,
    snapshot_dispatcher,
    targets,
)


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
    assert retry.variant == first.variant
    assert retry.inputs.dtype == first.inputs.dtype and np.array_equal(retry.inputs, first.inputs)
    assert retry.correlation_id == first.correlation_id
    # The budget left is measured again for the retry, not carried over from the first try.
    assert retry.deadline_ms is not None and first.deadline_ms is not None
    assert retry.deadline_ms < first.deadline_ms <= 10
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
    assert lambda_tier.calls[0].variant_id == "fast"


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


def test_dispatcher_bounds_an_attempt_by_the_budget_and_retries_a_hung_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attempts_module, "ATTEMPT_GRACE_S", 0.05)
    monkeypatch.setattr(attempts_module, "DEADLINE_GRACE_S", 2.0)
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
    monkeypatch.setattr(attempts_module, "ATTEMPT_GRACE_S", 0.05)
    monkeypatch.setattr(attempts_module, "DEADLINE_GRACE_S", 2.0)
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
    monkeypatch.setattr(attempts_module, "ATTEMPT_GRACE_S", 1.0)
    monkeypatch.setattr(attempts_module, "DEADLINE_GRACE_S", 0.05)
    monkeypatch.setattr(attempts_module, "REPLY_WRAP_UP_S", 0.0)  # a deadline shorter than it
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


class SlowToFail(FakeLambda):
    """A Lambda tier that hangs out its whole timeout and then takes ``wrap_up_s`` more to fail
    (a hung container killed and dropped): what a retry's own time adds after its attempt."""

    def __init__(self, wrap_up_s: float) -> None:
        super().__init__(LAMBDA_OUT)
        self.wrap_up_s = wrap_up_s

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        self.timeouts.append(timeout_s)
        threading.Event().wait(max(0.0, timeout_s) + self.wrap_up_s)
        raise WorkerUnreachableError("the Lambda container did not answer: TimeoutError('timed out')")


@pytest.mark.parametrize("wrap_up_s", [0.0, 0.05, 0.15])
def test_a_query_whose_every_attempt_runs_out_is_answered_by_its_deadline(
    monkeypatch: pytest.MonkeyPatch, wrap_up_s: float
) -> None:
    """The reply promise (docs/OPERATIONS.md): budget + grace, including the retries' own time.
    The worker hangs out its attempt, the Lambda retry its own and then takes ``wrap_up_s`` to
    fail; the thread's 503 still comes before the deadline (the route would cut it off there)."""
    monkeypatch.setattr(attempts_module, "ATTEMPT_GRACE_S", 0.05)
    monkeypatch.setattr(attempts_module, "DEADLINE_GRACE_S", 0.4)
    store = InMemoryMetadataStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    lambda_tier = SlowToFail(wrap_up_s)
    dispatcher = Dispatcher(
        store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT, hang={"http://w1"}), lambda_tier
    )
    started = time.perf_counter()

    with pytest.raises(ServiceUnavailableError) as raised:
        dispatcher.online_query(targets(latency=10), batch_of_one(), received=started)

    elapsed = time.perf_counter() - started
    deadline = 0.010 + 0.4
    assert lambda_tier.timeouts, "the Lambda tier was not tried"
    assert elapsed <= deadline, f"answered {elapsed:.3f} s after arrival; the deadline is {deadline} s"
    assert raised.value.status_code == 503 and "w1" in raised.value.message


def test_dispatcher_bounds_the_lambda_retry_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attempts_module, "DEADLINE_GRACE_S", 0.5)
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
