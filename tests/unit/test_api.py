"""The HTTP API in-process: FastAPI TestClient over real services with an in-memory store, a
local repository and an in-process Lambda tier running the real VariantRuntime.

Registration's background job (variant generation in child processes) never runs here: the
registrar's executor is replaced by a recorder, and query tests seed profiles directly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from modelless.api import create_app
from modelless.api.app import GATEWAY_THREADS
from modelless.api.services import Services, build_services
from modelless.catalog import DEFAULT_POOLS
from modelless.config import Settings
from modelless.dispatch import attempts
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.runtime import VariantRuntime
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    Registration,
    RegistrationStatus,
    VariantProfile,
    WorkerState,
)
from modelless.validation import inspect_model
from modelless.worker.reporting import INTERNAL_STATE_PATH
from tests.models import classifier_onnx, digits, fit_linear, hidden_model, linear_model, valset_npz

ADMIN_KEY = "admin-secret"
ADMIN = {"X-Api-Key": ADMIN_KEY}
MAX_MODEL = 32_000
MAX_VALSET = 32_000
MAX_QUERY = 20_000
MAX_BATCH = 16
LAMBDA_POOL = DEFAULT_POOLS["lambda-cpu"]


class InProcessLambda:
    """The Lambda tier as a LambdaInvoker, in this process: the real runtime on the repository."""

    def __init__(self, repository: LocalModelRepository, cache_dir: Path) -> None:
        self.runtime = VariantRuntime(repository, cache_dir)
        self.calls: list[str] = []

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        self.calls.append(invocation.variant_id)
        cold = invocation.variant_id not in self.runtime.loaded_ids
        # Through the wire's own encoding, as a Lambda event and its reply travel.
        served = self.runtime.serve(Invocation.from_message(invocation.to_message()))
        return dataclasses.replace(Reply.from_message(served.to_message()), cold_start=cold)


@dataclass
class Api:
    client: TestClient
    services: Services
    store: InMemoryMetadataStore
    repository: LocalModelRepository
    lambda_tier: InProcessLambda
    submitted: list[tuple[Any, ...]] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)

    def create_app(self, app_id: str) -> dict[str, str]:
        """Create an app through the admin endpoint; returns the headers its key goes in."""
        response = self.client.post("/v1/apps", json={"appID": app_id}, headers=ADMIN)
        assert response.status_code == 201, response.text
        self.apps.append(app_id)
        return {"X-Api-Key": response.json()["apiKey"]}

    def state(self) -> dict[str, Any]:
        """Everything a refused request must leave untouched."""
        return {
            "models": {app: self.store.list_models(app) for app in self.apps},
            "variants": {app: self.store.list_variants(app) for app in self.apps},
            "repository": {key: self.repository.get(key) for key in self.repository.list_keys("")},
            "lambda_calls": list(self.lambda_tier.calls),
            "submitted": len(self.submitted),
        }


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "metadata_url": "memory://",
        "repository_url": str(tmp_path / "repo"),
        "admin_key": ADMIN_KEY,
        "cache_dir": tmp_path / "cache",
        "max_model_bytes": MAX_MODEL,
        "max_valset_bytes": MAX_VALSET,
        "max_query_bytes": MAX_QUERY,
        "max_batch": MAX_BATCH,
        "lambda_function": "",
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    settings = make_settings(tmp_path)
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    services = build_services(settings, store=store, lambda_tier=lambda_tier)
    built = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)

    def record_submit(*args: Any, **kwargs: Any) -> None:
        built.submitted.append(args)

    # Never start variant generation (child processes) from a unit test.
    monkeypatch.setattr(services.registrar._background, "submit", record_submit)
    try:
        yield built
    finally:
        built.client.close()
        services.close()


# --- seeding ----------------------------------------------------------------------------------


def seed_model(
    api: Api,
    app_id: str,
    model_name: str,
    model_bytes: bytes,
    *,
    accuracy: float,
    p99: dict[int, float],
    load_ms: float,
    ready: bool = True,
) -> VariantProfile:
    """Store the model file and publish one Lambda-pool variant profile pointing at it."""
    signature = inspect_model(model_bytes, len(model_bytes))
    key = f"apps/{app_id}/{model_name}/source.onnx"
    api.repository.put(key, model_bytes)
    registration = Registration(f"reg-{app_id}-{model_name}", app_id, model_name)
    record = ModelRecord(
        app_id=app_id,
        model_name=model_name,
        input_name=signature.input_name,
        input_shape=signature.input_shape,
        input_dtype=signature.input_dtype,
        num_classes=signature.num_classes,
        registration_id=registration.registration_id,
        artifact_key=key,
    )
    api.store.add_model(record, registration)
    variant = VariantProfile(
        variant_id=f"{app_id}/{model_name}/fp32-all/{LAMBDA_POOL.name}",
        app_id=app_id,
        model_name=model_name,
        pool=LAMBDA_POOL.name,
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key=key,
        size_bytes=len(model_bytes),
        load_latency_ms=load_ms,
        latency_p50_ms={b: v / 2 for b, v in p99.items()},
        latency_p99_ms=p99,
        peak_memory_mb=10.0,
        accuracy=accuracy,
        price_per_second=LAMBDA_POOL.instance_price_per_second(1),
        request_price=LAMBDA_POOL.request_price,
        hardware="test",
        measured_on_target=True,
    )
    if ready:
        registration.status = RegistrationStatus.READY
        registration.variant_ids = [variant.variant_id]
        api.store.publish_variants(dataclasses.replace(record, ready=True), [variant], registration)
    return variant


def seed_digits(api: Api, app_id: str) -> tuple[VariantProfile, VariantProfile]:
    """The cheap linear classifier (fast, less accurate) and the hidden-layer one."""
    linear = seed_model(
        api, app_id, "linear", linear_model(), accuracy=0.865, p99={1: 1.0, 16: 3.0}, load_ms=4.0
    )
    hidden = seed_model(
        api, app_id, "hidden", hidden_model(), accuracy=0.93, p99={1: 3.0, 16: 10.0}, load_ms=20.0
    )
    return linear, hidden


def images(count: int = 1, start: int = 0) -> np.ndarray:
    return digits()[0][-200 + start :][:count]


def direct_logits(model_bytes: bytes, inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(None, {"input": inputs.astype(np.float32)})[0]
    return logits


def query(api: Api, headers: dict[str, str], **body: Any) -> Any:
    return api.client.post("/v1/online_query", json=body, headers=headers)


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["message"]
    return error


# --- health, apps and admin -------------------------------------------------------------------


def test_health(api: Api) -> None:
    assert api.client.get("/health").json() == {"status": "ok"}


def test_create_app_issues_a_key_for_that_app(api: Api) -> None:
    response = api.client.post("/v1/apps", json={"appID": "digits"}, headers=ADMIN)

    assert response.status_code == 201
    body = response.json()
    assert body["appID"] == "digits"
    assert body["apiKey"].startswith("mlk_")
    models = api.client.get("/v1/models", headers={"Authorization": f"Bearer {body['apiKey']}"})
    assert models.status_code == 200
    assert models.json() == {"appID": "digits", "models": []}


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-Api-Key": "wrong"}, {"Authorization": "Bearer wrong"}],
    ids=["no-key", "wrong-key", "wrong-bearer"],
)
def test_admin_endpoint_without_the_admin_key_is_401(api: Api, headers: dict[str, str]) -> None:
    response = api.client.post("/v1/apps", json={"appID": "digits"}, headers=headers)

    error = error_of(response, 401)
    assert error["code"] == "unauthorized"
    assert "admin key" in error["message"]
    # Nothing created: the admin can still create it.
    assert api.client.post("/v1/apps", json={"appID": "digits"}, headers=ADMIN).status_code == 201


def test_an_app_key_is_not_the_admin_key(api: Api) -> None:
    app_key = api.create_app("digits")
    error = error_of(api.client.post("/v1/apps", json={"appID": "other"}, headers=app_key), 401)
    assert "admin key" in error["message"]


def test_worker_report_endpoint_needs_the_admin_key(api: Api) -> None:
    state = WorkerState("w1", "cpu", "http://w1", 0.1, 2, reported_at=1e12)
    assert api.client.post(INTERNAL_STATE_PATH, content=state.to_json()).status_code == 401
    assert api.store.list_workers() == []

    assert api.client.post(INTERNAL_STATE_PATH, content=state.to_json(), headers=ADMIN).status_code == 204
    assert api.store.list_workers() == [state]
    key = api.create_app("digits")
    assert api.client.get("/v1/workers", headers=key).json()["workers"] == []  # none of its instances
    assert [w["worker_id"] for w in api.client.get("/v1/workers", headers=ADMIN).json()["workers"]] == ["w1"]


def test_workers_show_each_instances_tuned_configuration_and_scale(api: Api) -> None:
    tuned = InstanceStats(
        "digits/m/v1", InstanceState.ACTIVE, qps=3.0, latency_p50_ms=2.0, latency_p99_ms=3.0, queue_length=0,
        intra_threads=2, inter_threads=1, concurrency=2, latency_scale=1.25,
    )  # fmt: skip
    state = WorkerState("w1", "cpu", "http://w1", 0.1, 2, reported_at=1e12, instances=(tuned,))
    assert api.client.post(INTERNAL_STATE_PATH, content=state.to_json(), headers=ADMIN).status_code == 204
    key = api.create_app("digits")

    for headers in (key, ADMIN):
        (worker,) = api.client.get("/v1/workers", headers=headers).json()["workers"]
        (shown,) = worker["instances"]
        assert (shown["intra_threads"], shown["inter_threads"], shown["concurrency"]) == (2, 1, 2)
        assert shown["latency_scale"] == 1.25


def test_no_admin_key_configured_is_403(tmp_path: Path) -> None:
    services = build_services(make_settings(tmp_path, admin_key=""), store=InMemoryMetadataStore())
    try:
        response = TestClient(create_app(services)).post(
            "/v1/apps", json={"appID": "digits"}, headers={"X-Api-Key": ""}
        )
        error = error_of(response, 403)
        assert "no admin key is configured" in error["message"]
    finally:
        services.close()


def test_duplicate_app_is_409_and_keeps_the_first_key(api: Api) -> None:
    key = api.create_app("digits")

    error = error_of(api.client.post("/v1/apps", json={"appID": "digits"}, headers=ADMIN), 409)

    assert error["code"] == "conflict"
    assert "already exists" in error["message"]
    assert api.client.get("/v1/models", headers=key).status_code == 200


@pytest.mark.parametrize("app_id", ["", "../etc", "has space", "x" * 65])
def test_invalid_app_name_is_400(api: Api, app_id: str) -> None:
    error = error_of(api.client.post("/v1/apps", json={"appID": app_id}, headers=ADMIN), 400)
    assert "appID" in error["message"]


def test_malformed_body_is_400_naming_the_field(api: Api) -> None:
    error = error_of(api.client.post("/v1/apps", json={"name": "digits"}, headers=ADMIN), 400)
    assert error["code"] == "bad_request"
    assert "appID" in error["message"]


# --- keys -------------------------------------------------------------------------------------


def test_missing_key_is_401(api: Api) -> None:
    api.create_app("digits")
    error = error_of(query(api, {}, appID="digits", inputs=images().tolist(), accuracy=0.5), 401)
    assert "missing API key" in error["message"]
    error = error_of(api.client.get("/v1/models"), 401)
    assert "missing API key" in error["message"]


def test_unknown_key_is_401(api: Api) -> None:
    api.create_app("digits")
    before = api.state()
    response = query(api, {"X-Api-Key": "mlk_forged"}, appID="digits", inputs=images().tolist(), accuracy=0.5)
    error = error_of(response, 401)
    assert error["message"] == "unknown API key"
    assert api.state() == before


def test_key_of_one_app_cannot_query_another(api: Api) -> None:
    key_a = api.create_app("app-a")
    api.create_app("app-b")
    seed_digits(api, "app-b")
    before = api.state()

    response = query(api, key_a, appID="app-b", inputs=images().tolist(), accuracy=0.5)

    error = error_of(response, 403)
    assert error["code"] == "forbidden"
    assert "belongs to app 'app-a', not 'app-b'" in error["message"]
    assert api.state() == before


def test_key_of_one_app_cannot_register_into_another(api: Api) -> None:
    key_a = api.create_app("app-a")
    api.create_app("app-b")
    before = api.state()

    response = register(api, key_a, app_id="app-b")

    error = error_of(response, 403)
    assert "not 'app-b'" in error["message"]
    assert api.state() == before


def test_key_of_one_app_cannot_read_another_apps_registration(api: Api) -> None:
    key_a = api.create_app("app-a")
    key_b = api.create_app("app-b")
    accepted = register(api, key_b, app_id="app-b")
    assert accepted.status_code == 202
    status_url = accepted.json()["statusUrl"]

    assert api.client.get(status_url, headers=key_b).status_code == 200
    error_of(api.client.get(status_url, headers=key_a), 404)


def test_models_and_variants_are_listed_per_app(api: Api) -> None:
    key_a = api.create_app("app-a")
    key_b = api.create_app("app-b")
    linear, _ = seed_digits(api, "app-a")

    models = api.client.get("/v1/models", headers=key_a).json()["models"]
    assert sorted(m["model_name"] for m in models) == ["hidden", "linear"]
    assert all(m["ready"] for m in models)
    variants = api.client.get("/v1/variants", headers=key_a, params={"modelName": "linear"}).json()
    assert [v["variant_id"] for v in variants["variants"]] == [linear.variant_id]
    assert api.client.get("/v1/models", headers=key_b).json()["models"] == []
    assert api.client.get("/v1/variants", headers=key_b).json()["variants"] == []
    error_of(api.client.get("/v1/variants", headers=key_b, params={"modelName": "linear"}), 404)


# --- online_query: happy path -----------------------------------------------------------------


def test_query_returns_outputs_predictions_variant_tier_and_timings(api: Api) -> None:
    key = api.create_app("digits")
    linear, _ = seed_digits(api, "digits")
    batch = images(5)

    response = query(api, key, appID="digits", inputs=batch.tolist(), latency=10, accuracy=0.8)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == linear.variant_id
    assert body["model"] == "linear"
    assert body["tier"] == "lambda"
    assert body["worker"] is None
    assert body["variantState"] == "inactive"
    assert body["coldStart"] is True
    assert body["retried"] is False
    assert body["expectedLatencyMs"] == 7.0  # load 4 ms + 3 ms p99 (batch 5 -> the batch-16 row)
    expected = direct_logits(linear_model(), batch)
    np.testing.assert_allclose(np.array(body["outputs"]), expected, atol=1e-5)
    assert body["predictions"] == expected.argmax(axis=1).tolist()
    assert set(body["timingsMs"]) >= {"selection_ms", "queue_ms", "inference_ms", "load_ms", "total_ms"}
    assert 0 <= body["timingsMs"]["selection_ms"] <= body["timingsMs"]["total_ms"]
    assert api.lambda_tier.calls == [linear.variant_id]


def test_predictions_are_real_classifications(api: Api) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    batch = images(16)
    labels = digits()[1][-200:][:16]

    body = query(api, key, appID="digits", inputs=batch.tolist(), accuracy=0.9).json()

    assert body["model"] == "hidden"
    assert np.mean(np.array(body["predictions"]) == labels) >= 0.8


def test_different_targets_pick_different_variants(api: Api) -> None:
    key = api.create_app("digits")
    linear, hidden = seed_digits(api, "digits")
    one = images(1)

    tight = query(api, key, appID="digits", inputs=one[0].tolist(), latency=10, accuracy=0.8)
    accurate = query(api, key, appID="digits", inputs=one[0].tolist(), accuracy=0.9)
    accurate_with_room = query(api, key, appID="digits", inputs=one.tolist(), latency=50, accuracy=0.9)

    assert tight.json()["variant"] == linear.variant_id
    assert accurate.json()["variant"] == hidden.variant_id
    assert accurate_with_room.json()["variant"] == hidden.variant_id
    np.testing.assert_allclose(
        np.array(accurate.json()["outputs"]), direct_logits(hidden_model(), one), atol=1e-4
    )
    # The hidden model is warm after its first query.
    assert accurate.json()["coldStart"] is True
    assert accurate_with_room.json()["coldStart"] is False


def test_query_naming_the_model(api: Api) -> None:
    key = api.create_app("digits")
    _, hidden = seed_digits(api, "digits")

    body = query(api, key, appID="digits", inputs=images(2).tolist(), modelName="hidden").json()

    assert body["variant"] == hidden.variant_id
    assert body["model"] == "hidden"
    assert len(body["predictions"]) == 2


def test_correlation_id_is_echoed_and_is_the_query_id(api: Api) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")

    response = api.client.post(
        "/v1/online_query",
        json={"appID": "digits", "inputs": images().tolist(), "accuracy": 0.5},
        headers={**key, "X-Correlation-Id": "trace-123"},
    )

    assert response.status_code == 200
    assert response.headers["X-Correlation-Id"] == "trace-123"
    assert response.json()["queryId"] == "trace-123"


def test_correlation_id_is_generated_when_absent_and_echoed_on_errors(api: Api) -> None:
    generated = api.client.get("/health").headers["X-Correlation-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)

    refused = api.client.post(
        "/v1/online_query",
        json={"appID": "x", "inputs": [1.0], "accuracy": 0.5},
        headers={"X-Correlation-Id": "trace-err"},
    )
    assert refused.status_code == 401
    assert refused.headers["X-Correlation-Id"] == "trace-err"


def test_a_query_is_answered_by_its_deadline_whatever_holds_its_thread(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compute behind a query hangs in a call that ignores its timeout: the route answers a
    JSON 503 ``deadline_exceeded`` with ``Retry-After`` at the query's deadline (its budget plus
    the grace, counted from its arrival), not whenever the call returns."""
    monkeypatch.setattr(attempts, "DEADLINE_GRACE_S", 0.5)
    key = api.create_app("digits")
    seed_digits(api, "digits")
    release = threading.Event()
    hung = threading.Event()

    def hang(payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        hung.set()
        release.wait(30)  # ignores timeout_s, as a wedged call would
        raise AssertionError("released after the test")

    monkeypatch.setattr(api.lambda_tier, "invoke", hang)
    try:
        started = time.monotonic()
        response = query(api, key, appID="digits", inputs=images(1).tolist(), latency=100, accuracy=0.8)
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert hung.is_set()
    error = error_of(response, 503)
    assert error["code"] == "deadline_exceeded"
    assert "deadline" in error["message"] and "100 ms budget + 0.5 s grace" in error["message"]
    assert response.headers["Retry-After"] == "1"
    # Due at 0.1 s + 0.5 s after arrival (1 s more for a busy machine's round trip).
    assert 0.6 <= elapsed < 0.6 + 1.0


def test_the_gateway_has_threads_for_queries_held_by_a_hung_worker(api: Api) -> None:
    """A query holds a thread until its deadline: anyio's default of 40 would run out in a second
    of load on a hung worker, and the queries behind them would wait for a thread."""
    with TestClient(create_app(api.services)) as client:
        assert client.portal is not None
        tokens = client.portal.call(lambda: anyio.to_thread.current_default_thread_limiter().total_tokens)
    assert tokens == GATEWAY_THREADS >= 200


# --- online_query: refused inputs -------------------------------------------------------------


def nan_body() -> bytes:
    inputs = np.zeros((1, 8, 8)).tolist()
    inputs[0][3][3] = float("nan")
    return json.dumps({"appID": "digits", "inputs": inputs, "accuracy": 0.5}).encode()


QUERY_REFUSALS: list[tuple[str, dict[str, Any], int, str]] = [
    ("wrong-shape", {"inputs": [[1.0, 2.0, 3.0]], "accuracy": 0.5}, 400, r"takes \[1, 8, 8\]"),
    ("wrong-width", {"inputs": np.zeros((2, 1, 8, 7)).tolist(), "accuracy": 0.5}, 400, "shape"),
    ("strings", {"inputs": [[["a"] * 8] * 8], "accuracy": 0.5}, 400, "numeric"),
    ("null", {"inputs": None, "accuracy": 0.5}, 400, "shape"),
    ("infinity", {"inputs": [[[1e400] * 8] * 8], "accuracy": 0.5}, 400, "NaN or infinity"),
    ("empty-batch", {"inputs": [], "accuracy": 0.5}, 400, "shape"),
    ("batch-over-max", {"inputs": np.zeros((17, 1, 8, 8)).tolist(), "accuracy": 0.5}, 400, "limit of 16"),
    ("unknown-model", {"inputs": images().tolist(), "modelName": "nope"}, 404, "'nope' is not registered"),
    ("bad-model-name", {"inputs": images().tolist(), "modelName": "../x"}, 400, "modelName"),
    ("no-targets", {"inputs": images().tolist()}, 400, "give either modelName"),
    (
        "negative-latency",
        {"inputs": images().tolist(), "latency": -1},
        400,
        r"body\.latency: Input should be greater than 0",
    ),
    (
        "accuracy-over-one",
        {"inputs": images().tolist(), "accuracy": 1.5},
        400,
        r"body\.accuracy: Input should be less than or equal to 1",
    ),
    # Strict types: a JSON boolean or a numeric string is not a number (never coerced to 1.0, 50.0).
    ("latency-true", {"inputs": images().tolist(), "latency": True}, 400, r"body\.latency: .*valid number"),
    ("latency-text", {"inputs": images().tolist(), "latency": "50"}, 400, r"body\.latency: .*valid number"),
    (
        "accuracy-text",
        {"inputs": images().tolist(), "accuracy": "0.9"},
        400,
        r"body\.accuracy: .*valid number",
    ),
    (
        "accuracy-false",
        {"inputs": images().tolist(), "accuracy": False},
        400,
        r"body\.accuracy: .*valid number",
    ),
    (
        "inputs-all-booleans",
        {"inputs": [[[True] * 8] * 8], "accuracy": 0.5},
        400,
        "inputs must be numbers; got a JSON boolean",
    ),
    (
        "inputs-a-boolean-among-numbers",
        {"inputs": [[[1.0] * 7 + [False]] + [[1.0] * 8] * 7], "accuracy": 0.5},
        400,
        "inputs must be numbers; got a JSON boolean",
    ),
    ("inputs-numeric-strings", {"inputs": [[["1"] * 8] * 8], "accuracy": 0.5}, 400, "numeric"),
    # Bounds: finite, and within what a budget can mean (an hour), however large the number.
    (
        "latency-overflowing",
        {"inputs": images().tolist(), "latency": 1e308},
        400,
        r"body\.latency: Input should be less than or equal to 3600000",
    ),
    (
        "latency-huge-integer",
        {"inputs": images().tolist(), "latency": 10**400},
        400,
        r"body\.latency: Input should be a finite number",
    ),
    (
        "accuracy-huge-integer",
        {"inputs": images().tolist(), "accuracy": 10**400},
        400,
        r"body\.accuracy: Input should be a finite number",
    ),
    ("extra-field", {"inputs": images().tolist(), "accuracy": 0.5, "bogus": 1}, 400, "bogus"),
]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [case[1:] for case in QUERY_REFUSALS],
    ids=[case[0] for case in QUERY_REFUSALS],
)
def test_bad_queries_are_refused_and_change_nothing(
    api: Api, body: dict[str, Any], status: int, message: str
) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    before = api.state()

    response = api.client.post(
        "/v1/online_query",
        content=json.dumps({"appID": "digits", **body}).encode(),
        headers={**key, "Content-Type": "application/json"},
    )

    error = error_of(response, status)
    assert re.search(message, error["message"]), error["message"]
    assert api.state() == before  # nothing ran, nothing stored


def test_nan_inputs_are_400(api: Api) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    before = api.state()

    response = api.client.post(
        "/v1/online_query", content=nan_body(), headers={**key, "Content-Type": "application/json"}
    )

    error = error_of(response, 400)
    assert error["code"] == "invalid_input"
    assert "NaN or infinity" in error["message"]
    assert api.state() == before


def test_oversized_query_is_413_before_reading_it(api: Api) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    before = api.state()
    body = json.dumps({"appID": "digits", "inputs": np.zeros((100, 1, 8, 8)).tolist(), "accuracy": 0.5})
    assert len(body) > MAX_QUERY

    response = api.client.post(
        "/v1/online_query", content=body.encode(), headers={**key, "Content-Type": "application/json"}
    )

    error = error_of(response, 413)
    assert error["code"] == "payload_too_large"
    assert f"exceeds the limit of {MAX_QUERY} bytes" in error["message"]
    assert api.state() == before


def test_oversized_chunked_query_is_413(api: Api) -> None:
    key = api.create_app("digits")
    seed_digits(api, "digits")
    body = json.dumps({"appID": "digits", "inputs": np.zeros((100, 1, 8, 8)).tolist(), "accuracy": 0.5})

    response = api.client.post(
        "/v1/online_query",
        content=iter([body.encode()]),  # streamed: Transfer-Encoding: chunked
        headers={**key, "Content-Type": "application/json"},
    )

    assert response.status_code == 413


def test_impossible_targets_are_422_naming_the_closest_variant(api: Api) -> None:
    key = api.create_app("digits")
    _, hidden = seed_digits(api, "digits")
    before = api.state()

    response = query(api, key, appID="digits", inputs=images().tolist(), latency=1, accuracy=0.99)

    error = error_of(response, 422)
    assert error["code"] == "targets_unreachable"
    assert f"closest is {hidden.variant_id}" in error["message"]
    closest = error["details"]["closest"]
    assert closest["variant"] == hidden.variant_id
    assert closest["accuracy"] == 0.93
    assert closest["latency_ms"] == 3.0
    assert closest["cold_latency_ms"] == 23.0
    assert error["details"]["requested"]["accuracy"] == 0.99
    assert "warming" not in error["details"]
    assert api.state() == before


def test_impossible_latency_names_the_fastest_variant(api: Api) -> None:
    key = api.create_app("digits")
    linear, _ = seed_digits(api, "digits")

    response = query(api, key, appID="digits", inputs=images().tolist(), latency=0.5)

    error = error_of(response, 422)
    assert error["details"]["closest"]["variant"] == linear.variant_id


def test_model_still_profiling_is_409_not_ready(api: Api) -> None:
    key = api.create_app("digits")
    seed_model(api, "digits", "linear", linear_model(), accuracy=0.9, p99={1: 1.0}, load_ms=1.0, ready=False)

    error = error_of(query(api, key, appID="digits", inputs=images().tolist(), modelName="linear"), 409)

    assert error["code"] == "not_ready"
    assert api.lambda_tier.calls == []


def test_app_without_models_is_404(api: Api) -> None:
    key = api.create_app("digits")
    error = error_of(query(api, key, appID="digits", inputs=images().tolist(), accuracy=0.5), 404)
    assert "no registered models" in error["message"]


# --- register_model ---------------------------------------------------------------------------


def register(
    api: Api,
    headers: dict[str, str],
    *,
    app_id: str = "digits",
    name: str = "linear",
    model: bytes | None = None,
    valset: bytes | None = None,
) -> Any:
    files = {
        "model": ("model.onnx", linear_model() if model is None else model, "application/octet-stream"),
        "valSet": ("val.npz", valset_npz(50) if valset is None else valset, "application/octet-stream"),
    }
    return api.client.post(
        "/v1/register_model", data={"appID": app_id, "modelName": name}, files=files, headers=headers
    )


def test_register_is_accepted_at_once_with_a_status_url(api: Api) -> None:
    key = api.create_app("digits")

    response = register(api, key)

    assert response.status_code == 202, response.text
    body = response.json()
    assert re.fullmatch(r"[0-9a-f]{32}", body["registrationId"])
    assert body["statusUrl"].endswith(f"/v1/registrations/{body['registrationId']}")
    assert (body["appID"], body["modelName"], body["status"]) == ("digits", "linear", "queued")
    assert len(api.submitted) == 1  # the background job was handed over, not run

    status = api.client.get(body["statusUrl"], headers=key)
    assert status.status_code == 200
    assert status.json()["registrationId"] == body["registrationId"]
    assert status.json()["status"] == "queued"

    [model] = api.store.list_models("digits")
    assert (model.model_name, model.ready, model.input_shape, model.num_classes) == (
        "linear",
        False,
        [1, 8, 8],
        10,
    )
    assert api.repository.get("apps/digits/linear/source.onnx") == linear_model()
    assert api.repository.get("apps/digits/linear/valset.npz") == valset_npz(50)


def flat_model_and_valset() -> tuple[bytes, bytes]:
    """A classifier over flat [64] inputs: a different input contract from the digits models."""
    inputs, labels = digits()
    flat = inputs.reshape(len(inputs), 64)
    model = classifier_onnx(fit_linear(flat[:300], labels[:300]), input_shape=(64,))
    buffer = io.BytesIO()
    np.savez(buffer, inputs=flat[-20:], labels=labels[-20:])
    return model, buffer.getvalue()


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


REGISTER_REFUSALS: list[tuple[str, Callable[[], dict[str, Any]], int, str]] = [
    ("malformed-model", lambda: {"model": b"not an onnx file at all"}, 400, "not a valid ONNX model"),
    ("truncated-model", lambda: {"model": linear_model()[:100]}, 400, "not a valid ONNX model"),
    ("empty-model", lambda: {"model": b""}, 400, "model file is empty"),
    (
        "valset-wrong-shape",
        lambda: {"valset": npz_bytes(inputs=np.zeros((5, 64), np.float32), labels=np.zeros(5, np.int64))},
        400,
        r"the model takes \[N, 1, 8, 8\]",
    ),
    (
        "valset-labels-out-of-range",
        lambda: {"valset": npz_bytes(inputs=np.zeros((2, 1, 8, 8), np.float32), labels=np.array([0, 12]))},
        400,
        r"labels must lie in \[0, 10\)",
    ),
    ("valset-not-npz", lambda: {"valset": b"plain text, no archive"}, 400, "not a readable .npz"),
    ("valset-missing-labels", lambda: {"valset": npz_bytes(inputs=np.zeros((2, 1, 8, 8)))}, 400, "lacks"),
    ("bad-model-name", lambda: {"name": "../../etc"}, 400, "modelName"),
    ("model-file-over-limit", lambda: {"model": b"\x08" * (MAX_MODEL + 1)}, 413, "model file exceeds"),
    ("valset-over-limit", lambda: {"valset": b"\x00" * (MAX_VALSET + 1)}, 413, "validation set exceeds"),
]


@pytest.mark.parametrize(
    ("make_fields", "status", "message"),
    [case[1:] for case in REGISTER_REFUSALS],
    ids=[case[0] for case in REGISTER_REFUSALS],
)
def test_bad_registrations_are_refused_and_change_nothing(
    api: Api, make_fields: Callable[[], dict[str, Any]], status: int, message: str
) -> None:
    key = api.create_app("digits")
    before = api.state()

    response = register(api, key, **make_fields())

    error = error_of(response, status)
    assert re.search(message, error["message"]), error["message"]
    assert api.state() == before


def test_register_without_the_files_is_400(api: Api) -> None:
    key = api.create_app("digits")
    before = api.state()

    response = api.client.post(
        "/v1/register_model", data={"appID": "digits", "modelName": "linear"}, headers=key
    )

    error = error_of(response, 400)
    assert "model" in error["message"] and "valSet" in error["message"]
    assert api.state() == before


def test_oversized_registration_request_is_413_before_reading_it(api: Api) -> None:
    key = api.create_app("digits")
    before = api.state()
    assert len(hidden_model()) > MAX_MODEL + MAX_VALSET + 64 * 1024

    error = error_of(register(api, key, name="hidden", model=hidden_model()), 413)

    assert error["code"] == "payload_too_large"
    assert "request body of" in error["message"]
    assert api.state() == before


def test_duplicate_model_name_is_409_and_changes_nothing(api: Api) -> None:
    key = api.create_app("digits")
    assert register(api, key).status_code == 202
    before = api.state()

    error = error_of(register(api, key, model=linear_model()), 409)

    assert error["code"] == "conflict"
    assert "'linear' is already registered" in error["message"]
    assert api.state() == before


def test_model_with_another_input_shape_than_its_app_is_400(api: Api) -> None:
    key = api.create_app("digits")
    assert register(api, key).status_code == 202
    flat_model, flat_valset = flat_model_and_valset()
    before = api.state()

    error = error_of(register(api, key, name="flat", model=flat_model, valset=flat_valset), 400)

    assert "serves inputs of shape [1, 8, 8]" in error["message"]
    assert api.state() == before


def test_register_without_a_key_is_401(api: Api) -> None:
    api.create_app("digits")
    before = api.state()
    error = error_of(register(api, {}), 401)
    assert "missing API key" in error["message"]
    assert api.state() == before
