"""Health, live worker state, and the internal endpoint workers report to in the embedded stack."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from modelless.api.dependencies import AdminDep, CallerAppDep, ServicesDep
from modelless.pools.reporting import INTERNAL_STATE_PATH
from modelless.types import WorkerState

router = APIRouter(tags=["operations"])


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/v1/workers")
def workers(services: ServicesDep, _: CallerAppDep) -> dict[str, Any]:
    return {"workers": [asdict(w) for w in services.dispatcher.live_view.live_workers()]}


@router.post(INTERNAL_STATE_PATH, status_code=204, include_in_schema=False)
async def worker_state(request: Request, services: ServicesDep, _: AdminDep) -> None:
    services.store.put_worker_state(WorkerState.from_json(await request.body()))
