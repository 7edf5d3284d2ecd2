"""Shared by the functional tests that run real worker processes and the local Lambda tier."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from infra.local.lambda_container import local_lambda_tier
from modelless.catalog import CPU_POOL
from modelless.metadata.base import MetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import Invocation, Reply
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile, WorkerState
from modelless.worker.server import Worker
from tests.models import digits, linear_model
from tests.waiting import scaled, wait_for

APP = "workers-app"
MODEL = "linear"
ARTIFACT_KEY = f"apps/{APP}/{MODEL}/variants/fp32-basic.onnx"
REPORT_WITHIN_S = 3.0
INVOKE_TIMEOUT_S = 20.0
LOAD_LIMIT_S = 40.0  # no load phase runs longer than this (scaled), whatever happens

# --- helpers ----------------------------------------------------------------------------------


def gate_worker_runs(monkeypatch: Any) -> tuple[threading.Event, threading.Event]:
    """Make an in-process ``modelless.worker.server`` Worker's batch runs wait on a gate: returns
    (entered: a run has started, release: set it to let runs finish), so that a test can act
    while a request is in flight."""
    import modelless.worker.server as worker_server

    entered, release = threading.Event(), threading.Event()
    real_runner = worker_server._session_runner

    def gated_runner(loaded: Any) -> Any:
        run = real_runner(loaded)

        def gated(inputs: np.ndarray) -> np.ndarray:
            entered.set()
            assert release.wait(scaled(INVOKE_TIMEOUT_S)), "the test never released the run"
            return run(inputs)

        return gated

    monkeypatch.setattr(worker_server, "_session_runner", gated_runner)
    return entered, release


def report_url_of(store: RedisMetadataStore) -> str:
    """Where worker processes report so that the test's store sees them: its Redis namespace."""
    return f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={store.keys.prefix}"


@contextmanager
def worker_pool(repository_url: str, report_url: str, tmp: Path, slots: int = 2) -> Iterator[LocalWorkerPool]:
    """A pool of real worker processes on this machine; every process is gone afterwards."""
    workers = LocalWorkerPool(
        CPU_POOL,
        repository_url,
        report_url=report_url,
        report_token="",
        log_dir=tmp / "logs",
        cache_dir=tmp / "cache",
        slots_per_worker=slots,
    )
    try:
        yield workers
    finally:
        processes = [child.process for child in workers.workers().values()]
        workers.close()
        assert all(p.poll() is not None for p in processes), "a worker process outlived its pool"


def make_variant(pool: str = "cpu", artifact_key: str = ARTIFACT_KEY, suffix: str = "") -> VariantProfile:
    return VariantProfile(
        variant_id=f"{APP}/{MODEL}/fp32-basic{suffix}/{pool}",
        app_id=APP,
        model_name=MODEL,
        pool=pool,
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=artifact_key,
        size_bytes=len(linear_model()),
        load_latency_ms=20.0,
        # Generous on purpose: a slow first run on a busy CI machine must not read as Interfered.
        latency_p50_ms={1: 2.0, 2: 2.0, 4: 3.0, 8: 4.0},
        latency_p99_ms={1: 5.0, 2: 5.0, 4: 6.0, 8: 8.0},
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )


def sample_inputs(count: int = 4) -> np.ndarray:
    inputs, _ = digits()
    return np.ascontiguousarray(inputs[:count])


def expected_logits(inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(linear_model(), providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(None, {"input": inputs})[0]
    return logits


def invocation_of(variant: VariantProfile, inputs: np.ndarray) -> Invocation:
    return Invocation(variant, inputs, "functional-test")


def served(worker: Worker, invocation: Invocation) -> Reply:
    """``invocation`` through an in-process worker's ``POST /invoke`` route: its message in, the
    reply's message out, as they cross the wire."""
    return Reply.from_message(worker.invoke(invocation.to_message()))


def reported(store: RedisMetadataStore, worker_id: str) -> WorkerState | None:
    return next((w for w in store.list_workers() if w.worker_id == worker_id), None)


def reported_after(store: RedisMetadataStore, worker_id: str, after: float) -> WorkerState | None:
    """The worker's state if it reported after ``after`` (a ``reported_at`` time)."""
    state = reported(store, worker_id)
    return state if state is not None and state.reported_at > after else None


class Load:
    """Closed-loop callers running ``call`` until stopped (or ``LOAD_LIMIT_S``), keeping every
    outcome: nothing a caller sees is dropped."""

    def __init__(self, callers: int, call: Callable[[], object], pause_s: float = 0.0) -> None:
        self.results: list[object] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call = call
        self._pause_s = pause_s
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(callers)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + scaled(LOAD_LIMIT_S)  # outlasts the scaled waits under it
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                result = self._call()
                with self._lock:
                    self.results.append(result)
            except Exception as error:
                with self._lock:
                    self.errors.append(error)
            if self._pause_s:
                self._stop.wait(self._pause_s)

    def count(self) -> int:
        """Calls finished so far, answered or failed."""
        with self._lock:
            return len(self.results) + len(self.errors)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(scaled(INVOKE_TIMEOUT_S + 5))
        assert not any(t.is_alive() for t in self._threads), "a caller hung"


@dataclass
class Setup:
    repository_url: str
    tmp: Path


def make_tier(setup: Setup, concurrency: int) -> LocalLambdaTier:
    return local_lambda_tier(
        setup.repository_url,
        log_dir=setup.tmp / "lambda-logs",
        cache_dir=setup.tmp / "lambda-cache",
        concurrency=concurrency,
    )


def start_worker(pool: LocalWorkerPool, store: RedisMetadataStore) -> WorkerState:
    pool.scale_to(1)
    [worker_id] = pool.workers()
    return wait_for(lambda: reported(store, worker_id), REPORT_WITHIN_S, f"{worker_id}'s first report")


def publish_linear_model(store: MetadataStore, variant: VariantProfile, *more: VariantProfile) -> None:
    """Register the linear model, ready, with ``variant`` (and ``more``) as its variants."""
    inputs = sample_inputs(1)
    model = ModelRecord(
        app_id=APP,
        model_name=MODEL,
        input_name="input",
        input_shape=list(inputs.shape[1:]),
        input_dtype="float32",
        num_classes=10,
        registration_id="reg-linear",
        artifact_key=f"apps/{APP}/{MODEL}/source.onnx",
    )
    registration = Registration("reg-linear", APP, MODEL)
    store.add_model(model, registration)
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [v.variant_id for v in (variant, *more)]
    store.publish_variants(ModelRecord(**{**model.__dict__, "ready": True}), [variant, *more], registration)


def publish_model(
    store: MetadataStore,
    repository: LocalModelRepository,
    app_id: str,
    name: str,
    model: bytes,
    accuracy: float,
    p99_ms: float,
) -> None:
    """A ready model of ``app_id`` over 8x8 digits with one CPU variant: its profile as given (a
    test's claim), its artifact the real ``model``."""
    key = f"apps/{app_id}/{name}/variants/fp32-basic.onnx"
    repository.put(key, model)
    record = ModelRecord(app_id, name, "input", [1, 8, 8], "float32", 10, f"reg-{name}", key)
    registration = Registration(f"reg-{name}", app_id, name)
    store.add_model(record, registration)
    variant = VariantProfile(
        variant_id=f"{app_id}/{name}/fp32-basic/cpu",
        app_id=app_id,
        model_name=name,
        pool="cpu",
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=key,
        size_bytes=len(model),
        load_latency_ms=20.0,
        latency_p50_ms={1: p99_ms / 2, 8: p99_ms},
        latency_p99_ms={1: p99_ms, 8: p99_ms * 2},
        peak_memory_mb=1.0,
        accuracy=accuracy,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [variant.variant_id]
    store.publish_variants(ModelRecord(**{**record.__dict__, "ready": True}), [variant], registration)


def classes_of(model: bytes, inputs: np.ndarray) -> list[int]:
    """The classes the real ``model`` predicts for ``inputs``, run directly in onnxruntime."""
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [int(c) for c in np.argmax(session.run(None, {"input": inputs})[0], axis=1)]
