"""Small real ONNX classifiers for tests, built with onnx.helper (no torch, no downloads).

They are trained here in closed form on scikit-learn's bundled digits, so accuracy is real.
"""

from __future__ import annotations

import io
from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    inputs = (data.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return inputs, data.target.astype(np.int64)


def fit_linear(
    inputs: np.ndarray, labels: np.ndarray, ridge: float = 1.0, hidden: int = 0
) -> list[np.ndarray]:
    """Ridge regression onto one-hot labels, optionally on random ReLU features (a 2-layer net)."""
    flat = inputs.reshape(len(inputs), -1).astype(np.float64)
    layers: list[np.ndarray] = []
    features = flat
    if hidden:
        rng = np.random.default_rng(0)
        w1 = rng.normal(0, 1 / np.sqrt(flat.shape[1]), (flat.shape[1], hidden))
        layers.append(w1)
        features = np.maximum(flat @ w1, 0)
    targets = np.eye(10)[labels]
    design = np.hstack([features, np.ones((len(features), 1))])
    solution = np.linalg.solve(design.T @ design + ridge * np.eye(design.shape[1]), design.T @ targets)
    layers += [solution[:-1], solution[-1]]
    return [layer.astype(np.float32) for layer in layers]


def classifier_onnx(layers: list[np.ndarray], input_shape: tuple[int, ...] = (1, 8, 8)) -> bytes:
    """Flatten -> [MatMul -> Relu ->] MatMul -> Add, with a dynamic batch dimension."""
    nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1)]
    initializers = []
    current = "flat"
    if len(layers) == 3:
        initializers.append(numpy_helper.from_array(layers[0], "w_hidden"))
        nodes += [
            helper.make_node("MatMul", [current, "w_hidden"], ["hidden_pre"]),
            helper.make_node("Relu", ["hidden_pre"], ["hidden"]),
        ]
        current = "hidden"
    weights, bias = layers[-2], layers[-1]
    initializers += [numpy_helper.from_array(weights, "w_out"), numpy_helper.from_array(bias, "b_out")]
    nodes += [
        helper.make_node("MatMul", [current, "w_out"], ["scores"]),
        helper.make_node("Add", ["scores", "b_out"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *input_shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", weights.shape[1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized


@cache
def linear_model() -> bytes:
    inputs, labels = digits()
    return classifier_onnx(fit_linear(inputs[:1200], labels[:1200]))


@cache
def hidden_model() -> bytes:
    inputs, labels = digits()
    return classifier_onnx(fit_linear(inputs[:1200], labels[:1200], hidden=512))


def valset_npz(count: int = 200) -> bytes:
    inputs, labels = digits()
    buffer = io.BytesIO()
    np.savez(buffer, inputs=inputs[-count:], labels=labels[-count:])
    return buffer.getvalue()


WIDE_HIDDEN = 131072  # 32 MB of weights, beyond the caches: one run is bound by reading them


@cache
def wide_model() -> bytes:
    """A one-hidden-layer classifier wide enough that a run costs a few ms, most of it a fixed
    cost per run (reading the weights from memory): the kind of model batching is for."""
    rng = np.random.default_rng(0)
    return classifier_onnx(
        [
            rng.normal(0, 0.1, (64, WIDE_HIDDEN)).astype(np.float32),
            rng.normal(0, 0.1, (WIDE_HIDDEN, 10)).astype(np.float32),
            np.zeros(10, dtype=np.float32),
        ]
    )


@cache
def slow_model(side: int = 512, channels: int = 32, layers: int = 48) -> bytes:
    """A classifier that is genuinely slow to run and small to store: the digit upsampled to
    ``side`` x ``side`` inside the graph, then ``layers`` 3x3 convolutions of ``channels``
    channels (~2.4 GFLOP each at the defaults: about 950 ms a row on one thread and 490 ms on
    two, on the 2-core VM; 256 x 256 and 12 layers took 30 ms on two threads there, and once made
    a 150 ms target it was meant to miss). Its weights are random: for tests of what a slow model
    does to serving, not of its answers."""
    rng = np.random.default_rng(0)
    scale = side / 8
    initializers = [
        numpy_helper.from_array(np.array([1.0, 1.0, scale, scale], dtype=np.float32), "scales"),
        numpy_helper.from_array(rng.normal(0, 0.3, (channels, 1, 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, (channels, 10)).astype(np.float32), "w_out"),
    ]
    nodes = [
        helper.make_node("Resize", ["input", "", "scales"], ["big"], mode="nearest"),
        helper.make_node("Conv", ["big", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
    ]
    current = "r0"
    for layer in range(1, layers):
        weights = rng.normal(0, 0.1, (channels, channels, 3, 3)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weights, f"w{layer}"))
        nodes += [
            helper.make_node("Conv", [current, f"w{layer}"], [f"c{layer}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{layer}"], [f"r{layer}"]),
        ]
        current = f"r{layer}"
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w_out"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "slow_classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized
