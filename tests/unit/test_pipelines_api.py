"""Pipelines over the API in-process (the API's real services, an in-memory store, the real
runtime on the in-process Lambda tier): registered only when valid and over the app's models,
queried stage by stage with each stage's variant, tier, budget and timings in the reply, branches
taken by their conditions and counted; refused clearly (and changing nothing) when malformed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from modelless import cli
from modelless.client import Client, ModellessClientError
from tests.models import classifier_onnx, hidden_model, linear_model
from tests.unit.test_api import Api, direct_logits, error_of, images, seed_digits, seed_model
from tests.unit.test_api import api as api

APP = "pipes"


def sequential(**overrides: Any) -> dict[str, Any]:
    return {
        "appID": APP,
        "name": "both",
        "stages": [{"name": "first", "model": "linear"}, {"name": "second", "model": "hidden"}],
        "edges": [{"source": "first", "target": "second"}],
        "latencySlo": 500.0,
        **overrides,
    }


def cascade(threshold: float, **overrides: Any) -> dict[str, Any]:
    """A cheap model that calls an expensive one when its confidence is below ``threshold``."""
    edge = {
        "source": "cheap",
        "target": "expensive",
        "when": {"kind": "confidence_below", "threshold": threshold},
    }
    stages = [{"name": "cheap", "model": "linear"}, {"name": "expensive", "model": "hidden"}]
    return sequential(**{"name": "cascade", "stages": stages, "edges": [edge], **overrides})


@pytest.fixture
def app(api: Api) -> dict[str, str]:
    headers = api.create_app(APP)
    seed_digits(api, APP)
    return headers


def register(api: Api, headers: dict[str, str], body: dict[str, Any]) -> Any:
    return api.client.post("/v1/pipelines", json=body, headers=headers)


def run(api: Api, headers: dict[str, str], name: str, inputs: np.ndarray) -> dict[str, Any]:
    response = api.client.post(
        f"/v1/pipelines/{name}/query", json={"appID": APP, "inputs": inputs.tolist()}, headers=headers
    )
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def test_a_sequential_pipeline_runs_every_stage_and_answers_with_the_last(
    api: Api, app: dict[str, str]
) -> None:
    registered = register(api, app, sequential())
    assert registered.status_code == 201, registered.text
    assert registered.json()["order"] == ["first", "second"]
    assert registered.json()["branchProbabilities"] == {"first->second": None}

    rows = images(3)
    reply = run(api, app, "both", rows)

    assert [s["stage"] for s in reply["stages"]] == ["first", "second"]
    assert all(s["ran"] for s in reply["stages"])
    first, second = reply["stages"]
    assert first["variant"].startswith(f"{APP}/linear/") and second["variant"].startswith(f"{APP}/hidden/")
    assert {first["tier"], second["tier"]} == {"lambda"}
    # The first stage's budget leaves the second stage its expected latency.
    assert first["budgetMs"] <= 500.0 - second["expectedLatencyMs"] + 1e-6
    assert second["startedMs"] >= first["startedMs"] + first["timingsMs"]["inference_ms"]
    expected = direct_logits(hidden_model(), rows).argmax(axis=1).tolist()
    assert reply["answeredBy"] == "second" and reply["predictions"] == expected
    assert first["predictions"] == direct_logits(linear_model(), rows).argmax(axis=1).tolist()
    assert reply["totalMs"] >= second["timingsMs"]["total_ms"] and reply["metSlo"] is (
        reply["totalMs"] <= 500.0
    )
    shown = api.client.get("/v1/pipelines/both", params={"appID": APP}, headers=app).json()
    assert shown["branchProbabilities"] == {"first->second": 1.0}


def test_a_conditional_branch_runs_only_when_its_condition_holds_and_is_counted(
    api: Api, app: dict[str, str]
) -> None:
    assert register(api, app, cascade(1.0)).status_code == 201  # never sure enough: always escalates
    assert register(api, app, cascade(1e-6, name="never")).status_code == 201  # always sure enough

    escalated = run(api, app, "cascade", images(1))
    kept = run(api, app, "never", images(1))

    assert [s["ran"] for s in escalated["stages"]] == [True, True] and escalated["answeredBy"] == "expensive"
    assert [s["ran"] for s in kept["stages"]] == [True, False] and kept["answeredBy"] == "cheap"
    assert kept["stages"][1]["skippedBecause"] == "no incoming edge's condition held"
    assert kept["stages"][1]["variant"] is None
    assert kept["predictions"] == kept["stages"][0]["predictions"]
    listed = api.client.get("/v1/pipelines", params={"appID": APP}, headers=app).json()["pipelines"]
    assert {p["pipeline"]["name"]: p["branchProbabilities"] for p in listed} == {
        "cascade": {"cheap->expensive": 1.0},
        "never": {"cheap->expensive": 0.0},
    }


def test_a_fan_out_runs_both_branches_and_a_stage_can_take_its_predecessors_outputs(
    api: Api, app: dict[str, str]
) -> None:
    # A "refiner" over the first stage's 10 class scores (the identity: it answers as its input).
    identity = classifier_onnx(
        [np.eye(10, dtype=np.float32), np.zeros(10, dtype=np.float32)], input_shape=(10,)
    )
    seed_model(api, APP, "refiner", identity, accuracy=0.865, p99={1: 1.0, 16: 2.0}, load_ms=1.0)
    body = sequential(
        name="fan",
        stages=[
            {"name": "first", "model": "linear"},
            {"name": "refine", "model": "refiner", "input": "first"},
            {"name": "other", "model": "hidden"},
        ],
        edges=[{"source": "first", "target": "refine"}, {"source": "first", "target": "other"}],
    )
    assert register(api, app, body).status_code == 201

    reply = run(api, app, "fan", images(2))

    stages = {s["stage"]: s for s in reply["stages"]}
    assert all(s["ran"] for s in stages.values())
    assert stages["refine"]["predictions"] == stages["first"]["predictions"]
    assert reply["answeredBy"] in {"refine", "other"}


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (
            sequential(stages=[{"name": "first", "model": "linear"}, {"name": "second", "model": "nope"}]),
            400,
            "not registered",
        ),
        (sequential(edges=[]), 400, "exactly one entry"),
        (
            sequential(
                edges=[{"source": "first", "target": "second"}, {"source": "second", "target": "first"}]
            ),
            400,
            "entry",
        ),
        (sequential(latencySlo=0), 400, ""),
        (sequential(name="bad name"), 400, "not valid"),
        (sequential(extra=1), 400, ""),
    ],
    ids=["unknown-model", "two-entries", "cycle", "zero-slo", "bad-name", "extra-field"],
)
def test_an_invalid_pipeline_is_a_clear_4xx_and_stores_nothing(
    api: Api, app: dict[str, str], body: dict[str, Any], status: int, fragment: str
) -> None:
    error = error_of(register(api, app, body), status)
    assert fragment in error["message"]
    assert api.client.get("/v1/pipelines", params={"appID": APP}, headers=app).json()["pipelines"] == []


def test_names_are_unique_per_app_and_a_deleted_pipeline_is_gone(api: Api, app: dict[str, str]) -> None:
    assert register(api, app, sequential()).status_code == 201
    assert error_of(register(api, app, sequential(latencySlo=50.0)), 409)["code"] == "conflict"
    assert (
        api.client.get("/v1/pipelines/both", params={"appID": APP}, headers=app).json()["pipeline"][
            "latencySlo"
        ]
        == 500.0
    )

    assert api.client.delete("/v1/pipelines/both", params={"appID": APP}, headers=app).status_code == 204

    for response in (
        api.client.get("/v1/pipelines/both", params={"appID": APP}, headers=app),
        api.client.delete("/v1/pipelines/both", params={"appID": APP}, headers=app),
        api.client.post(
            "/v1/pipelines/both/query", json={"appID": APP, "inputs": images(1).tolist()}, headers=app
        ),
    ):
        error_of(response, 404)


def test_a_pipeline_is_its_apps_own_and_bad_inputs_are_refused(api: Api, app: dict[str, str]) -> None:
    assert register(api, app, sequential()).status_code == 201
    other = api.create_app("other")
    lambda_calls = list(api.lambda_tier.calls)

    assert register(api, other, sequential()).status_code == 403
    assert api.client.get("/v1/pipelines/both", params={"appID": APP}, headers=other).status_code == 403
    error_of(api.client.get("/v1/pipelines/both", params={"appID": "other"}, headers=other), 404)
    bad = api.client.post(
        "/v1/pipelines/both/query", json={"appID": APP, "inputs": [[1.0, 2.0]]}, headers=app
    )
    error_of(bad, 400)
    extra = api.client.post(
        "/v1/pipelines/both/query", json={"appID": APP, "inputs": images(1).tolist(), "x": 1}, headers=app
    )
    error_of(extra, 400)
    assert api.lambda_tier.calls == lambda_calls  # no stage ran


def _stage_accuracy(value: object) -> dict[str, Any]:
    stages = [{"name": "first", "model": "linear", "accuracy": value}, {"name": "second", "model": "hidden"}]
    return sequential(stages=stages)


# Issue 33: the spec took what the rest of the API refuses (a boolean SLO was stored as 1 ms).
COERCIONS = [
    ("slo-true", sequential(latencySlo=True), "latencySlo"),
    ("slo-text", sequential(latencySlo="500"), "latencySlo"),
    ("slo-nan", sequential(latencySlo=float("nan")), "latencySlo"),
    ("accuracy-true", sequential(accuracy=True), "accuracy"),
    ("accuracy-text", sequential(accuracy="0.5"), "accuracy"),
    ("stage-accuracy-false", _stage_accuracy(False), "stages.0.accuracy"),
    ("stage-accuracy-text", _stage_accuracy("0.9"), "stages.0.accuracy"),
    ("threshold-true", cascade(True), "edges.0.when.threshold"),  # type: ignore[arg-type]
    ("threshold-text", cascade("0.5"), "edges.0.when.threshold"),  # type: ignore[arg-type]
    (
        "class-true",
        sequential(
            edges=[
                {"source": "first", "target": "second", "when": {"kind": "predicted_in", "classes": [True]}}
            ]
        ),
        "classes",
    ),
]


@pytest.mark.parametrize(
    ("body", "field"), [case[1:] for case in COERCIONS], ids=[case[0] for case in COERCIONS]
)
def test_a_pipeline_spec_takes_numbers_only_as_json_numbers(
    api: Api, app: dict[str, str], body: dict[str, Any], field: str
) -> None:
    response = api.client.post(
        "/v1/pipelines",
        content=json.dumps(body, allow_nan=True),
        headers={**app, "Content-Type": "application/json"},
    )
    error = error_of(response, 400)
    assert field in error["message"], error["message"]
    assert api.client.get("/v1/pipelines", params={"appID": APP}, headers=app).json()["pipelines"] == []


def test_the_client_and_the_cli_register_list_and_query_pipelines(
    api: Api,
    app: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def client_of(_: Any = None) -> Client:
        client = Client("http://test", api_key=app["X-Api-Key"])
        client._http = TestClient(api.client.app)  # type: ignore[assignment]  # a CLI call closes it
        return client

    client = client_of()
    spec = {k: v for k, v in cascade(1.0).items() if k != "appID"}
    assert client.register_pipeline(spec, APP)["order"] == ["cheap", "expensive"]
    reply = client.query_pipeline("cascade", images(1), APP)
    assert reply["answeredBy"] == "expensive"
    with pytest.raises(ModellessClientError) as refused:
        client.register_pipeline(spec, APP)
    assert refused.value.status == 409

    monkeypatch.setattr(cli, "_client", client_of)
    spec_file = tmp_path / "both.json"
    spec_file.write_text(json.dumps({k: v for k, v in sequential().items() if k != "appID"}))
    cli.main(["pipelines", "register", "--app", APP, str(spec_file)])
    assert "pipeline both registered: first -> second" in capsys.readouterr().out
    cli.main(["pipelines", "list", "--app", APP])
    listed = capsys.readouterr().out
    assert "both" in listed and "cascade" in listed
    inputs = tmp_path / "inputs.npy"
    np.save(inputs, images(1))
    cli.main(["pipelines", "query", "--app", APP, "both", "--inputs", str(inputs)])
    printed = capsys.readouterr().out
    assert "answered by second" in printed and "SLO 500.0 ms" in printed
    cli.main(["pipelines", "delete", "--app", APP, "both"])
    assert [p["pipeline"]["name"] for p in client.pipelines(APP)] == ["cascade"]


def test_the_plan_is_explained_over_the_apps_profiles(
    api: Api, app: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert register(api, app, cascade(1.0)).status_code == 201
    run(api, app, "cascade", images(1))  # measures the branch: taken

    def plan(**params: Any) -> Any:
        return api.client.get("/v1/pipelines/cascade/plan", params={"appID": APP, **params}, headers=app)

    # The seeded variants are Lambda's only: provisioned, nothing can serve; with Lambda, all.
    provisioned = plan(qps=10).json()
    with_lambda = plan(qps=10, lambdaAllowed=True).json()

    assert provisioned["feasible"] is False
    assert [s["unmet_qps"] for s in provisioned["stages"]] == [10.0, 10.0]  # the branch measured at 1
    assert with_lambda["feasible"] is True
    assert [s["lambda_qps"] for s in with_lambda["stages"]] == [10.0, 10.0]
    assert with_lambda["critical_path_ms"] <= 500.0 and "latency splits" in with_lambda["explanation"][0]
    # A feasible plan's budgets guide the gateway's queries: each stage leaves the later ones
    # their planned share.
    planned = {s["stage"]: s["budget_ms"] for s in with_lambda["stages"]}
    guided = run(api, app, "cascade", images(1))
    assert {s["stage"]: s["expectedLatencyMs"] for s in guided["stages"]} == planned
    assert guided["stages"][0]["budgetMs"] <= 500.0 - planned["expensive"] + 1e-6
    for params in ({"qps": 0}, {"qps": -1}, {"qps": "many"}, {}):
        error_of(plan(**params), 400)
    error_of(api.client.get("/v1/pipelines/none/plan", params={"appID": APP, "qps": 1}, headers=app), 404)

    def client_of(_: Any = None) -> Client:
        client = Client("http://test", api_key=app["X-Api-Key"])
        client._http = TestClient(api.client.app)  # type: ignore[assignment]  # a CLI call closes it
        return client

    monkeypatch.setattr(cli, "_client", client_of)
    cli.main(["pipelines", "plan", "--app", APP, "cascade", "--qps", "10"])
    assert "NOT FEASIBLE" in capsys.readouterr().out
    cli.main(["pipelines", "plan", "--app", APP, "cascade", "--qps", "10", "--lambda-allowed"])
    printed = capsys.readouterr().out
    assert "stage cheap (linear)" in printed and "NOT FEASIBLE" not in printed


def test_without_the_solver_the_plan_is_a_clear_501_and_queries_still_run(
    api: Api, app: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The AWS gateway's package carries no scipy: asking it for a plan says why, nothing else
    breaks."""
    import sys

    assert register(api, app, cascade(1.0)).status_code == 201
    # A None entry makes the import fail as it does where the module's dependencies are absent.
    monkeypatch.setitem(sys.modules, "modelless.pipelines.planner", None)
    answer = api.client.get("/v1/pipelines/cascade/plan", params={"appID": APP, "qps": 1}, headers=app)
    body = error_of(answer, 501)
    assert "scipy" in json.dumps(body)
    assert run(api, app, "cascade", images(1))["stages"]
