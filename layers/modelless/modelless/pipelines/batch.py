"""A pipeline over a batch of independent rows (an offline job's inputs): one stage-wise pass,
in which each stage runs once, on the rows its incoming edges let through.

Online, a query's rows travel together and an edge is taken when its condition holds for any of
them (``executor``); offline, every row is its own item, so each row takes its own path: the
entry stage runs on every row, a later stage on the rows for which one of its incoming edges was
taken, fed either the rows themselves or its ``input`` stage's outputs for them (a row that did
not reach that stage does not run it). A row's answer is that of the last stage, in topological
order, it ran — as online.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from modelless.pipelines.spec import REQUEST_INPUT, PipelineSpec

# Runs one stage on a batch of rows and returns its outputs, one row of class scores per row.
StageRunner = Callable[[str, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class BatchPass:
    outputs: list[np.ndarray]  # per row, the answering stage's output row
    answered_by: list[str]  # per row, the stage whose output is its answer
    ran: dict[str, np.ndarray]  # per stage, the indices of the rows it ran on
    branches: dict[str, tuple[int, int]]  # per edge: (rows whose source ran, rows that took it)


def run_batch(spec: PipelineSpec, rows: np.ndarray, run_stage: StageRunner) -> BatchPass:
    """Route ``rows`` through ``spec``, calling ``run_stage`` once per stage that some row
    reaches (never with an empty batch)."""
    count = int(rows.shape[0])
    order = spec.topological_order()
    outputs: dict[str, np.ndarray] = {}  # stage -> outputs, aligned with ran[stage]
    reached: dict[str, np.ndarray] = {}  # stage -> boolean mask over the rows
    branches: dict[str, tuple[int, int]] = {}
    for name in order:
        incoming = spec.incoming(name)
        if not incoming:
            mask = np.ones(count, dtype=bool)
        else:
            mask = np.zeros(count, dtype=bool)
            for edge in incoming:
                source_mask = reached[edge.source]
                if not source_mask.any():
                    continue
                taken = np.zeros(count, dtype=bool)
                taken[source_mask] = edge.when.holds_per_row(outputs[edge.source])
                branches[edge.key] = (int(source_mask.sum()), int(taken.sum()))
                mask |= taken
        stage = spec.stage(name)
        if stage.input != REQUEST_INPUT:
            mask &= reached[stage.input]  # fed by a stage the row never reached: it cannot run
        reached[name] = mask
        if not mask.any():
            continue
        if stage.input == REQUEST_INPUT:
            stage_rows = rows[mask]
        else:
            source_rows = np.flatnonzero(reached[stage.input])
            stage_rows = outputs[stage.input][np.isin(source_rows, np.flatnonzero(mask))]
        result = np.asarray(run_stage(name, np.ascontiguousarray(stage_rows, dtype=np.float32)))
        if result.shape[0] != stage_rows.shape[0]:
            raise ValueError(
                f"stage {name!r} answered {result.shape[0]} rows for a batch of {stage_rows.shape[0]}"
            )
        outputs[name] = result
    answers: list[np.ndarray] = []
    answered_by: list[str] = []
    position = {name: np.cumsum(mask) - 1 for name, mask in reached.items()}
    for row in range(count):
        last = next(name for name in reversed(order) if reached[name][row])
        answers.append(outputs[last][position[last][row]])
        answered_by.append(last)
    ran = {name: np.flatnonzero(mask) for name, mask in reached.items() if mask.any()}
    return BatchPass(answers, answered_by, ran, branches)
