"""Health, live worker state, and the internal endpoint workers report to in the embedded stack."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, fields
from typing import Any

from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError

from modelless.api.dependencies import AdminDep, KeyDep, ServicesDep
from modelless.api.openapi import AUTHENTICATED, error_responses
from modelless.api.schemas import CacheStatsReply, request_error
from modelless.api.services import Services
from modelless.auth import check_admin
from modelless.exceptions import (
    BadRequestError,
    ForbiddenError,
    StoreEmptiedError,
    StoreUnavailableError,
    UnauthorizedError,
)
from modelless.types import InstanceStats, WorkerState
from modelless.worker.reporting import INTERNAL_STATE_PATH

router = APIRouter(tags=["operations"])


@router.get("/health", responses=error_responses())
@router.get("/health/live", responses=error_responses())
async def health() -> dict[str, str]:
    """Liveness: the process serves requests. Nothing else is looked at (a store outage must not
    get a gateway restarted that still serves the apps it knows), and on the event loop, not in
    the thread pool, so that it answers while every thread waits on something."""
    return {"status": "ok"}


@router.get("/health/ready", responses=error_responses(503))
def ready(services: ServicesDep) -> dict[str, Any]:
    """Readiness: the metadata store answers, and still holds the marker the deployment wrote to
    it where one was (``Settings.metadata_epoch``): else 503 ``store_unavailable`` or
    ``store_emptied``. Reports the store's kind and how long it took to answer."""
    store = services.store
    started = time.perf_counter()
    try:
        store.ping()
        expected = services.settings.metadata_epoch
        held = store.epoch() if expected else None
    except StoreUnavailableError as error:
        error.details["store"] = {"kind": store.kind, "reachable": False}
        raise
    latency_ms = round((time.perf_counter() - started) * 1000, 3)
    report = {"kind": store.kind, "reachable": True, "latencyMs": latency_ms}
    if expected and held != expected:
        raise StoreEmptiedError(
            f"the metadata store has lost what was registered in it: it should hold epoch "
            f"{expected!r} and holds {held!r} (it came back empty, without persistence). Every app, "
            f"key and model registered before is gone; see docs/PERSISTENCE.md",
            store=report,
        )
    return {"status": "ready", "store": report}


@router.get("/v1/workers", responses=error_responses(*AUTHENTICATED))
def workers(services: ServicesDep, key: KeyDep) -> dict[str, Any]:
    """Live worker state. The admin key sees every worker as it reports. An app's key sees the
    workers that run instances of the app's own variants, with those instances only, and
    without the workers' addresses (internal ones, that other apps' queries go to too)."""
    live = services.dispatcher.live_view.live_workers()
    if is_admin(services, key):
        return {"workers": [asdict(worker) for worker in live]}
    app_id = services.keys.app_for_key(key)
    views = (app_view(worker, app_id) for worker in live)
    return {"appID": app_id, "workers": [view for view in views if view is not None]}


def is_admin(services: Services, key: str | None) -> bool:
    try:
        check_admin(services.settings.admin_key, key)
    except (UnauthorizedError, ForbiddenError):
        return False
    return True


def app_view(worker: WorkerState, app_id: str) -> dict[str, Any] | None:
    """What an app may see of a worker: its own instances (a variant id starts with its app's
    id, which holds no '/'), nothing of the others', no address; None when it runs none."""
    own = [asdict(i) for i in worker.instances if i.variant_id.startswith(f"{app_id}/")]
    if not own:
        return None
    view = asdict(worker)
    del view["address"]
    view["instances"] = own
    return view


@router.post(INTERNAL_STATE_PATH, status_code=204, include_in_schema=False)
async def worker_state(request: Request, services: ServicesDep, _: AdminDep) -> None:
    services.store.put_worker_state(parse_worker_report(await request.body()))


@router.delete(INTERNAL_STATE_PATH + "/{worker_id}", status_code=204, include_in_schema=False)
def withdraw_worker_state(worker_id: str, services: ServicesDep, _: AdminDep) -> None:
    """A worker that stops withdraws its report (``worker.reporting.GatewaySink``)."""
    services.store.remove_worker(worker_id)


# Strict: a report is what WorkerState.to_json writes, to the type (no "2" for 2, no true for 1).
_WORKER_REPORT = TypeAdapter(WorkerState)


def parse_worker_report(body: bytes) -> WorkerState:
    """A worker's state report, or a 400 naming what is wrong with it (not JSON, a field missing
    or of the wrong type: the API's one shape for a malformed body; a number that is not
    finite); nothing is stored then."""
    try:
        state = _WORKER_REPORT.validate_json(body, strict=True)
    except ValidationError as error:
        raise request_error(error, "body") from None
    records: list[WorkerState | InstanceStats] = [state, *state.instances]
    for record in records:
        for item in fields(record):
            value = getattr(record, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise BadRequestError(
                    f"not a worker state report: {item.name} is {value}, not a finite number"
                )
    return state


@router.get("/v1/cache", tags=["operations"], responses=error_responses(*AUTHENTICATED, 403))
def cache_stats(services: ServicesDep, _: AdminDep) -> CacheStatsReply:
    """The prediction cache (admin only): hits, misses, hit rate, entries, bytes held and
    evictions; with Redis, those of every gateway and offline runner sharing it. A cache that
    cannot be read is a 503, as the store's outage is (queries go on, as misses)."""
    cache = services.dispatcher.cache
    if cache is None:
        return CacheStatsReply(
            enabled=False, backend=None, hits=0, misses=0, hitRate=0.0, entries=0, bytesUsed=0,
            maxBytes=0, evictions=0,
        )  # fmt: skip
    stats = cache.predictions.stats()
    return CacheStatsReply(
        enabled=True,
        backend=stats.backend,
        hits=stats.hits,
        misses=stats.misses,
        hitRate=round(stats.hit_rate, 6),
        entries=stats.entries,
        bytesUsed=stats.bytes_used,
        maxBytes=stats.max_bytes,
        evictions=stats.evictions,
    )


@router.delete(
    "/v1/cache", status_code=204, tags=["operations"], responses=error_responses(*AUTHENTICATED, 403)
)
def clear_cache(services: ServicesDep, _: AdminDep) -> None:
    """Empty the prediction cache and reset its counters (admin only)."""
    if services.dispatcher.cache is not None:
        services.dispatcher.cache.predictions.backend.clear()
