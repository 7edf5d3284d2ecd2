"""Model registration: validate at once, then generate and profile variants in the background.

Everything a caller can get wrong is checked before anything is written. The background part
runs variant generation and each profile in a fresh child process (never in the gateway), one
registration at a time so that concurrent profiling does not distort the measurements. A failure
removes every trace of the model from the store and the repository; the registration record
stays, marked failed, with the reason.

Where the background part runs: a thread of this process (the embedded stack), or, in AWS, the
registrar function (``functions/registrar``), which the gateway invokes asynchronously with a
``RegistrationJob`` once the upload is in the model repository (``LambdaRegistrationLauncher``).
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger

from modelless.catalog import PoolSpec
from modelless.config import Settings, variable_name
from modelless.exceptions import InvalidInputError, InvalidModelError, NotFoundError, ServiceUnavailableError
from modelless.metadata.base import MetadataStore
from modelless.registration.ingest import (
    IngestedModel,
    IngestRequest,
    Limits,
    RegistrationSource,
    S3Uri,
    ingest,
    ingest_in_child,
    needs_child,
    trial_run,
)
from modelless.registration.profiling import Profiler, build_and_profile, model_prefix
from modelless.repository.base import ModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, TensorSpec
from modelless.validation import ModelSignature, check_name, load_valset
from variants.recipes import ACCURACY_METRICS

logger = Logger(service="registrar", child=True)


@dataclass(frozen=True)
class RegistrationJob:
    """The background part of one registration: what the registrar function is invoked with."""

    registration_id: str
    app_id: str
    model_name: str
    metric: str = "top1"
    correlation_id: str = ""
    # The gateway could not test-run the model (no onnxruntime there, as in AWS): the registrar
    # does it first, and fails the registration at once, with the same message, if it does not run.
    test_run: bool = False

    def to_event(self) -> dict[str, str | bool]:
        return {
            "registrationId": self.registration_id,
            "appID": self.app_id,
            "modelName": self.model_name,
            "metric": self.metric,
            "correlationId": self.correlation_id,
            "testRun": self.test_run,
        }

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> RegistrationJob:
        missing = [k for k in ("registrationId", "appID", "modelName") if not event.get(k)]
        if missing:
            raise InvalidInputError(f"registration event lacks {missing}")
        return cls(
            registration_id=str(event["registrationId"]),
            app_id=str(event["appID"]),
            model_name=str(event["modelName"]),
            metric=str(event.get("metric") or "top1"),
            correlation_id=str(event.get("correlationId") or ""),
            test_run=event.get("testRun") is True,
        )


# Hands a registration's background part to whatever runs it; raising means it was not handed on.
RegistrationLauncher = Callable[[RegistrationJob], None]


class LambdaRegistrationLauncher:
    """In AWS: an asynchronous ``lambda:Invoke`` (InvocationType ``Event``) of the registrar."""

    def __init__(self, function_name: str, client: Any | None = None) -> None:
        from modelless import aws_clients

        self._function = function_name
        self._lambda = client or aws_clients.client("lambda")

    def __call__(self, job: RegistrationJob) -> None:
        self._lambda.invoke(
            FunctionName=self._function, InvocationType="Event", Payload=json.dumps(job.to_event())
        )


class RegistrationService:
    def __init__(
        self,
        store: MetadataStore,
        repository: ModelRepository,
        settings: Settings,
        pools: Mapping[str, PoolSpec],
        launcher: RegistrationLauncher | None = None,
        s3_client: Any | None = None,
    ) -> None:
        """``launcher``: where the background part runs; None runs it in a thread of this process.
        ``s3_client``: reads s3:// registration sources (default: boto3's, created when first
        needed, its endpoint from the standard AWS settings)."""
        self._store = store
        self._repository = repository
        self._settings = settings
        self._pools = pools
        self._launcher = launcher
        self._s3_client = s3_client
        # One registration at a time, so that concurrent profiles do not disturb each other.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="registrar")

    def register(
        self,
        app_id: str,
        model_name: str,
        source: RegistrationSource,
        metric: str = "top1",
        correlation_id: str = "",
        preprocessing: Mapping[str, Any] | None = None,
    ) -> Registration:
        """Check a model and its validation set (files on this machine or s3:// objects; see
        ``modelless.registration.ingest``), store them, and queue the generation of its variants. Everything a
        caller can get wrong is refused here, before anything is written."""
        _check_request(model_name, metric, preprocessing)
        limits = self._limits()
        with tempfile.TemporaryDirectory(prefix="modelless-ingest-") as tmp:
            # The ingested files live in the temporary directory: stored before it goes.
            ingested = self._ingest(source, Path(tmp), limits)
            recipe = _parsed_recipe(preprocessing, ingested.signature)
            self._check_same_inputs_as_the_app(app_id, ingested.signature)
            registration, model = _new_records(app_id, model_name, ingested, recipe)
            self._store_model(model, registration, ingested)
        # A snapshot taken before the background part starts: it goes on updating its own record.
        snapshot = Registration.from_json(registration.to_json())
        self._start_background(model, registration, metric, correlation_id, tested=ingested.tested)
        return snapshot

    def _limits(self) -> Limits:
        """The sizes a registration's files are held to, with the settings that name them."""
        settings = self._settings
        return Limits(
            settings.max_model_bytes,
            settings.max_valset_bytes,
            variable_name(Settings, "max_model_bytes"),
            variable_name(Settings, "max_valset_bytes"),
            settings.valset_unpacked_limit,
            variable_name(Settings, "max_valset_unpacked_bytes"),
            settings.max_ingest_memory_bytes,
        )

    def _ingest(self, source: RegistrationSource, work: Path, limits: Limits) -> IngestedModel:
        """The model and validation set on this machine (downloaded into ``work`` when they are
        s3:// objects), parsed, checked and test-run where this process can."""
        model_data = source.model_data
        request = IngestRequest(
            model=self._local(source.model, work / "model-source", limits, "modelUri"),
            valset=self._local(source.valset, work / "valset-source", limits, "valSetUri"),
            work_dir=work / "ingest",
            limits=limits,
            model_data=None
            if model_data is None
            else self._local(model_data, work / "data", limits, "modelDataUri"),
        )
        # A large model is parsed, checked and test-run in a child process: the memory that
        # takes (several times its size) must not stay with this process.
        return ingest_in_child(request) if needs_child(request) else ingest(request)

    def _check_same_inputs_as_the_app(self, app_id: str, signature: ModelSignature) -> None:
        """Model-less queries may land on any of the app's models: they must take the same inputs."""
        siblings = self._store.list_models(app_id)
        if siblings and not _same_inputs(siblings[0].input_specs, list(signature.inputs)):
            raise InvalidModelError(
                f"app {app_id!r} serves inputs of shape {siblings[0].input_shape} "
                f"({_describe(siblings[0].input_specs)}); this model takes "
                f"{_describe(list(signature.inputs))}: every model of an app takes the same inputs",
                expected=siblings[0].input_shape,
            )

    def _store_model(self, model: ModelRecord, registration: Registration, ingested: IngestedModel) -> None:
        """The model's records, then its files; the records go again if a file cannot be stored."""
        self._store.add_model(model, registration)  # ConflictError when the name is taken
        try:
            self._repository.put_file(model.artifact_key, ingested.model)
            self._repository.put_file(
                f"{model_prefix(model.app_id, model.model_name)}valset.npz", ingested.valset
            )
        except Exception:
            self._undo(model)
            raise

    def _start_background(
        self, model: ModelRecord, registration: Registration, metric: str, correlation_id: str, tested: bool
    ) -> None:
        """Queue variant generation (after the test run this process could not do, when
        ``tested`` is false): in a thread here, or handed to the registrar. A registration that
        cannot be handed on leaves nothing behind and is a 503."""
        if self._launcher is None:
            if tested:
                self._background.submit(self._generate_and_profile, model, registration, metric)
            else:
                self._background.submit(self._test_run_then_generate, model, registration, metric)
            return
        job = RegistrationJob(
            registration.registration_id,
            model.app_id,
            model.model_name,
            metric,
            correlation_id,
            test_run=not tested,
        )
        try:
            self._launcher(job)
        except Exception as error:
            logger.exception("registration could not be handed to the registrar")
            self._undo(model)
            self._fail(registration, f"the registrar could not be started: {type(error).__name__}")
            raise ServiceUnavailableError(
                "the registrar could not be started; nothing was kept, try again",
                registration_id=registration.registration_id,
            ) from error

    def _local(self, source: Path | S3Uri, target: Path, limits: Limits, field: str) -> Path:
        """A registration file on this machine: a path as it is, an s3:// object downloaded
        (``field``: the request field it came in, which names the limit it is held to)."""
        if isinstance(source, Path):
            return source
        valset = field == "valSetUri"
        limit = limits.valset_bytes if valset else limits.model_bytes
        setting = limits.valset_setting if valset else limits.model_setting
        # Here, not at the top: boto3 only where a registration reads from S3.
        from modelless.repository.s3 import download_object

        if self._s3_client is None:
            from modelless import aws_clients

            self._s3_client = aws_clients.client("s3")
        download_object(source.bucket, source.key, target, limit, setting, field, self._s3_client)
        return target

    def _test_run(self, model: ModelRecord, registration: Registration) -> bool:
        """The test run the gateway could not do (no onnxruntime there): batch 1 and batch 2 on
        the stored validation set's first examples. A model that does not run fails its
        registration at once, with the gateway's message, and leaves no trace; True when it runs."""
        try:
            with tempfile.TemporaryDirectory(prefix="modelless-trial-") as tmp:
                path = Path(tmp) / "source.onnx"
                valset = Path(tmp) / "valset.npz"
                self._repository.get_file(model.artifact_key, path)
                self._repository.get_file(f"{model_prefix(model.app_id, model.model_name)}valset.npz", valset)
                signature = ModelSignature(tuple(model.input_specs), model.num_classes)
                settings = self._settings
                examples, _ = load_valset(
                    valset,
                    signature,
                    settings.max_valset_bytes,
                    max_unpacked_bytes=settings.valset_unpacked_limit,
                )
                trial_run(path, signature, examples)
        except Exception as error:
            logger.warning("registered model does not run", extra={"model": model.model_name})
            self._undo(model)
            reason = f"{type(error).__name__}: {error}"
            self._fail(registration, error.message if isinstance(error, InvalidModelError) else reason)
            return False
        return True

    def _test_run_then_generate(self, model: ModelRecord, registration: Registration, metric: str) -> None:
        if self._test_run(model, registration):
            self._generate_and_profile(model, registration, metric)

    def run(self, job: RegistrationJob) -> Registration:
        """The background part of a registration handed on by a launcher (the registrar function):
        build, profile and prune its variants, then publish them, or record why it failed.

        A job whose registration has already left the queue (a duplicate delivery of the event)
        is not run again; its record is returned as it stands."""
        registration = self._store.get_registration(job.registration_id)
        model = self._store.get_model(job.app_id, job.model_name)
        if registration is None or registration.app_id != job.app_id:
            raise NotFoundError(f"no registration {job.registration_id!r} in app {job.app_id!r}")
        if registration.status is not RegistrationStatus.QUEUED:
            logger.warning(
                "registration is not queued; not run again",
                extra={"registration_id": job.registration_id, "status": registration.status.value},
            )
            return registration
        if model is None or model.registration_id != job.registration_id:
            self._fail(registration, "the model was removed before its variants were generated")
            return registration
        if job.test_run and not self._test_run(model, registration):
            return registration
        self._generate_and_profile(model, registration, job.metric)
        return registration

    def _generate_and_profile(self, model: ModelRecord, registration: Registration, metric: str) -> None:
        """Build the artifacts, profile them (each variant published as soon as its profile is
        done), prune; or, on failure, remove every trace of the model and record why."""
        try:
            with tempfile.TemporaryDirectory(prefix="modelless-reg-") as tmp:
                build_and_profile(
                    Profiler(self._store, self._repository, self._settings, self._pools, self._progress),
                    model, registration, Path(tmp), metric,
                )  # fmt: skip
            logger.info(
                "registration ready",
                extra={
                    "model": model.model_name,
                    "variants": len(registration.variant_ids),
                    "pruned": registration.pruned,
                },
            )
        except Exception as error:
            logger.exception("registration failed", extra={"model": model.model_name})
            self._undo(model)
            self._fail(registration, f"{type(error).__name__}: {error}")

    def _fail(self, registration: Registration, message: str) -> None:
        registration.status = RegistrationStatus.FAILED
        registration.finished_at = time.time()
        registration.message = message
        self._store.put_registration(registration)

    def _progress(self, registration: Registration, status: RegistrationStatus, message: str) -> None:
        registration.status = status
        registration.message = message
        self._store.put_registration(registration)

    def _undo(self, model: ModelRecord) -> None:
        self._store.delete_model(model.app_id, model.model_name)
        self._repository.delete_prefix(model_prefix(model.app_id, model.model_name))

    def wait_idle(self, timeout_s: float = 600.0) -> None:
        """Block until queued registrations finish (tests, the demo)."""
        self._background.submit(lambda: None).result(timeout=timeout_s)

    def close(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)


def _check_request(model_name: str, metric: str, preprocessing: Mapping[str, Any] | None) -> None:
    """What a registration request can get wrong before its files are read."""
    check_name("modelName", model_name)
    if metric not in ACCURACY_METRICS:
        raise InvalidInputError(f"metric {metric!r} is not one of {list(ACCURACY_METRICS)}")
    if preprocessing is not None and not isinstance(preprocessing, Mapping):
        raise InvalidInputError("preprocessing must be a JSON object (a recipe)", field="preprocessing")


def _parsed_recipe(
    preprocessing: Mapping[str, Any] | None, signature: ModelSignature
) -> dict[str, Any] | None:
    """The preprocessing recipe checked against the model's input, every key filled in."""
    if preprocessing is None:
        return None
    from modelless.inputs.preprocessing import parse_recipe

    return parse_recipe(preprocessing, signature.inputs[0])


def _new_records(
    app_id: str, model_name: str, ingested: IngestedModel, recipe: dict[str, Any] | None
) -> tuple[Registration, ModelRecord]:
    """The registration, queued, and the model's record (its artifact under the model's prefix)."""
    signature = ingested.signature
    registration = Registration(
        registration_id=uuid.uuid4().hex,
        app_id=app_id,
        model_name=model_name,
        created_at=time.time(),
        message="; ".join(["queued for variant generation", *ingested.notes]),
    )
    first = signature.inputs[0]
    model = ModelRecord(
        app_id=app_id,
        model_name=model_name,
        input_name=first.name,
        input_shape=list(first.shape),
        input_dtype=first.dtype,
        num_classes=signature.num_classes,
        registration_id=registration.registration_id,
        artifact_key=f"{model_prefix(app_id, model_name)}source.onnx",
        inputs=list(signature.inputs),
        preprocessing=recipe,
    )
    return registration, model


def _same_inputs(served: list[TensorSpec], offered: list[TensorSpec]) -> bool:
    """Whether a model takes the inputs its app's models take: the same shapes and dtypes, and
    the same names where there are several (a batch's fields are matched to inputs by name; a
    one-input model's batch is a plain array, whatever its input is called)."""
    if len(served) != len(offered):
        return False
    if len(served) == 1:
        return (list(served[0].shape), served[0].dtype) == (list(offered[0].shape), offered[0].dtype)
    return [(s.name, list(s.shape), s.dtype) for s in served] == [
        (o.name, list(o.shape), o.dtype) for o in offered
    ]


def _describe(specs: list[TensorSpec]) -> str:
    """``input_ids int64 [128], attention_mask int64 [128]``."""
    return ", ".join(f"{s.name} {s.dtype} [{', '.join(map(str, s.shape))}]" for s in specs)
