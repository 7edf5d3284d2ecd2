"""Tiny real ONNX models for the query-input tests, built with onnx.helper: one that takes an image
(one float input [3, 4, 4]) and one that takes two int64 inputs (token ids and a mask, as a BERT
does), with numpy references for their outputs; and small PNG/JPEG files made with Pillow."""

from __future__ import annotations

import io
from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelless.types import ModelRecord, TensorSpec
from tests.models import classifier_onnx

IMAGE_SHAPE = (3, 4, 4)
IMAGE_CLASSES = 5
TOKENS = 4
TOKEN_CLASSES = 3
TOKEN_SPECS = [TensorSpec("ids", [TOKENS], "int64"), TensorSpec("mask", [TOKENS], "int64")]
IMAGE_SPEC = TensorSpec("input", list(IMAGE_SHAPE), "float32")
# The torchvision evaluation pipeline, at the image model's size.
IMAGE_RECIPE = {
    "kind": "image",
    "size": [4, 4],
    "resize": 6,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "scale": 255,
    "layout": "NCHW",
    "channels": "RGB",
}


@cache
def image_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    size = int(np.prod(IMAGE_SHAPE))
    return (
        rng.normal(0, 0.3, (size, IMAGE_CLASSES)).astype(np.float32),
        rng.normal(0, 0.1, IMAGE_CLASSES).astype(np.float32),
    )


@cache
def image_model() -> bytes:
    """input [batch, 3, 4, 4] float32 -> logits [batch, 5]."""
    return classifier_onnx(list(image_weights()), IMAGE_SHAPE)


def image_logits(batch: np.ndarray) -> np.ndarray:
    weights, bias = image_weights()
    flat = batch.reshape(len(batch), -1).astype(np.float64)
    logits: np.ndarray = flat @ weights + bias
    return logits


@cache
def token_weights() -> np.ndarray:
    return np.random.default_rng(3).normal(0, 0.5, (TOKENS, TOKEN_CLASSES)).astype(np.float32)


@cache
def token_model() -> bytes:
    """ids, mask [batch, 4] int64 -> logits [batch, 3] = float(ids * mask) @ W.

    The product is taken in int64 before the cast: an input reaching the model as anything but
    int64 (a float32 cast on the way) fails in onnxruntime rather than passing unnoticed."""
    nodes = [
        helper.make_node("Mul", ["ids", "mask"], ["masked"]),
        helper.make_node("Cast", ["masked"], ["masked_float"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["masked_float", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", TOKENS]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", TOKENS]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", TOKEN_CLASSES])],
        [numpy_helper.from_array(token_weights(), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized


def token_logits(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    masked = (ids.astype(np.int64) * mask.astype(np.int64)).astype(np.float32)
    logits: np.ndarray = masked @ token_weights()
    return logits


def token_inputs(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30_000, (rows, TOKENS), dtype=np.int64)
    mask = rng.integers(0, 2, (rows, TOKENS), dtype=np.int64)
    return ids, mask


def token_record(app_id: str = "app", model_name: str = "tokens", **changes: object) -> ModelRecord:
    values: dict[str, object] = {
        "app_id": app_id,
        "model_name": model_name,
        "input_name": "ids",
        "input_shape": [TOKENS],
        "input_dtype": "int64",
        "num_classes": TOKEN_CLASSES,
        "registration_id": f"reg-{model_name}",
        "artifact_key": f"apps/{app_id}/{model_name}/source.onnx",
        "ready": True,
        "inputs": list(TOKEN_SPECS),
        **changes,
    }
    return ModelRecord(**values)  # type: ignore[arg-type]


def image_record(
    app_id: str = "app", model_name: str = "images", preprocessing: dict[str, object] | None = None
) -> ModelRecord:
    return ModelRecord(
        app_id=app_id,
        model_name=model_name,
        input_name="input",
        input_shape=list(IMAGE_SHAPE),
        input_dtype="float32",
        num_classes=IMAGE_CLASSES,
        registration_id=f"reg-{model_name}",
        artifact_key=f"apps/{app_id}/{model_name}/source.onnx",
        ready=True,
        preprocessing=preprocessing,
    )


def picture(height: int = 6, width: int = 8, seed: int = 0) -> np.ndarray:
    """An RGB picture [height, width, 3] uint8."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def png_bytes(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_bytes(pixels: np.ndarray, quality: int = 95) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()
