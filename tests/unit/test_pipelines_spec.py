"""Pipeline specs: a DAG checked on its own (names, edges, one entry, no cycle, inputs among
predecessors, conditions' parameters), its shape (order, paths, budgets' look-ahead) and its
conditions over class scores."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from modelless.exceptions import InvalidInputError
from modelless.pipelines.spec import Condition, ConditionKind, PipelineSpec, class_probabilities


def spec(**overrides: Any) -> PipelineSpec:
    body: dict[str, Any] = {
        "name": "cascade",
        "stages": [{"name": "cheap", "model": "linear"}, {"name": "expensive", "model": "hidden"}],
        "edges": [
            {"source": "cheap", "target": "expensive", "when": {"kind": "confidence_below", "threshold": 0.9}}
        ],
        "latencySlo": 100.0,
        **overrides,
    }
    return PipelineSpec.model_validate(body)


DIAMOND = {
    "stages": [
        {"name": "a", "model": "m"},
        {"name": "b", "model": "m"},
        {"name": "c", "model": "m"},
        {"name": "d", "model": "m"},
    ],
    "edges": [
        {"source": "a", "target": "b"},
        {"source": "a", "target": "c"},
        {"source": "b", "target": "d"},
        {"source": "c", "target": "d"},
    ],
}


def test_a_valid_cascade_has_one_entry_and_an_order() -> None:
    cascade = spec()
    cascade.validate_dag()
    assert cascade.entry == "cheap"
    assert cascade.topological_order() == ["cheap", "expensive"]
    assert cascade.paths() == [["cheap", "expensive"]]


def test_a_fan_out_and_join_is_ordered_and_its_look_ahead_is_the_longest_path() -> None:
    diamond = spec(**DIAMOND)
    diamond.validate_dag()
    order = diamond.topological_order()
    assert order[0] == "a" and order[-1] == "d" and set(order[1:3]) == {"b", "c"}
    assert sorted(diamond.paths()) == [["a", "b", "d"], ["a", "c", "d"]]
    after = diamond.longest_path_after({"a": 1.0, "b": 5.0, "c": 2.0, "d": 3.0})
    assert after == {"d": 0.0, "b": 3.0, "c": 3.0, "a": 8.0}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"stages": [{"name": "a", "model": "m"}, {"name": "a", "model": "n"}], "edges": []}, "unique"),
        ({"edges": [{"source": "cheap", "target": "nowhere"}]}, "unknown stage"),
        ({"edges": [{"source": "cheap", "target": "cheap"}]}, "loops"),
        (
            {
                "edges": [
                    {"source": "cheap", "target": "expensive"},
                    {"source": "cheap", "target": "expensive"},
                ]
            },
            "twice",
        ),
        ({"edges": []}, "exactly one entry"),
        (
            {
                "stages": [
                    {"name": "a", "model": "m"},
                    {"name": "b", "model": "m"},
                    {"name": "c", "model": "m"},
                ],
                "edges": [
                    {"source": "a", "target": "b"},
                    {"source": "b", "target": "c"},
                    {"source": "c", "target": "b"},
                ],
            },
            "cycle",
        ),
        (
            {"edges": [{"source": "cheap", "target": "expensive", "when": {"kind": "confidence_below"}}]},
            "threshold",
        ),
        (
            {"edges": [{"source": "cheap", "target": "expensive", "when": {"kind": "predicted_in"}}]},
            "classes",
        ),
        (
            {
                "edges": [
                    {"source": "cheap", "target": "expensive", "when": {"kind": "always", "threshold": 0.5}}
                ]
            },
            "confidence_below only",
        ),
        (
            {
                "stages": [
                    {"name": "cheap", "model": "linear"},
                    {"name": "expensive", "model": "hidden", "input": "x"},
                ]
            },
            "predecessors",
        ),
        ({"name": "bad name!"}, "not valid"),
        ({"stages": [{"name": "a", "model": "bad/model"}], "edges": []}, "not valid"),
    ],
    ids=[
        "duplicate-stage",
        "unknown-stage",
        "self-loop",
        "duplicate-edge",
        "two-entries",
        "cycle",
        "no-threshold",
        "no-classes",
        "stray-threshold",
        "input-not-a-predecessor",
        "bad-name",
        "bad-model-name",
    ],
)
def test_an_invalid_dag_is_refused_with_a_clear_message(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        spec(**overrides).validate_dag()


@pytest.mark.parametrize(
    "overrides",
    [
        {"latencySlo": 0},
        {"latencySlo": -5},
        {"accuracy": 1.5},
        {"stages": []},
        {"extra": 1},
        {"edges": [{"source": "cheap", "target": "expensive", "when": {"kind": "sometimes"}}]},
        {
            "edges": [
                {"source": "cheap", "target": "expensive", "when": {"kind": "predicted_in", "classes": [-1]}}
            ]
        },
        {
            "edges": [
                {
                    "source": "cheap",
                    "target": "expensive",
                    "when": {"kind": "confidence_below", "threshold": 2},
                }
            ]
        },
    ],
    ids=[
        "zero-slo",
        "negative-slo",
        "accuracy-above-1",
        "no-stages",
        "extra-field",
        "unknown-kind",
        "negative-class",
        "threshold-above-1",
    ],
)
def test_a_malformed_spec_fails_its_schema(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        spec(**overrides)


def test_conditions_hold_over_any_row_of_class_scores() -> None:
    sure = np.array([[0.0, 10.0, 0.0]])  # logits: class 1, confident
    unsure = np.array([[1.0, 1.1, 0.9]])
    below = Condition(kind=ConditionKind.CONFIDENCE_BELOW, threshold=0.9)
    assert not below.holds(sure)
    assert below.holds(unsure)
    assert below.holds(np.vstack([sure, unsure]))  # one unsure row takes the edge
    in_set = Condition(kind=ConditionKind.PREDICTED_IN, classes=[1])
    assert in_set.holds(sure) and not in_set.holds(np.array([[5.0, 0.0, 0.0]]))
    assert Condition().holds(sure)


def test_probabilities_are_kept_and_logits_softmaxed() -> None:
    probabilities = np.array([[0.2, 0.8]])
    assert np.allclose(class_probabilities(probabilities), probabilities)
    softmaxed = class_probabilities(np.array([[0.0, np.log(3.0)]]))
    assert np.allclose(softmaxed, [[0.25, 0.75]])
