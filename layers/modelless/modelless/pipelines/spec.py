"""A pipeline: a small DAG over an app's registered models, served under one end-to-end latency
SLO (InferLine; docs/PIPELINES.md).

Stages name models; edges say which stage runs after which, always or on a condition over the
source stage's answer (its class scores): its top-class confidence below a threshold (a cheap
model that calls an expensive one when unsure), or its predicted class in a set. A stage with
several outgoing edges fans out. A stage runs when one of its incoming edges is taken; it is fed
the pipeline's request, or the outputs of the predecessor it names as ``input``.

A spec is checked on its own here (``validate``); that its models exist is the service's check.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from modelless.exceptions import InvalidInputError
from modelless.numbers import Accuracy, LatencyMs, Probability
from modelless.validation import NAME_SCHEMA, check_name

REQUEST_INPUT = "request"  # a stage fed the pipeline's own inputs
MAX_STAGES = 16  # "small": the planner enumerates latency splits over them


class ConditionKind(StrEnum):
    ALWAYS = "always"
    CONFIDENCE_BELOW = "confidence_below"  # the source's top-class probability < threshold
    PREDICTED_IN = "predicted_in"  # the source's predicted class is one of ``classes``


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: ConditionKind = ConditionKind.ALWAYS
    threshold: Probability | None = Field(default=None, description="for confidence_below")
    classes: list[Annotated[int, Field(ge=0, strict=True)]] | None = Field(
        default=None, description="for predicted_in"
    )

    def holds(self, scores: np.ndarray) -> bool:
        """Whether the edge is taken for an online answer of class scores [rows, classes]: when
        the condition holds for any of its rows (a query's rows go through the pipeline together)."""
        return bool(self.holds_per_row(scores).any())

    def holds_per_row(self, scores: np.ndarray) -> np.ndarray:
        """Per row of class scores [rows, classes], whether the condition holds (an offline job
        routes each row on its own)."""
        rows = np.atleast_2d(np.asarray(scores, dtype=np.float64))
        if self.kind is ConditionKind.ALWAYS:
            return np.ones(rows.shape[0], dtype=bool)
        if self.kind is ConditionKind.CONFIDENCE_BELOW:
            assert self.threshold is not None
            below: np.ndarray = class_probabilities(rows).max(axis=1) < self.threshold
            return below
        assert self.classes is not None
        chosen: np.ndarray = np.isin(rows.argmax(axis=1), self.classes)
        return chosen


class Edge(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(json_schema_extra=NAME_SCHEMA, description="a stage's name")
    target: str = Field(json_schema_extra=NAME_SCHEMA, description="a stage's name")
    when: Condition = Field(default_factory=Condition)

    @property
    def key(self) -> str:
        return f"{self.source}->{self.target}"


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(json_schema_extra=NAME_SCHEMA)
    model: str = Field(json_schema_extra=NAME_SCHEMA, description="a model registered in the pipeline's app")
    input: str = Field(
        default=REQUEST_INPUT,
        description="'request' (the pipeline's inputs) or the name of a predecessor whose outputs feed it",
    )
    accuracy: Accuracy | None = Field(
        default=None, description="this stage's accuracy floor (default: the pipeline's)"
    )


class PipelineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(json_schema_extra=NAME_SCHEMA)
    stages: list[Stage] = Field(min_length=1, max_length=MAX_STAGES)
    edges: list[Edge] = Field(default_factory=list)
    latencySlo: LatencyMs = Field(description="end-to-end latency SLO, ms")
    accuracy: Accuracy = Field(default=0.0, description="accuracy floor of every stage")

    def validate_dag(self) -> None:
        """The checks a schema cannot make: names, edges over known stages, no cycle, one entry,
        a stage's input among its predecessors, a condition's parameters. ``InvalidInputError``."""
        check_name("name", self.name)
        names = [stage.name for stage in self.stages]
        for name in names:
            check_name("stage name", name)
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise InvalidInputError(f"stage names must be unique: {duplicates} repeat", stages=duplicates)
        for stage in self.stages:
            check_name("model", stage.model)
        known = set(names)
        seen_edges: set[str] = set()
        for edge in self.edges:
            for end in (edge.source, edge.target):
                if end not in known:
                    raise InvalidInputError(f"edge {edge.key} names an unknown stage {end!r}", edge=edge.key)
            if edge.source == edge.target:
                raise InvalidInputError(f"edge {edge.key} loops on its stage", edge=edge.key)
            if edge.key in seen_edges:
                raise InvalidInputError(f"edge {edge.key} is given twice", edge=edge.key)
            seen_edges.add(edge.key)
            _check_condition(edge)
        entries = [n for n in names if not self.predecessors(n)]
        if len(entries) != 1:
            raise InvalidInputError(
                f"a pipeline has exactly one entry stage (one with no incoming edge); got {entries}",
                entries=entries,
            )
        self.topological_order()  # raises on a cycle
        for stage in self.stages:
            if stage.input != REQUEST_INPUT and stage.input not in self.predecessors(stage.name):
                raise InvalidInputError(
                    f"stage {stage.name!r} takes its input from {stage.input!r}, which is not one of its "
                    f"predecessors {sorted(self.predecessors(stage.name))} (or 'request')",
                    stage=stage.name,
                )

    # --- the DAG's shape ----------------------------------------------------------------------
    @property
    def entry(self) -> str:
        return next(s.name for s in self.stages if not self.predecessors(s.name))

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def predecessors(self, name: str) -> set[str]:
        return {e.source for e in self.edges if e.target == name}

    def outgoing(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.source == name]

    def incoming(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.target == name]

    def topological_order(self) -> list[str]:
        """Stages in an order where every edge goes forward (Kahn; the spec's order breaks ties)."""
        indegree = {s.name: len(self.predecessors(s.name)) for s in self.stages}
        ready = [s.name for s in self.stages if indegree[s.name] == 0]
        order: list[str] = []
        while ready:
            name = ready.pop(0)
            order.append(name)
            for edge in self.outgoing(name):
                indegree[edge.target] -= 1
                if indegree[edge.target] == 0:
                    ready.append(edge.target)
        if len(order) != len(self.stages):
            cyclic = sorted(set(indegree) - set(order))
            raise InvalidInputError(f"the pipeline's edges form a cycle through {cyclic}", stages=cyclic)
        return order

    def longest_path_after(self, latency_ms: dict[str, float]) -> dict[str, float]:
        """Per stage, the largest sum of ``latency_ms`` over the stages on any path after it (0
        for a sink): what a stage's budget must leave for those still to run."""
        after: dict[str, float] = {}
        for name in reversed(self.topological_order()):
            after[name] = max(
                (latency_ms[e.target] + after[e.target] for e in self.outgoing(name)), default=0.0
            )
        return after

    def paths(self) -> list[list[str]]:
        """Every path from the entry to a sink."""
        found: list[list[str]] = []

        def walk(path: list[str]) -> None:
            nexts = self.outgoing(path[-1])
            if not nexts:
                found.append(path)
            for edge in nexts:
                walk([*path, edge.target])

        walk([self.entry])
        return found

    def models(self) -> Iterable[str]:
        return dict.fromkeys(s.model for s in self.stages)


def _check_condition(edge: Edge) -> None:
    when = edge.when
    if when.kind is ConditionKind.CONFIDENCE_BELOW and when.threshold is None:
        raise InvalidInputError(f"edge {edge.key}: confidence_below needs a threshold", edge=edge.key)
    if when.kind is ConditionKind.PREDICTED_IN and not when.classes:
        raise InvalidInputError(
            f"edge {edge.key}: predicted_in needs a non-empty list of classes", edge=edge.key
        )
    if when.kind is not ConditionKind.CONFIDENCE_BELOW and when.threshold is not None:
        raise InvalidInputError(f"edge {edge.key}: a threshold is for confidence_below only", edge=edge.key)
    if when.kind is not ConditionKind.PREDICTED_IN and when.classes is not None:
        raise InvalidInputError(f"edge {edge.key}: classes are for predicted_in only", edge=edge.key)


def class_probabilities(scores: np.ndarray) -> np.ndarray:
    """Rows of class scores as probabilities: kept when they already are (non-negative, summing
    to 1), else softmaxed (logits)."""
    rows = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    if (rows >= 0).all() and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
        return rows
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities
