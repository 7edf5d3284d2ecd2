"""Hostile and retried requests over the HTTP API, in-process (test_api.py's services): each gets a
clear 4xx in the API's error shape and changes nothing, or, retried with its Idempotency-Key,
gets its first reply and creates nothing twice.

- a validation set that unpacks past its limit (a small deflated .npz standing for a large one);
- a model that passes onnx's checker, and runs on synthetic inputs, but not on its validation set;
- imported profiles with absurd numbers;
- /v1/workers, which shows an app only its own instances (the admin key sees all);
- register_model retried with its Idempotency-Key, by hand and by the client;
- issue 33's cases: a validation set that declares its whole limit in its first array, bad
  worker reports, a query parameter given twice, a JSON body sent as another content type, a
  method a path does not serve.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper

from modelless import cli
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.catalog import DEFAULT_POOLS
from modelless.client import Client, ModellessClientError
from modelless.config import Settings
from modelless.inputs.tensors import example_batch
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.registration.ingest import RegistrationSource
from modelless.registration.service import RegistrationJob, RegistrationService
from modelless.repository.local import LocalModelRepository
from modelless.types import InstanceState, InstanceStats, RegistrationStatus, TensorSpec, WorkerState
from tests.models import linear_model, valset_npz
from tests.unit.test_api import (
    ADMIN,
    MAX_VALSET,
    Api,
    InProcessLambda,
    error_of,
    make_settings,
    register,
    seed_digits,
)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """test_api.py's in-process API; registration's background work is recorded, never run."""
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    services = build_services(make_settings(tmp_path), store=store, lambda_tier=lambda_tier)
    built = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)
    monkeypatch.setattr(
        services.registrar._background, "submit", lambda *args, **kwargs: built.submitted.append(args)
    )
    try:
        yield built
    finally:
        built.client.close()
        services.close()


def everything(api: Api) -> dict[str, Any]:
    """What a refused registration must leave as it was: test_api's state and the registrations."""
    return {**api.state(), "registrations": dict(api.store._registrations)}


# --- a validation set that unpacks past its limit ------------------------------------------------


def test_a_deflated_validation_set_past_its_unpacked_limit_is_413_and_stores_nothing(api: Api) -> None:
    key = api.create_app("digits")
    buffer = io.BytesIO()
    # 4,000 blank digits: 1 MB of float32 once unpacked, a few KB deflated.
    np.savez_compressed(buffer, inputs=np.zeros((4000, 1, 8, 8), np.float32), labels=np.zeros(4000, np.int64))
    bomb = buffer.getvalue()
    assert len(bomb) < MAX_VALSET < 4000 * 256  # under the file limit, far past 4x it unpacked
    before = everything(api)

    error = error_of(register(api, key, valset=bomb), 413)

    assert error["code"] == "payload_too_large"
    assert error["details"]["setting"] == "MODELLESS_MAX_VALSET_UNPACKED_BYTES"
    assert error["details"]["limit"] == 4 * MAX_VALSET  # derived from the file's own limit
    assert "validation array 'inputs' is 1024128 bytes unpacked" in error["message"]
    assert everything(api) == before


# --- a model that cannot run on its own validation set -------------------------------------------


def runs_on_synthetic_inputs_only() -> bytes:
    """A digits-shaped classifier ([batch, 1, 8, 8] -> [batch, 10]) whose logits are a row of a
    one-row table, picked by the image's brightest pixel (cast to an index): synthetic inputs,
    in [0, 1), pick row 0; a real digit has pixels of 1.0 and picks row 1, which does not exist.
    onnx's checker passes it; only a run on the validation set finds it out."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["x"], ["brightest"], axes=[1, 2, 3], keepdims=0),
            helper.make_node("Cast", ["brightest"], ["index"], to=TensorProto.INT64),
            helper.make_node("Gather", ["table", "index"], ["logits"]),
        ],
        "picks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(np.ones((1, 10), np.float32), "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized


def test_a_model_that_cannot_run_on_its_validation_set_is_400_and_nothing_is_stored(api: Api) -> None:
    model = runs_on_synthetic_inputs_only()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    synthetic = example_batch([TensorSpec("x", [1, 8, 8], "float32")], 2)
    assert session.run(None, {"x": synthetic})[0].shape == (2, 10)  # a synthetic test run passes it
    key = api.create_app("digits")
    before = everything(api)

    error = error_of(register(api, key, name="picky", model=model), 400)

    assert error["code"] == "invalid_model"
    assert error["message"].startswith("the model loads but does not run on the first validation example")
    assert everything(api) == before  # no model, no registration record, no repository object
    assert api.repository.list_keys("") == [] and api.submitted == []


def test_where_the_gateway_cannot_run_it_the_registrar_test_runs_it_on_the_validation_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the AWS gateway, whose package leaves onnxruntime out.
    monkeypatch.setattr("modelless.registration.ingest.onnxruntime_available", lambda: False)
    store, repository = InMemoryMetadataStore(), LocalModelRepository(tmp_path / "repo")
    jobs: list[RegistrationJob] = []
    service = RegistrationService(store, repository, Settings(), DEFAULT_POOLS, jobs.append)
    generated: list[str] = []
    monkeypatch.setattr(
        service, "_generate_and_profile", lambda model, *_: generated.append(model.model_name)
    )
    model, valset = tmp_path / "picky.onnx", tmp_path / "val.npz"
    model.write_bytes(runs_on_synthetic_inputs_only())
    valset.write_bytes(valset_npz(50))
    try:
        service.register("digits", "picky", RegistrationSource(model, valset))  # accepted unrun
        [job] = jobs
        assert job.test_run
        finished = service.run(job)
    finally:
        service.close()

    assert finished.status is RegistrationStatus.FAILED
    assert finished.message.startswith("the model loads but does not run on the first validation example")
    assert generated == [] and store.list_models("digits") == [] and repository.list_keys("") == []


# --- imported profiles ---------------------------------------------------------------------------


def gpu_profile(**changes: Any) -> dict[str, Any]:
    profile: dict[str, Any] = {
        "recipe": "fp32_basic",
        "pool": "gpu",
        "latency_p50_ms": {"1": 0.2, "8": 0.4},
        "latency_p99_ms": {"1": 0.3, "8": 0.6},
        "load_latency_ms": 5.0,
        "accuracy": 0.9,
        "hardware": "NVIDIA T4",
    }
    profile.update(changes)
    return profile


ABSURD_PROFILES = [
    ({"latency_p99_ms": {"1": 1e308, "8": 0.6}}, r"latency_p99_ms\[1\] must lie in \[0.001, 3600000\]"),
    ({"latency_p50_ms": {"1": -0.2, "8": 0.4}}, r"latency_p50_ms\[1\] must lie in"),
    ({"latency_p99_ms": {"1": 10**400, "8": 0.6}}, r"latency_p99_ms\[1\] must be a finite number"),
    ({"latency_p99_ms": {"1": "0.3", "8": 0.6}}, r"latency_p99_ms\[1\] must be a number"),
    ({"latency_p99_ms": {"1": True, "8": 0.6}}, r"latency_p99_ms\[1\] must be a number"),
    ({"latency_p50_ms": {"1": 0.2, "99999": 0.4}, "latency_p99_ms": {"1": 0.3, "99999": 0.6}}, "batch size"),
    ({"accuracy": 1.5}, r"accuracy must lie in \[0, 1\]"),
    ({"accuracy": "0.9"}, "accuracy must be a number"),
    ({"load_latency_ms": 1e12}, r"load_latency_ms must lie in \[0, 3600000\]"),
    ({"peak_memory_mb": 1e30}, "peak_memory_mb must lie in"),
    ({"threads": 10**6}, "threads must be at most 256"),
    ({"pool": "lambda-cpu", "memory_mb": 10**9}, "memory_mb must be at most 10240"),
    ({"pool": "lambda-cpu", "memory_mb": 64}, r"memory_mb must lie in \[128, 10240\]"),
    ({"saturation_qps": 1e300}, "saturation_qps must lie in"),
    ({"accuracy_examples": 10**12}, "accuracy_examples must be at most"),
    ({"hardware": 42}, "hardware must be a string"),
]


@pytest.mark.parametrize(("changes", "message"), ABSURD_PROFILES, ids=lambda case: str(case)[:40])
def test_an_imported_profile_with_absurd_numbers_is_400_naming_the_field(
    api: Api, changes: dict[str, Any], message: str
) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    api.repository.put("apps/digits/hidden/variants/fp32_basic.onnx", b"an artifact")
    body = {"appID": "digits", "modelName": "hidden", "profiles": [gpu_profile(**changes)]}
    assert api.client.post("/v1/variants/import", json={**body, "profiles": [gpu_profile()]}, headers=key)
    before = everything(api)

    response = api.client.post(
        "/v1/variants/import",
        content=json.dumps(body).encode(),
        headers={**key, "Content-Type": "application/json"},
    )

    error = error_of(response, 400)
    assert re.search(message, error["message"]), error["message"]
    assert error["message"].startswith("profile 0")
    assert everything(api) == before


# --- /v1/workers: an app sees its own instances only ----------------------------------------------


def instance(variant_id: str) -> InstanceStats:
    return InstanceStats(variant_id, InstanceState.ACTIVE, 3.0, 1.0, 2.0, 0)


def two_apps_on_shared_workers(api: Api) -> tuple[dict[str, str], dict[str, str]]:
    """w1 runs an instance of each app's model; w2 only the other app's."""
    mine, theirs = api.create_app("mine"), api.create_app("theirs")
    now = time.time()
    api.store.put_worker_state(
        WorkerState(
            "w1",
            "cpu",
            "http://10.0.0.1:9001",
            0.5,
            1,
            now,
            (instance("mine/resnet/fp32_basic/cpu-1t"), instance("theirs/secret/int8_all/cpu-1t")),
        )
    )
    api.store.put_worker_state(
        WorkerState(
            "w2", "cpu", "http://10.0.0.2:9001", 0.2, 2, now, (instance("theirs/secret/fp16_all/cpu-1t"),)
        )
    )
    return mine, theirs


def test_an_app_key_sees_only_its_own_instances_and_no_addresses(api: Api) -> None:
    mine, _ = two_apps_on_shared_workers(api)

    reply = api.client.get("/v1/workers", headers=mine)

    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["appID"] == "mine"
    [worker] = body["workers"]  # w2 runs nothing of this app's
    assert worker["worker_id"] == "w1" and "address" not in worker
    assert [i["variant_id"] for i in worker["instances"]] == ["mine/resnet/fp32_basic/cpu-1t"]
    assert "theirs" not in reply.text and "10.0.0" not in reply.text


def test_the_admin_key_sees_every_worker_as_it_reports(api: Api) -> None:
    two_apps_on_shared_workers(api)

    workers = api.client.get("/v1/workers", headers=ADMIN).json()["workers"]

    assert {w["worker_id"]: w["address"] for w in workers} == {
        "w1": "http://10.0.0.1:9001",
        "w2": "http://10.0.0.2:9001",
    }
    assert sum(len(w["instances"]) for w in workers) == 3


def test_workers_without_a_key_or_with_an_unknown_one_is_401(api: Api) -> None:
    two_apps_on_shared_workers(api)
    assert error_of(api.client.get("/v1/workers"), 401)["code"] == "unauthorized"
    assert error_of(api.client.get("/v1/workers", headers={"X-Api-Key": "mlk_nope"}), 401)


def in_process_client(api: Api, api_key: str | None = None, admin_key: str | None = None) -> Client:
    client = Client("http://testserver", api_key=api_key, admin_key=admin_key, retry_delays_s=())
    client._http.close()
    client._http = cast(Any, api.client)  # the TestClient answers in-process
    return client


def test_the_cli_workers_command_works_with_an_app_key_and_with_the_admin_key(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine, _ = two_apps_on_shared_workers(api)
    clients = {
        "app": in_process_client(api, api_key=mine["X-Api-Key"]),
        "admin": in_process_client(api, admin_key=ADMIN["X-Api-Key"]),
    }

    monkeypatch.setattr(cli, "_client", lambda args: clients["app" if args.app else "admin"])
    monkeypatch.setattr(Client, "close", lambda self: None)  # the TestClient serves both calls
    cli.main(["workers", "--app", "mine"])
    as_app = capsys.readouterr().out
    cli.main(["workers"])
    as_admin = capsys.readouterr().out

    assert "w1" in as_app and "mine/resnet" in as_app and "theirs" not in as_app and "w2" not in as_app
    assert "w1" in as_admin and "w2" in as_admin and "theirs/secret" in as_admin


# --- register_model retried with its Idempotency-Key ----------------------------------------------


def test_a_retried_registration_gets_its_first_reply_and_registers_once(api: Api) -> None:
    key = api.create_app("digits")
    keyed = {**key, "Idempotency-Key": "reg-1"}

    first = register(api, keyed)
    again = register(api, keyed)

    assert first.status_code == again.status_code == 202, again.text
    assert again.json() == first.json()  # the same registration id, the same status
    assert again.headers["Idempotent-Replayed"] == "true"
    assert [m.registration_id for m in api.store.list_models("digits")] == [first.json()["registrationId"]]
    assert list(api.store._registrations) == [first.json()["registrationId"]]
    assert len(api.submitted) == 1  # one background job

    # The same key with another request (another file): 409, and nothing registered.
    other = register(api, keyed, name="other")
    error = error_of(other, 409)
    assert error["code"] == "idempotency_conflict" and error["details"]["reason"] == "different_request"
    assert len(api.store.list_models("digits")) == 1 and len(api.submitted) == 1


def test_idempotency_keys_belong_to_one_app(api: Api) -> None:
    first_app, second_app = api.create_app("digits"), api.create_app("letters")

    one = register(api, {**first_app, "Idempotency-Key": "shared"}, app_id="digits")
    two = register(api, {**second_app, "Idempotency-Key": "shared"}, app_id="letters")

    assert one.status_code == two.status_code == 202, two.text
    assert one.json()["registrationId"] != two.json()["registrationId"]
    assert "Idempotent-Replayed" not in two.headers


def test_a_refused_registration_gives_its_idempotency_key_back(api: Api) -> None:
    key = api.create_app("digits")
    keyed = {**key, "Idempotency-Key": "reg-2"}

    assert register(api, keyed, valset=b"not an npz").status_code == 400
    assert register(api, keyed).status_code == 202  # corrected and sent again under the same key


def test_the_client_sends_one_key_per_call_and_its_retries_reuse_it(api: Api, tmp_path: Path) -> None:
    key = api.create_app("digits")
    seen: list[str] = []
    dropped = 0

    def drop_the_first_reply(request: Any) -> None:  # the TestClient's (httpx2's) request
        nonlocal dropped
        seen.append(request.headers["Idempotency-Key"])
        if dropped == 0:
            dropped += 1
            response = api.client.send(request)  # the server registers it...
            assert response.status_code == 202
            raise httpx.ReadError("connection reset", request=request)  # ...and the reply is lost

    client = in_process_client(api, api_key=key["X-Api-Key"])
    client._retry_delays_s = (0.0,)
    model, valset = tmp_path / "m.onnx", tmp_path / "val.npz"
    model.write_bytes(linear_model())
    valset.write_bytes(valset_npz(50))
    api.client.event_hooks["request"] = [drop_the_first_reply]
    try:
        reply = client.register_model("linear", model, valset, "digits")
    finally:
        api.client.event_hooks["request"] = []

    assert len(seen) == 3 and seen[1] == seen[2] == seen[0]  # (the hook saw its own resend too)
    assert reply["registrationId"] == api.store.list_models("digits")[0].registration_id
    assert len(api.store.list_models("digits")) == 1 and len(api.submitted) == 1

    # A new logical call gets a new key: a second registration is a new one (409: the name).
    api.client.event_hooks["request"] = [lambda request: seen.append(request.headers["Idempotency-Key"])]
    with pytest.raises(ModellessClientError) as refused:
        client.register_model("linear", model, valset, "digits")
    assert refused.value.status == 409 and refused.value.code == "conflict"
    assert len(seen) == 4 and seen[3] != seen[0]


# --- issue 33: the last 500s, silent coercions and slow refusals -------------------------------


def test_a_validation_set_whose_first_array_declares_the_whole_limit_is_413_before_inflating(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labels come after inputs that declare exactly the unpacked limit: refused on what
    the headers declare, no array data inflated (it cost ~12 s per 1 MB request before)."""
    import modelless.inputs.archives as archives_module

    inflated: list[tuple[int, ...]] = []
    real = archives_module._read_data

    def counting(stream: Any, shape: tuple[int, ...], *rest: Any) -> np.ndarray:
        inflated.append(shape)
        return real(stream, shape, *rest)

    monkeypatch.setattr(archives_module, "_read_data", counting)
    key = api.create_app("digits")
    limit = 4 * MAX_VALSET  # the unpacked limit, derived from the file's own
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer, inputs=np.zeros((limit // 256, 1, 8, 8), np.float32), labels=np.zeros(limit // 256, np.int64)
    )
    assert len(buffer.getvalue()) < MAX_VALSET
    before = everything(api)

    error = error_of(register(api, key, valset=buffer.getvalue()), 413)

    assert error["details"]["setting"] == "MODELLESS_MAX_VALSET_UNPACKED_BYTES"
    assert "bytes of array data in all" in error["message"]
    assert inflated == []
    assert everything(api) == before


def worker_report(**changes: Any) -> dict[str, Any]:
    instance = InstanceStats("digits/linear/fp32-all/cpu", InstanceState.ACTIVE, 1.0, 1.0, 2.0, 0)
    state = WorkerState("cpu-0-abc123", "cpu", "http://127.0.0.1:9", 0.5, 1, time.time(), (instance,))
    report: dict[str, Any] = json.loads(state.to_json())
    report.update(changes)
    return report


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not json", "Invalid JSON"),
        (b"[]", "body"),
        (b"{}", "worker_id: Field required"),
        (
            json.dumps({k: v for k, v in worker_report().items() if k != "pool"}).encode(),
            "pool: Field required",
        ),
        (json.dumps(worker_report(free_slots="1")).encode(), "free_slots"),
        (json.dumps(worker_report(free_slots=True)).encode(), "free_slots"),
        (json.dumps(worker_report(utilisation=float("inf"))).encode(), "utilisation"),
        (json.dumps(worker_report(utilisation=float("nan"))).encode(), "utilisation"),
        (json.dumps(worker_report(instances=[{"variant_id": "v"}])).encode(), "instances.0.state"),
        (
            json.dumps(worker_report(instances=[{**worker_report()["instances"][0], "state": "x"}])).encode(),
            "state",
        ),
    ],
    ids=[
        "not-json",
        "array",
        "empty",
        "no-pool",
        "text-count",
        "bool-count",
        "inf",
        "nan",
        "bare-instance",
        "state",
    ],
)
def test_a_bad_worker_report_is_400_and_stores_nothing(api: Api, body: bytes, problem: str) -> None:
    response = api.client.post("/internal/worker-state", content=body, headers=ADMIN)
    error = error_of(response, 400)
    assert error["code"] == "bad_request" and problem in error["message"], error["message"]
    assert api.store.list_worker_reports() == []


def test_a_worker_report_is_stored_and_withdrawn_with_the_admin_key_only(api: Api) -> None:
    report = json.dumps(worker_report()).encode()
    key = api.create_app("digits")
    assert api.client.post("/internal/worker-state", content=report, headers=key).status_code in (401, 403)
    assert api.client.post("/internal/worker-state", content=report, headers=ADMIN).status_code == 204
    assert [w.worker_id for w in api.store.list_worker_reports()] == ["cpu-0-abc123"]
    assert api.client.delete("/internal/worker-state/cpu-0-abc123", headers=key).status_code in (401, 403)
    assert api.client.delete("/internal/worker-state/cpu-0-abc123", headers=ADMIN).status_code == 204
    assert api.store.list_worker_reports() == []


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("POST", "/v1/online_query?appID=digits&latency=5&latency=500"),
        ("POST", "/v1/online_query?appID=digits&appID=digits&accuracy=0.5"),
        ("POST", "/v1/online_query?appID=digits&accuracy=0.5&accur%61cy=0.9"),
        ("GET", "/v1/pipelines?appID=digits&appID=other"),
        ("GET", "/v1/models?modelName=a&modelName=b"),
    ],
)
def test_a_parameter_given_twice_is_400_naming_it(api: Api, method: str, url: str) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    before = everything(api)
    body = io.BytesIO()
    np.save(body, np.zeros((1, 1, 8, 8), np.float32))
    response = api.client.request(
        method, url, content=body.getvalue(), headers={**key, "Content-Type": "application/x-npy"}
    )
    error = error_of(response, 400)
    assert "more than once" in error["message"]
    assert len(error["details"]["parameters"]) == 1
    assert error["details"]["parameters"][0] in url
    assert everything(api) == before


def json_body_operations(api: Api) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path with its parameters filled, its responses) of every operation the schema
    says takes JSON."""
    operations = []
    for path, methods in api.client.get("/openapi.json").json()["paths"].items():
        for method, operation in methods.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                filled = re.sub(r"\{[^}]+\}", "digits", path)
                operations.append(
                    (method.upper(), filled, {"responses": operation["responses"], "content": content})
                )
    return operations


def test_every_json_operation_refuses_another_content_type_with_a_415_naming_it(api: Api) -> None:
    operations = json_body_operations(api)
    assert len(operations) >= 8
    before = everything(api)
    for method, path, documented in operations:
        assert "415" in documented["responses"], (method, path)
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            if content_type in documented["content"]:
                continue  # register_model takes s3:// URIs as form fields too
            response = api.client.request(
                method, path, content=b'{"appID": "digits"}', headers={**ADMIN, "Content-Type": content_type}
            )
            error = error_of(response, 415)
            assert content_type in error["message"], (method, path, error["message"])
    assert everything(api) == before


def test_a_method_a_path_does_not_serve_is_405_allowing_every_method_it_documents(api: Api) -> None:
    for path, methods in api.client.get("/openapi.json").json()["paths"].items():
        documented = {method.upper() for method in methods}
        url = re.sub(r"\{[^}]+\}", "digits", path)
        for method in {"OPTIONS", "PATCH", "PUT", "DELETE", "POST", "GET"} - documented:
            response = api.client.request(method, url, headers=ADMIN)
            error = error_of(response, 405)
            assert error["code"] == "method_not_allowed"
            allowed = {m.strip() for m in response.headers["Allow"].split(",")}
            assert allowed == documented, (method, path, allowed)
