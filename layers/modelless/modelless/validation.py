"""Checks on everything a caller sends: names, model files, validation sets and query inputs.

Each failure is a 4xx domain error that says what was wrong; nothing here writes anywhere.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelless.exceptions import InvalidInputError, InvalidModelError, PayloadTooLargeError
from modelless.types import ModelRecord

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FLOAT_TYPES = {1: "float32"}  # onnx.TensorProto.FLOAT (onnx is imported where a model is inspected)


def check_name(kind: str, value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise InvalidInputError(
            f"{kind} {value!r} is not valid: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit",
            field=kind,
        )
    return value


@dataclass(frozen=True)
class ModelSignature:
    input_name: str
    input_shape: list[int]  # without the batch dimension
    input_dtype: str
    num_classes: int


def inspect_model(data: bytes, max_bytes: int) -> ModelSignature:
    """Parse and check an ONNX classifier: one float input [batch, ...], one output [batch, classes]."""
    # Here, not at the top: only registration inspects models, and the functions that never do
    # (the offline function, the Lambda tier) leave onnx out of their packages.
    import onnx
    from google.protobuf.message import DecodeError

    if len(data) > max_bytes:
        raise PayloadTooLargeError(
            f"model file is {len(data)} bytes; the limit is {max_bytes}", limit=max_bytes
        )
    if not data:
        raise InvalidModelError("model file is empty")
    try:
        model = onnx.load_from_string(data)
        onnx.checker.check_model(model)
    except (DecodeError, onnx.checker.ValidationError, ValueError, RuntimeError) as error:
        raise InvalidModelError(f"model file is not a valid ONNX model: {_first_line(error)}") from error
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise InvalidModelError(
            "model must have exactly one input and one output; "
            f"it has {len(inputs)} and {len(model.graph.output)}"
        )
    tensor = inputs[0].type.tensor_type
    if tensor.elem_type not in FLOAT_TYPES:
        raise InvalidModelError(
            f"model input must be float32; it is {onnx.TensorProto.DataType.Name(tensor.elem_type)}"
        )
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    if len(dims) < 2 or any(d <= 0 for d in dims[1:]):
        raise InvalidModelError(
            f"model input must be [batch, fixed dims...]; it is {dims} (-1 = symbolic)", input_shape=dims
        )
    out_dims = [
        d.dim_value if d.HasField("dim_value") else -1
        for d in model.graph.output[0].type.tensor_type.shape.dim
    ]
    if len(out_dims) != 2 or out_dims[1] <= 0:
        raise InvalidModelError(
            f"model output must be [batch, classes]; it is {out_dims}", output_shape=out_dims
        )
    return ModelSignature(inputs[0].name, dims[1:], FLOAT_TYPES[tensor.elem_type], out_dims[1])


def load_valset(data: bytes, signature: ModelSignature, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``.npz`` with ``inputs`` [N, *input_shape] and integer ``labels`` [N]."""
    if len(data) > max_bytes:
        raise PayloadTooLargeError(
            f"validation set is {len(data)} bytes; the limit is {max_bytes}", limit=max_bytes
        )
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise InvalidModelError(
            f"validation set is not a readable .npz archive: {_first_line(error)}"
        ) from error
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise InvalidModelError("validation set must be an .npz archive with 'inputs' and 'labels'")
    try:
        with loaded as archive:
            missing = {"inputs", "labels"} - set(archive.files)
            if missing:
                raise InvalidModelError(
                    f"validation set lacks {sorted(missing)}; it has {sorted(archive.files)}"
                )
            inputs = archive["inputs"]
            labels = archive["labels"]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise InvalidModelError(
            f"validation set is not a readable .npz archive: {_first_line(error)}"
        ) from error
    # A member that is not .npy data comes back as raw bytes, not an array.
    if not isinstance(inputs, np.ndarray) or not isinstance(labels, np.ndarray):
        raise InvalidModelError("validation set members 'inputs' and 'labels' must be .npy arrays")
    if inputs.dtype.kind not in "fiu" or labels.dtype.kind not in "iu":
        raise InvalidModelError(
            f"validation inputs must be numeric and labels integers; got {inputs.dtype} and {labels.dtype}"
        )
    if inputs.ndim == 0:
        raise InvalidModelError("validation inputs must be an array [N, ...], not a single number")
    if len(inputs) == 0:
        raise InvalidModelError("validation set is empty")
    if list(inputs.shape[1:]) != signature.input_shape:
        raise InvalidModelError(
            f"validation inputs have shape {list(inputs.shape)}; "
            f"the model takes [N, {', '.join(map(str, signature.input_shape))}]",
            expected=signature.input_shape,
        )
    if labels.shape != (len(inputs),):
        raise InvalidModelError(
            f"labels have shape {list(labels.shape)}; expected [{len(inputs)}], one per input"
        )
    if labels.min() < 0 or labels.max() >= signature.num_classes:
        raise InvalidModelError(f"labels must lie in [0, {signature.num_classes}) for this model's output")
    as_float32 = inputs.astype(np.float32)
    if not np.isfinite(as_float32).all():
        raise InvalidModelError("validation inputs contain NaN or infinity, or values beyond float32's range")
    return as_float32, labels.astype(np.int64)


def query_inputs(raw: Any, model: ModelRecord, max_batch: int) -> np.ndarray:
    """Turn a query's ``inputs`` (nested lists) into a float32 batch the model accepts."""
    shape = ", ".join(map(str, model.input_shape))
    try:
        # No dtype forced here: strings must be refused, not silently parsed as numbers.
        array = np.asarray(raw)
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidInputError(
            f"inputs must be a numeric array of shape [{shape}] or [batch, {shape}]: {_first_line(error)}"
        ) from error
    return check_batch(array, model, max_batch)


def check_batch(array: np.ndarray, model: ModelRecord, max_batch: int) -> np.ndarray:
    expected = list(model.input_shape)
    dims = ", ".join(map(str, expected))
    takes = f"model {model.model_name!r} takes [{dims}] or [batch, {dims}]"
    if array.ndim == 0:
        raise InvalidInputError(f"inputs have no shape (a single value); {takes}", expected=expected, got=[])
    if array.dtype.kind not in "fiub":
        # 'O' arrives for ragged lists and integers too large for any machine type.
        raise InvalidInputError(
            f"inputs must be a regular numeric array; got {array.dtype} "
            "(strings, ragged nesting or out-of-range integers)"
        )
    if list(array.shape) == expected:
        array = array[np.newaxis, ...]
    if list(array.shape[1:]) != expected or array.ndim != len(expected) + 1:
        raise InvalidInputError(
            f"inputs have shape {list(array.shape)}; {takes}", expected=expected, got=list(array.shape)
        )
    if array.shape[0] == 0:
        raise InvalidInputError("inputs hold an empty batch")
    if array.shape[0] > max_batch:
        raise InvalidInputError(
            f"batch of {array.shape[0]} exceeds the limit of {max_batch}", limit=max_batch
        )
    as_float32 = array.astype(np.float32)
    # Checked after the cast: 1e39 is finite in float64 but reaches a float32 model as inf.
    if not np.isfinite(as_float32).all():
        raise InvalidInputError("inputs contain NaN or infinity, or values beyond float32's range")
    return as_float32


def check_targets(latency_ms: float | None, accuracy: float | None) -> None:
    if latency_ms is not None and (not math.isfinite(latency_ms) or latency_ms <= 0):
        raise InvalidInputError(f"latency must be a positive number of milliseconds; got {latency_ms}")
    if accuracy is not None and (not math.isfinite(accuracy) or not 0.0 <= accuracy <= 1.0):
        raise InvalidInputError(f"accuracy must lie in [0, 1]; got {accuracy}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
