"""Build a model's variant artifacts: every (precision, graph optimisation level) that makes sense.

Precisions: FP32 (as registered), dynamic INT8 (weights quantised offline, activations at run
time), static INT8 (weights and activations quantised, calibrated on part of the validation set)
and FP16 (for pools whose hardware runs it; kept for CPU pools only when onnxruntime's CPU
provider can run it). Each is saved optimised at onnxruntime's basic, extended and all levels.

Static INT8 calibrates on validation examples fed to every input of the model, and is skipped
for models whose inputs are not all floating point (token ids, masks: quantising what feeds an
embedding lookup has no meaning); a precision that fails to build is skipped with the reason,
never the registration: FP32, the registered model itself, is always built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from modelless.inputs.tensors import to_feeds
from variants.recipes import Recipe

OPT_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
CALIBRATION_BATCH = 16


@dataclass(frozen=True)
class Artifact:
    recipe: Recipe
    path: Path
    runs_on_cpu: bool  # FP16 may not: then only pools with a GPU can serve it


def build_artifacts(
    source: Path, out_dir: Path, calibration: np.ndarray | None = None, notes: list[str] | None = None
) -> list[Artifact]:
    """Write one optimised ONNX file per recipe into ``out_dir``.

    ``calibration`` (a batch of validation examples: a plain array for one input, a structured
    array for several) enables static INT8. ``notes`` collects why a precision was skipped.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    skipped = notes if notes is not None else []
    sources: dict[str, Path] = {"fp32": source}
    _try_precision(sources, skipped, "int8", lambda: _quantize_dynamic_folded(source, out_dir))
    if calibration is not None and len(calibration):
        reason = static_int8_unsupported(source)
        if reason is not None:
            skipped.append(f"int8-static skipped: {reason}")
        else:
            _try_precision(
                sources,
                skipped,
                "int8-static",
                lambda: _quantize_static(source, out_dir / "int8-static-source.onnx", calibration),
            )
    _try_precision(sources, skipped, "fp16", lambda: _to_fp16(source, out_dir / "fp16-source.onnx"))

    artifacts: list[Artifact] = []
    for precision, precision_source in sources.items():
        for level_name, level in OPT_LEVELS.items():
            recipe = Recipe(precision, level_name)
            target = out_dir / f"{recipe.name}.onnx"
            if precision == "fp16" and level_name != "basic":
                # Beyond basic, the CPU optimiser rewrites FP16 graphs into CPU-only kernels;
                # a GPU session optimises the basic artifact for itself when it loads it.
                continue
            runs_on_cpu = _optimise(precision_source, target, level)
            if not runs_on_cpu:
                target.write_bytes(precision_source.read_bytes())
            artifacts.append(Artifact(recipe, target, runs_on_cpu))
    return artifacts


def _quantize_dynamic_folded(source: Path, out_dir: Path) -> Path:
    """Dynamic INT8 of ``source``, or of its constant-folded form when the quantiser refuses the
    graph as exported: torch's exporter may feed a Conv its weight through Identity or Constant
    nodes, and the dynamic quantiser only quantises weights that are initializers."""
    target = out_dir / "int8-source.onnx"
    try:
        return _quantize_dynamic(source, target)
    except ValueError:
        folded = out_dir / "fp32-folded.onnx"
        if not _optimise(source, folded, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
            raise
        return _quantize_dynamic(folded, target)


def _try_precision(
    sources: dict[str, Path], notes: list[str], precision: str, build: Callable[[], Path]
) -> None:
    try:
        sources[precision] = build()
    except Exception as error:  # the quantisers and converters raise anything; the others go on
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        notes.append(f"{precision} skipped: {type(error).__name__}: {first_line}")


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (initializers listed as inputs excluded)."""
    initializers = {init.name for init in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def static_int8_unsupported(source: Path) -> str | None:
    """Why static INT8 cannot be built for this model (None when it can)."""
    model = onnx.load(str(source), load_external_data=False)
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
    other = [
        f"{i.name} ({onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type).lower()})"
        for i in model_inputs(model)
        if i.type.tensor_type.elem_type not in floats
    ]
    if other:
        return f"the model's inputs are not all floating point: {', '.join(other)}"
    return None


def _quantize_dynamic(source: Path, target: Path) -> Path:
    # UInt8 weights keep Conv layers on onnxruntime's ConvInteger CPU kernel.
    _quiet_quantiser()
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8)
    return target


class _ValidationSetReader(CalibrationDataReader):  # type: ignore[misc]
    """Calibration batches fed to every input of the model."""

    def __init__(self, input_names: list[str], examples: np.ndarray) -> None:
        self._batches: Iterator[np.ndarray] = iter(
            [examples[i : i + CALIBRATION_BATCH] for i in range(0, len(examples), CALIBRATION_BATCH)]
        )
        self._input_names = input_names

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else to_feeds(batch, self._input_names)


def _quantize_static(source: Path, target: Path, calibration: np.ndarray) -> Path:
    _quiet_quantiser()
    input_names = [i.name for i in model_inputs(onnx.load(str(source), load_external_data=False))]
    quantize_static(
        str(source),
        str(target),
        _ValidationSetReader(input_names, calibration),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return target


def _to_fp16(source: Path, target: Path) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # Inputs and outputs stay float32: callers send the same arrays to every variant.
    converted = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(converted, str(target))
    return target


def _optimise(source: Path, target: Path, level: ort.GraphOptimizationLevel) -> bool:
    """Save ``source`` optimised at ``level``; False when the CPU provider cannot load it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises its own Fail/NotImplemented types, not a common base
        return False
    return True


def _quiet_quantiser() -> None:
    # The quantiser logs a pre-processing hint on every call.
    logging.getLogger("root").setLevel(logging.ERROR)
