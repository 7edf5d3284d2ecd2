"""The objects an offline job writes: one result per input, and the job's summary at its end.
Pure functions of the run's state: where they are written, and how (once), is the runner's.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from modelless.offline.jobs import RESULT_SUFFIX
from modelless.offline.run_state import Decoded, RunState

MAX_SUMMARY_ERRORS = 1000  # the summary names at most this many failed inputs (the count is exact)


def result_object(state: RunState, item: Decoded, outputs: np.ndarray) -> bytes:
    """One input's result: its predictions and outputs, and what computed them."""
    job = state.job
    values = np.asarray(outputs, dtype=np.float64)
    body: dict[str, Any] = {
        "input": state.input_path.url_of(item.key),
        "job": job.job_id,
        "model": state.variant.model_name,
        "variant": item.cached_by or state.variant.variant_id,
        "cached": item.cached_by is not None,
    }
    if state.pipeline is not None and item.answered_by is not None:
        # Each row's answer is its answering stage's outputs (rows of stages with fewer
        # classes were padded with NaN for the batch: the padding is not theirs).
        rows = [row[~np.isnan(row)] for row in values]
        body |= {
            "pipeline": state.pipeline.name,
            "answeredBy": item.answered_by,
            "stages": {
                name: {"model": s.variant.model_name, "variant": s.variant.variant_id}
                for name, s in state.stages.items()
            },
            "predictions": [int(np.argmax(row)) for row in rows],
            "outputs": [row.round(6).tolist() for row in rows],
        }
        del body["model"], body["variant"]
    else:
        body |= {
            "predictions": np.argmax(values, axis=1).astype(int).tolist(),
            "outputs": values.round(6).tolist(),
        }
    return json.dumps(body, sort_keys=True).encode()


def summary_object(state: RunState, done: int, failed: int, errors: dict[str, str], now: float) -> bytes:
    """The job's summary: what was asked, what ran it, what succeeded and what failed (``errors``:
    some failed inputs, at most MAX_SUMMARY_ERRORS, with why)."""
    job = state.job
    summary: dict[str, Any] = {
        "jobId": job.job_id,
        "appID": job.app_id,
        "inputPath": job.input_path,
        "outputPath": job.output_path,
        "source": job.source,
        "model": state.variant.model_name,
        "variant": state.variant.variant_id,
        "variantAccuracy": state.variant.accuracy,
        "requested": {
            "accuracy": job.min_accuracy,
            "modelName": job.model_name,
            "pipeline": job.pipeline,
        },
        "total": job.total,
        "succeeded": done - failed,
        "failed": failed,
        "errors": [{"input": state.input_path.url_of(k), "error": v} for k, v in errors.items()],
        "errorsTruncated": failed > len(errors),
        "startedAt": job.started_at,
        "finishedAt": now,
        "runs": job.runs,
        "resultSuffix": RESULT_SUFFIX,
    }
    if state.pipeline is not None:
        summary["pipeline"] = state.pipeline.name
        summary["stages"] = {
            name: {
                "model": s.variant.model_name,
                "variant": s.variant.variant_id,
                "accuracy": s.variant.accuracy,
            }
            for name, s in state.stages.items()
        }
    return json.dumps(summary, indent=2, sort_keys=True).encode()
