"""Apps and their API keys (admin only)."""

from __future__ import annotations

from fastapi import APIRouter

from modelless.api.dependencies import AdminDep, ServicesDep
from modelless.api.openapi import error_responses
from modelless.api.schemas import AppCreated, CreateApp
from modelless.auth import hash_key, issue_key
from modelless.offline.jobs import S3Path
from modelless.validation import check_name

router = APIRouter(prefix="/v1", tags=["apps"])


@router.post("/apps", status_code=201, responses=error_responses(400, 401, 403, 409, 413, 503))
def create_app(body: CreateApp, services: ServicesDep, _: AdminDep) -> AppCreated:
    check_name("appID", body.appID)
    key = issue_key()
    if body.offlineBuckets is not None:
        for bucket in body.offlineBuckets:
            S3Path.parse(f"s3://{bucket}/", "offlineBuckets")
    services.store.create_app(body.appID, hash_key(key))
    if body.offlineBuckets is not None:
        services.store.set_offline_buckets(body.appID, body.offlineBuckets)
    return AppCreated(appID=body.appID, apiKey=key)
