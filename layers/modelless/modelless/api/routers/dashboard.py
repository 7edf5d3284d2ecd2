"""The live dashboard: one HTML page (``GET /dashboard``) and the document it polls
(``GET /v1/dashboard/state``): models and variants, workers and their instances, the scaler's
last plan and its cost, query load over time and offline jobs.

The page is static and holds no data: it asks for the key in the page (or ``#key=`` in its URL,
which never reaches a server) and sends it as every API call does. The admin key sees the whole
deployment. An app's key sees its own app: its models, jobs and load, the workers that run its
instances (those instances only, no addresses, as ``GET /v1/workers`` shows them) and its part
of the plan, without the deployment's cost.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from modelless.api.dependencies import KeyDep, ServicesDep
from modelless.api.openapi import AUTHENTICATED, error_responses
from modelless.api.routers.operations import app_view, is_admin
from modelless.api.services import Services
from modelless.metadata.base import LOAD_RETENTION_S
from modelless.offline.views import JobView
from modelless.query_load import QueryGroup
from modelless.types import ModelRecord, VariantProfile, WorkerState

router = APIRouter(tags=["operations"])

# A finished job stays on the dashboard this long (its final count shown), then leaves it.
FINISHED_JOB_SHOWN_S = 600.0


@cache
def dashboard_html() -> str:
    """The page, shipped as package data beside the API (pyproject.toml: package-data)."""
    return resources.files("modelless.api").joinpath("static/dashboard.html").read_text(encoding="utf-8")


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> HTMLResponse:
    # No key needed for the page itself: it holds no data, only the code that asks for it.
    return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})


@router.get("/v1/dashboard/state", responses=error_responses(*AUTHENTICATED))
def dashboard_state(services: ServicesDep, key: KeyDep) -> dict[str, Any]:
    """Everything the dashboard shows, in one document (see the module docstring for who sees
    what). ``load.series`` holds each app's and model's queries per second over the last
    ``load.windowS`` seconds, oldest first; ``plan`` is null until the scaler's first tick."""
    now = time.time()
    admin = is_admin(services, key)
    app_id = None if admin else services.keys.app_for_key(key)
    apps = services.store.list_apps() if app_id is None else [app_id]
    return {
        "generatedAt": now,
        "scope": {"admin": admin, "appID": app_id},
        "apps": [{"appID": app, "models": _models(services, app)} for app in apps],
        "workers": _workers(services, app_id, now),
        "plan": _plan(services, app_id, now),
        "load": _load(services, app_id, now),
        "offlineEnabled": services.offline is not None,
        "jobs": _jobs(services, apps, now),
    }


def _models(services: Services, app_id: str) -> list[dict[str, Any]]:
    store = services.store
    variants: dict[str, list[VariantProfile]] = defaultdict(list)
    for variant in store.list_variants(app_id):
        variants[variant.model_name].append(variant)
    return [
        _model(services, model, variants.get(model.model_name, [])) for model in store.list_models(app_id)
    ]


def _model(services: Services, model: ModelRecord, variants: list[VariantProfile]) -> dict[str, Any]:
    registration = services.store.get_registration(model.registration_id)
    return {
        "modelName": model.model_name,
        "ready": model.ready,
        "referenceAccuracy": model.reference_accuracy,
        "registration": None
        if registration is None
        else {"status": registration.status.value, "done": registration.done, "total": registration.total},
        "variants": [_variant(v) for v in sorted(variants, key=lambda v: v.variant_id)],
    }


def _variant(variant: VariantProfile) -> dict[str, Any]:
    return {
        "variantId": variant.variant_id,
        "pool": variant.pool,
        "precision": variant.precision,
        "accuracy": variant.accuracy,
        "latencyP99Ms": variant.latency_ms(1),  # batch 1: the scatter's x
        "latencyP50Ms": variant.median_ms(1),
        "loadLatencyMs": variant.load_latency_ms,
        "pricePerHour": round(variant.price_per_second * 3600, 6),
        "saturationQps": variant.saturation_qps,
        "imported": variant.imported,
    }


def _workers(services: Services, app_id: str | None, now: float) -> list[dict[str, Any]]:
    live = services.dispatcher.live_view.live_workers()
    shown: list[dict[str, Any]] = []
    for worker in sorted(live, key=lambda w: (w.pool, w.worker_id)):
        view = asdict(worker) if app_id is None else app_view(worker, app_id)
        if view is not None:
            shown.append(_worker(worker, view, now))
    return shown


def _worker(worker: WorkerState, view: dict[str, Any], now: float) -> dict[str, Any]:
    return {
        "workerId": worker.worker_id,
        "pool": worker.pool,
        "address": view.get("address"),  # absent from an app's view
        "utilisation": round(worker.utilisation, 4),
        "offlineUtilisation": round(worker.offline_utilisation, 4),
        "freeSlots": worker.free_slots,
        "reportAgeS": round(max(0.0, now - worker.reported_at), 1),
        "instances": [
            {
                "variantId": instance["variant_id"],
                "state": str(instance["state"]),
                "qps": round(instance["qps"], 3),
                "latencyP99Ms": round(instance["latency_p99_ms"], 3),
                "queueLength": instance["queue_length"],
                "utilisation": round(instance["utilisation"], 4),
            }
            for instance in view["instances"]
        ],
    }


def _plan(services: Services, app_id: str | None, now: float) -> dict[str, Any] | None:
    recorded = services.store.scaling_plan()
    if recorded is None:
        return None
    plan: dict[str, Any] = json.loads(recorded)
    at = float(plan.get("at", now))
    instances = plan.get("instances", [])
    lambda_qps: dict[str, float] = plan.get("lambda_qps", {})
    unmet: dict[str, str] = plan.get("unmet", {})
    if app_id is not None:  # the app's own variants and groups (both start with its id)
        instances = [i for i in instances if str(i["variant"]).startswith(f"{app_id}/")]
        lambda_qps = {g: q for g, q in lambda_qps.items() if QueryGroup.parse(g).app_id == app_id}
        unmet = {g: why for g, why in unmet.items() if QueryGroup.parse(g).app_id == app_id}
    shown: dict[str, Any] = {
        "at": at,
        "ageS": round(max(0.0, now - at), 1),
        "solver": plan.get("solver"),
        "status": plan.get("status"),
        "instances": instances,
        "lambdaQps": lambda_qps,
        "unmet": unmet,
    }
    if app_id is None:  # what the whole deployment pays and runs: the admin's
        shown |= {
            "costPerHour": plan.get("cost_per_hour"),
            "workers": plan.get("workers", {}),
            "solveMs": plan.get("solve_ms"),
            "notes": plan.get("notes", []),
        }
    return shown


def _load(services: Services, app_id: str | None, now: float) -> dict[str, Any]:
    """Queries per second per app and model (their groups' counts added up)."""
    window_s = LOAD_RETENTION_S  # what the store keeps
    summed: dict[tuple[str, str], list[int]] = {}
    for key, counts in services.store.load_series(window_s, now).items():
        group = QueryGroup.parse(key)
        if app_id is not None and group.app_id != app_id:
            continue
        series = summed.setdefault((group.app_id, group.model_name or "*"), [0] * window_s)
        for second, count in enumerate(counts):
            series[second] += count
    return {
        "windowS": window_s,
        "endsAt": int(now) - 1,  # the last whole second (the current one is still counted)
        "series": [
            {"appID": app, "modelName": model, "qps": counts}
            for (app, model), counts in sorted(summed.items())
        ],
    }


def _jobs(services: Services, apps: list[str], now: float) -> list[dict[str, Any]]:
    """Unfinished jobs, and those that finished in the last ``FINISHED_JOB_SHOWN_S``."""
    offline = services.offline
    if offline is None:
        return []
    shown = []
    for app in apps:
        for view in offline.views(app):
            finished_at = view.job.finished_at
            if finished_at is None or now - finished_at <= FINISHED_JOB_SHOWN_S:
                shown.append(_job(view))
    return sorted(shown, key=lambda job: job["createdAt"], reverse=True)


def _job(view: JobView) -> dict[str, Any]:
    job = view.job
    return {
        "jobId": job.job_id,
        "appID": job.app_id,
        "status": job.status.value,
        "done": view.done,
        "total": view.total,
        "errors": view.errors,
        "throughput": round(view.throughput, 3),
        "paused": job.paused,
        "pauseReason": job.pause_reason,
        "health": "stalled" if view.stalled else "ok",
        "variant": job.variant_id,
        "message": view.message,
        "createdAt": job.created_at,
        "finishedAt": job.finished_at,
    }
