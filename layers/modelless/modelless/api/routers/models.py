"""register_model, registration status, models and variants."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from modelless.api.dependencies import CallerAppDep, KeyDep, ServicesDep
from modelless.api.idempotency import IDEMPOTENCY_HEADER, fingerprint, run_once
from modelless.api.openapi import AUTHENTICATED, error_responses
from modelless.api.schemas import ImportProfiles, RegisterModel, RegistrationReply
from modelless.config import Settings, variable_name
from modelless.exceptions import (
    InvalidInputError,
    InvalidModelError,
    NotFoundError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from modelless.registration.ingest import RegistrationSource, S3Uri
from modelless.registration.profile_import import import_profiles
from modelless.types import Registration
from modelless.validation import NAME_SCHEMA, too_large

router = APIRouter(prefix="/v1", tags=["models"])

UPLOAD_CHUNK_BYTES = 1024 * 1024  # an upload is copied to disk a piece at a time, never whole
JSON_BODY_LIMIT = 64 * 1024  # a JSON registration carries URIs, not files
FORM_FIELDS = set(RegisterModel.model_fields)
FILE_PARTS = {"model": "model file", "valSet": "validation set", "modelData": "model data file"}

# register_model's plain form fields (multipart or urlencoded): every field text.
FORM_FIELD_SCHEMAS: dict[str, Any] = {
    **{
        name: {"type": "string", "description": str(info.description or name)}
        for name, info in RegisterModel.model_fields.items()
    },
    "appID": {"type": "string", **NAME_SCHEMA},
    "modelName": {"type": "string", **NAME_SCHEMA},
    "preprocessing": {"type": "string", "description": "a JSON object (a recipe)"},
}
URI_FORM_EXAMPLE = {
    "appID": "shop",
    "modelName": "resnet",
    "modelUri": "s3://shop-models/resnet.onnx",
    "valSetUri": "s3://shop-models/resnet-val.npz",
}
REGISTER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["appID", "modelName"],
                    "properties": {
                        **FORM_FIELD_SCHEMAS,
                        "model": {
                            "type": "string",
                            "format": "binary",
                            "description": "ONNX file or zip/tar",
                        },
                        "valSet": {
                            "type": "string",
                            "format": "binary",
                            "description": ".npz validation set",
                        },
                        "modelData": {"type": "string", "format": "binary", "description": "x.onnx.data"},
                    },
                },
                # Files are sent as file parts (model, valSet); s3:// URIs as plain fields, as here.
                "example": URI_FORM_EXAMPLE,
            },
            "application/json": {"schema": RegisterModel.model_json_schema()},
            # s3:// URIs as plain form fields, no file parts.
            "application/x-www-form-urlencoded": {
                "schema": {
                    "type": "object",
                    "required": ["appID", "modelName"],
                    "properties": FORM_FIELD_SCHEMAS,
                },
                "example": URI_FORM_EXAMPLE,
            },
        },
    }
}


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
        variants=registration.variants,
        pruneReasons=registration.prune_reasons,
        etaSeconds=registration.eta_s,
        createdAt=registration.created_at,
        firstServableAt=registration.first_servable_at,
        finishedAt=registration.finished_at,
    )


@router.post(
    "/register_model",
    status_code=202,
    openapi_extra=REGISTER_BODY,
    responses=error_responses(*AUTHENTICATED, 400, 403, 409, 413, 415),
)
async def register_model(
    request: Request,
    response: Response,
    services: ServicesDep,
    key: KeyDep,
    idempotency_key: Annotated[str | None, Header(alias=IDEMPOTENCY_HEADER)] = None,
) -> RegistrationReply:
    """Register a model: files uploaded as multipart/form-data (``model``, ``valSet``, optionally
    ``modelData``), or s3:// URIs (``modelUri``, ``valSetUri``) as form fields or a JSON body.
    Uploads are copied to disk in pieces, never held whole in memory (docs/REGISTRATION.md).
    With an ``Idempotency-Key``, a retry of the same request gets the first reply and registers
    nothing again (the same key with another request is a 409)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    staging = Path(await run_in_threadpool(tempfile.mkdtemp, prefix="modelless-upload-"))
    try:
        if media == "application/json":
            fields = _fields(await _json_body(request))
            files: dict[str, Path] = {}
            digests: dict[str, str] = {}
            services.keys.authorize(key, fields.appID)
        elif media in {"multipart/form-data", "application/x-www-form-urlencoded"}:
            # Starlette spools each file part to a temporary file as it is parsed (1 MB in memory).
            form = await request.form(max_files=len(FILE_PARTS), max_fields=len(FORM_FIELDS) + 4)
            try:
                fields = _fields(_form_values(form))
                services.keys.authorize(key, fields.appID)  # before a byte is copied
                files, digests = await run_in_threadpool(_spool_parts, form, staging, services.settings)
            finally:
                await form.close()
        else:
            raise UnsupportedMediaTypeError(
                f"register_model takes multipart/form-data (files), or application/json or "
                f"application/x-www-form-urlencoded (s3:// URIs); "
                f"got {media or 'no content type'!r}"
            )
        source = _source(fields, files)

        async def register() -> RegistrationReply:
            registration = await run_in_threadpool(
                services.registrar.register,
                fields.appID,
                fields.modelName,
                source,
                fields.metric,
                request.state.correlation_id,
                fields.preprocessing,
            )
            return _reply(request, registration)

        # The request, as a retry would repeat it: its fields and what each file part held.
        identity = fingerprint({"fields": fields.model_dump(), "files": digests})
        return await run_once(
            services,
            idempotency_key,
            response,
            "register_model",
            fields.appID,
            identity,
            RegistrationReply,
            register,
        )
    finally:
        await run_in_threadpool(shutil.rmtree, staging, True)


async def _json_body(request: Request) -> dict[str, Any]:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > JSON_BODY_LIMIT:
            raise PayloadTooLargeError(
                f"a JSON register_model body carries s3:// URIs and fields, at most {JSON_BODY_LIMIT} "
                "bytes; upload files as multipart/form-data",
                limit=JSON_BODY_LIMIT,
            )
    try:
        parsed = json.loads(bytes(body))
    except ValueError as error:
        raise InvalidInputError(f"the request body is not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return parsed


def _form_values(form: FormData) -> dict[str, Any]:
    """The form's plain fields; the preprocessing recipe arrives as a JSON string."""
    values: dict[str, Any] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            if name not in FILE_PARTS:
                raise InvalidInputError(
                    f"unknown file part {name!r}; register_model takes {sorted(FILE_PARTS)}", field=name
                )
            continue
        if name in FILE_PARTS:
            raise InvalidInputError(f"{name!r} must be a file part (a filename is needed)", field=name)
        if name in values:
            raise InvalidInputError(f"field {name!r} is given twice", field=name)
        values[name] = value
    raw = values.get("preprocessing")
    if isinstance(raw, str):
        try:
            values["preprocessing"] = json.loads(raw) if raw.strip() else None
        except ValueError as error:
            raise InvalidInputError(
                f"preprocessing must be a JSON object: {error}", field="preprocessing"
            ) from error
    return values


def _fields(values: dict[str, Any]) -> RegisterModel:
    try:
        return RegisterModel.model_validate(values)
    except ValidationError as error:
        problems = [
            f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}"
            for item in error.errors(include_url=False)
        ]
        raise InvalidInputError(
            "; ".join(problems) + f" (register_model takes {sorted(FORM_FIELDS | set(FILE_PARTS))})",
            problems=problems,
        ) from None


def _spool_parts(form: FormData, staging: Path, settings: Settings) -> tuple[dict[str, Path], dict[str, str]]:
    """Copy each file part to its own file under ``staging``, in pieces, refusing one over its
    limit with a 413 that names the setting (a model's external data shares the model's).
    Returns the files, and each one's SHA-256 (what tells a retry from another request)."""
    limits = {
        "model": (settings.max_model_bytes, variable_name(Settings, "max_model_bytes")),
        "modelData": (settings.max_model_bytes, variable_name(Settings, "max_model_bytes")),
        "valSet": (settings.max_valset_bytes, variable_name(Settings, "max_valset_bytes")),
    }
    copied: dict[str, Path] = {}
    digests: dict[str, str] = {}
    for name, value in form.multi_items():
        if not isinstance(value, UploadFile):
            continue
        if name in copied:
            raise InvalidInputError(f"file part {name!r} is given twice", field=name)
        limit, setting = limits[name]
        target = staging / name
        written = 0
        digest = hashlib.sha256()
        value.file.seek(0)
        with target.open("wb") as out:
            while piece := value.file.read(UPLOAD_CHUNK_BYTES):
                written += len(piece)
                if written > limit:
                    raise too_large(FILE_PARTS[name], limit, setting)
                out.write(piece)
                digest.update(piece)
        copied[name] = target
        digests[name] = digest.hexdigest()
    return copied, digests


def _source(fields: RegisterModel, files: dict[str, Path]) -> RegistrationSource:
    """Where the model, its validation set and its external data come from: one way each."""
    pairs = (("model", "modelUri"), ("valSet", "valSetUri"), ("modelData", "modelDataUri"))
    chosen: dict[str, Path | S3Uri | None] = {}
    for part, uri_field in pairs:
        uri = getattr(fields, uri_field)
        if part in files and uri:
            raise InvalidInputError(
                f"send either a {part!r} file or a {uri_field!r}, not both", field=uri_field
            )
        chosen[part] = files[part] if part in files else S3Uri.parse(uri, uri_field) if uri else None
    model, valset = chosen["model"], chosen["valSet"]
    if model is None or valset is None:
        missing = [
            f"a {part!r} file or a {uri_field!r} (s3://bucket/key)"
            for part, uri_field in pairs[:2]
            if chosen[part] is None
        ]
        raise InvalidModelError(
            f"both a model and a validation set are required: send {' and '.join(missing)}"
        )
    return RegistrationSource(model, valset, chosen["modelData"])


@router.get(
    "/registrations/{registration_id}",
    name="registration_status",
    responses=error_responses(*AUTHENTICATED, 404),
)
def registration_status(
    request: Request, registration_id: str, services: ServicesDep, app_id: CallerAppDep
) -> RegistrationReply:
    registration = services.store.get_registration(registration_id)
    if registration is None or registration.app_id != app_id:
        raise NotFoundError(f"no registration {registration_id!r} in app {app_id!r}")
    return _reply(request, registration)


@router.get("/registrations", responses=error_responses(*AUTHENTICATED))
def list_registrations(request: Request, services: ServicesDep, app_id: CallerAppDep) -> dict[str, Any]:
    """The registration of each of the app's models, finished or in progress."""
    found = (services.store.get_registration(m.registration_id) for m in services.store.list_models(app_id))
    return {"appID": app_id, "registrations": [_reply(request, r) for r in found if r is not None]}


@router.post(
    "/variants/import", status_code=201, responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413)
)
def import_variant_profiles(body: ImportProfiles, services: ServicesDep, key: KeyDep) -> dict[str, Any]:
    """Profiles measured on hardware this deployment lacks (GPU, Inferentia), marked imported."""
    services.keys.authorize(key, body.appID)
    imported = import_profiles(
        services.store, services.repository, services.pools, body.appID, body.modelName, body.profiles
    )
    return {"appID": body.appID, "imported": [v.variant_id for v in imported]}


@router.get("/models", responses=error_responses(*AUTHENTICATED))
def list_models(services: ServicesDep, app_id: CallerAppDep) -> dict[str, Any]:
    return {"appID": app_id, "models": [asdict(m) for m in services.store.list_models(app_id)]}


@router.get("/variants", responses=error_responses(*AUTHENTICATED, 404))
def list_variants(
    services: ServicesDep, app_id: CallerAppDep, modelName: str | None = None
) -> dict[str, Any]:
    if modelName is not None and services.store.get_model(app_id, modelName) is None:
        raise NotFoundError(f"model {modelName!r} is not registered in app {app_id!r}")
    variants = services.store.list_variants(app_id, modelName)
    return {"appID": app_id, "variants": [asdict(v) for v in variants]}
