"""RegistrationService for real: variant generation and profiling in ``python -m variants`` child
processes, into a real Redis store and a local repository. Every number the service publishes is
checked against what this test measures itself, never copied from it."""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import modelless.registration as registration_module
from modelless.config import Settings
from modelless.exceptions import ConflictError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.registration import RegistrationService, model_prefix
from modelless.repository.local import LocalModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url
from tests.models import hidden_model, valset_npz

APP = "reg-app"
MODEL = "hidden"
RECIPES = ("fp32-basic", "fp32-all", "int8-basic", "int8-all")
POOLS = ("lambda-cpu", "cpu")
BATCHES = {1, 2, 4, 8}
WAIT_S = 120.0


def settings() -> Settings:
    return Settings(profile_runs=10)


def accuracy_of(artifact: bytes, valset: bytes) -> float:
    """Top-1 accuracy of an artifact on the validation set, measured here with onnxruntime, the
    artifact run as it is served (already optimised: no further graph optimisation)."""
    with np.load(io.BytesIO(valset), allow_pickle=False) as data:
        inputs = data["inputs"].astype(np.float32)
        labels = data["labels"].astype(np.int64)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(artifact, sess_options=options, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: inputs})[0]
    return float((np.argmax(logits, axis=1) == labels).mean())


@dataclass
class Registered:
    store: RedisMetadataStore
    repository: LocalModelRepository
    registration: Registration
    model: ModelRecord
    variants: list[VariantProfile]


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    """One real registration of hidden_model(), shared by the read-only checks below."""
    base = service_url("MODELLESS_TEST_REDIS_URL")
    store = RedisMetadataStore.from_url(f"{base}?prefix=test-{uuid.uuid4().hex[:12]}:")
    repository = LocalModelRepository(tmp_path_factory.mktemp("registration") / "repo")
    service = RegistrationService(store, repository, settings(), DEFAULT_POOLS)
    try:
        queued = service.register(APP, MODEL, hidden_model(), valset_npz())
        service.wait_idle(WAIT_S)
        registration = store.get_registration(queued.registration_id)
        model = store.get_model(APP, MODEL)
        assert registration is not None, "the registration record vanished"
        assert model is not None, f"no model after registration: {registration.message}"
        yield Registered(store, repository, registration, model, store.list_variants(APP, MODEL))
    finally:
        # Let a still-running background registration finish before its keys are deleted.
        with contextlib.suppress(Exception):
            service.wait_idle(WAIT_S)
        service.close()
        store.flush_namespace()
        store.close()


def by_id(variants: list[VariantProfile]) -> dict[str, VariantProfile]:
    return {v.variant_id: v for v in variants}


# --- a successful registration ----------------------------------------------------------------


def test_registration_is_ready_with_all_steps_done(registered: Registered) -> None:
    registration = registered.registration

    assert registration.status is RegistrationStatus.READY, registration.message
    assert registration.total > 0
    assert registration.done == registration.total
    assert registration.finished_at is not None
    assert registration.finished_at >= registration.created_at > 0
    assert sorted(registration.variant_ids) == sorted(v.variant_id for v in registered.variants)
    assert registered.model.ready
    assert registered.store.list_models(APP) == [registered.model]


def test_eight_variants_precision_and_level_by_pool(registered: Registered) -> None:
    expected = {f"{APP}/{MODEL}/{recipe}/{pool}" for recipe in RECIPES for pool in POOLS}

    assert set(by_id(registered.variants)) == expected
    assert len(registered.variants) == 8
    for variant in registered.variants:
        recipe = f"{variant.precision}-{variant.opt_level}"
        assert variant.variant_id == f"{APP}/{MODEL}/{recipe}/{variant.pool}"
        assert variant.artifact_key == f"{model_prefix(APP, MODEL)}variants/{recipe}.onnx"
        assert variant.app_id == APP and variant.model_name == MODEL
        assert variant.threads >= 1
    # Every variant can be selected: all of them are in the accuracy index.
    assert set(by_id(registered.store.candidate_variants(APP, 0.0, MODEL))) == expected


def test_repository_holds_source_valset_and_one_artifact_per_recipe(registered: Registered) -> None:
    prefix = model_prefix(APP, MODEL)

    assert registered.repository.list_keys(prefix) == sorted(
        [f"{prefix}source.onnx", f"{prefix}valset.npz"] + [f"{prefix}variants/{r}.onnx" for r in RECIPES]
    )
    assert registered.repository.get(f"{prefix}source.onnx") == hidden_model()
    assert registered.repository.get(f"{prefix}valset.npz") == valset_npz()


def test_int8_artifacts_are_smaller_on_disk_than_fp32(registered: Registered) -> None:
    def disk_size(recipe: str) -> int:
        key = f"{model_prefix(APP, MODEL)}variants/{recipe}.onnx"
        return (registered.repository.root / key).stat().st_size

    for level in ("basic", "all"):
        assert disk_size(f"int8-{level}") < disk_size(f"fp32-{level}")
    for variant in registered.variants:
        recipe = f"{variant.precision}-{variant.opt_level}"
        assert variant.size_bytes == disk_size(recipe)


def test_every_accuracy_is_the_measured_accuracy_of_its_artifact(registered: Registered) -> None:
    valset = valset_npz()
    measured: dict[str, float] = {}
    for variant in registered.variants:
        if variant.artifact_key not in measured:
            measured[variant.artifact_key] = accuracy_of(
                registered.repository.get(variant.artifact_key), valset
            )
        assert variant.accuracy == pytest.approx(measured[variant.artifact_key], abs=1e-6), variant.variant_id

    source = accuracy_of(hidden_model(), valset)
    assert source > 0.8  # a real classifier, so the comparison means something
    for variant in registered.variants:
        if variant.precision == "fp32":
            assert variant.accuracy == pytest.approx(source, abs=1e-6)
        else:
            assert variant.accuracy >= source - 0.05  # quantisation costs little on this model


def test_latency_memory_and_hardware_are_recorded(registered: Registered) -> None:
    for variant in registered.variants:
        assert set(variant.latency_p50_ms) == BATCHES, variant.variant_id
        assert set(variant.latency_p99_ms) == BATCHES, variant.variant_id
        for batch in BATCHES:
            assert variant.latency_p50_ms[batch] > 0
            assert variant.latency_p99_ms[batch] >= variant.latency_p50_ms[batch]
        assert variant.load_latency_ms > 0
        assert variant.peak_memory_mb >= 0
        assert variant.hardware.strip()
        assert f"{variant.threads} intra-op thread" in variant.hardware
        assert variant.measured_on_target


def test_prices_follow_the_pool(registered: Registered) -> None:
    for variant in registered.variants:
        pool = DEFAULT_POOLS[variant.pool]
        assert variant.price_per_second == pytest.approx(pool.instance_price_per_second(variant.threads))
        assert variant.request_price == pool.request_price
    lambda_variants = [v for v in registered.variants if v.pool == "lambda-cpu"]
    assert lambda_variants and all(v.request_price > 0 for v in lambda_variants)


def test_variants_of_one_recipe_share_one_measurement_per_thread_count(registered: Registered) -> None:
    # Profiles are measured once per (artifact, threads) and reused by every pool at that count.
    groups: dict[tuple[str, int], list[VariantProfile]] = {}
    for variant in registered.variants:
        groups.setdefault((variant.artifact_key, variant.threads), []).append(variant)
    assert len(groups) == registered.registration.total
    for members in groups.values():
        first = members[0]
        for other in members[1:]:
            assert other.latency_p99_ms == first.latency_p99_ms
            assert other.accuracy == first.accuracy


def test_registering_the_name_again_conflicts(registered: Registered, tmp_path: Path) -> None:
    service = RegistrationService(registered.store, registered.repository, settings(), DEFAULT_POOLS)
    try:
        with pytest.raises(ConflictError):
            service.register(APP, MODEL, hidden_model(), valset_npz())
    finally:
        service.close()
    assert registered.store.get_model(APP, MODEL) == registered.model
    assert len(registered.store.list_variants(APP, MODEL)) == 8


# --- a failed registration leaves no trace but its record --------------------------------------


@pytest.fixture
def service(
    redis_store: RedisMetadataStore, local_repository: LocalModelRepository
) -> Iterator[RegistrationService]:
    registrar = RegistrationService(redis_store, local_repository, settings(), DEFAULT_POOLS)
    try:
        yield registrar
    finally:
        with contextlib.suppress(Exception):
            registrar.wait_idle(WAIT_S)
        registrar.close()


def assert_no_trace(
    store: RedisMetadataStore, repository: LocalModelRepository, registration_id: str
) -> Registration:
    assert store.get_model(APP, MODEL) is None
    assert store.list_models(APP) == []
    assert store.list_variants(APP) == []
    assert store.list_variants(APP, MODEL) == []
    assert store.candidate_variants(APP, 0.0) == []
    assert repository.list_keys("apps/") == []
    assert [p for p in repository.root.rglob("*") if p.is_file()] == []
    record = store.get_registration(registration_id)
    assert record is not None, "the failed registration's record must stay"
    assert record.status is RegistrationStatus.FAILED
    assert record.finished_at is not None
    return record


def test_failing_background_step_leaves_no_model_variants_or_objects(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_step(command: str, *args: object) -> dict[str, Any]:
        raise RuntimeError(f"variant {command} step failed: injected by the test")

    monkeypatch.setattr(registration_module, "_run_step", broken_step)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "RuntimeError" in record.message
    assert "injected by the test" in record.message
    assert record.variant_ids == []


def test_failure_after_artifacts_were_stored_removes_them_too(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_step = registration_module._run_step
    stored_before_failure: list[str] = []

    def fail_on_second_measure(command: str, *args: object) -> dict[str, Any]:
        if command == "measure":
            stored_before_failure.extend(local_repository.list_keys("apps/"))
            if len([k for k in stored_before_failure if "/variants/" in k]) > 1:
                raise RuntimeError("profiling crashed: injected by the test")
        return real_step(command, *args)

    monkeypatch.setattr(registration_module, "_run_step", fail_on_second_measure)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    # The failure came after variant artifacts (and one profile) were already written...
    assert any("/variants/" in key for key in stored_before_failure)
    # ...and none of it survives.
    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "profiling crashed" in record.message
    assert 0 < record.done < record.total


def test_a_failed_name_can_be_registered_again(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_step(command: str, *args: object) -> dict[str, Any]:
        raise RuntimeError("injected")

    monkeypatch.setattr(registration_module, "_run_step", broken_step)
    first = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    second = service.register(APP, MODEL, hidden_model(), valset_npz())  # no ConflictError
    service.wait_idle(WAIT_S)

    assert second.registration_id != first.registration_id
    for registration_id in (first.registration_id, second.registration_id):
        assert_no_trace(redis_store, local_repository, registration_id)


def test_register_returns_a_snapshot_the_background_does_not_mutate(
    service: RegistrationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_step(command: str, *args: object) -> dict[str, Any]:
        raise RuntimeError("injected")

    monkeypatch.setattr(registration_module, "_run_step", broken_step)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    snapshot = queued.to_json()
    service.wait_idle(WAIT_S)

    assert queued.to_json() == snapshot
    assert queued.status is RegistrationStatus.QUEUED


def test_the_real_step_reports_a_broken_artifact_as_a_failure(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No mock of the step itself: the real child process fails on an artifact that is not ONNX.
    real_step = registration_module._run_step

    def corrupt_artifacts(command: str, *args: object) -> dict[str, Any]:
        result = real_step(command, *args)
        if command == "build":
            for path in result.values():
                Path(path).write_bytes(b"not an onnx model")
        return result

    monkeypatch.setattr(registration_module, "_run_step", corrupt_artifacts)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "variant measure step failed" in record.message
