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

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.config import Settings
from modelless.exceptions import InvalidInputError, InvalidModelError, NotFoundError, ServiceUnavailableError
from modelless.metadata.base import MetadataStore
from modelless.pools.catalog import Placement, PoolSpec, placements
from modelless.repository.base import ModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from modelless.validation import check_name, inspect_model, load_valset
from variants.pruning import prune_dominated
from variants.recipes import ACCURACY_METRICS, Recipe

logger = Logger(service="registrar", child=True)


def model_prefix(app_id: str, model_name: str) -> str:
    return f"apps/{app_id}/{model_name}/"


def variant_id(app_id: str, model_name: str, recipe: str, pool: str) -> str:
    return f"{app_id}/{model_name}/{recipe}/{pool}"


@dataclass(frozen=True)
class RegistrationJob:
    """The background part of one registration: what the registrar function is invoked with."""

    registration_id: str
    app_id: str
    model_name: str
    metric: str = "top1"
    correlation_id: str = ""

    def to_event(self) -> dict[str, str]:
        return {
            "registrationId": self.registration_id,
            "appID": self.app_id,
            "modelName": self.model_name,
            "metric": self.metric,
            "correlationId": self.correlation_id,
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
        )


# Hands a registration's background part to whatever runs it; raising means it was not handed on.
RegistrationLauncher = Callable[[RegistrationJob], None]


class LambdaRegistrationLauncher:
    """In AWS: an asynchronous ``lambda:Invoke`` (InvocationType ``Event``) of the registrar."""

    def __init__(self, function_name: str, client: Any | None = None) -> None:
        import boto3

        self._function = function_name
        self._lambda = client or boto3.client("lambda")

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
    ) -> None:
        """``launcher``: where the background part runs; None runs it in a thread of this process."""
        self._store = store
        self._repository = repository
        self._settings = settings
        self._pools = pools
        self._launcher = launcher
        # One registration at a time, so that concurrent profiles do not disturb each other.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="registrar")

    def register(
        self,
        app_id: str,
        model_name: str,
        model_bytes: bytes,
        valset_bytes: bytes,
        metric: str = "top1",
        correlation_id: str = "",
    ) -> Registration:
        check_name("modelName", model_name)
        if metric not in ACCURACY_METRICS:
            raise InvalidInputError(f"metric {metric!r} is not one of {list(ACCURACY_METRICS)}")
        signature = inspect_model(model_bytes, self._settings.max_model_bytes)
        load_valset(valset_bytes, signature, self._settings.max_valset_bytes)

        siblings = self._store.list_models(app_id)
        if siblings and siblings[0].input_shape != signature.input_shape:
            # Model-less queries may land on any of the app's models: they must take the same input.
            raise InvalidModelError(
                f"app {app_id!r} serves inputs of shape {siblings[0].input_shape}; this model takes "
                f"{signature.input_shape}",
                expected=siblings[0].input_shape,
            )
        prefix = model_prefix(app_id, model_name)
        registration = Registration(
            registration_id=uuid.uuid4().hex,
            app_id=app_id,
            model_name=model_name,
            created_at=time.time(),
            message="queued for variant generation",
        )
        model = ModelRecord(
            app_id=app_id,
            model_name=model_name,
            input_name=signature.input_name,
            input_shape=signature.input_shape,
            input_dtype=signature.input_dtype,
            num_classes=signature.num_classes,
            registration_id=registration.registration_id,
            artifact_key=f"{prefix}source.onnx",
        )
        self._store.add_model(model, registration)  # ConflictError when the name is taken
        try:
            self._repository.put(model.artifact_key, model_bytes)
            self._repository.put(f"{prefix}valset.npz", valset_bytes)
        except Exception:
            self._undo(model)
            raise
        # A snapshot taken before the background part starts: it goes on updating its own record.
        snapshot = Registration.from_json(registration.to_json())
        if self._launcher is None:
            self._background.submit(self._generate_and_profile, model, registration, metric)
        else:
            job = RegistrationJob(registration.registration_id, app_id, model_name, metric, correlation_id)
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
        return snapshot

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
        self._generate_and_profile(model, registration, job.metric)
        return registration

    def _generate_and_profile(self, model: ModelRecord, registration: Registration, metric: str) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="modelless-reg-") as tmp:
                generated = self._build_variants(model, registration, Path(tmp), metric)
            variants, pruned = prune_dominated(generated)
            registration.status = RegistrationStatus.READY
            registration.finished_at = time.time()
            registration.variant_ids = sorted(v.variant_id for v in variants)
            registration.pruned = len(pruned)
            registration.message = (
                f"{len(generated)} variants generated and profiled; {len(pruned)} pruned as dominated "
                f"(slower, costlier and no more accurate than another of their pool); {len(variants)} kept"
            )
            ready = dataclasses.replace(model, ready=True)
            self._store.publish_variants(ready, variants, registration)
            logger.info(
                "registration ready",
                extra={"model": model.model_name, "variants": len(variants), "pruned": len(pruned)},
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

    def _build_variants(
        self, model: ModelRecord, registration: Registration, tmp: Path, metric: str
    ) -> list[VariantProfile]:
        prefix = model_prefix(model.app_id, model.model_name)
        source = tmp / "source.onnx"
        source.write_bytes(self._repository.get(model.artifact_key))
        valset = tmp / "valset.npz"
        valset.write_bytes(self._repository.get(f"{prefix}valset.npz"))
        with np.load(valset, allow_pickle=False) as data:
            examples = len(data["labels"])
        # Static INT8 calibrates on the first examples; every variant's accuracy is then measured
        # on the others, so that all accuracies are comparable and none is measured on its own
        # calibration data. Too small a set is kept whole and static INT8 skipped.
        calibration = (
            min(MAX_CALIBRATION_EXAMPLES, examples // 4) if examples >= MIN_EXAMPLES_TO_CALIBRATE else 0
        )

        self._progress(
            registration, RegistrationStatus.GENERATING, "building optimised and quantised artifacts"
        )
        build_args: list[object] = [source, tmp / "artifacts"]
        if calibration:
            build_args += ["--calibration", valset, "--calibration-count", calibration]
        artifacts = _run_step("build", *build_args)
        cpu_placements = [
            p for pool in self._pools.values() if pool.device == "cpu" for p in placements(pool)
        ]
        thread_counts = sorted({p.threads for p in cpu_placements})
        runnable = [a for a in artifacts if a["runs_on_cpu"]]
        registration.total = len(runnable) * len(thread_counts)
        self._progress(registration, RegistrationStatus.PROFILING, "profiling variants")

        variants: list[VariantProfile] = []
        for artifact in sorted(artifacts, key=lambda a: str(a["recipe"])):
            recipe = Recipe.parse(str(artifact["recipe"]))
            key = f"{prefix}variants/{recipe.name}.onnx"
            self._repository.put(key, Path(str(artifact["path"])).read_bytes())
            if not artifact["runs_on_cpu"]:
                continue  # kept for pools with the hardware; profiles come from where it runs
            # A cold load starts from the repository: time the fetch, add the session's start-up.
            fetch_started = time.perf_counter()
            self._repository.get(key)
            fetch_ms = (time.perf_counter() - fetch_started) * 1000
            for threads in thread_counts:
                # Each profile in its own fresh process: its memory is the variant's own.
                measured = _run_step(
                    "measure", artifact["path"], valset,
                    "--threads", threads, "--runs", self._settings.profile_runs,
                    "--metric", metric, "--accuracy-from", calibration,
                )  # fmt: skip
                registration.done += 1
                self._progress(
                    registration,
                    RegistrationStatus.PROFILING,
                    f"profiled {recipe.name} at {threads} thread(s)",
                )
                for placement in (p for p in cpu_placements if p.threads == threads):
                    variants.append(_profile(model, recipe, key, placement, measured, fetch_ms))
        return variants

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


def _profile(
    model: ModelRecord,
    recipe: Recipe,
    key: str,
    placement: Placement,
    measured: dict[str, Any],
    fetch_ms: float,
) -> VariantProfile:
    return VariantProfile(
        variant_id=variant_id(model.app_id, model.model_name, recipe.name, placement.name),
        app_id=model.app_id,
        model_name=model.model_name,
        pool=placement.pool.name,
        precision=recipe.precision,
        opt_level=recipe.opt_level,
        threads=placement.threads,
        artifact_key=key,
        size_bytes=measured["size_bytes"],
        load_latency_ms=round(measured["load_latency_ms"] + fetch_ms, 3),
        latency_p50_ms={int(b): t for b, t in measured["latency_p50_ms"].items()},
        latency_p99_ms={int(b): t for b, t in measured["latency_p99_ms"].items()},
        peak_memory_mb=measured["peak_memory_mb"],
        accuracy=measured["accuracy"],
        price_per_second=placement.price_per_second,
        request_price=placement.pool.request_price,
        hardware=measured["hardware"],
        # The embedded stack runs its CPU pools, Lambda's included, on this machine.
        measured_on_target=True,
        memory_mb=placement.memory_mb,
        saturation_qps=measured["saturation_qps"],
        max_useful_batch=measured["max_useful_batch"],
        accuracy_metric=measured["accuracy_metric"],
        accuracy_examples=measured["accuracy_examples"],
    )


STEP_TIMEOUT_S = 600
MAX_CALIBRATION_EXAMPLES = 128
MIN_EXAMPLES_TO_CALIBRATE = 40


def _run_step(command: str, *args: object) -> Any:
    """Run one ``python -m variants`` step in a child process and return its JSON answer."""
    completed = subprocess.run(
        [sys.executable, "-m", "variants", command, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"variant {command} step failed: {last}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
