"""The Lambda handlers, invoked in-process with real event shapes (no AWS, no network)."""

from __future__ import annotations

import copy
import importlib
import json
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from modelless.query_load import QueryGroup
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import PROTOCOL_VERSION, Invocation, Reply
from modelless.serving.wire import to_json_message
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
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
    event = to_json_message(Invocation(variant, images[:4], "corr-1").to_message())
    first = worker.handler(event, FakeContext())
    second = worker.handler(event, FakeContext())
    assert first["statusCode"] == second["statusCode"] == 200
    first_reply, second_reply = Reply.from_message(first), Reply.from_message(second)
    assert first_reply.load_ms > 0  # loaded once per container...
    assert second_reply.load_ms == 0  # ...and reused while warm
    outputs = first_reply.outputs
    assert outputs.shape == (4, 10)
    assert np.array_equal(outputs, second_reply.outputs)


def test_cpu_worker_handler_refuses_garbage_with_a_4xx(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    worker = fresh_import("functions.cpu_worker.app")
    event = {
        "version": PROTOCOL_VERSION,
        "variant_id": "x",
        "variant": linear_variant().to_json(),
        "inputs_npy_b64": "not base64!",
    }
    reply = worker.handler(event, FakeContext())
    assert reply["statusCode"] == 400
    assert "npy" in reply["error"]["message"]


def test_cpu_worker_handler_refuses_an_event_of_another_protocol_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", str(tmp_path / "repo"))
    worker = fresh_import("functions.cpu_worker.app")
    event = to_json_message(Invocation(linear_variant(), digits()[0][:1], "corr-old").to_message())
    for version in (None, PROTOCOL_VERSION + 1):
        if version is None:
            del event["version"]  # a gateway from before versions
        else:
            event["version"] = version
        reply = worker.handler(event, FakeContext())
        assert reply["statusCode"] == 502
        assert reply["error"]["code"] == "protocol_mismatch"


# --- the scaler: its ticks within a scheduled invocation ----------------------------------------


class ScalerClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ScalerContext(FakeContext):
    """The context of an invocation with a 70 s timeout (template.yaml), on the fake clock."""

    def __init__(self, clock: ScalerClock) -> None:
        self._clock = clock
        self._deadline = clock.now + 70.0

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - self._clock.now) * 1000)


def scaler_function(monkeypatch: pytest.MonkeyPatch, period: str) -> ModuleType:
    monkeypatch.setenv("MODELLESS_METADATA_URL", "memory://")
    monkeypatch.setenv("MODELLESS_POOL_GROUPS", "{}")
    monkeypatch.setenv("MODELLESS_MAX_WORKERS", "{}")  # no pool to manage: no AWS call
    monkeypatch.setenv("MODELLESS_SCALER_PERIOD_S", period)
    return fresh_import("functions.scaler.app")


def scheduled_invocation() -> tuple[dict[str, Any], float, ScalerClock]:
    """EventBridge's scheduled event, when it was scheduled, and a clock 0.4 s after that."""
    event: dict[str, Any] = json.loads((EVENTS / "scheduled.json").read_text())
    scheduled = datetime.fromisoformat(event["time"]).timestamp()
    return event, scheduled, ScalerClock(scheduled + 0.4)


def test_scaler_handler_ticks_every_period_within_its_scheduled_minute(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelless.scaling.ticks import ScheduledTicks

    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    function = scaler_function(monkeypatch, "15")
    scaler = function.scaler  # the container's: its store, its ticks
    event, scheduled, clock = scheduled_invocation()
    ticked: list[float] = []

    def tick(now: float) -> dict[str, Any]:
        ticked.append(now)
        summary: dict[str, Any] = scaler.scaling_tick(now)
        return summary

    # Load a Lambda variant serves (no pool is managed here): every tick's plan leaves it there.
    variant = linear_variant()
    record = ModelRecord("app", "linear", "input", [64], "float32", 10, "reg", "src", True)
    registration = Registration("reg", "app", "linear", RegistrationStatus.READY)
    scaler.store.add_model(record, registration)
    scaler.store.publish_variants(record, [variant], registration)
    group = QueryGroup("app", None, 0.8, 50.0)
    for second in range(int(scheduled) - 30, int(scheduled) + 60):
        scaler.store.add_load({group.key: 40}, second)
    # The handler's own loop, on the fake clock: its period is the environment's.
    assert scaler.ticks.period_s == 15.0
    monkeypatch.setattr(
        scaler, "ticks", ScheduledTicks(tick, scaler.store, period_s=15.0, clock=clock, sleep=clock.sleep)
    )
    capsys.readouterr()

    summary = function.handler(event, ScalerContext(clock))

    assert ticked == [scheduled + 0.4, scheduled + 15, scheduled + 30, scheduled + 45]
    assert summary["ticks"] == 4 and summary["failed"] == summary["skipped"] == 0
    assert summary["stopped"] == "the next invocation is due" and summary["period_s"] == 15.0
    assert summary["status"] == "optimal"  # the last tick's plan
    assert summary["lambda_qps"] == {group.key: pytest.approx(48.0)}  # the load and its 20 % slack
    assert scaler.store.scaler_lease_holder() is None
    # One EMF record for the invocation, holding every tick's figures.
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "ScalingTicks" in line]
    assert len(emf) == 1
    assert emf[0]["ScalingTicks"] == [4.0] and emf[0]["ScalingTicksFailed"] == [0.0]
    assert emf[0]["LambdaTierQps"] == [pytest.approx(48.0)] * 4
    assert len(emf[0]["SolveTime"]) == len(emf[0]["PlanCostPerHour"]) == 4


class SettlingWarmPool:
    """The warm pool's ``settle``, recorded: how long the handler let its rounds finish."""

    def __init__(self, clock: ScalerClock, unanswered: int) -> None:
        self.clock, self.unanswered = clock, unanswered
        self.waited: list[tuple[float, float]] = []  # (when, timeout)

    def settle(self, timeout_s: float) -> int:
        self.waited.append((self.clock.now, timeout_s))
        return self.unanswered


def test_scaler_handler_lets_the_warm_pools_rounds_finish_before_lambda_freezes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modelless.entrypoints.scaler import SETTLE_MARGIN_S
    from modelless.scaling.ticks import ScheduledTicks

    function = scaler_function(monkeypatch, "30")
    scaler = function.scaler
    event, _, clock = scheduled_invocation()
    ticked: list[float] = []

    def tick(now: float) -> dict[str, Any]:
        ticked.append(now)
        return {}

    warm_pool = SettlingWarmPool(clock, unanswered=1)
    monkeypatch.setattr(scaler, "warm_pool", warm_pool)
    monkeypatch.setattr(
        scaler, "ticks", ScheduledTicks(tick, scaler.store, period_s=30.0, clock=clock, sleep=clock.sleep)
    )
    context = ScalerContext(clock)

    summary = function.handler(event, context)

    assert len(ticked) == 2
    # Once, after the last tick, with what the invocation has left less the margin for returning.
    ((when, timeout),) = warm_pool.waited
    assert when == clock.now >= ticked[-1]
    assert timeout == pytest.approx(context.get_remaining_time_in_millis() / 1000 - SETTLE_MARGIN_S, abs=1e-3)
    assert summary["warm_rounds_unsettled"] == 1


@pytest.mark.parametrize(
    ("period", "message"),
    [("soon", "MODELLESS_SCALER_PERIOD_S must be a number of seconds"), ("90", "at most 60 s")],
)
def test_scaler_function_refuses_a_bad_period(
    monkeypatch: pytest.MonkeyPatch, period: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        scaler_function(monkeypatch, period)


# --- what each function imports ----------------------------------------------------------------

# Packages a function's Lambda package does not hold, or that it must not pay for at its cold start
# (its lambda-NAME extra in pyproject.toml and the layer say what it holds).
NOT_IMPORTED = {
    "cpu_worker": {"fastapi", "mangum", "scipy", "onnxruntime", "redis", "httpx", "boto3", "variants", "PIL"},
    "gateway": {"scipy", "onnxruntime", "PIL"},
    "offline": {"fastapi", "mangum", "scipy", "onnxruntime", "variants"},
    "registrar": {"fastapi", "mangum", "scipy", "onnxruntime", "PIL"},
    "scaler": {"fastapi", "mangum", "onnxruntime", "onnx", "variants", "PIL"},
}
IMPORTED_PACKAGES = """
import json, sys
import functions.{name}.app
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""


@pytest.mark.parametrize("name", sorted(NOT_IMPORTED))
def test_a_function_imports_only_what_its_package_holds(name: str, tmp_path: Path) -> None:
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELLESS_")}
    env |= {
        "MODELLESS_METADATA_URL": "memory://",
        "MODELLESS_REPOSITORY_URL": str(tmp_path / "repo"),
        "MODELLESS_MAX_WORKERS": "{}",
        "PYTHONPATH": str(root),
    }
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_PACKAGES.format(name=name)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout.splitlines()[-1]))
    assert "modelless" in imported
    assert imported & NOT_IMPORTED[name] == set()
