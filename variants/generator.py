"""Build a model's variant artifacts: every (precision, graph optimisation level) pair."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

PRECISIONS = ("fp32", "int8")
OPT_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class Recipe:
    """How an artifact was made; recorded in every variant built from it."""

    precision: str
    opt_level: str

    @property
    def name(self) -> str:
        return f"{self.precision}-{self.opt_level}"


def build_artifacts(source: Path, out_dir: Path) -> dict[str, Path]:
    """Write one optimised ONNX file per recipe into ``out_dir``; returns recipe name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_precision = {"fp32": source, "int8": _quantize(source, out_dir / "int8-source.onnx")}
    artifacts: dict[str, Path] = {}
    for precision in PRECISIONS:
        for level_name, level in OPT_LEVELS.items():
            recipe = Recipe(precision, level_name)
            target = out_dir / f"{recipe.name}.onnx"
            _optimise(by_precision[precision], target, level)
            artifacts[recipe.name] = target
    return artifacts


def _quantize(source: Path, target: Path) -> Path:
    # Dynamic INT8: weights quantised offline, activations at run time; no calibration data.
    # UInt8 weights keep Conv layers on onnxruntime's ConvInteger CPU kernel.
    logging.getLogger("root").setLevel(logging.ERROR)  # the quantiser logs a preprocessing hint per call
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8)
    return target


def _optimise(source: Path, target: Path, level: ort.GraphOptimizationLevel) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
