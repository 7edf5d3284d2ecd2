"""Build a model's variant artifacts: every (precision, graph optimisation level) that makes sense.

Precisions: FP32 (as registered), dynamic INT8 (weights quantised offline, activations at run
time), static INT8 (weights and activations quantised, calibrated on part of the validation set)
and FP16 (for pools whose hardware runs it; kept for CPU pools only when onnxruntime's CPU
provider can run it). Each is saved optimised at onnxruntime's basic, extended and all levels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
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


def build_artifacts(source: Path, out_dir: Path, calibration: np.ndarray | None = None) -> list[Artifact]:
    """Write one optimised ONNX file per recipe into ``out_dir``.

    ``calibration`` (inputs from the validation set) enables static INT8.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    sources: dict[str, Path] = {"fp32": source}
    sources["int8"] = _quantize_dynamic(source, out_dir / "int8-source.onnx")
    if calibration is not None and len(calibration):
        sources["int8-static"] = _quantize_static(source, out_dir / "int8-static-source.onnx", calibration)
    sources["fp16"] = _to_fp16(source, out_dir / "fp16-source.onnx")

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


def _quantize_dynamic(source: Path, target: Path) -> Path:
    # UInt8 weights keep Conv layers on onnxruntime's ConvInteger CPU kernel.
    _quiet_quantiser()
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8)
    return target


class _ValidationSetReader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, input_name: str, inputs: np.ndarray) -> None:
        self._batches: Iterator[np.ndarray] = iter(
            [inputs[i : i + CALIBRATION_BATCH] for i in range(0, len(inputs), CALIBRATION_BATCH)]
        )
        self._input_name = input_name

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {self._input_name: batch.astype(np.float32)}


def _quantize_static(source: Path, target: Path, calibration: np.ndarray) -> Path:
    _quiet_quantiser()
    model = onnx.load(str(source))
    initializers = {init.name for init in model.graph.initializer}
    input_name = next(i.name for i in model.graph.input if i.name not in initializers)
    quantize_static(
        str(source),
        str(target),
        _ValidationSetReader(input_name, calibration),
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
