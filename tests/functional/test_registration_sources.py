"""Registration at real size: models registered from s3:// (emulated S3, moto), a model larger
than the old 64 MiB limit streamed over real HTTP without the gateway's memory growing by its
size, and 413s that name the setting to raise.

Registration's background part (variant generation) never runs here: these tests are about what
gets in, and the launcher records the job it would have been handed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper

from infra.local.ports import free_port
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.catalog import DEFAULT_POOLS
from modelless.client import Client
from modelless.config import Settings
from modelless.exceptions import InvalidInputError, PayloadTooLargeError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.registration.ingest import RegistrationSource, S3Uri
from modelless.registration.service import RegistrationJob, RegistrationService
from modelless.repository.local import LocalModelRepository
from modelless.types import RegistrationStatus, TensorSpec
from tests.models import linear_model, valset_npz
from tests.waiting import scaled, wait_for_process

APP = "sources"
MiB = 1024 * 1024
ADMIN_KEY = "registration-admin"


# --- models ------------------------------------------------------------------------------------


def big_model(path: Path, weight_bytes: int) -> Path:
    """A valid classifier whose file is about ``weight_bytes``: x [batch, 4] @ w [4, 3] plus a
    bias sliced from one big initializer (cheap to run, and the bytes are real weights)."""
    table = np.random.default_rng(0).random(weight_bytes // 4, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["table", "start", "end"], ["bias"]),
            helper.make_node("MatMul", ["x", "w"], ["scores"]),
            helper.make_node("Add", ["scores", "bias"], ["logits"]),
        ],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([0], np.int64), "start"),
            numpy_helper.from_array(np.array([3], np.int64), "end"),
            numpy_helper.from_array(np.ones((4, 3), np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def small_valset(path: Path, features: int = 4) -> Path:
    np.savez(
        path, inputs=np.random.default_rng(1).random((8, features), dtype=np.float32), labels=np.arange(8) % 3
    )
    return path


def digest(path: Path) -> str:
    hashed = hashlib.sha256()
    with path.open("rb") as source:
        while piece := source.read(MiB):
            hashed.update(piece)
    return hashed.hexdigest()


# --- s3:// sources, through RegistrationService ---------------------------------------------------


@dataclass
class Registrar:
    service: RegistrationService
    store: InMemoryMetadataStore
    repository: LocalModelRepository
    jobs: list[RegistrationJob]
    s3: Any
    bucket: str
    reads: list[str]  # GetObject calls: what was downloaded

    def upload(self, key: str, body: bytes) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        return f"s3://{self.bucket}/{key}"

    def nothing_kept(self) -> bool:
        return self.store.list_models(APP) == [] and self.repository.list_keys("") == []


@pytest.fixture
def registrar(s3_bucket: str, aws_endpoint: str, tmp_path: Path) -> Iterator[Registrar]:
    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    reads: list[str] = []
    s3.meta.events.register("before-call.s3.GetObject", lambda params, **_: reads.append(params["url_path"]))
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    jobs: list[RegistrationJob] = []
    settings = Settings(max_model_bytes=4 * MiB, max_valset_bytes=1 * MiB)
    service = RegistrationService(store, repository, settings, DEFAULT_POOLS, jobs.append, s3_client=s3)
    try:
        yield Registrar(service, store, repository, jobs, s3, s3_bucket, reads)
    finally:
        service.close()


@pytest.mark.localstack
def test_a_model_and_valset_registered_from_s3_are_stored_and_queued(registrar: Registrar) -> None:
    model_uri = registrar.upload("exports/linear.onnx", linear_model())
    valset_uri = registrar.upload("exports/val.npz", valset_npz(50))
    source = RegistrationSource(S3Uri.parse(model_uri, "modelUri"), S3Uri.parse(valset_uri, "valSetUri"))

    registration = registrar.service.register(APP, "linear", source)

    assert registration.status is RegistrationStatus.QUEUED
    assert registrar.repository.get("apps/sources/linear/source.onnx") == linear_model()
    assert registrar.repository.get("apps/sources/linear/valset.npz") == valset_npz(50)
    [model] = registrar.store.list_models(APP)
    assert model.inputs == [TensorSpec("input", [1, 8, 8], "float32")]
    [job] = registrar.jobs
    assert job.registration_id == registration.registration_id and not job.test_run  # tested here


@pytest.mark.localstack
def test_a_zip_with_external_data_in_s3_becomes_one_self_contained_model(
    registrar: Registrar, tmp_path: Path
) -> None:
    model = onnx.load_from_string(linear_model())
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data")
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.write(tmp_path / "m.onnx", "m.onnx")
        archive.write(tmp_path / "m.onnx.data", "m.onnx.data")
    source = RegistrationSource(
        S3Uri.parse(registrar.upload("m.zip", bundle.getvalue()), "modelUri"),
        S3Uri.parse(registrar.upload("val.npz", valset_npz(50)), "valSetUri"),
    )

    registration = registrar.service.register(APP, "zipped", source)

    assert "external data ['m.onnx.data'] merged" in registration.message
    stored = onnx.load_from_string(registrar.repository.get("apps/sources/zipped/source.onnx"))
    assert all(t.data_location == TensorProto.DEFAULT for t in stored.graph.initializer)


@pytest.mark.parametrize(
    ("model_uri", "message"),
    [
        ("s3://{bucket}/missing.onnx", "modelUri s3://{bucket}/missing.onnx: no such object"),
        ("s3://no-such-bucket-{suffix}/m.onnx", "bucket 'no-such-bucket-{suffix}' does not exist"),
    ],
    ids=["missing-object", "missing-bucket"],
)
@pytest.mark.localstack
def test_a_missing_object_or_bucket_is_a_400_naming_it(
    registrar: Registrar, model_uri: str, message: str
) -> None:
    names = {"bucket": registrar.bucket, "suffix": uuid.uuid4().hex[:8]}
    valset_uri = registrar.upload("val.npz", valset_npz(50))
    source = RegistrationSource(
        S3Uri.parse(model_uri.format(**names), "modelUri"), S3Uri.parse(valset_uri, "valSetUri")
    )

    with pytest.raises(InvalidInputError) as refused:
        registrar.service.register(APP, "missing", source)

    assert refused.value.status_code == 400
    assert message.format(**names) in refused.value.message
    assert refused.value.details == {"field": "modelUri"}
    assert registrar.nothing_kept() and registrar.jobs == []


@pytest.mark.localstack
def test_an_s3_object_over_the_limit_is_refused_before_it_is_read(registrar: Registrar) -> None:
    model_uri = registrar.upload("huge.onnx", b"\0" * (4 * MiB + 1))
    valset_uri = registrar.upload("val.npz", valset_npz(50))
    source = RegistrationSource(S3Uri.parse(model_uri, "modelUri"), S3Uri.parse(valset_uri, "valSetUri"))

    with pytest.raises(PayloadTooLargeError) as refused:
        registrar.service.register(APP, "huge", source)

    assert refused.value.message == (
        f"modelUri {model_uri} exceeds {4 * MiB} bytes (MODELLESS_MAX_MODEL_BYTES); it is {4 * MiB + 1} bytes"
    )
    assert registrar.reads == []  # HEAD only: not a byte of it was downloaded
    assert registrar.nothing_kept()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The HTTP API in-process, its registrar reading S3 through boto3's default client (the
    endpoint from AWS_ENDPOINT_URL, as in the embedded stack and in AWS)."""
    settings = Settings(repository_url=str(tmp_path / "repo"), admin_key=ADMIN_KEY, lambda_function="")
    services = build_services(settings, store=InMemoryMetadataStore())
    services.registrar._background.submit = lambda *a, **k: None  # type: ignore[assignment,method-assign]
    client = TestClient(create_app(services))
    created = client.post("/v1/apps", json={"appID": APP}, headers={"X-Api-Key": ADMIN_KEY})
    assert created.status_code == 201, created.text
    try:
        yield client, {"X-Api-Key": created.json()["apiKey"]}
    finally:
        client.close()
        services.close()


@pytest.mark.localstack
def test_register_model_takes_s3_uris_as_json_or_as_form_fields(
    api: tuple[TestClient, dict[str, str]], s3_bucket: str, aws_endpoint: str
) -> None:
    client, key = api
    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    s3.put_object(Bucket=s3_bucket, Key="m.onnx", Body=linear_model())
    s3.put_object(Bucket=s3_bucket, Key="v.npz", Body=valset_npz(50))
    uris = {"modelUri": f"s3://{s3_bucket}/m.onnx", "valSetUri": f"s3://{s3_bucket}/v.npz"}

    as_json = client.post("/v1/register_model", json={"appID": APP, "modelName": "json", **uris}, headers=key)
    as_form = client.post("/v1/register_model", data={"appID": APP, "modelName": "form", **uris}, headers=key)

    assert as_json.status_code == 202, as_json.text
    assert as_form.status_code == 202, as_form.text
    models = client.get("/v1/models", headers=key).json()["models"]
    assert sorted(m["model_name"] for m in models) == ["form", "json"]


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        (
            {"modelUri": "https://example.com/m.onnx", "valSetUri": "s3://b/v.npz"},
            400,
            "must be an s3://bucket/key",
        ),
        ({"modelUri": "s3://bucket-only"}, 400, "names no object"),
        ({"valSetUri": "s3://b/v.npz"}, 400, "send a 'model' file or a 'modelUri'"),
        ({"modelUri": "s3://b/m.onnx", "valSetUri": "s3://b/v.npz", "extra": 1}, 400, "extra"),
    ],
    ids=["not-s3", "no-key", "no-model", "unknown-field"],
)
def test_bad_registration_fields_are_400s_that_say_why(
    api: tuple[TestClient, dict[str, str]], fields: dict[str, Any], status: int, message: str
) -> None:
    client, key = api
    response = client.post("/v1/register_model", json={"appID": APP, "modelName": "m", **fields}, headers=key)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


DIGITS_RECIPE = {"size": [8, 8], "resize": None, "channels": "L", "mean": [0.5], "std": [0.25], "scale": 255}


def test_a_preprocessing_recipe_is_checked_and_stored_with_the_model(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, key = api
    files = {"model": ("m.onnx", linear_model()), "valSet": ("v.npz", valset_npz(20))}

    response = client.post(
        "/v1/register_model",
        data={"appID": APP, "modelName": "images", "preprocessing": json.dumps(DIGITS_RECIPE)},
        files=files,
        headers=key,
    )

    assert response.status_code == 202, response.text
    [model] = client.get("/v1/models", headers=key).json()["models"]
    stored = model["preprocessing"]
    assert stored["size"] == [8, 8] and stored["channels"] == "L" and stored["layout"] == "NCHW"

    wrong = {**DIGITS_RECIPE, "channels": "RGB"}  # three channels for a one-channel input
    refused = client.post(
        "/v1/register_model",
        data={"appID": APP, "modelName": "rgb", "preprocessing": json.dumps(wrong)},
        files=files,
        headers=key,
    )
    assert refused.status_code == 400, refused.text
    assert "preprocessing" in refused.json()["error"]["message"]
    not_json = client.post(
        "/v1/register_model",
        data={"appID": APP, "modelName": "bad", "preprocessing": "{size: 8"},
        files=files,
        headers=key,
    )
    assert not_json.status_code == 400
    assert "preprocessing must be a JSON object" in not_json.json()["error"]["message"]
    assert [m["model_name"] for m in client.get("/v1/models", headers=key).json()["models"]] == ["images"]


# --- over real HTTP: a streamed upload larger than the old limit -----------------------------------


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[str]
    client: Client

    def peak_rss_bytes(self) -> int:
        """The gateway process's peak resident memory so far (VmHWM)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024


def start_gateway(tmp_path: Path, **limits: int) -> Gateway:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELLESS_")}
    env |= {f"MODELLESS_{name.upper()}": str(value) for name, value in limits.items()}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.functional.registration_gateway",
            str(port),
            str(tmp_path / "repo"),
            ADMIN_KEY,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    probe = Client(url)
    wait_for_process(process, probe.health, 60.0, f"the gateway to answer on {url}")
    probe.close()
    key = Client(url, admin_key=ADMIN_KEY).create_app(APP)
    return Gateway(url, process, Client(url, api_key=key, timeout_s=300))


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    running = start_gateway(tmp_path)  # the default limits: 1 GiB models, 256 MiB validation sets
    try:
        yield running
    finally:
        running.client.close()
        running.process.terminate()
        running.process.wait(scaled(30))


def test_a_70mb_model_streams_in_without_the_gateway_holding_it(gateway: Gateway, tmp_path: Path) -> None:
    # Warm up: a small registration loads what any registration needs (onnx, onnxruntime).
    small = big_model(tmp_path / "small.onnx", MiB)  # checked in the gateway's own process
    warm = gateway.client.register_model("warm", small, small_valset(tmp_path / "val.npz"), APP)
    assert warm["status"] == "queued"
    model = big_model(tmp_path / "big.onnx", 70 * MiB)
    size = model.stat().st_size
    assert size > 64 * MiB  # past the old limit
    before = gateway.peak_rss_bytes()

    reply = gateway.client.register_model("big", model, small_valset(tmp_path / "val.npz"), APP)

    grown = gateway.peak_rss_bytes() - before
    print(f"\n{size / MiB:.1f} MiB upload: the gateway's peak RSS grew by {grown / MiB:.1f} MiB")
    assert reply["status"] == "queued", reply
    assert grown < size // 4, (
        f"the gateway's memory grew by {grown / MiB:.1f} MiB for a {size / MiB:.0f} MiB file"
    )
    stored = tmp_path / "repo" / "apps" / APP / "big" / "source.onnx"
    assert stored.stat().st_size == size and digest(stored) == digest(model)


# --- 413s name the setting -----------------------------------------------------------------------


def test_413s_name_the_setting_to_raise(tmp_path: Path) -> None:
    settings = Settings(
        repository_url=str(tmp_path / "repo"),
        admin_key=ADMIN_KEY,
        lambda_function="",
        max_model_bytes=2 * MiB,
        max_valset_bytes=MiB,
    )
    services = build_services(settings, store=InMemoryMetadataStore())
    try:
        client = TestClient(create_app(services))
        key = {
            "X-Api-Key": client.post(
                "/v1/apps", json={"appID": APP}, headers={"X-Api-Key": ADMIN_KEY}
            ).json()["apiKey"]
        }

        def register(model: bytes, valset: bytes) -> dict[str, Any]:
            response = client.post(
                "/v1/register_model",
                data={"appID": APP, "modelName": "m"},
                files={"model": ("m.onnx", model), "valSet": ("v.npz", valset)},
                headers=key,
            )
            assert response.status_code == 413, response.text
            error: dict[str, Any] = response.json()["error"]
            return error

        part = register(b"\0" * (2 * MiB + 1), valset_npz(20))
        assert part["message"] == f"model file exceeds {2 * MiB} bytes (MODELLESS_MAX_MODEL_BYTES)"
        assert part["details"] == {"limit": 2 * MiB, "setting": "MODELLESS_MAX_MODEL_BYTES"}

        valset = register(linear_model(), b"\0" * (MiB + 1))
        assert valset["message"] == f"validation set exceeds {MiB} bytes (MODELLESS_MAX_VALSET_BYTES)"

        body = register(b"\0" * (4 * MiB), b"")
        assert "request body of" in body["message"]
        assert "MODELLESS_MAX_MODEL_BYTES + MODELLESS_MAX_VALSET_BYTES" in body["message"]
        client.close()
    finally:
        services.close()

    behind_a_proxy = settings.with_overrides(max_register_body_bytes=MiB)
    services = build_services(behind_a_proxy, store=InMemoryMetadataStore())
    try:
        with TestClient(create_app(services)) as client:
            response = client.post(
                "/v1/register_model",
                content=b"\0" * (MiB + 1),
                headers={"content-type": "multipart/form-data; boundary=x"},
            )
        assert response.status_code == 413
        assert response.json()["error"]["details"]["setting"] == "MODELLESS_MAX_REGISTER_BODY_BYTES"
        assert json.dumps(response.json()).count("MODELLESS_MAX_REGISTER_BODY_BYTES") >= 1
    finally:
        services.close()


# --- where the gateway has no onnxruntime (AWS): the registrar test-runs first -----------------------


def test_a_model_the_gateway_could_not_run_fails_fast_in_the_registrar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_ingest import baked_batch_of_one, save

    monkeypatch.setattr("modelless.registration.ingest.onnxruntime_available", lambda: False)
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    jobs: list[RegistrationJob] = []
    service = RegistrationService(store, repository, Settings(), DEFAULT_POOLS, jobs.append)
    generated: list[str] = []
    monkeypatch.setattr(
        service, "_generate_and_profile", lambda model, *_: generated.append(model.model_name)
    )
    model = save(baked_batch_of_one(), tmp_path / "baked.onnx")
    valset = tmp_path / "val.npz"
    np.savez(valset, inputs=np.zeros((4, 2, 4), np.float32), labels=np.zeros(4, np.int64))
    try:
        queued = service.register(APP, "baked", RegistrationSource(model, valset))
        [job] = jobs
        assert job.test_run and job.to_event()["testRun"] is True
        assert RegistrationJob.from_event(job.to_event()) == job

        finished = service.run(job)
    finally:
        service.close()

    assert finished.registration_id == queued.registration_id
    assert finished.status is RegistrationStatus.FAILED
    assert finished.message.startswith("the graph fixes the batch size at 1")
    assert "re-export with dynamic_axes={'x': {0: 'batch'}}" in finished.message
    assert generated == []  # no variant was built
    assert store.list_models(APP) == [] and repository.list_keys("") == []
