"""onnxruntime inference of variants: the one code path used by pool workers, the Lambda tier
(``functions/cpu_worker``) and the profiler.

Payloads are the Lambda invocation contract: ``{"variant": <profile JSON string>, "inputs_npy_b64": ...}``
in, ``{"outputs_npy_b64": ..., "inference_ms": ..., "load_ms": ..., "queue_ms": ...}`` out.
Arrays travel as ``.npy`` bytes, read with ``allow_pickle=False``: nothing is ever unpickled.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from modelless.exceptions import InvalidInputError
from modelless.repository.base import ModelRepository, fetch_to_cache
from modelless.types import VariantProfile

if TYPE_CHECKING:
    # Imported where a session is made: the gateway and the offline function use this module's
    # payload helpers only, and their Lambda packages leave onnxruntime out.
    import onnxruntime as ort


def encode_array(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def invocation_payload(
    variant: VariantProfile, inputs: np.ndarray, correlation_id: str, deadline_ms: float | None = None
) -> dict[str, Any]:
    """The one request shape for a worker and for the Lambda tier (the cpu_worker event)."""
    payload: dict[str, Any] = {
        "variant_id": variant.variant_id,
        "variant": variant.to_json(),
        "memory_mb": variant.memory_mb,  # picks the Lambda function (memory size) to run it
        "inputs_npy_b64": encode_array(inputs),
        "correlation_id": correlation_id,
    }
    if deadline_ms is not None:
        # What is left of the query's latency budget: a batching worker never holds it longer.
        payload["deadline_ms"] = deadline_ms
    return payload


def decode_array(encoded: str) -> np.ndarray:
    try:
        raw = base64.b64decode(encoded, validate=True)
        array: np.ndarray = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise InvalidInputError(f"inputs are not a valid base64 .npy array: {error}") from error
    return array


def make_session(model_path: Path | str, threads: int) -> ort.InferenceSession:
    """A CPU session for an artifact that was optimised offline at its variant's level.

    Artifacts are saved already optimised, so the session must not optimise them again: that
    would erase the difference between optimisation levels that the variants stand for.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=options, providers=available_providers())


def available_providers() -> list[str]:
    # The GPU pool's workers use CUDA where a device exists; everywhere else the CPU provider.
    import onnxruntime as ort

    preferred = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    present = set(ort.get_available_providers())
    return [p for p in preferred if p in present]


@dataclass
class LoadedVariant:
    variant: VariantProfile
    session: ort.InferenceSession
    input_name: str
    lock: threading.Lock  # one run at a time per instance: its threads are all it may use
    load_ms: float


class VariantRuntime:
    """Loads variants on demand from the model repository and runs them."""

    def __init__(self, repository: ModelRepository, cache_dir: Path) -> None:
        self._repository = repository
        self._cache_dir = cache_dir
        self._loaded: dict[str, LoadedVariant] = {}
        self._load_lock = threading.Lock()

    @property
    def loaded_ids(self) -> list[str]:
        return list(self._loaded)

    def ensure_loaded(self, variant: VariantProfile) -> tuple[LoadedVariant, float]:
        """Return the loaded instance and the load time this call paid (0 when already loaded)."""
        found = self._loaded.get(variant.variant_id)
        if found is not None:
            return found, 0.0
        with self._load_lock:
            found = self._loaded.get(variant.variant_id)
            if found is not None:
                return found, 0.0
            started = time.perf_counter()
            path = fetch_to_cache(self._repository, variant.artifact_key, self._cache_dir)
            session = make_session(path, variant.threads)
            load_ms = (time.perf_counter() - started) * 1000
            loaded = LoadedVariant(variant, session, session.get_inputs()[0].name, threading.Lock(), load_ms)
            self._loaded[variant.variant_id] = loaded
            return loaded, load_ms

    def unload(self, variant_id: str) -> bool:
        return self._loaded.pop(variant_id, None) is not None

    def infer(self, variant: VariantProfile, inputs: np.ndarray) -> dict[str, Any]:
        loaded, load_ms = self.ensure_loaded(variant)
        queued = time.perf_counter()
        with loaded.lock:
            started = time.perf_counter()
            outputs = loaded.session.run(None, {loaded.input_name: inputs})[0]
            finished = time.perf_counter()
        return {
            "outputs": outputs,
            "batch": int(inputs.shape[0]),
            "load_ms": load_ms,
            "queue_ms": (started - queued) * 1000,
            "inference_ms": (finished - started) * 1000,
        }

    def handle_invocation(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Serve one invocation payload (the Lambda event and the worker's request body)."""
        variant = VariantProfile.from_json(payload["variant"])
        inputs = decode_array(payload["inputs_npy_b64"]).astype(np.float32, copy=False)
        result = self.infer(variant, inputs)
        return {
            "outputs_npy_b64": encode_array(result.pop("outputs")),
            **result,
        }
