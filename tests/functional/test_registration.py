"""RegistrationService for real: artifacts built and profiled in ``python -m variants`` child
processes, into a real Redis store and a local repository. Every number the service publishes is
checked against what this test measures or derives itself, never copied from it.

The pipeline: 10 recipes (FP32, dynamic INT8 and static INT8 at three graph optimisation levels,
FP16 at basic), each CPU-runnable one's accuracy measured once (quantised ones at batch 1 and 64,
the lower kept) and its latency timed at 1 and 2 threads, one variant per CPU placement (cpu-1t,
cpu-2t, lambda-cpu-1769mb, lambda-cpu-3538mb), each published as soon as its own profile is done,
dominated variants pruned per pool at the end. With 200 validation examples, the first 50
calibrate static INT8 and accuracy is measured on the rest.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import modelless.registration.profiling as profiling_module
from modelless.catalog import DEFAULT_POOLS, LAMBDA_PRICE_PER_GB_SECOND
from modelless.config import Settings
from modelless.exceptions import ConflictError, InvalidInputError
from modelless.metadata.redis import RedisMetadataStore
from modelless.registration.profiling import model_prefix
from modelless.registration.service import RegistrationService
from modelless.repository.local import LocalModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url
from tests.models import hidden_model, linear_model, valset_npz
from variants.pruning import Pruning, dominates, prune_variants
from variants.recipes import Recipe
from variants.stats import wilson_interval

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
LARGEST_BATCH = 64  # Settings.max_batch: the largest batch a query of this model can carry
CALIBRATION = 50  # min(128, 200 // 4)
SCORED = 150
QUANTISED = ("int8", "int8-static")
WAIT_S = 400.0


def settings() -> Settings:
    # Every optimisation level profiled in full (no screening): these tests follow each recipe
    # through its accuracy pass, its timings and pruning. Screening has tests of its own.
    return Settings(profile_runs=10, profile_min_runs=5, max_batch=LARGEST_BATCH, profile_screen_pct=0.0)


def register(
    service: RegistrationService, app: str, name: str, model: bytes, valset: bytes, **options: Any
) -> Registration:
    """``service.register`` from bytes: the files written where an upload would be."""
    from modelless.registration.ingest import RegistrationSource

    with tempfile.TemporaryDirectory(prefix="reg-test-") as tmp:
        model_path, valset_path = Path(tmp) / "model.onnx", Path(tmp) / "valset.npz"
        model_path.write_bytes(model)
        valset_path.write_bytes(valset)
        return service.register(app, name, RegistrationSource(model_path, valset_path), **options)


# --- what the test measures itself ------------------------------------------------------------


def valset_arrays(valset: bytes) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(valset), allow_pickle=False) as data:
        return data["inputs"].astype(np.float32), data["labels"].astype(np.int64)


def logits_of(artifact: bytes, inputs: np.ndarray, batch: int | None = None) -> np.ndarray:
    """The artifact run as it is served: already optimised, so no further graph optimisation;
    ``batch`` rows a run (all at once by default)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(artifact, sess_options=options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    step = batch or len(inputs)
    runs = [session.run(None, {name: inputs[i : i + step]})[0] for i in range(0, len(inputs), step)]
    return np.concatenate(runs)


def accuracy_of(
    artifact: bytes, valset: bytes, metric: str = "top1", start: int = CALIBRATION, batch: int | None = None
) -> float:
    inputs, labels = valset_arrays(valset)
    logits = logits_of(artifact, inputs[start:], batch)
    labels = labels[start:]
    if metric == "top1":
        hits = logits.argmax(axis=1) == labels
    else:
        ranked = np.argsort(-logits, axis=1)[:, :5]
        hits = np.array([label in row for label, row in zip(labels, ranked, strict=True)])
    return float(hits.mean())


def top5_near_ties(artifact: bytes, valset: bytes, start: int = CALIBRATION) -> int:
    """Scored examples whose 5th and 6th best scores differ by no more than float rounding (of
    the scores' own magnitude), at every batch size registration scores in."""
    inputs, _ = valset_arrays(valset)
    ties = np.zeros(len(inputs) - start, dtype=bool)
    for batch in (1, LARGEST_BATCH):
        logits = np.sort(logits_of(artifact, inputs[start:], batch), axis=1)[:, ::-1]
        gap = logits[:, 4] - logits[:, 5]
        ties |= gap <= 1e-5 * np.maximum(1.0, np.abs(logits).max(axis=1))
    return int(ties.sum())


def loads_on_cpu(artifact: bytes) -> bool:
    try:
        ort.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def served_accuracy(artifact: bytes, precision: str, valset: bytes, metric: str = "top1") -> float:
    """The accuracy as registration records it: as queries run (quantised: the lower of batch 1
    and the largest batch; dynamic INT8 scales activations per batch)."""
    if precision in QUANTISED:
        return min(accuracy_of(artifact, valset, metric, batch=b) for b in (1, LARGEST_BATCH))
    return accuracy_of(artifact, valset, metric, batch=LARGEST_BATCH)


def best_batch(throughput: dict[int, float]) -> int:
    """The largest batch size up to which each doubling raised throughput by 5 % or more."""
    sizes = sorted(throughput)
    best = sizes[0]
    for smaller, larger in itertools.pairwise(sizes):
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
    reasons: dict[str, str]
    seconds: float


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    """One real registration of hidden_model(); pruning's input and output are recorded on the
    way (the real function runs; the test only keeps what it was given and returned)."""
    base = service_url("MODELLESS_TEST_REDIS_URL")
    store = RedisMetadataStore.from_url(f"{base}?prefix=test-{uuid.uuid4().hex[:12]}:")
    repository = LocalModelRepository(tmp_path_factory.mktemp("registration") / "repo")
    service = RegistrationService(store, repository, settings(), DEFAULT_POOLS)
    calls: list[tuple[list[VariantProfile], Pruning]] = []

    def recording_prune(variants: list[VariantProfile]) -> Pruning:
        result = prune_variants(variants)  # the real function: registration's own
        calls.append((list(variants), result))
        return result

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(profiling_module, "prune_variants", recording_prune)
            started = time.perf_counter()
            queued = register(service, APP, MODEL, hidden_model(), valset_npz())
            service.wait_idle(WAIT_S)
            seconds = time.perf_counter() - started
        registration = store.get_registration(queued.registration_id)
        model = store.get_model(APP, MODEL)
        assert registration is not None, "the registration record vanished"
        assert model is not None, f"no model after registration: {registration.message}"
        assert len(calls) == 1, "pruning ran once per registration"
        generated, pruning = calls[0]
        kept, pruned = pruning.kept, pruning.pruned
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
            pruning.reasons,
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
    assert registration.eta_s == 0.0


def test_a_variant_was_servable_long_before_the_registration_was_ready(registered: Registered) -> None:
    registration = registered.registration
    assert registration.first_servable_at is not None and registration.finished_at is not None
    assert registration.created_at < registration.first_servable_at < registration.finished_at
    # The registered precision went first: by the time anything was servable, 1 of 20 profiles was.
    servable_share = (registration.first_servable_at - registration.created_at) / (
        registration.finished_at - registration.created_at
    )
    assert servable_share < 0.5, f"first servable at {servable_share:.0%} of the registration"


def test_every_recipe_ends_ready_or_pruned_and_every_prune_says_why(registered: Registered) -> None:
    registration = registered.registration
    runnable = cpu_runnable_recipes(registered)
    kept_recipes = {recipe_of(v) for v in registered.kept}

    assert set(registration.variants) == set(runnable)
    for recipe, state in registration.variants.items():
        assert state == ("ready" if recipe in kept_recipes else "pruned"), recipe
    assert registration.prune_reasons == registered.reasons
    assert set(registration.prune_reasons) == set(by_id(registered.pruned))
    for variant_id, reason in registration.prune_reasons.items():
        winner = reason.removeprefix("dominated by ").split(":")[0]
        assert f"{APP}/{MODEL}/{winner}" in by_id(registered.kept), (variant_id, reason)
        assert "not faster at batch" in reason


def test_the_model_records_its_reference_accuracy(registered: Registered) -> None:
    fp32 = [v.accuracy for v in registered.generated if v.precision == "fp32"]
    assert registered.model.reference_accuracy == max(fp32)


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

    inputs, _ = valset_arrays(valset)
    original = logits_of(hidden_model(), inputs[CALIBRATION:]).argmax(axis=1)
    for variant in registered.generated:
        artifact = artifact_bytes(registered, recipe_of(variant))
        expected = served_accuracy(artifact, variant.precision, valset)
        assert variant.accuracy == pytest.approx(expected, abs=1e-6), variant.variant_id
        assert variant.accuracy_metric == "top1"
        assert variant.accuracy_examples == SCORED
        low, high = wilson_interval(round(variant.accuracy * SCORED), SCORED)
        assert variant.accuracy_low == pytest.approx(low) and variant.accuracy_high == pytest.approx(high)
        agreeing = (logits_of(artifact, inputs[CALIBRATION:], 1).argmax(axis=1) == original).mean()
        assert variant.agreement is not None and variant.agreement <= agreeing + 1e-9
        if variant.precision == "fp32":
            assert variant.agreement == pytest.approx(1.0, abs=0.02)
        assert measured[recipe_of(variant)] > 0
        if variant.precision == "fp32":
            assert variant.accuracy == pytest.approx(source, abs=1e-6)
        else:
            assert variant.accuracy >= source - 0.05  # quantisation costs little on this model


def test_latency_tables_throughput_memory_and_hardware_are_recorded(registered: Registered) -> None:
    for variant in registered.generated:
        name = variant.variant_id
        batches = sorted(variant.latency_p50_ms)
        # Doubling from 1 while it paid, then the largest batch a query can carry.
        assert batches[0] == 1 and batches[-1] == LARGEST_BATCH, name
        assert all(b == 1 << i for i, b in enumerate(batches[:-1])), name
        assert sorted(variant.latency_p99_ms) == batches, name
        for batch in batches:
            assert variant.latency_p50_ms[batch] > 0, name
            assert variant.latency_p99_ms[batch] >= variant.latency_p50_ms[batch], name
        throughput = {b: round(b * 1000 / variant.latency_p50_ms[b], 1) for b in batches}
        assert variant.saturation_qps > 0
        assert variant.saturation_qps == pytest.approx(max(throughput.values())), name
        assert variant.max_useful_batch in batches
        assert variant.max_useful_batch == best_batch(throughput), name
        # Runs until stable (at least the minimum, at most profile_runs; 3 once doubling stopped paying).
        assert 5 + 3 * (len(batches) - 1) <= variant.profile_runs <= 10 * len(batches), name
        assert variant.p50_ci_pct >= 0 and not variant.contended
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
    profiled = f"{len(generated)} variants generated, {len(generated)} profiled; {len(pruned)} pruned"
    assert profiled in registration.message
    assert f"{len(kept)} kept" in registration.message
    # Both pools keep at least one variant: Lambda variants are never pruned for cpu ones.
    assert {v.pool for v in kept} == {"cpu", "lambda-cpu"}
    for loser in pruned:
        assert any(dominates(winner, loser) for winner in kept if winner.pool == loser.pool), (
            f"{loser.variant_id} was pruned, but no kept variant of its pool dominates it"
        )
    # Every pool keeps FP32 and every precision it has, whatever dominance says.
    for pool in ("cpu", "lambda-cpu"):
        generated_precisions = {v.precision for v in generated if v.pool == pool}
        assert {v.precision for v in kept if v.pool == pool} == generated_precisions

    # No kept variant is dominated by another kept one of its pool, but the best of a precision
    # kept for its precision's sake.
    def only_of_its_precision(v: VariantProfile) -> bool:
        return sum(k.precision == v.precision and k.pool == v.pool for k in kept) == 1

    dominated = [
        f"{b.variant_id} by {a.variant_id}"
        for a, b in itertools.permutations(kept, 2)
        if a.pool == b.pool and dominates(a, b) and not only_of_its_precision(b)
    ]
    assert not dominated, f"kept variants dominated by kept ones: {dominated}"


def test_registering_the_name_again_conflicts(registered: Registered) -> None:
    service = RegistrationService(registered.store, registered.repository, settings(), DEFAULT_POOLS)
    try:
        with pytest.raises(ConflictError):
            register(service, APP, MODEL, hidden_model(), valset_npz())
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
    queued = register(service, "top5-app", "linear", linear_model(), valset_npz(), metric="top5")
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
        expected = served_accuracy(artifact, variant.precision, valset, "top5")
        # Registration scores in a process of its own, on the variant's threads: an example whose
        # 5th and 6th scores are equal, or a rounding error apart (INT8 outputs tie outright), may
        # rank either way there and here.
        ties = top5_near_ties(artifact, valset)
        assert abs(variant.accuracy - expected) <= ties / SCORED + 1e-6, (variant.variant_id, ties)
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
        register(service, APP, MODEL, hidden_model(), valset_npz(), metric=metric)

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
    def broken_step(command: str, *args: object, **options: Any) -> dict[str, Any]:
        raise RuntimeError(f"variant {command} step failed: injected by the test")

    monkeypatch.setattr(profiling_module, "run_step", broken_step)

    queued = register(service, APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "RuntimeError" in record.message
    assert "injected by the test" in record.message
    assert record.variant_ids == []
    assert record.pruned == 0


def test_failure_of_the_registered_model_after_it_was_servable_removes_everything(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_step = profiling_module.run_step
    measures = 0
    stored_before_failure: list[str] = []
    published_before_failure: list[VariantProfile] = []

    def fail_on_second_measure(command: str, *args: object, **options: Any) -> Any:
        nonlocal measures
        if command == "measure":
            measures += 1
            if measures == 2:  # the registered model (FP32) at 2 threads: its 1-thread ones are out
                stored_before_failure.extend(local_repository.list_keys("apps/"))
                published_before_failure.extend(redis_store.list_variants(APP, MODEL))
                raise RuntimeError("profiling crashed: injected by the test")
        return real_step(command, *args, **options)

    monkeypatch.setattr(profiling_module, "run_step", fail_on_second_measure)

    queued = register(service, APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    # The failure came after every artifact was stored and the first variants were published...
    assert len([key for key in stored_before_failure if "/variants/" in key]) == len(RECIPES)
    assert {placement_of(v) for v in published_before_failure} == {"cpu-1t", "lambda-cpu-1769mb"}
    # ...and none of it survives.
    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    assert "profiling crashed" in record.message
    assert record.done == 1
    assert record.total == 2 * len(RECIPES)


def test_a_failing_variant_is_marked_failed_and_the_others_go_on(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_step = profiling_module.run_step

    def int8_basic_crashes(command: str, *args: object, **options: Any) -> Any:
        if command == "accuracy" and str(args[0]).endswith("/int8_basic.onnx"):
            raise RuntimeError("variant accuracy step failed: injected by the test")
        return real_step(command, *args, **options)

    monkeypatch.setattr(profiling_module, "run_step", int8_basic_crashes)

    queued = register(service, APP, "linear", linear_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = redis_store.get_registration(queued.registration_id)
    assert record is not None and record.status is RegistrationStatus.READY, record
    assert record.variants["int8_basic"] == "failed"
    assert "int8_basic failed: variant accuracy step failed: injected by the test" in record.message
    assert record.done == record.total
    stored = redis_store.list_variants(APP, "linear")
    assert stored and not [v for v in stored if recipe_of(v) == "int8_basic"]
    assert {state for recipe, state in record.variants.items() if recipe != "int8_basic"} <= {
        "ready",
        "pruned",
    }


def test_the_model_answers_queries_while_its_other_variants_are_profiled(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The registered precision is published first; a query naming the model is answered (by a
    real Lambda-tier container loading the published artifact) while the registration holds
    profiling the others: here, until the test lets its third timing pass start."""
    from modelless.catalog import DEFAULT_POOLS
    from modelless.dispatch import Dispatcher
    from modelless.pools.invokers import HttpWorkerInvoker
    from modelless.selection import InfaasPolicy
    from modelless.types import QueryTargets
    from tests.functional.workers_kit import Setup, make_tier

    real_step = profiling_module.run_step
    timings = 0
    holding, release = threading.Event(), threading.Event()

    def held_third_timing(command: str, *args: object, **options: Any) -> Any:
        nonlocal timings
        if command == "measure":
            timings += 1
            if timings == 3:
                holding.set()
                assert release.wait(WAIT_S), "the test never let profiling go on"
        return real_step(command, *args, **options)

    monkeypatch.setattr(profiling_module, "run_step", held_third_timing)
    tier = make_tier(Setup(str(local_repository.root), tmp_path), concurrency=1)
    invoker = HttpWorkerInvoker()
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, tier, extra_workers=None)
    try:
        queued = register(service, APP, "linear", linear_model(), valset_npz())
        assert holding.wait(WAIT_S), "profiling never reached its third timing pass"

        during = redis_store.get_registration(queued.registration_id)
        model = redis_store.get_model(APP, "linear")
        assert during is not None and model is not None
        assert during.status is RegistrationStatus.PROFILING and during.finished_at is None
        assert during.first_servable_at is not None and model.ready
        assert model.reference_accuracy is not None
        assert during.variants[during.variant_ids[0].split("/")[2]] == "ready"
        assert "queued" in during.variants.values()
        assert during.eta_s is not None and during.eta_s > 0
        published = redis_store.list_variants(APP, "linear")
        assert {recipe_of(v) for v in published} == {"fp32_all"}

        inputs, _ = valset_arrays(valset_npz())
        answer = dispatcher.online_query(
            QueryTargets(APP, model_name="linear"), inputs[:2], "during-profiling"
        )
        assert answer.decision.variant.variant_id in {v.variant_id for v in published}
        expected = logits_of(linear_model(), inputs[:2]).argmax(axis=1)
        assert np.array_equal(np.asarray(answer.outputs).argmax(axis=1), expected)
    finally:
        release.set()
        service.wait_idle(WAIT_S)
        invoker.close()
        tier.close()
    final = redis_store.get_registration(queued.registration_id)
    assert final is not None and final.status is RegistrationStatus.READY, final
    assert final.first_servable_at is not None and final.finished_at is not None
    assert final.first_servable_at < final.finished_at


def test_a_failed_name_can_be_registered_again(
    service: RegistrationService,
    redis_store: RedisMetadataStore,
    local_repository: LocalModelRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_step(command: str, *args: object, **options: Any) -> dict[str, Any]:
        raise RuntimeError("injected")

    monkeypatch.setattr(profiling_module, "run_step", broken_step)
    first = register(service, APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    second = register(service, APP, MODEL, hidden_model(), valset_npz())  # no ConflictError
    service.wait_idle(WAIT_S)

    assert second.registration_id != first.registration_id
    for registration_id in (first.registration_id, second.registration_id):
        assert_no_trace(redis_store, local_repository, registration_id)


def test_register_returns_a_snapshot_the_background_does_not_mutate(
    service: RegistrationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_step(command: str, *args: object, **options: Any) -> dict[str, Any]:
        raise RuntimeError("injected")

    monkeypatch.setattr(profiling_module, "run_step", broken_step)

    queued = register(service, APP, MODEL, hidden_model(), valset_npz())
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
    real_step = profiling_module.run_step

    def corrupt_artifacts(command: str, *args: object, **options: Any) -> Any:
        result = real_step(command, *args, **options)
        if command == "build":
            for artifact in result["artifacts"]:
                Path(artifact["path"]).write_bytes(b"not an onnx model")
        return result

    monkeypatch.setattr(profiling_module, "run_step", corrupt_artifacts)

    queued = register(service, APP, MODEL, hidden_model(), valset_npz())
    service.wait_idle(WAIT_S)

    record = assert_no_trace(redis_store, local_repository, queued.registration_id)
    # The registered model's accuracy pass goes first, and fails: nothing else is tried.
    assert "variant accuracy step failed" in record.message
