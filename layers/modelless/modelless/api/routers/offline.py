"""offline_query (INFaaS Table 4): batch jobs over S3 objects, and their progress."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.concurrency import run_in_threadpool

from modelless.api.dependencies import AdminDep, CallerAppDep, KeyDep, ServicesDep
from modelless.api.idempotency import IDEMPOTENCY_HEADER, fingerprint, run_once
from modelless.api.openapi import AUTHENTICATED, NamePath, error_responses
from modelless.api.schemas import JobReply, OfflineBuckets, OfflineQuery
from modelless.api.services import Services
from modelless.exceptions import InvalidInputError, InvalidJobError, NotFoundError, ServiceUnavailableError
from modelless.offline.jobs import JobSpec, S3Path
from modelless.offline.service import OfflineService
from modelless.offline.views import JobView
from modelless.validation import check_name

router = APIRouter(prefix="/v1", tags=["offline"])


def _offline(services: Services) -> OfflineService:
    if services.offline is None:
        raise ServiceUnavailableError("offline jobs are not enabled on this deployment")
    return services.offline


def _reply(request: Request, view: JobView) -> JobReply:
    job = view.job
    try:
        input_path: S3Path | None = S3Path.parse(job.input_path, "inputPath")
    except InvalidJobError:
        input_path = None  # a refused manifest's path, kept as it was written

    def input_url(key: str) -> str:
        return input_path.url_of(key) if input_path is not None else key

    return JobReply(
        jobId=job.job_id,
        appID=job.app_id,
        status=job.status.value,
        done=view.done,
        total=view.total,
        errors=view.errors,
        succeeded=view.done - view.errors,
        throughput=round(view.throughput, 3),
        elapsedSeconds=round(view.elapsed_s, 3),
        activeSeconds=round(job.active_s, 3),
        paused=job.paused,
        pauseReason=job.pause_reason,
        variant=job.variant_id,
        pipeline=job.pipeline,
        stageVariants=job.stage_variants,
        inputPath=job.input_path,
        outputPath=job.output_path,
        summaryPath=job.summary_key,
        message=view.message,
        source=job.source,
        runs=job.runs,
        health="stalled" if view.stalled else "ok",
        heartbeatAgeS=round(age, 1) if (age := view.heartbeat_age_s) is not None else None,
        restarts=job.restarts,
        lastRunnerFailure=job.runner_failure or None,
        createdAt=job.created_at,
        startedAt=job.started_at,
        finishedAt=job.finished_at,
        errorSamples=[{"input": input_url(k), "error": v} for k, v in view.error_samples.items()],
        statusUrl=str(request.url_for("job_status", job_id=job.job_id)),
    )


@router.post(
    "/offline_query",
    status_code=202,
    responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413),
)
async def offline_query(
    body: OfflineQuery,
    request: Request,
    response: Response,
    services: ServicesDep,
    key: KeyDep,
    idempotency_key: Annotated[str | None, Header(alias=IDEMPOTENCY_HEADER)] = None,
) -> JobReply:
    """Start a batch job over every object under ``inputPath``. With an ``Idempotency-Key``, a
    retry of the same request gets the first reply (the same job) and starts nothing again."""
    services.keys.authorize(key, body.appID)
    if body.accuracy is None and body.modelName is None and body.pipeline is None:
        raise InvalidInputError("give an accuracy target, a modelName or a pipeline")
    if body.modelName is not None:
        check_name("modelName", body.modelName)
    offline = _offline(services)
    spec = JobSpec(
        body.appID, body.inputPath, body.outputPath, body.accuracy or 0.0, body.modelName, body.pipeline
    )

    async def submit() -> JobReply:
        # Validation lists buckets and objects (S3 round trips): off the event loop.
        job = await run_in_threadpool(offline.submit, spec)
        return _reply(request, offline.view(job.job_id, body.appID))

    identity = fingerprint(body.model_dump())
    return await run_once(
        services, idempotency_key, response, "offline_query", body.appID, identity, JobReply, submit
    )


@router.get("/jobs/{job_id}", name="job_status", responses=error_responses(*AUTHENTICATED, 404))
def job_status(request: Request, job_id: str, services: ServicesDep, app_id: CallerAppDep) -> JobReply:
    return _reply(request, _offline(services).view(job_id, app_id))


@router.get("/jobs", responses=error_responses(*AUTHENTICATED))
def list_jobs(request: Request, services: ServicesDep, app_id: CallerAppDep) -> dict[str, Any]:
    views = _offline(services).views(app_id)
    return {"appID": app_id, "jobs": [_reply(request, v) for v in views]}


@router.put("/apps/{app_id}/offline-buckets", responses=error_responses(*AUTHENTICATED, 400, 403, 404, 413))
def set_offline_buckets(
    app_id: NamePath, body: OfflineBuckets, services: ServicesDep, _: AdminDep
) -> dict[str, Any]:
    """Admin: the buckets the app's offline jobs may read and write (replaces the list)."""
    if not services.store.app_exists(app_id):
        raise NotFoundError(f"no app {app_id!r}", app=app_id)
    for bucket in body.buckets:
        S3Path.parse(f"s3://{bucket}/", "bucket")
    services.store.set_offline_buckets(app_id, body.buckets)
    return {"appID": app_id, "buckets": services.store.offline_buckets(app_id)}
