"""The dashboard: its page, and the state document the page polls (shape, and who sees what).
The page in a real browser: tests/e2e/test_dashboard.py."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from modelless.api.routers.dashboard import FINISHED_JOB_SHOWN_S
from modelless.metadata.base import LOAD_RETENTION_S
from modelless.query_load import QueryGroup
from modelless.scaling.controller import ScalingReport, record_plan
from modelless.scaling.problem import PlanStatus, ScalingPlan
from modelless.types import InstanceState, InstanceStats, JobStatus, OfflineJob, WorkerState
from modelless.worker.reporting import INTERNAL_STATE_PATH
from tests.unit.test_api import ADMIN, Api, error_of, seed_digits
from tests.unit.test_api import api as api

STATE = "/v1/dashboard/state"


def report_worker(api: Api, worker_id: str, *variant_ids: str) -> None:
    instances = tuple(
        InstanceStats(
            v, InstanceState.ACTIVE, qps=2.0, latency_p50_ms=1.0, latency_p99_ms=2.5, queue_length=0
        )
        for v in variant_ids
    )
    state = WorkerState(
        worker_id, "cpu", f"http://{worker_id}", 0.25, 1, reported_at=time.time(), instances=instances
    )
    assert api.client.post(INTERNAL_STATE_PATH, content=state.to_json(), headers=ADMIN).status_code == 204


def record_a_plan(
    api: Api, instances: dict[tuple[str, str], int], lambda_qps: dict[str, float], at: float
) -> None:
    plan = ScalingPlan(
        instances=instances,
        workers={"cpu": 2},
        lambda_qps=lambda_qps,
        served={},
        cost_per_second=0.0001,
        objective=0.0001,
        solver="milp",
        status=PlanStatus.OPTIMAL,
        solve_seconds=0.012,
    )
    record_plan(api.store, ScalingReport(plan, load_qps={}, workers={"cpu": 2}, held={}), at)


def add_job(api: Api, job_id: str, app_id: str, status: JobStatus, finished_at: float | None = None) -> None:
    job = OfflineJob(
        job_id, app_id, "s3://in/x/", "s3://out/x/", status=status, created_at=time.time() - 30,
        total=10, finished_at=finished_at,
    )  # fmt: skip
    assert api.store.create_job(job)


def seed_deployment(api: Api) -> tuple[dict[str, str], float]:
    """Two apps with models, a worker running an instance of each, a plan, load and jobs."""
    key = api.create_app("digits")
    api.create_app("other")
    linear, _ = seed_digits(api, "digits")
    foreign, _ = seed_digits(api, "other")
    report_worker(api, "w-both", linear.variant_id, foreign.variant_id)
    report_worker(api, "w-other", foreign.variant_id)
    now = time.time()
    digits_group = QueryGroup("digits", "linear", 0.8, 50.0).key
    other_group = QueryGroup("other", None, 0.9, 100.0).key
    record_a_plan(
        api,
        {(linear.variant_id, "cpu"): 2, (foreign.variant_id, "cpu"): 1},
        {digits_group: 1.5, other_group: 4.0},
        at=now - 5,
    )
    for ago in (2, 3, 10):
        api.store.add_load({digits_group: 4, other_group: 1}, int(now) - ago)
    add_job(api, "job-running", "digits", JobStatus.RUNNING)
    add_job(api, "job-just-done", "digits", JobStatus.COMPLETED, finished_at=now - 60)
    add_job(api, "job-long-done", "digits", JobStatus.COMPLETED, finished_at=now - FINISHED_JOB_SHOWN_S - 60)
    add_job(api, "job-of-other", "other", JobStatus.QUEUED)
    return key, now


def test_the_page_is_one_self_contained_file_served_without_a_key(api: Api) -> None:
    response = api.client.get("/dashboard")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "v1/dashboard/state" in page
    # Nothing from elsewhere: no script, style or image from another origin (the page runs offline).
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    for section in ("models-table", "scatter", "workers-table", "plan-cost", "load-charts", "jobs-table"):
        assert f'id="{section}"' in page


def test_the_state_needs_a_key(api: Api) -> None:
    assert error_of(api.client.get(STATE), 401)["code"] == "unauthorized"
    assert (
        error_of(api.client.get(STATE, headers={"X-Api-Key": "mlk_unknown"}), 401)["code"] == "unauthorized"
    )


def test_the_admin_sees_every_app_worker_plan_load_and_recent_job(api: Api) -> None:
    _, now = seed_deployment(api)

    state = api.client.get(STATE, headers=ADMIN).json()

    assert state["scope"] == {"admin": True, "appID": None}
    assert [app["appID"] for app in state["apps"]] == ["digits", "other"]
    models = {m["modelName"]: m for m in state["apps"][0]["models"]}
    assert set(models) == {"linear", "hidden"}
    (linear,) = models["linear"]["variants"]
    assert models["linear"]["ready"] and models["linear"]["registration"]["status"] == "ready"
    assert (linear["accuracy"], linear["latencyP99Ms"], linear["latencyP50Ms"]) == (0.865, 1.0, 0.5)
    assert set(linear) >= {"variantId", "pool", "precision", "loadLatencyMs", "pricePerHour", "imported"}

    workers = {w["workerId"]: w for w in state["workers"]}
    assert set(workers) == {"w-both", "w-other"}
    assert workers["w-both"]["address"] == "http://w-both"
    assert [i["state"] for i in workers["w-both"]["instances"]] == ["active", "active"]
    assert workers["w-both"]["instances"][0]["latencyP99Ms"] == 2.5

    plan = state["plan"]
    assert plan["costPerHour"] == 0.36 and plan["workers"] == {"cpu": 2}
    assert (plan["solver"], plan["status"]) == ("milp", "optimal")
    assert 5 <= plan["ageS"] < 60
    assert sorted((i["variant"], i["count"]) for i in plan["instances"]) == [
        ("digits/linear/fp32-all/lambda-cpu", 2),
        ("other/linear/fp32-all/lambda-cpu", 1),
    ]
    assert sum(plan["lambdaQps"].values()) == 5.5

    load = state["load"]
    assert load["windowS"] == LOAD_RETENTION_S and int(now) - 1 <= load["endsAt"] <= int(time.time()) - 1
    series = {(s["appID"], s["modelName"]): s["qps"] for s in load["series"]}
    assert set(series) == {("digits", "linear"), ("other", "*")}
    digits_load = series[("digits", "linear")]
    assert len(digits_load) == LOAD_RETENTION_S
    # Oldest first, the last entry being endsAt's second (the request's clock is a little later).
    seeded = {LOAD_RETENTION_S - 1 - (load["endsAt"] - (int(now) - ago)) for ago in (2, 3, 10)}
    assert {i for i, count in enumerate(digits_load) if count} == seeded
    assert {digits_load[i] for i in seeded} == {4}

    assert state["offlineEnabled"] is True
    jobs = {j["jobId"]: j for j in state["jobs"]}
    assert set(jobs) == {"job-running", "job-just-done", "job-of-other"}  # long finished: gone
    assert (jobs["job-running"]["status"], jobs["job-running"]["total"]) == ("running", 10)
    json.dumps(state, allow_nan=False)  # plain JSON, as the page parses it


def test_an_app_key_sees_its_own_app_only_and_no_deployment_cost(api: Api) -> None:
    key, _ = seed_deployment(api)

    state = api.client.get(STATE, headers=key).json()

    assert state["scope"] == {"admin": False, "appID": "digits"}
    assert [app["appID"] for app in state["apps"]] == ["digits"]
    (worker,) = state["workers"]  # w-other runs nothing of this app's
    assert worker["workerId"] == "w-both" and worker["address"] is None
    assert [i["variantId"] for i in worker["instances"]] == ["digits/linear/fp32-all/lambda-cpu"]
    plan = state["plan"]
    assert "costPerHour" not in plan and "workers" not in plan
    assert [i["variant"] for i in plan["instances"]] == ["digits/linear/fp32-all/lambda-cpu"]
    assert list(plan["lambdaQps"].values()) == [1.5]
    assert [s["appID"] for s in state["load"]["series"]] == ["digits"]
    assert {j["appID"] for j in state["jobs"]} == {"digits"}


def test_before_the_scalers_first_tick_there_is_no_plan(api: Api) -> None:
    state: dict[str, Any] = api.client.get(STATE, headers=ADMIN).json()

    assert state["plan"] is None
    assert state["apps"] == [] and state["workers"] == [] and state["jobs"] == []
    assert state["load"]["series"] == []
