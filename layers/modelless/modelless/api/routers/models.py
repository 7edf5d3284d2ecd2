"""register_model, registration status, models and variants."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool

from modelless.api.dependencies import CallerAppDep, KeyDep, ServicesDep
from modelless.api.schemas import ImportProfiles, RegistrationReply
from modelless.auth import authorize_app
from modelless.exceptions import InvalidModelError, NotFoundError, PayloadTooLargeError
from modelless.profile_import import import_profiles
from modelless.types import Registration

router = APIRouter(prefix="/v1", tags=["models"])


async def _read_limited(upload: UploadFile, limit: int, what: str) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLargeError(f"{what} exceeds the limit of {limit} bytes", limit=limit)
    return data


def _reply(request: Request, registration: Registration) -> RegistrationReply:
    return RegistrationReply(
        registrationId=registration.registration_id,
        appID=registration.app_id,
        modelName=registration.model_name,
        status=registration.status.value,
        done=registration.done,
        total=registration.total,
        message=registration.message,
        variantIds=registration.variant_ids,
        pruned=registration.pruned,
        statusUrl=str(request.url_for("registration_status", registration_id=registration.registration_id)),
    )


@router.post("/register_model", status_code=202)
async def register_model(
    request: Request,
    services: ServicesDep,
    key: KeyDep,
    appID: Annotated[str, Form()],
    modelName: Annotated[str, Form()],
    model: Annotated[UploadFile, File(description="ONNX model file")],
    valSet: Annotated[UploadFile, File(description=".npz with 'inputs' and 'labels'")],
    metric: Annotated[str, Form(description="accuracy metric: top1 or top5")] = "top1",
) -> RegistrationReply:
    authorize_app(services.store, key, appID)
    if not model.filename or not valSet.filename:
        raise InvalidModelError("both 'model' and 'valSet' files are required")
    model_bytes = await _read_limited(model, services.settings.max_model_bytes, "model file")
    valset_bytes = await _read_limited(valSet, services.settings.max_valset_bytes, "validation set")
    registration = await run_in_threadpool(
        services.registrar.register,
        appID,
        modelName,
        model_bytes,
        valset_bytes,
        metric,
        request.state.correlation_id,
    )
    return _reply(request, registration)


@router.get("/registrations/{registration_id}", name="registration_status")
def registration_status(
    request: Request, registration_id: str, services: ServicesDep, app_id: CallerAppDep
) -> RegistrationReply:
    registration = services.store.get_registration(registration_id)
    if registration is None or registration.app_id != app_id:
        raise NotFoundError(f"no registration {registration_id!r} in app {app_id!r}")
    return _reply(request, registration)


@router.get("/registrations")
def list_registrations(request: Request, services: ServicesDep, app_id: CallerAppDep) -> dict[str, Any]:
    """The registration of each of the app's models, finished or in progress."""
    found = (services.store.get_registration(m.registration_id) for m in services.store.list_models(app_id))
    return {"appID": app_id, "registrations": [_reply(request, r) for r in found if r is not None]}


@router.post("/variants/import", status_code=201)
def import_variant_profiles(body: ImportProfiles, services: ServicesDep, key: KeyDep) -> dict[str, Any]:
    """Profiles measured on hardware this deployment lacks (GPU, Inferentia), marked imported."""
    authorize_app(services.store, key, body.appID)
    imported = import_profiles(
        services.store, services.repository, services.pools, body.appID, body.modelName, body.profiles
    )
    return {"appID": body.appID, "imported": [v.variant_id for v in imported]}


@router.get("/models")
def list_models(services: ServicesDep, app_id: CallerAppDep) -> dict[str, Any]:
    return {"appID": app_id, "models": [asdict(m) for m in services.store.list_models(app_id)]}


@router.get("/variants")
def list_variants(
    services: ServicesDep, app_id: CallerAppDep, modelName: str | None = None
) -> dict[str, Any]:
    if modelName is not None and services.store.get_model(app_id, modelName) is None:
        raise NotFoundError(f"model {modelName!r} is not registered in app {app_id!r}")
    variants = services.store.list_variants(app_id, modelName)
    return {"appID": app_id, "variants": [asdict(v) for v in variants]}
