"""Model registration: validate at once, then generate and profile variants in the background.

Everything a caller can get wrong is checked before anything is written. The background part
runs variant generation and each profile in a fresh child process (never in the gateway), one
registration at a time so that concurrent profiling does not distort the measurements. A failure
removes every trace of the model from the store and the repository; the registration record
stays, marked failed, with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger

from modelless.config import Settings
from modelless.exceptions import InvalidModelError
from modelless.metadata.base import MetadataStore
from modelless.pools.catalog import PoolKind, PoolSpec
from modelless.repository.base import ModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from modelless.validation import check_name, inspect_model, load_valset

logger = Logger(service="registrar", child=True)


def model_prefix(app_id: str, model_name: str) -> str:
    return f"apps/{app_id}/{model_name}/"


def variant_id(app_id: str, model_name: str, recipe: str, pool: str) -> str:
    return f"{app_id}/{model_name}/{recipe}/{pool}"


class RegistrationService:
    def __init__(
        self,
        store: MetadataStore,
        repository: ModelRepository,
        settings: Settings,
        pools: Mapping[str, PoolSpec],
    ) -> None:
        self._store = store
        self._repository = repository
        self._settings = settings
        self._pools = pools
        # One registration at a time, so that concurrent profiles do not disturb each other.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="registrar")

    def register(self, app_id: str, model_name: str, model_bytes: bytes, valset_bytes: bytes) -> Registration:
        check_name("modelName", model_name)
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
        self._background.submit(self._generate_and_profile, model, registration)
        # A snapshot: the background thread goes on updating its own record.
        return Registration.from_json(registration.to_json())

    def _generate_and_profile(self, model: ModelRecord, registration: Registration) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="modelless-reg-") as tmp:
                variants = self._build_variants(model, registration, Path(tmp))
            registration.status = RegistrationStatus.READY
            registration.finished_at = time.time()
            registration.variant_ids = [v.variant_id for v in variants]
            registration.message = f"{len(variants)} variants profiled"
            ready = dataclasses.replace(model, ready=True)
            self._store.publish_variants(ready, variants, registration)
            logger.info("registration ready", extra={"model": model.model_name, "variants": len(variants)})
        except Exception as error:
            logger.exception("registration failed", extra={"model": model.model_name})
            self._undo(model)
            registration.status = RegistrationStatus.FAILED
            registration.finished_at = time.time()
            registration.message = f"{type(error).__name__}: {error}"
            self._store.put_registration(registration)

    def _build_variants(
        self, model: ModelRecord, registration: Registration, tmp: Path
    ) -> list[VariantProfile]:
        prefix = model_prefix(model.app_id, model.model_name)
        source = tmp / "source.onnx"
        source.write_bytes(self._repository.get(model.artifact_key))
        valset = tmp / "valset.npz"
        valset.write_bytes(self._repository.get(f"{prefix}valset.npz"))

        self._progress(
            registration, RegistrationStatus.GENERATING, "building optimised and quantised artifacts"
        )
        artifacts = {
            recipe: Path(path) for recipe, path in _run_step("build", source, tmp / "artifacts").items()
        }

        thread_counts = sorted({_threads(pool) for pool in self._pools.values()})
        registration.total = len(artifacts) * len(thread_counts)
        self._progress(registration, RegistrationStatus.PROFILING, "profiling variants")
        variants: list[VariantProfile] = []
        for recipe, path in sorted(artifacts.items()):
            key = f"{prefix}variants/{recipe}.onnx"
            self._repository.put(key, path.read_bytes())
            for threads in thread_counts:
                # Each profile in its own fresh process: its peak memory is the variant's own.
                measured = _run_step("measure", path, valset, threads, self._settings.profile_runs)
                registration.done += 1
                self._progress(
                    registration, RegistrationStatus.PROFILING, f"profiled {recipe} at {threads} thread(s)"
                )
                precision, opt_level = recipe.split("-", 1)
                for pool in self._pools.values():
                    if _threads(pool) != threads:
                        continue
                    variants.append(
                        VariantProfile(
                            variant_id=variant_id(model.app_id, model.model_name, recipe, pool.name),
                            app_id=model.app_id,
                            model_name=model.model_name,
                            pool=pool.name,
                            precision=precision,
                            opt_level=opt_level,
                            threads=threads,
                            artifact_key=key,
                            size_bytes=measured["size_bytes"],
                            load_latency_ms=measured["load_latency_ms"],
                            latency_p50_ms={int(b): t for b, t in measured["latency_p50_ms"].items()},
                            latency_p99_ms={int(b): t for b, t in measured["latency_p99_ms"].items()},
                            peak_memory_mb=measured["peak_memory_mb"],
                            accuracy=measured["accuracy"],
                            price_per_second=pool.instance_price_per_second(threads),
                            request_price=pool.request_price,
                            hardware=measured["hardware"],
                            # The embedded stack runs every CPU pool, Lambda's included, here.
                            measured_on_target=pool.device == "cpu",
                        )
                    )
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


def _threads(pool: PoolSpec) -> int:
    # Lambda's threads follow its memory size; a provisioned instance gets one vCPU of its worker.
    return pool.vcpus_per_worker if pool.kind is PoolKind.LAMBDA else 1


STEP_TIMEOUT_S = 600


def _run_step(command: str, *args: object) -> dict[str, Any]:
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
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result
