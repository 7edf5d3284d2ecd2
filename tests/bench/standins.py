"""Tiny stand-ins for the real zoo's models (never results): ONNX graphs made with onnx.helper, a
float image-like model of one input and a text-like model of two int64 inputs, with validation
and test sets, in the layout ``infra.zoo.real`` caches (model.onnx, valset.npz, testset.npz)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES = 10
IMAGE_SHAPE = (3, 8, 8)
TOKENS = 6


@dataclass(frozen=True)
class StandIn:
    """Shaped like ``infra.zoo.real.BuiltModel`` (what ``bench.real_zoo`` registers)."""

    name: str
    app: str
    onnx_path: Path
    valset_path: Path
    testset_path: Path
    manifest: dict[str, Any]

    @property
    def preprocessing(self) -> dict[str, Any] | None:
        return None


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def _labels(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The model's own answers, a fifth of them replaced at random: an accuracy near 0.8."""
    labels: np.ndarray = logits.argmax(axis=1)
    noisy = rng.random(len(labels)) < 0.2
    labels[noisy] = rng.integers(0, CLASSES, size=int(noisy.sum()))
    return labels.astype(np.int64)


def image_model(directory: Path, name: str = "tiny-image", app: str = "zoo-images", seed: int = 0) -> StandIn:
    """``input`` float32 [batch, 3, 8, 8] -> Flatten -> MatMul -> Add -> ``logits`` [batch, 10]."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    features = int(np.prod(IMAGE_SHAPE))
    weights = rng.normal(size=(features, CLASSES)).astype(np.float32)
    bias = rng.normal(size=CLASSES).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["input"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["scores"]),
            helper.make_node("Add", ["scores", "B"], ["logits"]),
        ],
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *IMAGE_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )
    _save(graph, directory / "model.onnx")
    for split, count in (("valset", 96), ("testset", 16)):
        inputs = rng.random((count, *IMAGE_SHAPE), dtype=np.float32)
        labels = _labels(inputs.reshape(count, -1) @ weights + bias, rng)
        np.savez(directory / f"{split}.npz", input=inputs, labels=labels)
    spec = {"name": "input", "shape": list(IMAGE_SHAPE), "dtype": "float32"}
    return StandIn(
        name,
        app,
        directory / "model.onnx",
        directory / "valset.npz",
        directory / "testset.npz",
        {
            "name": name,
            "app": app,
            "params": features * CLASSES + CLASSES,
            "inputs": [spec],
            "stand_in": True,
        },
    )


def text_model(directory: Path, name: str = "tiny-text", app: str = "zoo-text", seed: int = 1) -> StandIn:
    """``input_ids`` and ``attention_mask`` int64 [batch, 6] -> masked tokens as floats ->
    MatMul -> Add -> ``logits`` [batch, 10]."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    weights = rng.normal(size=(TOKENS, CLASSES)).astype(np.float32)
    bias = rng.normal(size=CLASSES).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["ids", "mask"], ["masked"]),
            helper.make_node("MatMul", ["masked", "W"], ["scores"]),
            helper.make_node("Add", ["scores", "B"], ["logits"]),
        ],
        name,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", TOKENS]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", TOKENS]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )
    _save(graph, directory / "model.onnx")
    for split, count in (("valset", 96), ("testset", 16)):
        ids = rng.integers(0, 20, size=(count, TOKENS)).astype(np.int64)
        mask = (rng.random((count, TOKENS)) < 0.8).astype(np.int64)
        labels = _labels((ids * mask).astype(np.float32) @ weights + bias, rng)
        np.savez(directory / f"{split}.npz", input_ids=ids, attention_mask=mask, labels=labels)
    specs = [{"name": n, "shape": [TOKENS], "dtype": "int64"} for n in ("input_ids", "attention_mask")]
    return StandIn(
        name,
        app,
        directory / "model.onnx",
        directory / "valset.npz",
        directory / "testset.npz",
        {"name": name, "app": app, "params": TOKENS * CLASSES + CLASSES, "inputs": specs, "stand_in": True},
    )
