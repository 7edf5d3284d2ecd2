"""Shared by the offline-job tests: a model, a fake compute, fake clocks, inputs of every kind."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelless.catalog import CPU_POOL
from modelless.exceptions import ModellessError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.offline.compute import Paused, RunResult
from modelless.offline.objects import InMemoryObjectStore
from modelless.types import (
    Decision,
    InstanceState,
    ModelRecord,
    OfflineJob,
    Registration,
    RegistrationStatus,
    Tier,
    VariantProfile,
)
from tests.models import digits

APP = "offline-app"
MODEL = "linear"
BUCKET = "offline-bucket"
WEIGHTS = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)


class FakeClock:
    """Time that passes only when the code under test sleeps (or the test says so)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


def variant(pool: str = "cpu", suffix: str = "") -> VariantProfile:
    return VariantProfile(
        variant_id=f"{APP}/{MODEL}/fp32-basic{suffix}/{pool}-1t",
        app_id=APP,
        model_name=MODEL,
        pool=pool,
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=f"apps/{APP}/{MODEL}/variants/fp32-basic.onnx",
        size_bytes=1000,
        load_latency_ms=20.0,
        latency_p50_ms={1: 1.0, 2: 1.0, 4: 1.5, 8: 2.0, 16: 3.0, 32: 5.0, 64: 12.0},
        latency_p99_ms={1: 2.0, 2: 2.0, 4: 3.0, 8: 4.0, 16: 6.0, 32: 9.0, 64: 20.0},
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
    )


def model_record(ready: bool = True) -> ModelRecord:
    return ModelRecord(
        app_id=APP,
        model_name=MODEL,
        input_name="input",
        input_shape=[1, 8, 8],
        input_dtype="float32",
        num_classes=10,
        registration_id="reg-1",
        artifact_key=f"apps/{APP}/{MODEL}/source.onnx",
        ready=ready,
    )


def publish(store: InMemoryMetadataStore | Any, variants: list[VariantProfile]) -> None:
    registration = Registration("reg-1", APP, MODEL)
    model = model_record(ready=False)
    store.add_model(model, registration)
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [v.variant_id for v in variants]
    store.publish_variants(model_record(ready=True), variants, registration)


def logits(inputs: np.ndarray) -> np.ndarray:
    """What the fake compute's "model" answers."""
    return np.asarray(inputs.reshape(len(inputs), -1) @ WEIGHTS, dtype=np.float32)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def image_bytes(pixels: np.ndarray, fmt: str = "PNG", mode: str = "L") -> bytes:
    from PIL import Image

    image = Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8), mode="L")
    if mode != "L":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def digit_inputs(count: int, start: int = 0) -> np.ndarray:
    inputs, _ = digits()
    return np.ascontiguousarray(inputs[start : start + count])


def upload_npy_inputs(objects: InMemoryObjectStore, prefix: str, count: int) -> list[str]:
    keys = []
    for index, row in enumerate(digit_inputs(count)):
        key = f"{prefix}item-{index:04d}.npy"
        objects.put(BUCKET, key, npy(row))
        keys.append(key)
    return keys


@dataclass
class FakeCompute:
    """Runs batches in-process; ``verdicts`` (Paused or None for "run") are consumed one per
    acquire before it answers "run"; ``failures`` are raised by run, one per call."""

    chosen: VariantProfile
    verdicts: list[Paused | None] = field(default_factory=list)
    failures: list[Exception] = field(default_factory=list)
    refuse_rows_above: float | None = None  # a batch holding a row with a value above this is refused
    runs: list[int] = field(default_factory=list)  # rows per run
    acquires: int = 0

    def choose_variant(self, job: OfflineJob) -> VariantProfile:
        return self.chosen

    def acquire(self, variant: VariantProfile, rows: int) -> Decision | Paused:
        self.acquires += 1
        if self.verdicts:
            verdict = self.verdicts.pop(0)
            if verdict is not None:
                return verdict
        return Decision(variant, Tier.WORKER, "w-1", InstanceState.ACTIVE, 1.0, "fake", "http://fake")

    def run(self, decision: Decision, inputs: np.ndarray, correlation_id: str) -> RunResult:
        if self.failures:
            raise self.failures.pop(0)
        if self.refuse_rows_above is not None and float(inputs.max()) > self.refuse_rows_above:
            error = ModellessError("inputs out of range")
            error.status_code = 400
            error.code = "invalid_input"
            raise error
        self.runs.append(len(inputs))
        return RunResult(logits(inputs), decision.worker_id, 0.1)


def read_json(objects: InMemoryObjectStore, key: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(objects.get(BUCKET, key))
    return data
