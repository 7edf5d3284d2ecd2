"""RegistrationService for real: artifacts built and profiled in ``python -m variants`` child
processes, into a real Redis store and a local repository. Every number the service publishes is
checked against what this test measures or derives itself, never copied from it.

The pipeline: 10 recipes (FP32, dynamic INT8 and static INT8 at three graph optimisation levels,
FP16 at basic), each CPU-runnable one profiled at 1 and 2 threads, one variant per CPU placement
(cpu-1t, cpu-2t, lambda-cpu-1769mb, lambda-cpu-3538mb), dominated variants pruned per pool. With
200 validation examples, the first 50 calibrate static INT8 and accuracy is measured on the rest.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import time
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
from modelless.exceptions import ConflictError, InvalidInputError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS, LAMBDA_PRICE_PER_GB_SECOND
from modelless.registration import RegistrationService, model_prefix
from modelless.repository.local import LocalModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url
from tests.models import hidden_model, linear_model, valset_npz
from variants.pruning import dominates, prune_dominated
from variants.recipes import Recipe

APP = "reg-app"
MODEL = "hidden"
LEVELS = ("basic", "extended", "all")
RECIPES = (*(f"{p}_{level}" for p in ("fp32", "int8", "int8-static") for level in LEVELS), "fp16_basic")
# CPU placement -> (threads, Lambda memory)
PLACEMENTS = {
    "lambda-cpu-1769mb": (1, 1769),
    "lambda-cpu-3538mb": (2, 3538),
    "cpu-1t": (1, 0),
    "cpu-2t": (2, 0),
}
THREAD_COUNTS = (1, 2)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION = 50  # min(128, 200 // 4)
SCORED = 150
WAIT_S = 180.0


def settings() -> Settings:
    return Settings(profile_runs=10)


# --- what the test measures itself ------------------------------------------------------------


def valset_arrays(valset: bytes) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(valset), allow_pickle=False) as data:
        return data["inputs"].astype(np.float32), data["labels"].astype(np.int64)


def logits_of(artifact: bytes, inputs: np.ndarray) -> np.ndarray:
    """The artifact run as it is served: already optimised, so no further graph optimisation."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(artifact, sess_options=options, providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(None, {session.get_inputs()[0].name: inputs})[0]
    return logits


def accuracy_of(artifact: bytes, valset: bytes, metric: str = "top1", start: int = CALIBRATION) -> float:
    inputs, labels = valset_arrays(valset)
    logits = logits_of(artifact, inputs[start:])
    labels = labels[start:]
    if metric == "top1":
        hits = logits.argmax(axis=1) == labels
    else:
        ranked = np.argsort(-logits, axis=1)[:, :5]
        hits = np.array([label in row for label, row in zip(labels, ranked, strict=True)])
    return float(hits.mean())


def loads_on_cpu(artifact: bytes) -> bool:
    try:
        ort.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def best_batch(throughput: dict[int, float]) -> int:
    """The largest batch size up to which each doubling raised throughput by 5 % or more."""
    best = BATCHES[0]
    for smaller, larger in itertools.pairwise(BATCHES):
        if throughput[larger] < 1.05 * throughput[smaller]:
            break
        best = larger
    return best


def recipe_of(variant: VariantProfile) -> str:
    return f"{variant.precision}_{variant.opt_level}"


def placement_of(variant: VariantProfile) -> str:
    return variant.variant_id.rsplit("/", 1)[1]


# --- one real registration, shared by the read-only checks ------------------------------------


@dataclass
class Registered:
    store: RedisMetadataStore
    repository: LocalModelRepository
    registration: Registration
    model: ModelRecord
    variants: list[VariantProfile]  # as stored: the kept ones
    generated: list[VariantProfile]  # everything profiled, before pruning
    kept: list[VariantProfile]
    pruned: list[VariantProfile]
    seconds: float


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    """One real registration of hidden_model(); pruning's input and output are recorded on the
    way (the real function runs; the test only keeps what it was given and returned)."""
    base = service_url("MODELLESS_TEST_REDIS_URL")
    store = RedisMetadataStore.from_url(f"{base}?prefix=test-{uuid.uuid4().hex[:12]}:")
    repository = LocalModelRepository(tmp_path_factory.mktemp("registration") / "repo")
    service = RegistrationService(store, repository, settings(), DEFAULT_POOLS)
    calls: list[tuple[list[VariantProfile], list[VariantProfile], list[VariantProfile]]] = []

    def recording_prune(
        variants: list[VariantProfile],
    ) -> tuple[list[VariantProfile], list[VariantProfile]]:
        kept, pruned = prune_dominated(variants)  # the real function: registration's own
        calls.append((list(variants), list(kept), list(pruned)))
        return kept, pruned

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(registration_module, "prune_dominated", recording_prune)
            started = time.perf_counter()
            queued = service.register(APP, MODEL, hidden_model(), valset_npz())
            service.wait_idle(WAIT_S)
            seconds = time.perf_counter() - started
        registration = store.get_registration(queued.registration_id)
        model = store.get_model(APP, MODEL)
        assert registration is not None, "the registration record vanished"
        assert model is not None, f"no model after registration: {registration.message}"
        assert len(calls) == 1, "pruning ran once per registration"
        generated, kept, pruned = calls[0]
        print(
            f"\nregistration of {MODEL}: {seconds:.1f} s for {registration.done} profiles "
            f"({len(generated)} variants, {len(kept)} kept, {len(pruned)} pruned)"
        )
        yield Registered(
            store,
            repository,
            registration,
            model,
            store.list_variants(APP, MODEL),
            generated,
            kept,
            pruned,
            seconds,
        )
    finally:
        # Let a still-running background registration finish before its keys are deleted.
        with contextlib.suppress(Exception):
            service.wait_idle(WAIT_S)
        service.close()
        store.flush_namespace()
        store.close()


def by_id(variants: list[VariantProfile]) -> dict[str, VariantProfile]:
    return {v.variant_id: v for v in variants}


def artifact_bytes(registered: Registered, recipe: str) -> bytes:
    return registered.repository.get(f"{model_prefix(APP, MODEL)}variants/{recipe}.onnx")


def cpu_runnable_recipes(registered: Registered) -> list[str]:
    return [r for r in RECIPES if loads_on_cpu(artifact_bytes(registered, r))]


# --- a successful registration ----------------------------------------------------------------


def test_registration_is_ready_with_every_profile_done(registered: Registered) -> None:
    registration = registered.registration
    runnable = cpu_runnable_recipes(registered)

    assert registration.status is RegistrationStatus.READY, registration.message
    # One profile per CPU-runnable artifact per thread count, each in its own child process.
    assert len(runnable) >= 9  # FP32 and both INT8s always run on the CPU; FP16 where ORT can
    assert registration.total == len(runnable) * len(THREAD_COUNTS)
    assert registration.done == registration.total
    assert registration.finished_at is not None
    assert registration.finished_at >= registration.created_at > 0
    assert registration.variant_ids == sorted(v.variant_id for v in registered.variants)
    assert registered.model.ready
    assert registered.store.list_models(APP) == [registered.model]
    assert registered.seconds < WAIT_S


def test_every_runnable_recipe_is_generated_at_every_cpu_placement(registered: Registered) -> None:
    runnable = cpu_runnable_recipes(registered)
    expected = {f"{APP}/{MODEL}/{recipe}/{placement}" for recipe in runnable for placement in PLACEMENTS}

    assert set(by_id(registered.generated)) == expected
    assert len(registered.generated) == len(expected) == len(runnable) * 4
    if "fp16_basic" in runnable:
        assert len(registered.generated) == 40


def test_the_kept_variants_are_stored_and_selectable(registered: Registered) -> None:
    kept_ids = set(by_id(registered.kept))

    assert set(by_id(registered.variants)) == kept_ids
    assert by_id(registered.variants) == by_id(registered.kept)  # stored exactly as profiled
    assert set(by_id(registered.store.candidate_variants(APP, 0.0, MODEL))) == kept_ids
    assert registered.variants, "pruning never drops every variant"


def test_variants_are_named_by_recipe_and_placement(registered: Registered) -> None:
    for variant in registered.generated:
        recipe, placement = recipe_of(variant), placement_of(variant)
        assert Recipe.parse(recipe) == Recipe(variant.precision, variant.opt_level)
        assert variant.variant_id == f"{APP}/{MODEL}/{recipe}/{placement}"
        assert placement in PLACEMENTS
        assert variant.pool == ("lambda-cpu" if placement.startswith("lambda") else "cpu")
        assert variant.artifact_key == f"{model_prefix(APP, MODEL)}variants/{recipe}.onnx"
        assert (variant.app_id, variant.model_name) == (APP, MODEL)
        assert variant.measured_on_target and not variant.imported


def test_repository_holds_source_valset_and_one_artifact_per_recipe(registered: Registered) -> None:
    prefix = model_prefix(APP, MODEL)

    assert registered.repository.list_keys(prefix) == sorted(
        [f"{prefix}source.onnx", f"{prefix}valset.npz"] + [f"{prefix}variants/{r}.onnx" for r in RECIPES]
    )
    assert len(RECIPES) == 10
    assert registered.repository.get(f"{prefix}source.onnx") == hidden_model()
    assert registered.repository.get(f"{prefix}valset.npz") == valset_npz()


def test_int8_artifacts_are_smaller_on_disk_than_fp32(registered: Registered) -> None:
    def disk_size(recipe: str) -> int:
        key = f"{model_prefix(APP, MODEL)}variants/{recipe}.onnx"
        return (registered.repository.root / key).stat().st_size

    for level in LEVELS:
        assert disk_size(f"int8_{level}") < disk_size(f"fp32_{level}"), level
        assert disk_size(f"int8-static_{level}") < disk_size(f"fp32_{level}"), level
    for variant in registered.generated:
        assert variant.size_bytes == disk_size(recipe_of(variant)), variant.variant_id


def test_every_accuracy_is_measured_on_the_examples_after_the_calibration(registered: Registered) -> None:
    valset = valset_npz()
    measured = {r: accuracy_of(artifact_bytes(registered, r), valset) for r in RECIPES}
    source = accuracy_of(hidden_model(), valset)
    assert source > 0.8  # a real classifier, so the comparison means something
    # Scoring all 200 examples would give another number: the split is real.
    assert accuracy_of(hidden_model(), valset, start=0) != pytest.approx(source, abs=1e-6)

    for variant in registered.generated:
        expected = measured[recipe_of(variant)]
        assert variant.accuracy == pytest.approx(expected, abs=1e-6), variant.variant_id
        assert variant.accuracy_metric == "top1"
        assert variant.accuracy_examples == SCORED
        if variant.precision == "fp32":
            assert variant.accuracy == pytest.approx(source, abs=1e-6)
        else:
            assert variant.accuracy >= source - 0.05  # quantisation costs little on this model


def test_latency_tables_throughput_memory_and_hardware_are_recorded(registered: Registered) -> None:
    for variant in registered.generated:
        name = variant.variant_id
        assert tuple(sorted(variant.latency_p50_ms)) == BATCHES, name
        assert tuple(sorted(variant.latency_p99_ms)) == BATCHES, name
        for batch in BATCHES:
            assert variant.latency_p50_ms[batch] > 0, name
            assert variant.latency_p99_ms[batch] >= variant.latency_p50_ms[batch], name
        throughput = {b: round(b * 1000 / variant.latency_p50_ms[b], 1) for b in BATCHES}
        assert variant.saturation_qps > 0
        assert variant.saturation_qps == pytest.approx(max(throughput.values())), name
        assert variant.max_useful_batch in BATCHES
        assert variant.max_useful_batch == best_batch(throughput), name
        assert variant.load_latency_ms > 0
        assert variant.peak_memory_mb >= 0
        assert f"{variant.threads} intra-op thread" in variant.hardware, name


def test_lambda_threads_follow_memory_and_prices_follow_the_placement(registered: Registered) -> None:
    for variant in registered.generated:
        threads, memory = PLACEMENTS[placement_of(variant)]
        assert (variant.threads, variant.memory_mb) == (threads, memory), variant.variant_id
        pool = DEFAULT_POOLS[variant.pool]
        if variant.pool == "lambda-cpu":
            assert variant.threads == variant.memory_mb // 1769
            assert variant.price_per_second == pytest.approx(LAMBDA_PRICE_PER_GB_SECOND * memory / 1024)
            assert variant.request_price == pytest.approx(2e-7)
        else:
            assert variant.price_per_second == pytest.approx(0.085 / 3600 / 2 * threads)
            assert variant.request_price == 0.0
        assert variant.price_per_second == pytest.approx(
            pool.instance_price_per_second(variant.threads, variant.memory_mb)
        )


def test_one_measurement_per_artifact_and_thread_count_serves_both_pools(registered: Registered) -> None:
    groups: dict[tuple[str, int], list[VariantProfile]] = {}
    for variant in registered.generated:
        groups.setdefault((variant.artifact_key, variant.threads), []).append(variant)

    assert len(groups) == registered.registration.total
    for members in groups.values():
        assert sorted(v.pool for v in members) == ["cpu", "lambda-cpu"]
        first, other = members
        assert other.latency_p99_ms == first.latency_p99_ms
        assert other.latency_p50_ms == first.latency_p50_ms
        assert other.load_latency_ms == first.load_latency_ms
        assert other.accuracy == first.accuracy
        assert other.hardware == first.hardware


def test_dominated_variants_are_pruned_per_pool(registered: Registered) -> None:
    generated, kept, pruned = registered.generated, registered.kept, registered.pruned
    registration = registered.registration

    assert len(kept) + len(pruned) == len(generated)
    assert set(by_id(kept)) | set(by_id(pruned)) == set(by_id(generated))
    assert not set(by_id(kept)) & set(by_id(pruned))
    assert registration.pruned == len(pruned)
    assert f"{len(generated)} variants generated and profiled; {len(pruned)} pruned" in registration.message
    assert f"{len(kept)} kept" in registration.message
    # Both pools keep at least one variant: Lambda variants are never pruned for cpu ones.
    assert {v.pool for v in kept} == {"cpu", "lambda-cpu"}
    for loser in pruned:
        assert any(dominates(winner, loser) for winner in kept if winner.pool == loser.pool), (
            f"{loser.variant_id} was pruned, but no kept variant of its pool dominates it"
        )
    # No kept variant is dominated by another kept one of its pool.
    dominated = [
        f"{b.variant_id} by {a.variant_id}"
        for a, b in itertools.permutations(kept, 2)
        if a.pool == b.pool and dominates(a, b)
    ]
    assert not dominated, f"kept variants dominated by kept ones: {dominated}"


def test_registering_the_name_again_conflicts(registered: Registered) -> None:
    service = RegistrationService(registered.store, registered.repository, settings(), DEFAULT_POOLS)
    try:
        with pytest.raises(ConflictError):
            service.register(APP, MODEL, hidden_model(), valset_npz())
    finally:
        service.close()
    assert registered.store.get_model(APP, MODEL) == registered.model
    assert len(registered.store.list_variants(APP, MODEL)) == len(registered.variants)


# --- the accuracy metric -----------------------------------------------------------------------


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


def test_top5_registration_measures_top5_accuracy(
    service: RegistrationService, redis_store: RedisMetadataStore, local_repository: LocalModelRepository
) -> None:
    queued = service.register("top5-app", "linear", linear_model(), valset_npz(), metric="top5")
    service.wait_idle(WAIT_S)

    registration = redis_store.get_registration(queued.registration_id)
    assert registration is not None and registration.status is RegistrationStatus.READY, registration
    variants = redis_store.list_variants("top5-app", "linear")
    assert variants
    valset = valset_npz()
    strictly_better = 0
    for variant in variants:
        artifact = local_repository.get(variant.artifact_key)
        top1 = accuracy_of(artifact, valset, "top1")
        assert variant.accuracy_metric == "top5"
        assert variant.accuracy_examples == SCORED
        assert variant.accuracy == pytest.approx(accuracy_of(artifact, valset, "top5"), abs=1e-6)
        assert variant.accuracy >= top1
        strictly_better += variant.accuracy > top1
    assert strictly_better == len(variants)  # the linear model misses some top-1 but few top-5


@pytest.mark.parametrize("metric", ["top3", "TOP1", "", "top1 ", "accuracy"])
def test_an_invalid_metric_is_refused_before_anything_is_written(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    metric: str,
) -> None:
    with pytest.raises(InvalidInputError, match="metric") as refused:
        service.register(APP, MODEL, hidden_model(), valset_npz(), metric=metric)

    assert refused.value.status_code == 400
    assert redis_store.get_model(APP, MODEL) is None
    assert redis_store.list_models(APP) == []
    assert local_repository.list_keys("") == []
    service.wait_idle(5)  # nothing was queued
    assert redis_store.list_models(APP) == []


# --- a failed registration leaves no trace but its record --------------------------------------


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
    assert record.pruned == 0


def test_failure_after_artifacts_were_stored_removes_them_too(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_step = registration_module._run_step
    measures = 0
    stored_before_failure: list[str] = []

    def fail_on_third_measure(command: str, *args: object) -> Any:
        nonlocal measures
        if command == "measure":
            measures += 1
            if measures == 3:
                stored_before_failure.extend(local_repository.list_keys("apps/"))
                raise RuntimeError("profiling crashed: injected by the test")
        return real_step(command, *args)

    monkeypatch.setattr(registration_module, "_run_step", fail_on_third_measure)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    # The failure came after two variant artifacts (and two profiles) were written...
    assert len([key for key in stored_before_failure if "/variants/" in key]) == 2
    # ...and none of it survives.
    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "profiling crashed" in record.message
    assert record.done == 2
    assert record.total == 2 * len(RECIPES)


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

    def corrupt_artifacts(command: str, *args: object) -> Any:
        result = real_step(command, *args)
        if command == "build":
            for artifact in result:
                Path(artifact["path"]).write_bytes(b"not an onnx model")
        return result

    monkeypatch.setattr(registration_module, "_run_step", corrupt_artifacts)

    queued = service.register(APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "variant measure step failed" in record.message
