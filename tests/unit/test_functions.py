"""The Lambda handlers, invoked in-process with real event shapes (no AWS, no network)."""

from __future__ import annotations

import copy
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from modelless.repository.local import LocalModelRepository
from modelless.runtime import decode_array, encode_array
from modelless.types import VariantProfile
from tests.models import digits, linear_model

EVENTS = Path(__file__).resolve().parents[2] / "events"


class FakeContext:
    function_name = "fn"
    function_version = "$LATEST"
    memory_limit_in_mb = 1769
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:fn"
    aws_request_id = "req-1"
    log_group_name = "/aws/lambda/fn"
    log_stream_name = "stream"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def fresh_import(module: str) -> ModuleType:
    sys.modules.pop(module, None)
    return importlib.import_module(module)


def test_gateway_handler_serves_an_http_api_event(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    gateway = fresh_import("functions.gateway.app")
    event = json.loads((EVENTS / "http_api_health.json").read_text())
    response = gateway.handler(event, FakeContext())
    assert response["statusCode"] == 200
    assert json.loads(response["body"]) == {"status": "ok"}
    assert response["headers"]["x-correlation-id"] == "corr-health-1"


def test_gateway_handler_maps_domain_errors_to_http(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    gateway = fresh_import("functions.gateway.app")
    event = copy.deepcopy(json.loads((EVENTS / "http_api_health.json").read_text()))
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/v1/models"
    response = gateway.handler(event, FakeContext())
    assert response["statusCode"] == 401
    assert "API key" in json.loads(response["body"])["error"]["message"]


def linear_variant() -> VariantProfile:
    return VariantProfile(
        variant_id="app/linear/fp32-all/lambda-cpu",
        app_id="app",
        model_name="linear",
        pool="lambda-cpu",
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key="apps/app/linear/variants/fp32-all.onnx",
        size_bytes=len(linear_model()),
        load_latency_ms=1.0,
        latency_p50_ms={1: 0.01},
        latency_p99_ms={1: 0.02},
        peak_memory_mb=1.0,
        accuracy=0.86,
        price_per_second=1e-5,
        request_price=2e-7,
        hardware="test",
        measured_on_target=True,
    )


def test_cpu_worker_handler_runs_the_variant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    repository = LocalModelRepository(tmp_path / "repo")
    variant = linear_variant()
    repository.put(variant.artifact_key, linear_model())
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    monkeypatch.setenv("MODELLESS_CACHE_DIR", str(tmp_path / "cache"))
    worker = fresh_import("functions.cpu_worker.app")
    images = digits()[0]
    event = {
        "variant_id": variant.variant_id,
        "variant": variant.to_json(),
        "inputs_npy_b64": encode_array(images[:4]),
        "correlation_id": "corr-1",
    }
    first = worker.handler(event, FakeContext())
    second = worker.handler(event, FakeContext())
    assert first["statusCode"] == 200
    assert first["load_ms"] > 0  # loaded once per container...
    assert second["load_ms"] == 0  # ...and reused while warm
    outputs = decode_array(first["outputs_npy_b64"])
    assert outputs.shape == (4, 10)
    assert np.array_equal(outputs, decode_array(second["outputs_npy_b64"]))


def test_cpu_worker_handler_refuses_garbage_with_a_4xx(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    worker = fresh_import("functions.cpu_worker.app")
    event = {"variant_id": "x", "variant": linear_variant().to_json(), "inputs_npy_b64": "not base64!"}
    reply = worker.handler(event, FakeContext())
    assert reply["statusCode"] == 400
    assert "npy" in reply["error"]["message"]
