"""Checks on everything a caller sends: names, model files, validation sets and query inputs.

Each failure is a 4xx domain error that says what was wrong; nothing here writes anywhere.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from modelless.config import VALSET_UNPACK_FACTOR
from modelless.exceptions import InvalidInputError, InvalidModelError, PayloadTooLargeError, first_line
from modelless.inputs.archives import UNREADABLE, open_zip, read_npz_members
from modelless.inputs.tensors import from_feeds
from modelless.types import TensorSpec

if TYPE_CHECKING:
    import onnx

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The rule ``modelless.validation.check_name`` holds app, model and pipeline names to, stated in the
# schema only: the routes check it themselves (a 400 naming the field), and an app, model or
# pipeline whose name breaks it cannot exist, so a request naming one is refused either way.
NAME_SCHEMA: dict[str, Any] = {"pattern": NAME_PATTERN.pattern, "minLength": 1, "maxLength": 64}
# onnx.TensorProto element types a model input may have, by their numpy names (onnx itself is
# imported only where a model is inspected).
INPUT_TYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32"}
OUTPUT_TYPES = {1: "float32", 10: "float16"}
VALSET_INPUTS = "inputs"  # the validation set's member for a one-input model (or the input's name)
VALSET_LABELS = "labels"
MAX_MODEL_SETTING = "MODELLESS_MAX_MODEL_BYTES"
MAX_VALSET_SETTING = "MODELLESS_MAX_VALSET_BYTES"
MAX_VALSET_UNPACKED_SETTING = "MODELLESS_MAX_VALSET_UNPACKED_BYTES"
# Bounds on the numbers a caller states (query targets, imported profiles). Past them a number is
# a mistake, and the arithmetic it feeds (budgets, rates, costs) would overflow or lose meaning.
MAX_LATENCY_MS = 3_600_000.0  # an hour: no query waits longer, no variant takes longer to load
MIN_LATENCY_MS = 0.001  # a microsecond: a profiled latency below it is a unit mistake


def check_name(kind: str, value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise InvalidInputError(
            f"{kind} {value!r} is not valid: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit",
            field=kind,
        )
    return value


def too_large(what: str, limit: int, setting: str, size: int | None = None) -> PayloadTooLargeError:
    """The 413 for a file over its limit: names the setting that raises it."""
    measured = f"; it is {size} bytes" if size is not None else ""
    return PayloadTooLargeError(
        f"{what} exceeds {limit} bytes ({setting}){measured}", limit=limit, setting=setting
    )


@dataclass(frozen=True)
class ModelSignature:
    """What registration reads off a model: its inputs (each [batch, *shape]) and its classes."""

    inputs: tuple[TensorSpec, ...]
    num_classes: int

    @property
    def input_name(self) -> str:
        return self.inputs[0].name

    @property
    def input_shape(self) -> list[int]:
        return list(self.inputs[0].shape)

    @property
    def input_dtype(self) -> str:
        return self.inputs[0].dtype


def inspect_model(source: bytes | Path, max_bytes: int, setting: str = MAX_MODEL_SETTING) -> ModelSignature:
    """Parse and check an ONNX classifier: inputs [batch, fixed dims...] of float32, float16, int64
    or int32, one output [batch, classes]. ``source``: the model's bytes or a self-contained file."""
    size = source.stat().st_size if isinstance(source, Path) else len(source)
    if size > max_bytes:
        raise too_large("model file", max_bytes, setting, size)
    if size == 0:
        raise InvalidModelError("model file is empty")
    return model_signature(load_model(source))


def load_model(source: bytes | Path, check: bool = True) -> onnx.ModelProto:
    """The ONNX model in ``source``, checked unless ``check`` is False (a model whose external
    data is not loaded yet: ``modelless.registration.ingest`` loads it, then calls ``check_model``)."""
    # Here, not at the top: only registration inspects models, and the functions that never do
    # (the offline function, the Lambda tier) leave onnx out of their packages.
    import onnx
    from google.protobuf.message import DecodeError

    try:
        if isinstance(source, Path):
            model = onnx.load(str(source), load_external_data=False)
        else:
            model = onnx.load_from_string(source)
    except (DecodeError, ValueError, RuntimeError, OSError) as error:
        raise InvalidModelError(f"model file is not a valid ONNX model: {first_line(error)}") from error
    if check:
        check_model(model)
    return model


def check_model(model: onnx.ModelProto) -> None:
    """onnx's checker on a model held in memory; InvalidModelError with its first complaint."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as error:
        raise InvalidModelError(f"model file is not a valid ONNX model: {first_line(error)}") from error


def model_signature(model: onnx.ModelProto) -> ModelSignature:
    """The signature of a parsed, checked model; InvalidModelError says what it cannot serve."""
    import onnx

    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    outputs = list(model.graph.output)
    if not inputs or len(outputs) != 1:
        raise InvalidModelError(
            "model must have at least one input and exactly one output (class scores [batch, classes]); "
            f"it has {len(inputs)} inputs and {len(outputs)} outputs",
            outputs=[o.name for o in outputs],
        )
    specs: list[TensorSpec] = []
    for value in inputs:
        tensor = value.type.tensor_type
        if tensor.elem_type not in INPUT_TYPES:
            kind = onnx.TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "not a tensor"
            raise InvalidModelError(
                f"model input {value.name!r} is {kind}; inputs must be float32, float16, int64 or int32",
                input=value.name,
            )
        dims = _dims(tensor)
        if len(dims) < 2 or any(d <= 0 for d in dims[1:]):
            raise InvalidModelError(
                f"model input {value.name!r} must be [batch, fixed dims...]; it is {dims} (-1 = symbolic): "
                "only the batch dimension may vary (export a sequence model at a fixed length)",
                input=value.name,
                input_shape=dims,
            )
        if dims[0] > 0:
            # A model whose every input and output fixes the batch size is made dynamic by
            # modelless.registration.ingest; one that fixes it on some inputs only cannot be guessed right.
            raise InvalidModelError(
                f"model input {value.name!r} fixes the batch dimension at {dims[0]}; re-export with "
                f"dynamic_axes={{{value.name!r}: {{0: 'batch'}}}} (or dynamic_shapes)",
                input=value.name,
                input_shape=dims,
            )
        specs.append(TensorSpec(value.name, dims[1:], INPUT_TYPES[tensor.elem_type]))
    output = outputs[0].type.tensor_type
    out_dims = _dims(output)
    if len(out_dims) != 2 or out_dims[1] <= 0:
        raise InvalidModelError(
            f"model output must be [batch, classes]; it is {out_dims}", output_shape=out_dims
        )
    if output.elem_type not in OUTPUT_TYPES:
        raise InvalidModelError(
            f"model output must be float32 or float16 class scores; it is "
            f"{onnx.TensorProto.DataType.Name(output.elem_type)}"
        )
    return ModelSignature(tuple(specs), out_dims[1])


def _dims(tensor: onnx.TypeProto.Tensor) -> list[int]:
    """A tensor's dims, -1 for a symbolic (or unknown) one."""
    return [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]


@dataclass(frozen=True)
class ValidationSet:
    """A validation set read and checked against a model: one array per input, cast to its dtype."""

    arrays: dict[str, np.ndarray]  # input name -> [N, *shape]
    labels: np.ndarray  # int64 [N]
    # Whether the archive already holds exactly this: each input under its canonical member name
    # (``inputs`` for a one-input model, else the input's name) in its dtype, int64 labels.
    canonical: bool

    def batch(self, signature: ModelSignature) -> np.ndarray:
        return from_feeds(self.arrays, signature.inputs)

    def save(self, path: Path, signature: ModelSignature) -> None:
        """Write the canonical form, the one every later reader (variants, profiling) reads."""
        members = {valset_member(spec, signature): self.arrays[spec.name] for spec in signature.inputs}
        members[VALSET_LABELS] = self.labels
        save: Any = np.savez  # typed with its own keyword arguments, which member names are not
        with path.open("wb") as target:
            save(target, **members)


def valset_member(spec: TensorSpec, signature: ModelSignature) -> str:
    """The canonical archive member of an input: ``inputs`` for a one-input model, else its name."""
    return VALSET_INPUTS if len(signature.inputs) == 1 else spec.name


def load_valset(
    source: bytes | Path,
    signature: ModelSignature,
    max_bytes: int,
    setting: str = MAX_VALSET_SETTING,
    max_unpacked_bytes: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A ``.npz`` with integer ``labels`` [N] and the model's inputs: ``inputs`` (or the input's
    own name) for a one-input model, one array per input name for several. Returns the batch
    (``modelless.inputs.tensors``: a plain array for one input, a structured one for several) and the
    labels."""
    valset = read_valset(source, signature, max_bytes, setting, max_unpacked_bytes)
    return valset.batch(signature), valset.labels


def read_valset(
    source: bytes | Path,
    signature: ModelSignature,
    max_bytes: int,
    setting: str = MAX_VALSET_SETTING,
    max_unpacked_bytes: int | None = None,
    unpacked_setting: str = MAX_VALSET_UNPACKED_SETTING,
) -> ValidationSet:
    """The validation set at ``source``, at most ``max_bytes`` as sent and ``max_unpacked_bytes``
    (default: ``VALSET_UNPACK_FACTOR`` times ``max_bytes``) as its arrays unpack: what each member
    declares is checked before it is inflated, and read through a bounded stream (413 naming
    ``unpacked_setting`` beyond it)."""
    size = source.stat().st_size if isinstance(source, Path) else len(source)
    if size > max_bytes:
        raise too_large("validation set", max_bytes, setting, size)
    unpacked_limit = VALSET_UNPACK_FACTOR * max_bytes if max_unpacked_bytes is None else max_unpacked_bytes

    def unpacked_too_large(message: str) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"{message} ({unpacked_setting})", limit=unpacked_limit, setting=unpacked_setting
        )

    try:
        with open_zip(source, "validation set", refuse=InvalidModelError) as archive:
            infos = {
                info.filename.removesuffix(".npy"): info for info in archive.infolist() if not info.is_dir()
            }
            members = _members(signature, list(infos))
            loaded = read_npz_members(
                archive,
                {member: infos[member] for member in [*members.values(), VALSET_LABELS]},
                unpacked_limit,
                lambda member: f"validation array {member!r}",
                f"a validation set's arrays may unpack to at most {unpacked_limit} bytes in all",
                unpacked_too_large,
            )
    except InvalidInputError as error:
        raise InvalidModelError(f"validation set is not a readable .npz archive: {error.message}") from error
    except UNREADABLE as error:
        raise InvalidModelError(
            f"validation set is not a readable .npz archive with {_wanted(signature)}: {first_line(error)}"
        ) from error
    raw = {name: loaded[member] for name, member in members.items()}
    labels = loaded[VALSET_LABELS]
    if labels.dtype.kind not in "iu":
        raise InvalidModelError(f"validation labels must be integers; got {labels.dtype}")
    several = len(signature.inputs) > 1
    arrays: dict[str, np.ndarray] = {}
    canonical = labels.dtype == np.int64
    for spec in signature.inputs:
        what = f"validation input {spec.name!r}" if several else "validation inputs"
        array = raw[spec.name]
        arrays[spec.name] = _checked_input(array, spec, what, several)
        canonical = canonical and members[spec.name] == valset_member(spec, signature)
        canonical = canonical and array.dtype == np.dtype(spec.dtype)
    rows = {len(a) for a in arrays.values()}
    if len(rows) > 1:
        counts = {name: len(a) for name, a in arrays.items()}
        raise InvalidModelError(f"validation inputs hold different numbers of examples: {counts}")
    count = rows.pop()
    if count == 0:
        raise InvalidModelError("validation set is empty")
    if labels.shape != (count,):
        raise InvalidModelError(f"labels have shape {list(labels.shape)}; expected [{count}], one per input")
    if labels.min() < 0 or labels.max() >= signature.num_classes:
        raise InvalidModelError(f"labels must lie in [0, {signature.num_classes}) for this model's output")
    return ValidationSet(arrays, labels.astype(np.int64), canonical)


def _wanted(signature: ModelSignature) -> str:
    if len(signature.inputs) == 1:
        return f"'{VALSET_INPUTS}' (or {signature.input_name!r}) and '{VALSET_LABELS}'"
    return f"one array per input ({', '.join(repr(s.name) for s in signature.inputs)}) and 'labels'"


def _members(signature: ModelSignature, files: list[str]) -> dict[str, str]:
    """Input name -> the archive member holding it; InvalidModelError names what is missing."""
    if len(signature.inputs) == 1:
        spec = signature.inputs[0]
        candidates = [VALSET_INPUTS] + ([spec.name] if spec.name != VALSET_LABELS else [])
        found = next((c for c in candidates if c in files), None)
        missing = ([] if found else [VALSET_INPUTS]) + ([] if VALSET_LABELS in files else [VALSET_LABELS])
        if missing:
            raise InvalidModelError(
                f"validation set lacks {missing}; it has {sorted(files)} (it needs {_wanted(signature)})"
            )
        return {spec.name: str(found)}
    clash = [s.name for s in signature.inputs if s.name == VALSET_LABELS]
    if clash:
        raise InvalidModelError(
            "the model has an input named 'labels', which the validation set keeps for its labels: "
            "rename the input"
        )
    missing = [s.name for s in signature.inputs if s.name not in files]
    missing += [] if VALSET_LABELS in files else [VALSET_LABELS]
    if missing:
        raise InvalidModelError(
            f"validation set lacks {missing}; it has {sorted(files)} (it needs {_wanted(signature)})"
        )
    return {s.name: s.name for s in signature.inputs}


def _checked_input(array: np.ndarray, spec: TensorSpec, what: str, several: bool) -> np.ndarray:
    """One input's examples, cast to the input's dtype; InvalidModelError says what is wrong."""
    target = np.dtype(spec.dtype)
    integer = target.kind in "iu"
    if array.dtype.kind not in ("iub" if integer else "fiub"):
        expected = "integers" if integer else "numeric"
        raise InvalidModelError(
            f"{what} must be {expected} ({spec.dtype} for input {spec.name!r}); got {array.dtype}",
            input=spec.name,
        )
    if array.ndim == 0:
        raise InvalidModelError(f"{what} must be an array [N, ...], not a single number")
    if list(array.shape[1:]) != list(spec.shape):
        takes = f"input {spec.name!r} takes" if several else "the model takes"
        have = "has" if several else "have"
        raise InvalidModelError(
            f"{what} {have} shape {list(array.shape)}; {takes} [N, {', '.join(map(str, spec.shape))}]",
            expected=list(spec.shape),
            input=spec.name,
        )
    if integer:
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise InvalidModelError(f"{what}: values beyond {spec.dtype}'s range", input=spec.name)
        return array.astype(target, copy=False)
    with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
        cast = array.astype(target, copy=False)
    # Checked after the cast: 1e39 is finite in float64 but reaches a float32 model as inf.
    if not np.isfinite(cast).all():
        raise InvalidModelError(
            f"{what}: NaN or infinity, or values beyond {spec.dtype}'s range", input=spec.name
        )
    return cast


def check_targets(latency_ms: float | None, accuracy: float | None) -> None:
    """A query's targets where no request schema checked them (an offline job's manifest)."""
    if latency_ms is not None and (not math.isfinite(latency_ms) or not 0 < latency_ms <= MAX_LATENCY_MS):
        raise InvalidInputError(
            f"latency must be a positive number of milliseconds, at most {MAX_LATENCY_MS:.0f}; "
            f"got {latency_ms}",
            field="latency",
        )
    if accuracy is not None and (not math.isfinite(accuracy) or not 0.0 <= accuracy <= 1.0):
        raise InvalidInputError(f"accuracy must lie in [0, 1]; got {accuracy}", field="accuracy")
