"""Importing profiles measured on hardware this machine lacks (GPU, Inferentia): what is stored,
what is refused (and that a refusal stores nothing), the HTTP endpoint, and selection's use of
an imported GPU variant."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modelless.api import create_app
from modelless.api.services import Services, build_services
from modelless.catalog import CPU_POOL, DEFAULT_POOLS, GPU_POOL, LAMBDA_POOL
from modelless.config import Settings
from modelless.exceptions import InvalidInputError, NotFoundError, NotReadyError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.registration.profile_import import import_profiles
from modelless.repository.local import LocalModelRepository
from modelless.selection import InfaasPolicy
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
    Tier,
    VariantProfile,
    WorkerState,
)
from tests.models import hidden_model, linear_model

APP = "imp"
MODEL = "hidden"
ADMIN_KEY = "admin-secret"
GPU_ID = f"{APP}/{MODEL}/fp16_basic/gpu-1t"
CPU_ID = f"{APP}/{MODEL}/fp32_basic/cpu-1t"


def gpu_entry(**overrides: Any) -> dict[str, Any]:
    """A profile as measured on a T4: JSON-shaped (batch sizes are strings)."""
    entry: dict[str, Any] = {
        "recipe": "fp16_basic",
        "pool": "gpu",
        "threads": 1,
        "latency_p50_ms": {"1": 0.2, "8": 0.3, "64": 1.0},
        "latency_p99_ms": {"1": 0.4, "8": 0.5, "64": 1.6},
        "load_latency_ms": 3.0,
        "accuracy": 0.93,
        "hardware": "NVIDIA T4, CUDA 12.4, onnxruntime-gpu 1.20",
    }
    entry.update(overrides)
    return entry


def without(name: str) -> dict[str, Any]:
    entry = gpu_entry()
    del entry[name]
    return entry


def cpu_variant() -> VariantProfile:
    p99 = {1: 2.0, 8: 6.0, 64: 40.0}
    return VariantProfile(
        variant_id=CPU_ID,
        app_id=APP,
        model_name=MODEL,
        pool="cpu",
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=f"apps/{APP}/{MODEL}/variants/fp32_basic.onnx",
        size_bytes=len(hidden_model()),
        load_latency_ms=20.0,
        latency_p50_ms={b: t / 2 for b, t in p99.items()},
        latency_p99_ms=p99,
        peak_memory_mb=5.0,
        accuracy=0.93,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test cpu",
        measured_on_target=True,
    )


def seed(store: Any, repository: Any, *, ready: bool = True, app_id: str = APP) -> Registration:
    """What a finished registration leaves: the model, its artifacts and one CPU variant."""
    prefix = f"apps/{app_id}/{MODEL}/"
    repository.put(f"{prefix}source.onnx", hidden_model())
    repository.put(f"{prefix}variants/fp32_basic.onnx", hidden_model())
    repository.put(f"{prefix}variants/fp16_basic.onnx", linear_model())  # any bytes of its own size
    registration = Registration(f"reg-{app_id}", app_id, MODEL)
    model = ModelRecord(
        app_id=app_id,
        model_name=MODEL,
        input_name="input",
        input_shape=[1, 8, 8],
        input_dtype="float32",
        num_classes=10,
        registration_id=registration.registration_id,
        artifact_key=f"{prefix}source.onnx",
    )
    store.add_model(model, registration)
    if ready:
        registration.status = RegistrationStatus.READY
        registration.variant_ids = [CPU_ID]
        store.publish_variants(dataclasses.replace(model, ready=True), [cpu_variant()], registration)
    return registration


@dataclass
class Seeded:
    store: InMemoryMetadataStore
    repository: LocalModelRepository
    registration: Registration

    def run(self, entries: list[dict[str, Any]], model: str = MODEL) -> list[VariantProfile]:
        return import_profiles(self.store, self.repository, DEFAULT_POOLS, APP, model, entries)

    def snapshot(self) -> tuple[Any, ...]:
        registration = self.store.get_registration(self.registration.registration_id)
        return (
            self.store.list_variants(APP),
            registration.to_json() if registration else None,
            self.store.profiles_version(APP),
            self.repository.list_keys(""),
        )


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    return Seeded(store, repository, seed(store, repository))


# --- a valid import ---------------------------------------------------------------------------


def test_a_valid_gpu_profile_is_stored_as_imported(seeded: Seeded) -> None:
    version = seeded.store.profiles_version(APP)

    [imported] = seeded.run([gpu_entry()])

    assert imported.variant_id == GPU_ID
    assert imported.imported is True
    assert (imported.pool, imported.precision, imported.opt_level, imported.threads) == (
        "gpu",
        "fp16",
        "basic",
        1,
    )
    assert imported.artifact_key == f"apps/{APP}/{MODEL}/variants/fp16_basic.onnx"
    assert imported.size_bytes == len(linear_model())  # the stored artifact's, not a claimed one
    assert imported.price_per_second == pytest.approx(
        GPU_POOL.price_per_device_second / GPU_POOL.instances_per_device
    )
    assert imported.price_per_second == pytest.approx(0.526 / 3600 / 4)
    assert imported.request_price == 0.0
    assert imported.latency_p50_ms == {1: 0.2, 8: 0.3, 64: 1.0}  # int batch sizes
    assert imported.latency_p99_ms == {1: 0.4, 8: 0.5, 64: 1.6}
    assert (imported.load_latency_ms, imported.accuracy) == (3.0, 0.93)
    assert imported.hardware.startswith("NVIDIA T4")
    assert imported.saturation_qps == pytest.approx(64 * 1000 / 1.0)  # derived when not given
    assert imported.max_useful_batch == 64
    assert imported.accuracy_metric == "top1"
    assert imported.memory_mb == 0

    stored = {v.variant_id: v for v in seeded.store.list_variants(APP, MODEL)}
    assert stored == {CPU_ID: cpu_variant(), GPU_ID: imported}
    assert {v.variant_id for v in seeded.store.candidate_variants(APP, 0.93)} == {CPU_ID, GPU_ID}
    registration = seeded.store.get_registration(seeded.registration.registration_id)
    assert registration is not None
    assert registration.variant_ids == sorted([CPU_ID, GPU_ID])
    assert registration.status is RegistrationStatus.READY
    # The gateway's profile cache sees the change.
    assert seeded.store.profiles_version(APP) > version


def test_an_imported_profile_survives_a_json_round_trip(seeded: Seeded) -> None:
    [imported] = seeded.run([gpu_entry()])
    assert VariantProfile.from_json(imported.to_json()) == imported


def test_accel_and_lambda_profiles_take_their_placement(seeded: Seeded) -> None:
    accel, on_lambda = seeded.run(
        [
            gpu_entry(pool="accel", threads=2),
            gpu_entry(recipe="fp32_basic", pool="lambda-cpu", memory_mb=3538, threads=7),
        ]
    )

    assert accel.variant_id == f"{APP}/{MODEL}/fp16_basic/accel-2t"
    assert accel.price_per_second == pytest.approx(0.228 / 3600 / 4)
    assert on_lambda.variant_id == f"{APP}/{MODEL}/fp32_basic/lambda-cpu-3538mb"
    assert (on_lambda.threads, on_lambda.memory_mb) == (2, 3538)  # threads follow memory
    assert on_lambda.price_per_second == pytest.approx(LAMBDA_POOL.instance_price_per_second(2, 3538))
    assert on_lambda.request_price == LAMBDA_POOL.request_price
    assert all(v.imported for v in (accel, on_lambda))


def test_optional_fields_are_kept(seeded: Seeded) -> None:
    [imported] = seeded.run(
        [
            gpu_entry(
                saturation_qps=50000,
                max_useful_batch=8,
                peak_memory_mb=300.5,
                accuracy_metric="top5",
                accuracy_examples=150,
            )
        ]
    )
    assert (imported.saturation_qps, imported.max_useful_batch) == (50000.0, 8)
    assert (imported.peak_memory_mb, imported.accuracy_metric, imported.accuracy_examples) == (
        300.5,
        "top5",
        150,
    )


def test_importing_again_replaces_the_profile(seeded: Seeded) -> None:
    seeded.run([gpu_entry()])
    seeded.run([gpu_entry(load_latency_ms=9.0)])

    gpu = [v for v in seeded.store.list_variants(APP) if v.pool == "gpu"]
    assert [(v.variant_id, v.load_latency_ms) for v in gpu] == [(GPU_ID, 9.0)]


# --- refusals: 4xx, and nothing stored -------------------------------------------------------


REFUSED = [
    *[
        pytest.param(without(name), f"lacks ['{name}']", id=f"missing-{name}")
        for name in (
            "recipe",
            "pool",
            "latency_p50_ms",
            "latency_p99_ms",
            "load_latency_ms",
            "accuracy",
            "hardware",
        )
    ],
    pytest.param(gpu_entry(pool="tpu"), "unknown pool 'tpu'", id="unknown-pool"),
    pytest.param(gpu_entry(recipe="fp64_basic"), "is not a recipe", id="unknown-recipe"),
    pytest.param(gpu_entry(recipe="fp32-basic"), "is not a recipe", id="old-recipe-name"),
    pytest.param(gpu_entry(recipe="int8_all"), "has no int8_all artifact", id="recipe-without-artifact"),
    pytest.param(
        gpu_entry(latency_p99_ms={"1": -0.4, "8": 0.5, "64": 1.6}), "latency_p99_ms[1]", id="negative-p99"
    ),
    pytest.param(
        gpu_entry(latency_p50_ms={"1": 0.2, "8": -1.0, "64": 1.0}), "latency_p50_ms[8]", id="negative-p50"
    ),
    pytest.param(gpu_entry(latency_p50_ms={"1": math.nan, "8": 0.3, "64": 1.0}), "finite", id="nan-p50"),
    pytest.param(gpu_entry(latency_p99_ms={"1": 0.4, "8": math.inf, "64": 1.6}), "finite", id="inf-p99"),
    pytest.param(
        gpu_entry(latency_p99_ms={"1": 0.0, "8": 0.5, "64": 1.6}), "must lie in [0.001,", id="zero-latency"
    ),
    pytest.param(gpu_entry(latency_p99_ms={"1": 0.4, "8": 0.5}), "same batch sizes", id="batch-mismatch"),
    pytest.param(
        gpu_entry(latency_p50_ms={"8": 0.3}, latency_p99_ms={"8": 0.5}), "batch 1 included", id="no-batch-1"
    ),
    pytest.param(gpu_entry(latency_p99_ms={"one": 0.4}), "not an integer", id="batch-not-integer"),
    pytest.param(gpu_entry(latency_p99_ms={"0": 0.4}), "must lie in [1, 4096]", id="batch-zero"),
    pytest.param(gpu_entry(latency_p99_ms={}), "must map batch sizes", id="empty-table"),
    pytest.param(gpu_entry(latency_p99_ms=[0.4, 0.5]), "must map batch sizes", id="table-not-a-map"),
    pytest.param(gpu_entry(accuracy=1.01), "accuracy must lie in [0, 1]", id="accuracy-above-1"),
    pytest.param(gpu_entry(accuracy=-0.1), "accuracy", id="accuracy-negative"),
    pytest.param(gpu_entry(accuracy=math.nan), "accuracy", id="accuracy-nan"),
    pytest.param(gpu_entry(accuracy="high"), "must be a number", id="accuracy-not-a-number"),
    pytest.param(gpu_entry(load_latency_ms=-1.0), "load_latency_ms", id="load-negative"),
    pytest.param(gpu_entry(pool="lambda-cpu"), "needs memory_mb", id="lambda-without-memory"),
    pytest.param(gpu_entry(pool="lambda-cpu", memory_mb=0), "needs memory_mb", id="lambda-zero-memory"),
    pytest.param(gpu_entry(threads=0), "threads must be a positive integer", id="threads-zero"),
    pytest.param(gpu_entry(threads=1.5), "threads must be a positive integer", id="threads-fraction"),
    pytest.param(gpu_entry(threads=True), "threads must be a positive integer", id="threads-bool"),
    pytest.param(gpu_entry(accuracy_metric="top3"), "accuracy_metric", id="unknown-metric"),
    pytest.param(gpu_entry(peak_memory_mb=math.inf), "peak_memory_mb", id="memory-inf"),
]


@pytest.mark.parametrize(("entry", "message"), REFUSED)
def test_invalid_profiles_are_refused_and_nothing_is_stored(
    seeded: Seeded, entry: dict[str, Any], message: str
) -> None:
    before = seeded.snapshot()

    with pytest.raises(InvalidInputError) as refused:
        seeded.run([entry])

    assert refused.value.status_code == 400
    assert message in refused.value.message
    assert refused.value.message.startswith("profile 0")
    assert seeded.snapshot() == before


def test_one_bad_profile_refuses_the_whole_batch(seeded: Seeded) -> None:
    before = seeded.snapshot()

    with pytest.raises(InvalidInputError, match="profile 1: unknown pool"):
        seeded.run([gpu_entry(), gpu_entry(pool="tpu")])

    assert seeded.snapshot() == before


def test_no_profiles_is_refused(seeded: Seeded) -> None:
    with pytest.raises(InvalidInputError, match="no profiles"):
        seeded.run([])


def test_an_unknown_model_is_404(seeded: Seeded) -> None:
    before = seeded.snapshot()

    with pytest.raises(NotFoundError, match="'ghost' is not registered") as refused:
        seeded.run([gpu_entry()], model="ghost")

    assert refused.value.status_code == 404
    assert seeded.snapshot() == before


def test_a_model_still_registering_is_refused(tmp_path: Path) -> None:
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    seed(store, repository, ready=False)

    with pytest.raises(NotReadyError) as refused:
        import_profiles(store, repository, DEFAULT_POOLS, APP, MODEL, [gpu_entry()])

    assert refused.value.status_code == 409
    assert store.list_variants(APP) == []


@pytest.mark.parametrize("field", ["memory_mb", "saturation_qps", "max_useful_batch", "accuracy_examples"])
def test_a_non_numeric_optional_field_is_a_400(seeded: Seeded, field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        seeded.run([gpu_entry(**{field: "lots"})])


@pytest.mark.parametrize(
    "overrides",
    [
        {"saturation_qps": math.nan},
        {"saturation_qps": -5.0},
        {"max_useful_batch": -8},
        {"max_useful_batch": 1000},
        {"accuracy_examples": -3},
    ],
    ids=lambda o: f"{next(iter(o))}={next(iter(o.values()))}",
)
def test_a_nonsensical_optional_field_is_refused(seeded: Seeded, overrides: dict[str, Any]) -> None:
    before = seeded.snapshot()
    with pytest.raises(InvalidInputError):
        seeded.run([gpu_entry(**overrides)])
    assert seeded.snapshot() == before


# --- selection uses it ------------------------------------------------------------------------


def worker(worker_id: str, pool: str, free_slots: int, *instances: InstanceStats) -> WorkerState:
    return WorkerState(
        worker_id=worker_id,
        pool=pool,
        address=f"http://{worker_id}",
        utilisation=0.1,
        free_slots=free_slots,
        reported_at=time.time(),
        instances=instances,
    )


def test_selection_places_the_imported_gpu_variant_on_a_gpu_worker_with_room(seeded: Seeded) -> None:
    seeded.run([gpu_entry()])
    candidates = seeded.store.candidate_variants(APP, 0.9)
    workers = [worker("cpu-w1", "cpu", 2), worker("gpu-w1", "gpu", 2)]
    targets = QueryTargets(app_id=APP, latency_ms=10.0, min_accuracy=0.9)

    decision = InfaasPolicy(DEFAULT_POOLS).get_variant(targets, candidates, workers)

    # Inactive everywhere: the lowest load + inference latency, 3 + 0.4 ms, against 20 + 2 ms.
    assert decision.variant.variant_id == GPU_ID
    assert decision.variant.imported
    assert (decision.tier, decision.worker_id, decision.worker_address) == (
        Tier.WORKER,
        "gpu-w1",
        "http://gpu-w1",
    )
    assert decision.state is InstanceState.INACTIVE
    assert decision.expected_latency_ms == pytest.approx(3.4)


def test_selection_prefers_an_active_imported_gpu_instance(seeded: Seeded) -> None:
    seeded.run([gpu_entry()])
    candidates = seeded.store.candidate_variants(APP, 0.9)
    active = InstanceStats(GPU_ID, InstanceState.ACTIVE, 10.0, 0.2, 0.4, 0)
    workers = [worker("cpu-w1", "cpu", 2), worker("gpu-w1", "gpu", 0, active)]
    targets = QueryTargets(app_id=APP, latency_ms=1.0, min_accuracy=0.9, batch=8)

    decision = InfaasPolicy(DEFAULT_POOLS).get_variant(targets, candidates, workers)

    assert decision.variant.variant_id == GPU_ID
    assert (decision.tier, decision.worker_id, decision.state) == (
        Tier.WORKER,
        "gpu-w1",
        InstanceState.ACTIVE,
    )
    assert decision.expected_latency_ms == 0.5


# --- over HTTP --------------------------------------------------------------------------------


@dataclass
class Http:
    client: TestClient
    services: Services
    store: InMemoryMetadataStore

    def key_for(self, app_id: str) -> dict[str, str]:
        response = self.client.post("/v1/apps", json={"appID": app_id}, headers={"X-Api-Key": ADMIN_KEY})
        assert response.status_code == 201, response.text
        return {"X-Api-Key": response.json()["apiKey"]}

    def post(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        # json.dumps, as clients do: it writes NaN and Infinity literals.
        return self.client.post(
            "/v1/variants/import",
            content=json.dumps(body),
            headers={**headers, "Content-Type": "application/json"},
        )


@pytest.fixture
def http(tmp_path: Path) -> Iterator[Http]:
    settings = Settings(
        metadata_url="memory://",
        repository_url=str(tmp_path / "repo"),
        admin_key=ADMIN_KEY,
        cache_dir=tmp_path / "cache",
        lambda_function="",
    )
    store = InMemoryMetadataStore()
    services = build_services(settings, store=store)
    client = TestClient(create_app(services))
    try:
        yield Http(client, services, store)
    finally:
        client.close()
        services.close()


def body(**overrides: Any) -> dict[str, Any]:
    return {"appID": APP, "modelName": MODEL, "profiles": [gpu_entry()], **overrides}


def test_import_over_http(http: Http) -> None:
    key = http.key_for(APP)
    seed(http.store, http.services.repository)

    response = http.post(body(), key)

    assert response.status_code == 201, response.text
    assert response.json() == {"appID": APP, "imported": [GPU_ID]}
    listed = http.client.get("/v1/variants", params={"modelName": MODEL}, headers=key).json()["variants"]
    by_id = {v["variant_id"]: v for v in listed}
    assert set(by_id) == {CPU_ID, GPU_ID}
    assert by_id[GPU_ID]["imported"] is True and by_id[CPU_ID]["imported"] is False
    [registration] = http.client.get("/v1/registrations", headers=key).json()["registrations"]
    assert registration["variantIds"] == sorted([CPU_ID, GPU_ID])


def test_a_key_of_another_app_is_403_and_imports_nothing(http: Http) -> None:
    http.key_for(APP)
    other = http.key_for("other")
    seed(http.store, http.services.repository)
    before = http.store.list_variants(APP)

    response = http.post(body(), other)

    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "forbidden"
    assert "not 'imp'" in response.json()["error"]["message"]
    assert http.store.list_variants(APP) == before


@pytest.mark.parametrize(
    ("headers", "status"), [({}, 401), ({"X-Api-Key": "mlk_forged"}, 401)], ids=["no-key", "forged"]
)
def test_without_a_valid_key_is_401(http: Http, headers: dict[str, str], status: int) -> None:
    http.key_for(APP)
    seed(http.store, http.services.repository)
    before = http.store.list_variants(APP)

    assert http.post(body(), headers).status_code == status
    assert http.store.list_variants(APP) == before


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (body(profiles=[gpu_entry(pool="tpu")]), 400, "unknown pool"),
        (body(profiles=[gpu_entry(latency_p50_ms={"1": math.nan, "8": 0.3, "64": 1.0})]), 400, "finite"),
        (body(profiles=[without("hardware")]), 400, "lacks ['hardware']"),
        (body(modelName="ghost"), 404, "'ghost' is not registered"),
        (body(extra=1), 400, "extra"),
        ({"appID": APP, "modelName": MODEL}, 400, "profiles"),
    ],
    ids=["bad-pool", "nan-latency", "missing-field", "unknown-model", "extra-field", "no-profiles"],
)
def test_refusals_over_http(http: Http, payload: dict[str, Any], status: int, message: str) -> None:
    key = http.key_for(APP)
    seed(http.store, http.services.repository)
    before = http.store.list_variants(APP)

    response = http.post(payload, key)

    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
    assert http.store.list_variants(APP) == before
