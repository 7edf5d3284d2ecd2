"""One group of an offline job's inputs, from their objects to their results: read and decoded
(concurrently), run in batches of the job's batch size (an input the prediction cache answers is
not run), each result written once, and only then the group's inputs marked done.

When and where a batch runs (the throttle, retries, the deadline) is the runner's: ``run_batch``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from modelless.cache.predictions import CachedPredictions
from modelless.exceptions import (
    InvalidInputError,
    ModellessError,
    NotFoundError,
    OfflineInputError,
    S3AccessDeniedError,
)
from modelless.inputs.bodies import check_batch
from modelless.metadata.base import OfflineJobStore
from modelless.offline.compute import batch_rows
from modelless.offline.decoding import decode_input
from modelless.offline.jobs import output_key
from modelless.offline.objects import ObjectStore
from modelless.offline.results import result_object
from modelless.offline.run_state import Decoded, RunnerConfig, RunState
from modelless.pipelines.batch import run_batch
from modelless.pipelines.spec import REQUEST_INPUT
from modelless.pipelines.store import PipelineStore
from modelless.selection import Candidates
from modelless.types import VariantProfile

# One inference run of the given rows on the given variant: the rows' outputs.
BatchRun = Callable[[RunState, VariantProfile, np.ndarray], np.ndarray]


class BatchRefused(Exception):
    """The worker refused a batch as bad input (4xx): its inputs are tried one by one.

    An exception, not a return value: a pipeline job's batch is refused from inside
    ``pipelines.batch.run_batch``, whose stage callback has no other way out."""

    def __init__(self, error: ModellessError) -> None:
        super().__init__(error.message)
        self.error = error


class GroupRunner:
    """Runs the groups of one runner's jobs (``process``: one group of one run)."""

    def __init__(
        self,
        store: OfflineJobStore,
        objects: ObjectStore,
        config: RunnerConfig,
        run_batch: BatchRun,
        *,
        variants: Callable[[str], list[VariantProfile]],
        predictions: CachedPredictions | None,
        pipelines: PipelineStore | None,
    ) -> None:
        self._store = store
        self._objects = objects
        self._config = config
        self._run_batch = run_batch
        self._variants = variants
        self._predictions = predictions
        self._pipelines = pipelines

    def process(self, state: RunState, group: list[str], io: ThreadPoolExecutor) -> None:
        """Read and decode the group, run it, write each result once, then mark it done."""
        job = state.job
        decoded: list[Decoded] = []
        outcomes: dict[str, tuple[str, str]] = {}
        for key, result in zip(group, io.map(lambda k: self._decode(state, k), group), strict=True):
            if isinstance(result, str):
                outcomes[key] = ("", result)
            else:
                decoded.append(Decoded(key, result))
        outputs = self._infer_cached(state, decoded)
        writes = [(item, out) for item, out in zip(decoded, outputs, strict=True) if not isinstance(out, str)]
        for item, out in zip(decoded, outputs, strict=True):
            if isinstance(out, str):
                outcomes[item.key] = ("", out)
        for (item, _), key in zip(
            writes, io.map(lambda w: self._write_result(state, *w), writes), strict=True
        ):
            outcomes[item.key] = (key, "")
        # Only now, with every result object in place, are the inputs marked done.
        added = self._store.mark_items(job.job_id, outcomes)
        state.report.processed += added
        state.report.failed += sum(1 for _, error in outcomes.values() if error)

    def _decode(self, state: RunState, key: str) -> np.ndarray | str:
        """The input's rows, or why it cannot be used."""
        try:
            data = self._objects.get(state.input_path.bucket, key)
        except NotFoundError:
            return "the object was deleted after the job started"
        except S3AccessDeniedError as error:
            return error.message
        if len(data) > self._config.max_input_bytes:
            return f"input of {len(data)} bytes exceeds the limit of {self._config.max_input_bytes}"
        try:
            return decode_input(key, data, state.model, self._config.max_rows_per_input)
        except OfflineInputError as error:
            return str(error)

    def _infer_cached(self, state: RunState, decoded: list[Decoded]) -> list[np.ndarray | str]:
        """``_infer``, with the prediction cache online queries share: an input whose every row
        is cached for the job's model, by a variant the job's targets admit (as selection would
        for an online query with them), is answered from it; the rest run, and their rows are
        cached under the model's generation (its registration id as this run read it)."""
        cache = self._predictions
        if cache is None or not decoded:
            return self._infer(state, decoded)
        job, model = state.job, state.model
        if state.pipeline is not None:
            # Rows are cached per model; a pipeline's answer is per row of several models (not
            # cached: its stages' rows would need a cache entry of their own each).
            return self._infer(state, decoded)
        if state.cache_admits is None:
            admitted = Candidates(self._variants(job.app_id)).subset(job.min_accuracy, job.model_name)
            state.cache_admits = frozenset(v.variant_id for v in admitted)
        generations = {model.model_name: model.registration_id}
        digests = [cache.digests(item.rows) for item in decoded]
        hits = cache.find_each(job.app_id, generations, digests, state.cache_admits.__contains__)
        missed = [index for index, hit in enumerate(hits) if hit is None]
        ran = iter(self._infer(state, [decoded[index] for index in missed]))
        results: list[np.ndarray | str] = []
        computed: list[np.ndarray] = []
        computed_digests: list[str] = []
        for item, hit, item_digests in zip(decoded, hits, digests, strict=True):
            if hit is not None:
                item.cached_by = hit.variant_ids[0]
                results.append(hit.outputs)
                continue
            out = next(ran)
            results.append(out)
            if not isinstance(out, str):
                computed.append(out)
                computed_digests.extend(item_digests)
        if computed:
            cache.remember(
                job.app_id,
                model.model_name,
                model.registration_id,
                computed_digests,
                np.concatenate(computed),
                state.variant.variant_id,
            )
        cache.count(hits=len(decoded) - len(missed), misses=len(missed))
        return results

    def _infer(self, state: RunState, decoded: list[Decoded]) -> list[np.ndarray | str]:
        """Each input's output rows (or why the worker refused it): the group's rows run in
        batches of ``job.batch`` rows."""
        if not decoded:
            return []
        try:
            outputs = self._run_all(state, decoded, np.concatenate([d.rows for d in decoded]))
        except BatchRefused as refused:
            if len(decoded) == 1:
                return [f"the worker refused the input: {refused.error.message}"]
            # One bad input must not fail the others: each is tried alone.
            return [out for item in decoded for out in self._infer(state, [item])]
        split: list[np.ndarray | str] = []
        offset = 0
        for item in decoded:
            split.append(outputs[offset : offset + len(item.rows)])
            offset += len(item.rows)
        return split

    def _run_all(self, state: RunState, decoded: list[Decoded], rows: np.ndarray) -> np.ndarray:
        """The rows' outputs from the job's variant; for a pipeline job, each row's answer from
        one stage-wise pass over the DAG (``pipelines.batch``), whose stages' answered rows are
        noted on the inputs; their outputs are padded with NaN to the widest stage's width."""
        if state.pipeline is None:
            return self._run_rows(state, rows, state.variant, state.job.batch)
        stages = state.stages
        pipeline = state.pipeline

        def run_stage(name: str, stage_rows: np.ndarray) -> np.ndarray:
            stage = stages[name]
            if pipeline.stage(name).input != REQUEST_INPUT:
                try:  # a predecessor's outputs, as the stage's model takes them
                    stage_rows = check_batch(stage_rows, stage.model, len(stage_rows))
                except InvalidInputError as error:
                    error.within(f"stage {name!r} cannot take its input stage's outputs")
                    raise BatchRefused(error) from error
            batch = batch_rows(stage.variant, self._config.max_rows, self._config.run_ms)
            return self._run_rows(state, stage_rows, stage.variant, batch)

        routed = run_batch(pipeline, rows, run_stage)
        if self._pipelines is not None:
            self._pipelines.add_branch_counts(state.job.app_id, pipeline.name, routed.branches)
        offset = 0
        for item in decoded:
            item.answered_by = routed.answered_by[offset : offset + len(item.rows)]
            offset += len(item.rows)
        width = max(len(row) for row in routed.outputs)
        padded = np.full((len(routed.outputs), width), np.nan)
        for index, row in enumerate(routed.outputs):
            padded[index, : len(row)] = row
        return padded

    def _run_rows(self, state: RunState, rows: np.ndarray, variant: VariantProfile, batch: int) -> np.ndarray:
        step = max(1, batch)
        parts = [
            self._run_batch(state, variant, rows[start : start + step]) for start in range(0, len(rows), step)
        ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _write_result(self, state: RunState, item: Decoded, outputs: np.ndarray) -> str:
        """The input's result object, written once (a rerun finds its own and writes no copy)."""
        key = output_key(state.input_path.prefix, state.output_path.prefix, item.key)
        data = result_object(state, item, outputs)
        self._objects.put_once(state.output_path.bucket, key, data, state.job.job_id, "application/json")
        return key
