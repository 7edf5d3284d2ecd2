"""onnxruntime inference of variants: the one code path used by pool workers, the Lambda tier
(``functions/cpu_worker``) and the profiler.

``VariantRuntime.serve`` is the one place an ``Invocation`` (``modelless.serving.invocation``) is run into
its ``Reply``: the Lambda tier calls it directly, a pool worker through its batcher when it
batches (``modelless.worker.server``). A batch keeps its dtype end to end (int64 token ids stay
int64); a model with several inputs gets a structured array, split into the session's feeds
only at ``session.run`` (``modelless.inputs.tensors``).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from modelless.exceptions import InvalidInputError
from modelless.inputs.tensors import from_feeds, to_feeds
from modelless.repository.base import ModelRepository, fetch_to_cache
from modelless.serving.invocation import Invocation, Reply
from modelless.tuning.base import ParallelConfig
from modelless.types import ModelRecord, VariantProfile

if TYPE_CHECKING:
    # Imported where a session is made: the gateway and the offline function use this module's
    # payload helpers only, and their Lambda packages leave onnxruntime out.
    import onnxruntime as ort


def warmup_invocation(variant: VariantProfile, contract: ModelRecord) -> Invocation:
    """A warm-up invocation of ``variant``: one row of zeros in its model's own input dtypes
    (``contract``: the model's record), so that the worker or container loads it."""
    zeros = from_feeds(
        {spec.name: np.zeros((1, *spec.shape), dtype=spec.dtype) for spec in contract.input_specs},
        contract.input_specs,
    )
    return Invocation(variant, zeros, f"warmup-{uuid.uuid4().hex}")


def make_session(model_path: Path | str, threads: int, inter_threads: int = 1) -> ort.InferenceSession:
    """A CPU session for an artifact that was optimised offline at its variant's level, with
    ``threads`` intra-op threads; ``inter_threads`` above 1 runs independent operators in
    parallel (onnxruntime's parallel execution mode) on that many inter-op threads.

    Artifacts are saved already optimised, so the session must not optimise them again: that
    would erase the difference between optimisation levels that the variants stand for.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = max(1, inter_threads)
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if inter_threads > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
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
    input_names: list[str]  # the session's inputs, in order: what ``to_feeds`` splits a batch into
    # Runs at once on this instance: its configuration's concurrency (one by default: its threads
    # are all it may use). An onnxruntime session may be run from several threads at once.
    lock: threading.Semaphore
    load_ms: float
    config: ParallelConfig = field(default_factory=ParallelConfig)


def default_config(variant: VariantProfile) -> ParallelConfig:
    """How an instance runs until tuned: its profile's threads, sequentially, one run at a time
    (what registration profiled it with)."""
    return ParallelConfig(intra=max(1, variant.threads))


def load_session(variant: VariantProfile, path: Path, config: ParallelConfig) -> LoadedVariant:
    """A new instance of ``variant`` from its cached artifact, run with ``config``."""
    started = time.perf_counter()
    session = make_session(path, config.intra, config.inter)
    load_ms = (time.perf_counter() - started) * 1000
    input_names = [declared.name for declared in session.get_inputs()]
    return LoadedVariant(
        variant, session, input_names, threading.BoundedSemaphore(config.concurrency), load_ms, config
    )


def run_session(loaded: LoadedVariant, batch: np.ndarray) -> np.ndarray:
    """The first output of one run of ``loaded`` on ``batch`` (a plain or a structured array).
    The caller holds the instance's lock."""
    try:
        feeds = to_feeds(batch, loaded.input_names)
    except ValueError as error:
        raise InvalidInputError(
            f"inputs do not fit variant {loaded.variant.variant_id}: {error}", inputs=loaded.input_names
        ) from error
    outputs: np.ndarray = loaded.session.run(None, feeds)[0]
    return outputs


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
            loaded = load_session(variant, path, default_config(variant))
            load_ms = (time.perf_counter() - started) * 1000
            loaded.load_ms = load_ms
            self._loaded[variant.variant_id] = loaded
            return loaded, load_ms

    def current(self, variant_id: str) -> LoadedVariant | None:
        """The loaded instance of ``variant_id`` now (None when not loaded)."""
        return self._loaded.get(variant_id)

    def build(self, current: LoadedVariant, config: ParallelConfig) -> LoadedVariant:
        """A new session of ``current``'s variant run with ``config``, beside the one in use (which
        serves meanwhile): ``swap`` puts it in its place."""
        variant = current.variant
        path = fetch_to_cache(self._repository, variant.artifact_key, self._cache_dir)
        return load_session(variant, path, config)

    def swap(self, current: LoadedVariant, fresh: LoadedVariant) -> bool:
        """Put ``fresh`` in the place of ``current``; False when ``current`` is no longer the
        loaded instance (unloaded or replaced meanwhile). The old session stays usable by whoever
        holds it: runs in flight on it finish there, and it is freed with its last reference."""
        with self._load_lock:
            if self._loaded.get(current.variant.variant_id) is not current:
                return False
            self._loaded[current.variant.variant_id] = fresh
        return True

    def unload(self, variant_id: str) -> bool:
        return self._loaded.pop(variant_id, None) is not None

    def serve(self, invocation: Invocation) -> Reply:
        """Run ``invocation`` (loading its variant on demand) under its instance's lock."""
        loaded, load_ms = self.ensure_loaded(invocation.variant)
        queued = time.perf_counter()
        with loaded.lock:
            started = time.perf_counter()
            outputs = run_session(loaded, invocation.inputs)
            finished = time.perf_counter()
        return Reply(
            outputs=outputs,
            batch=invocation.rows,
            load_ms=load_ms,
            queue_ms=(started - queued) * 1000,
            inference_ms=(finished - started) * 1000,
        )
