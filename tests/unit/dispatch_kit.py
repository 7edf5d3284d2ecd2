"""Factories of profiles, workers and targets for selection's tests, and stand-ins for what the
Dispatcher reaches (its invokers, a counting store, a clock moved by hand) for the tests of
``modelless.dispatch``."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import modelless.dispatch.live_view as live_view_module
import modelless.dispatch.profiles as profiles_module
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.exceptions import WorkerUnreachableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Invocation, Reply
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
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


def resnet_like(variant_id: str = "v", load_ms: float = 10.0, **kwargs: Any) -> VariantProfile:
    """~7 ms a query (the cost study's heavy model): median 7.0 ms, p99 7.5 ms at batch 1;
    batches of 4 and 8 take 14 and 24 ms at the median."""
    profile = make_variant(variant_id, p99={1: 7.5, 4: 15.0, 8: 26.0}, load_ms=load_ms, **kwargs)
    return dataclasses.replace(profile, latency_p50_ms={1: 7.0, 4: 14.0, 8: 24.0})


def queued(variant_id: str, queue_length: int, batch_limit: int = 1) -> InstanceStats:
    return dataclasses.replace(make_instance(variant_id), queue_length=queue_length, batch_limit=batch_limit)


# --- what the Dispatcher reaches ----------------------------------------------------------------


def reply(outputs: np.ndarray, **extra: Any) -> Reply:
    """A compute reply, as the runtime gives one."""
    return Reply(outputs=outputs, batch=int(outputs.shape[0]), queue_ms=0.25, inference_ms=1.5, **extra)


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
        self.calls: list[tuple[str, Invocation]] = []
        self.timeouts: list[float] = []

    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply:
        self.calls.append((address, invocation))
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
        self.calls: list[Invocation] = []
        self.timeouts: list[float] = []

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        self.calls.append(invocation)
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
    """Stands in for the ``time`` module of the dispatch modules that keep state by the monotonic
    clock (``fake_clock``): a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.perf_counter = time.perf_counter
        self.time = time.time  # wall clock: query-load counting only

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


class BlockingWorkers(FakeWorkers):
    """A WorkerInvoker whose calls wait until released: queries outstanding on the worker."""

    def __init__(self, outputs: np.ndarray) -> None:
        super().__init__(outputs)
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply:
        self.entered.release()
        assert self.release.wait(10), "never released"
        return super().invoke(address, invocation, timeout_s)


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A clock moved by hand for the modules of ``modelless.dispatch`` that keep state by the
    monotonic clock (the profile cache and the live view)."""
    clock = FakeClock()
    monkeypatch.setattr(profiles_module, "time", clock)
    monkeypatch.setattr(live_view_module, "time", clock)
    return clock


def snapshot_dispatcher(
    monkeypatch: pytest.MonkeyPatch, store: InMemoryMetadataStore, **kwargs: Any
) -> tuple[Dispatcher, FakeClock]:
    clock = fake_clock(monkeypatch)
    workers = kwargs.pop("workers", FakeWorkers(WORKER_OUT))
    lambda_tier = kwargs.pop("lambda_tier", FakeLambda(LAMBDA_OUT))
    return Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), workers, lambda_tier, **kwargs), clock
