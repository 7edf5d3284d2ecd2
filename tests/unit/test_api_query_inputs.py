"""online_query's bodies end to end, in-process (FastAPI TestClient over real services, as in
test_api.py): JSON, .npy, .npz, PNG/JPEG and octet-stream bodies, int64 and two-input models run
by the real runtime on tiny ONNX models, the refusals (400, 413, 415) in the API's error shape,
the reply's decode timing, the OpenAPI description, and the Python client's binary default."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient

from modelless import cli
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.client import Client, ModellessClientError
from modelless.inputs.preprocessing import decode_image, parse_recipe
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.repository.local import LocalModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.input_models import (
    IMAGE_RECIPE,
    IMAGE_SPEC,
    image_logits,
    image_model,
    image_record,
    jpeg_bytes,
    npy_bytes,
    npz_bytes,
    picture,
    png_bytes,
    token_inputs,
    token_logits,
    token_model,
    token_record,
)
from tests.unit.test_api import (
    LAMBDA_POOL,
    MAX_BATCH,
    MAX_QUERY,
    Api,
    InProcessLambda,
    error_of,
    make_settings,
)

APP = "inputs"
QUERY = "/v1/online_query"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """test_api.py's in-process API: real services, an in-memory store, a local repository and
    the real runtime as the Lambda tier; registration's background work never starts."""
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    services = build_services(make_settings(tmp_path), store=store, lambda_tier=lambda_tier)
    built = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)
    monkeypatch.setattr(services.registrar._background, "submit", lambda *args, **kwargs: None)
    try:
        yield built
    finally:
        built.client.close()
        services.close()


def publish(api: Api, record: ModelRecord, model_bytes: bytes) -> VariantProfile:
    """Store the model and publish it, ready, with one Lambda-tier variant that runs it."""
    api.repository.put(record.artifact_key, model_bytes)
    registration = Registration(record.registration_id, record.app_id, record.model_name)
    api.store.add_model(dataclasses.replace(record, ready=False), registration)
    variant = VariantProfile(
        variant_id=f"{record.app_id}/{record.model_name}/fp32-all/{LAMBDA_POOL.name}",
        app_id=record.app_id,
        model_name=record.model_name,
        pool=LAMBDA_POOL.name,
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key=record.artifact_key,
        size_bytes=len(model_bytes),
        load_latency_ms=2.0,
        latency_p50_ms={1: 0.5, MAX_BATCH: 1.0},
        latency_p99_ms={1: 1.0, MAX_BATCH: 2.0},
        peak_memory_mb=10.0,
        accuracy=0.9,
        price_per_second=LAMBDA_POOL.instance_price_per_second(1),
        request_price=LAMBDA_POOL.request_price,
        hardware="test",
        measured_on_target=True,
    )
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [variant.variant_id]
    api.store.publish_variants(dataclasses.replace(record, ready=True), [variant], registration)
    return variant


def images_app(api: Api, preprocessing: dict[str, Any] | None = IMAGE_RECIPE) -> dict[str, str]:
    key = api.create_app(APP)
    publish(api, image_record(APP, "images", preprocessing), image_model())
    return key


def tokens_app(api: Api) -> dict[str, str]:
    key = api.create_app(APP)
    publish(api, token_record(APP, "tokens"), token_model())
    return key


def post(api: Api, key: dict[str, str], body: bytes, content_type: str | None, **params: Any) -> Any:
    headers = dict(key)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return api.client.post(QUERY, content=body, params=params or None, headers=headers)


def outputs_of(response: Any) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array(response.json()["outputs"])


# --- each content type ------------------------------------------------------------------------


def test_npy_body_with_targets_in_the_query_string(api: Api) -> None:
    key = images_app(api)
    batch = np.random.default_rng(1).random((3, *IMAGE_SPEC.shape)).astype(np.float32)

    response = post(api, key, npy_bytes(batch), "application/x-npy", appID=APP, accuracy=0.5, latency=50)

    np.testing.assert_allclose(outputs_of(response), image_logits(batch), atol=1e-5)
    body = response.json()
    assert body["model"] == "images" and body["tier"] == "lambda"
    assert body["predictions"] == image_logits(batch).argmax(axis=1).tolist()


def test_npy_and_json_bodies_answer_alike(api: Api) -> None:
    key = images_app(api)
    batch = np.random.default_rng(2).random((2, *IMAGE_SPEC.shape)).astype(np.float32)

    binary = post(api, key, npy_bytes(batch), "application/x-npy", appID=APP, modelName="images")
    as_json = api.client.post(
        QUERY, json={"appID": APP, "modelName": "images", "inputs": batch.tolist()}, headers=key
    )

    np.testing.assert_allclose(outputs_of(binary), outputs_of(as_json), atol=1e-6)


def test_two_int64_inputs_as_npz(api: Api) -> None:
    key = tokens_app(api)
    ids, mask = token_inputs(5)

    response = post(api, key, npz_bytes(ids=ids, mask=mask), "application/x-npz", appID=APP, accuracy=0.5)

    np.testing.assert_allclose(outputs_of(response), token_logits(ids, mask), rtol=1e-5, atol=1e-3)
    assert api.lambda_tier.calls == [f"{APP}/tokens/fp32-all/{LAMBDA_POOL.name}"]


def test_two_int64_inputs_as_a_json_object(api: Api) -> None:
    key = tokens_app(api)
    ids, mask = token_inputs(2, seed=4)

    response = api.client.post(
        QUERY,
        json={"appID": APP, "accuracy": 0.5, "inputs": {"ids": ids.tolist(), "mask": mask.tolist()}},
        headers=key,
    )

    np.testing.assert_allclose(outputs_of(response), token_logits(ids, mask), rtol=1e-5, atol=1e-3)


def test_zip_content_type_is_an_npz(api: Api) -> None:
    key = tokens_app(api)
    ids, mask = token_inputs(1)
    response = post(api, key, npz_bytes(ids=ids, mask=mask), "application/zip", appID=APP, modelName="tokens")
    np.testing.assert_allclose(outputs_of(response), token_logits(ids, mask), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(
    ("encode", "content_type"),
    [(png_bytes, "image/png"), (jpeg_bytes, "image/jpeg"), (png_bytes, "application/octet-stream")],
    ids=["png", "jpeg", "sniffed-png"],
)
def test_image_bodies_are_decoded_with_the_models_recipe(api: Api, encode: Any, content_type: str) -> None:
    key = images_app(api)
    data = encode(picture(12, 9, seed=5))

    response = post(api, key, data, content_type, appID=APP, modelName="images")

    tensor = decode_image(data, parse_recipe(IMAGE_RECIPE, IMAGE_SPEC))
    np.testing.assert_allclose(outputs_of(response), image_logits(tensor), atol=1e-4)
    assert len(response.json()["predictions"]) == 1


# --- timings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["json", "npy", "image"])
def test_decode_time_is_reported_and_counted_in_the_total(api: Api, form: str) -> None:
    key = images_app(api)
    batch = np.zeros((1, *IMAGE_SPEC.shape), dtype=np.float32)
    if form == "json":
        response = api.client.post(
            QUERY, json={"appID": APP, "modelName": "images", "inputs": batch.tolist()}, headers=key
        )
    elif form == "npy":
        response = post(api, key, npy_bytes(batch), "application/x-npy", appID=APP, modelName="images")
    else:
        response = post(api, key, png_bytes(picture()), "image/png", appID=APP, modelName="images")

    assert response.status_code == 200, response.text
    timings = response.json()["timingsMs"]
    assert timings["decode_ms"] > 0
    parts = ("decode_ms", "selection_ms", "queue_ms", "load_ms", "cold_start_ms", "inference_ms")
    assert timings["total_ms"] >= sum(timings[part] for part in parts) - 0.01
    assert timings["total_ms"] >= timings["decode_ms"]


# --- refusals ---------------------------------------------------------------------------------


def test_image_for_a_model_without_a_recipe_is_415(api: Api) -> None:
    key = images_app(api, preprocessing=None)
    before = api.state()

    response = post(api, key, png_bytes(picture()), "image/png", appID=APP, modelName="images")

    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type"
    assert "has no preprocessing recipe" in error["message"]
    assert api.state() == before


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("text/plain", b"1 2 3"), ("image/gif", b"GIF89a"), ("application/octet-stream", b"\x00\x01 unknown")],
)
def test_unknown_content_types_are_415_in_the_error_shape(api: Api, content_type: str, body: bytes) -> None:
    key = images_app(api)
    before = api.state()

    response = post(api, key, body, content_type, appID=APP, modelName="images")

    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type"
    assert "application/x-npy" in error["details"]["accepted"]
    assert api.state() == before


BINARY_REFUSALS: list[tuple[str, dict[str, Any], bytes, int, str]] = [
    ("no-app", {"modelName": "tokens"}, b"", 400, r"query\.appID: Field required"),
    ("unknown-parameter", {"appID": APP, "accuracy": 0.5, "bogus": 1}, b"", 400, r"query\.bogus"),
    ("latency-not-a-number", {"appID": APP, "latency": "fast"}, b"", 400, r"query\.latency"),
    ("no-targets", {"appID": APP}, b"", 400, "give either modelName"),
    ("negative-latency", {"appID": APP, "latency": -1}, b"", 400, r"query\.latency: .*greater than 0"),
    # Query-string values are text: read only as JSON writes a number, then held to the bounds.
    ("latency-true", {"appID": APP, "latency": "true"}, b"", 400, r"query\.latency: .*must be a number"),
    ("latency-nan", {"appID": APP, "latency": "nan"}, b"", 400, r"query\.latency: .*must be a number"),
    ("latency-padded", {"appID": APP, "latency": " 5"}, b"", 400, r"query\.latency: .*must be a number"),
    (
        "latency-underscored",
        {"appID": APP, "latency": "1_000"},
        b"",
        400,
        r"query\.latency: .*must be a number",
    ),
    ("latency-infinite", {"appID": APP, "latency": "1e999"}, b"", 400, r"query\.latency: .*finite number"),
    ("latency-huge", {"appID": APP, "latency": "1e308"}, b"", 400, r"query\.latency: .*less than or equal"),
    ("accuracy-over-one", {"appID": APP, "accuracy": "1.5"}, b"", 400, r"query\.accuracy: .*less than or"),
    ("accuracy-hex", {"appID": APP, "accuracy": "0x1"}, b"", 400, r"query\.accuracy: .*must be a number"),
    (
        "fraction",
        {"appID": APP, "accuracy": 0.5},
        b"fraction",
        400,
        r"input 'ids' must be integers \(int64\)",
    ),
    ("missing-input", {"appID": APP, "accuracy": 0.5}, b"missing", 400, r"missing \['mask'\]"),
    ("corrupt", {"appID": APP, "accuracy": 0.5}, b"PK\x03\x04 broken", 400, "not a readable .npz"),
]


@pytest.mark.parametrize(
    ("params", "body", "status", "message"),
    [case[1:] for case in BINARY_REFUSALS],
    ids=[case[0] for case in BINARY_REFUSALS],
)
def test_bad_binary_queries_are_refused_and_change_nothing(
    api: Api, params: dict[str, Any], body: bytes, status: int, message: str
) -> None:
    key = tokens_app(api)
    ids, mask = token_inputs(2)
    bodies = {
        b"": npz_bytes(ids=ids, mask=mask),
        b"fraction": npz_bytes(ids=ids + 0.5, mask=mask),
        b"missing": npz_bytes(ids=ids),
    }
    before = api.state()

    response = post(api, key, bodies.get(body, body), "application/x-npz", **params)

    error = error_of(response, status)
    assert re.search(message, error["message"]), error["message"]
    assert api.state() == before


def test_binary_query_needs_the_apps_key(api: Api) -> None:
    tokens_app(api)
    ids, mask = token_inputs(1)
    response = post(api, {}, npz_bytes(ids=ids, mask=mask), "application/x-npz", appID=APP, accuracy=0.5)
    assert error_of(response, 401)["code"] == "unauthorized"


def test_json_query_with_targets_in_the_query_string_is_refused(api: Api) -> None:
    key = images_app(api)
    response = api.client.post(
        QUERY,
        params={"accuracy": 0.9},
        json={"appID": APP, "modelName": "images", "inputs": np.zeros((1, 3, 4, 4)).tolist()},
        headers=key,
    )
    assert "not in the query string" in error_of(response, 400)["message"]


def test_malformed_json_is_400_in_the_error_shape(api: Api) -> None:
    key = images_app(api)
    response = post(api, key, b'{"appID": "inputs", "inputs": [1, 2', "application/json")
    error = error_of(response, 400)
    assert error["code"] == "bad_request"
    assert error["message"].startswith("body")


def test_oversized_binary_body_is_413_naming_the_setting(api: Api) -> None:
    key = images_app(api)
    batch = np.zeros((MAX_BATCH, *IMAGE_SPEC.shape), dtype=np.float64)
    data = npy_bytes(np.resize(batch, (MAX_QUERY // 8 + 1,)))
    assert len(data) > MAX_QUERY

    response = post(api, key, data, "application/x-npy", appID=APP, modelName="images")

    error = error_of(response, 413)
    assert error["code"] == "payload_too_large"
    assert f"exceeds the limit of {MAX_QUERY} bytes" in error["message"]
    assert "MODELLESS_MAX_QUERY_BYTES" in error["message"]


# --- the API's description --------------------------------------------------------------------


def test_openapi_documents_every_body_and_the_query_parameters(api: Api) -> None:
    operation = api.client.get("/openapi.json").json()["paths"][QUERY]["post"]

    content = operation["requestBody"]["content"]
    assert set(content) >= {
        "application/json",
        "application/x-npy",
        "application/x-npz",
        "image/jpeg",
        "image/png",
        "application/octet-stream",
    }
    assert set(content["application/json"]["schema"]["properties"]) >= {"appID", "inputs", "latency"}
    assert {p["name"] for p in operation["parameters"] if p["in"] == "query"} >= {
        "appID",
        "latency",
        "accuracy",
        "modelName",
    }
    assert "415" in operation["responses"] and "413" in operation["responses"]


# --- the Python client ------------------------------------------------------------------------


def in_process_client(api: Api, key: dict[str, str]) -> Client:
    client = Client("http://testserver", api_key=key["X-Api-Key"])
    client._http.close()
    # The TestClient is an httpx-style client (httpx2's, here): the app answers in-process.
    client._http = cast(Any, api.client)
    return client


def test_client_sends_arrays_as_npy_by_default_and_reports_its_own_timings(api: Api) -> None:
    key = images_app(api)
    client = in_process_client(api, key)
    sent: list[str] = []
    api.client.event_hooks["request"] = [lambda request: sent.append(request.headers["content-type"])]
    batch = np.random.default_rng(3).random((2, *IMAGE_SPEC.shape)).astype(np.float32)

    binary = client.online_query(batch, APP, accuracy=0.5)
    as_json = client.online_query(batch, APP, accuracy=0.5, encoding="json")

    assert sent == ["application/x-npy", "application/json"]
    for reply in (binary, as_json):
        np.testing.assert_allclose(np.array(reply["outputs"]), image_logits(batch), atol=1e-5)
        assert set(reply["clientTimingsMs"]) == {"encode", "roundTrip"}
        assert reply["clientTimingsMs"]["encode"] >= 0
        assert reply["clientTimingsMs"]["roundTrip"] > 0
        assert "decode_ms" in reply["timingsMs"]  # the server's own stay the server's


def test_client_sends_a_dict_as_npz_and_image_bytes_as_the_image(api: Api) -> None:
    key = tokens_app(api)
    publish(api, image_record(APP, "images", IMAGE_RECIPE), image_model())
    client = in_process_client(api, key)
    sent: list[str] = []
    api.client.event_hooks["request"] = [lambda request: sent.append(request.headers["content-type"])]
    ids, mask = token_inputs(3)
    jpeg = jpeg_bytes(picture(seed=9))

    tokens = client.online_query({"ids": ids, "mask": mask}, APP, model_name="tokens")
    image = client.online_query(jpeg, APP, model_name="images")

    assert sent == ["application/x-npz", "image/jpeg"]
    np.testing.assert_allclose(np.array(tokens["outputs"]), token_logits(ids, mask), rtol=1e-5, atol=1e-3)
    tensor = decode_image(jpeg, parse_recipe(IMAGE_RECIPE, IMAGE_SPEC))
    np.testing.assert_allclose(np.array(image["outputs"]), image_logits(tensor), atol=1e-4)


def test_client_sends_lists_of_numbers_binary_and_anything_else_as_json(api: Api) -> None:
    key = images_app(api)
    client = in_process_client(api, key)
    sent: list[str] = []
    api.client.event_hooks["request"] = [lambda request: sent.append(request.headers["content-type"])]

    reply = client.online_query(np.zeros((3, 4, 4)).tolist(), APP, model_name="images")
    with pytest.raises(ModellessClientError, match="numeric array") as refused:
        client.online_query([["a"] * 4] * 4, APP, model_name="images")

    assert len(reply["predictions"]) == 1
    assert sent == ["application/x-npy", "application/json"]
    assert refused.value.status == 400


# --- the command line -------------------------------------------------------------------------


def test_cli_load_inputs_reads_each_kind_of_file(tmp_path: Path) -> None:
    ids, mask = token_inputs(2)
    image = png_bytes(picture())
    (tmp_path / "x.png").write_bytes(image)
    (tmp_path / "x.JPG").write_bytes(jpeg_bytes(picture()))
    np.savez(tmp_path / "tokens.npz", ids=ids, mask=mask)

    assert cli.load_inputs(tmp_path / "x.png") == image
    assert cli.load_inputs(tmp_path / "x.JPG")[:3] == b"\xff\xd8\xff"
    arrays = cli.load_inputs(tmp_path / "tokens.npz")
    assert set(arrays) == {"ids", "mask"}
    np.testing.assert_array_equal(arrays["ids"], ids)
    # A usage error: the command reports it and exits 2 (cli.ExitCode.USAGE).
    with pytest.raises(cli.UsageProblem, match=r"use a \.npy, \.npz, \.json, \.png or \.jpg file"):
        cli.load_inputs(tmp_path / "x.txt")


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".json", ".png"])
def test_cli_query_sends_each_file_kind(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    key = images_app(api)
    monkeypatch.setattr(cli, "_client", lambda args: in_process_client(api, key))
    batch = np.random.default_rng(6).random((2, *IMAGE_SPEC.shape)).astype(np.float32)
    path = tmp_path / f"inputs{suffix}"
    if suffix == ".npy":
        np.save(path, batch)
    elif suffix == ".npz":
        np.savez(path, inputs=batch)
    elif suffix == ".json":
        path.write_text(json.dumps(batch.tolist()))
    else:
        path.write_bytes(png_bytes(picture()))

    cli.main(["query", "--app", APP, "--model", "images", "--inputs", str(path), "--json"])

    reply = json.loads(capsys.readouterr().out)
    assert len(reply["predictions"]) == (1 if suffix == ".png" else 2)
    assert set(reply["clientTimingsMs"]) == {"encode", "roundTrip"}
    assert reply["timingsMs"]["decode_ms"] > 0
