"""A pipeline over a batch of independent rows (an offline job's): each stage runs once, on the
rows its incoming edges let through; each row answers with the last stage it reached."""

from __future__ import annotations

import numpy as np
import pytest

from modelless.pipelines.batch import run_batch
from modelless.pipelines.memory import InMemoryPipelineStore
from modelless.pipelines.spec import PipelineSpec


def spec(stages: list[dict[str, str]], edges: list[dict[str, object]]) -> PipelineSpec:
    built = PipelineSpec.model_validate({"name": "p", "stages": stages, "edges": edges, "latencySlo": 100.0})
    built.validate_dag()
    return built


def one_hot(classes: list[int], width: int = 3, confidence: float = 0.9) -> np.ndarray:
    rest = (1 - confidence) / (width - 1)
    rows = np.full((len(classes), width), rest)
    rows[np.arange(len(classes)), classes] = confidence
    return rows


class Recorder:
    """Stage runners that answer from a table per stage, keyed by the row's first value."""

    def __init__(self, answers: dict[str, dict[int, np.ndarray]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, list[float]]] = []

    def __call__(self, stage: str, rows: np.ndarray) -> np.ndarray:
        assert len(rows) > 0, "a stage is never run on an empty batch"
        self.calls.append((stage, [float(r.flat[0]) for r in rows]))
        return np.stack([self.answers[stage][int(r.flat[0])] for r in rows])


ROWS = np.arange(4, dtype=np.float32).reshape(4, 1)


def test_a_cascade_sends_only_unsure_rows_to_the_expensive_stage() -> None:
    cascade = spec(
        [{"name": "cheap", "model": "a"}, {"name": "expensive", "model": "b"}],
        [{"source": "cheap", "target": "expensive", "when": {"kind": "confidence_below", "threshold": 0.5}}],
    )
    sure, unsure = one_hot([0], confidence=0.9)[0], one_hot([1], confidence=0.4)[0]
    expensive = one_hot([2], confidence=0.99)[0]
    runner = Recorder(
        {"cheap": {0: sure, 1: unsure, 2: sure, 3: unsure}, "expensive": dict.fromkeys(range(4), expensive)}
    )

    routed = run_batch(cascade, ROWS, runner)

    assert runner.calls == [("cheap", [0, 1, 2, 3]), ("expensive", [1, 3])]
    assert routed.answered_by == ["cheap", "expensive", "cheap", "expensive"]
    np.testing.assert_allclose(routed.outputs[1], expensive)
    np.testing.assert_allclose(routed.outputs[2], sure)
    assert routed.branches == {"cheap->expensive": (4, 2)}
    assert list(routed.ran["expensive"]) == [1, 3]


def test_a_stage_fed_by_its_predecessor_gets_that_stages_outputs_for_its_rows_only() -> None:
    chain = spec(
        [{"name": "first", "model": "a"}, {"name": "second", "model": "b", "input": "first"}],
        [{"source": "first", "target": "second", "when": {"kind": "predicted_in", "classes": [1]}}],
    )
    # first predicts class 1 for odd rows and 2 for even ones (its first score tells the rows
    # apart); second answers ten times what it was fed.
    first = {r: np.array([0.1 * r, float(r % 2 == 1), 0.5 * float(r % 2 == 0)]) for r in range(4)}
    fed: list[np.ndarray] = []

    def run(stage: str, rows: np.ndarray) -> np.ndarray:
        if stage == "first":
            return np.stack([first[int(r[0])] for r in rows])
        fed.append(rows.copy())
        return rows * 10

    routed = run_batch(chain, ROWS, run)

    assert routed.answered_by == ["first", "second", "first", "second"]
    np.testing.assert_allclose(fed[0], np.stack([first[1], first[3]]).astype(np.float32))
    np.testing.assert_allclose(routed.outputs[3], first[3] * 10)


def test_fan_out_runs_each_branch_on_its_own_rows_and_unreached_stages_not_at_all() -> None:
    fan = spec(
        [{"name": "root", "model": "a"}, {"name": "left", "model": "b"}, {"name": "right", "model": "c"}],
        [
            {"source": "root", "target": "left", "when": {"kind": "predicted_in", "classes": [0]}},
            {"source": "root", "target": "right", "when": {"kind": "predicted_in", "classes": [2]}},
        ],
    )
    runner = Recorder(
        {
            "root": {r: one_hot([0])[0] for r in range(4)},
            "left": {r: np.array([5.0, 6.0]) for r in range(4)},  # a narrower stage: 2 classes
        }
    )

    routed = run_batch(fan, ROWS, runner)

    assert [call[0] for call in runner.calls] == ["root", "left"]  # no row predicts class 2
    assert routed.answered_by == ["left"] * 4
    assert routed.outputs[0].shape == (2,)
    assert routed.branches == {"root->left": (4, 4), "root->right": (4, 0)}
    assert "right" not in routed.ran


def test_a_stage_answering_the_wrong_number_of_rows_is_an_error() -> None:
    single = spec([{"name": "only", "model": "a"}], [])
    with pytest.raises(ValueError, match="answered 1 rows for a batch of 4"):
        run_batch(single, ROWS, lambda _, rows: rows[:1])


def test_branch_counts_add_up_over_queries_and_batches() -> None:
    store = InMemoryPipelineStore()
    store.count_branches("app", "p", {"a->b": True})
    store.add_branch_counts("app", "p", {"a->b": (10, 3)})
    counts = store.branches("app", "p")["a->b"]
    assert (counts.seen, counts.taken) == (11, 4)
