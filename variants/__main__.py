"""Child-process entry points for registration, one step per process:

    python -m variants build SOURCE OUT_DIR --valset VALSET [--calibration-count N] [--threads T]
    python -m variants accuracy ARTIFACT VALSET --threads T [--metric top1] [--accuracy-from N]
        [--batches 1,64] [--reference ANSWERS.npy]
    python -m variants measure ARTIFACT VALSET --threads T [--max-runs R] [--min-runs M]
        [--stability-pct S] [--batch-budget-s B] [--max-batch C] [--ceiling-ms X]

``build`` writes every recipe's artifact and the registered model's own top-1 answers on the
scored examples (``OUT_DIR/reference-top1.npy``, for every variant's agreement). ``accuracy``
measures one artifact's accuracy; ``measure`` times it at one thread count. Each prints one JSON
line on stdout. A fresh process per step keeps its memory, and its timings, its own.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from variants.examples import read_examples, session_specs
from variants.generator import build_artifacts
from variants.profiler import TimingPlan, measure_accuracy, measure_latency, reference_top1

REFERENCE_FILE = "reference-top1.npy"


def _batches(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in text.split(",") if part.strip())
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m variants", description=__doc__)
    steps = parser.add_subparsers(dest="step", required=True)
    build = steps.add_parser("build")
    build.add_argument("source", type=Path)
    build.add_argument("out_dir", type=Path)
    build.add_argument("--valset", type=Path, help="validation .npz: calibration and reference answers")
    build.add_argument("--calibration-count", type=int, default=0, help="first examples that calibrate INT8")
    build.add_argument("--threads", type=int, default=1, help="threads for the reference answers")
    accuracy = steps.add_parser("accuracy")
    accuracy.add_argument("artifact", type=Path)
    accuracy.add_argument("valset", type=Path)
    accuracy.add_argument("--threads", type=int, required=True)
    accuracy.add_argument("--metric", default="top1")
    accuracy.add_argument("--accuracy-from", type=int, default=0)
    accuracy.add_argument("--batches", type=_batches, default=(1,))
    accuracy.add_argument("--reference", type=Path)
    profile = steps.add_parser("measure")
    profile.add_argument("artifact", type=Path)
    profile.add_argument("valset", type=Path)
    profile.add_argument("--threads", type=int, required=True)
    defaults = TimingPlan()
    profile.add_argument("--max-runs", type=int, default=defaults.max_runs)
    profile.add_argument("--min-runs", type=int, default=defaults.min_runs)
    profile.add_argument("--stability-pct", type=float, default=defaults.stability_pct)
    profile.add_argument("--batch-budget-s", type=float, default=defaults.batch_budget_s)
    profile.add_argument("--max-batch", type=int, default=defaults.max_batch)
    profile.add_argument("--ceiling-ms", type=float, default=defaults.ceiling_ms)
    args = parser.parse_args(argv)

    if args.step == "build":
        print(json.dumps(_build(args)))
    elif args.step == "accuracy":
        measured = measure_accuracy(
            args.artifact,
            args.valset,
            args.threads,
            args.metric,
            args.accuracy_from,
            args.batches,
            args.reference,
        )
        print(json.dumps(asdict(measured)))
    else:
        plan = TimingPlan(
            max_runs=args.max_runs,
            min_runs=min(args.min_runs, args.max_runs),
            stability_pct=args.stability_pct,
            batch_budget_s=args.batch_budget_s,
            max_batch=args.max_batch,
            ceiling_ms=args.ceiling_ms,
        )
        print(json.dumps(asdict(measure_latency(args.artifact, args.valset, args.threads, plan))))


def _build(args: argparse.Namespace) -> dict[str, object]:
    import onnxruntime as ort

    calibration = None
    reference = None
    if args.valset is not None:
        if args.calibration_count > 0:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            session = ort.InferenceSession(str(args.source), options, providers=["CPUExecutionProvider"])
            examples, _ = read_examples(args.valset, session_specs(session))
            calibration = examples[: args.calibration_count].copy()
            del session, examples
        answers = reference_top1(args.source, args.valset, args.calibration_count, args.threads)
        reference = args.out_dir / REFERENCE_FILE
        args.out_dir.mkdir(parents=True, exist_ok=True)
        np.save(reference, answers, allow_pickle=False)
    notes: list[str] = []
    artifacts = build_artifacts(args.source, args.out_dir, calibration, notes)
    return {
        "artifacts": [
            {
                "recipe": a.recipe.name,
                "path": str(a.path),
                "runs_on_cpu": a.runs_on_cpu,
                "size_bytes": a.path.stat().st_size,
            }
            for a in artifacts
        ],
        "notes": notes,
        "reference": str(reference) if reference is not None else None,
    }


if __name__ == "__main__":
    main()
