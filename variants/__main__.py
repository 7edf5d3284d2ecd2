"""Child-process entry points for registration, one step per process:

    python -m variants build SOURCE OUT_DIR [--calibration VALSET --calibration-count N]
    python -m variants measure ARTIFACT VALSET --threads T --runs R [--metric top1] [--accuracy-from N]

Each prints one JSON line on stdout. A fresh process per profile keeps its memory its own.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from variants.generator import build_artifacts
from variants.profiler import measure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m variants", description=__doc__)
    steps = parser.add_subparsers(dest="step", required=True)
    build = steps.add_parser("build")
    build.add_argument("source", type=Path)
    build.add_argument("out_dir", type=Path)
    build.add_argument("--calibration", type=Path, help="validation .npz whose first inputs calibrate INT8")
    build.add_argument("--calibration-count", type=int, default=0)
    profile = steps.add_parser("measure")
    profile.add_argument("artifact", type=Path)
    profile.add_argument("valset", type=Path)
    profile.add_argument("--threads", type=int, required=True)
    profile.add_argument("--runs", type=int, required=True)
    profile.add_argument("--metric", default="top1")
    profile.add_argument("--accuracy-from", type=int, default=0)
    args = parser.parse_args(argv)

    if args.step == "build":
        calibration = None
        if args.calibration is not None and args.calibration_count > 0:
            with np.load(args.calibration, allow_pickle=False) as data:
                calibration = data["inputs"][: args.calibration_count].astype(np.float32)
        artifacts = build_artifacts(args.source, args.out_dir, calibration)
        print(
            json.dumps(
                [
                    {"recipe": a.recipe.name, "path": str(a.path), "runs_on_cpu": a.runs_on_cpu}
                    for a in artifacts
                ]
            )
        )
    else:
        measured = measure(
            args.artifact, args.valset, args.threads, args.runs, args.metric, args.accuracy_from
        )
        print(json.dumps(asdict(measured)))


if __name__ == "__main__":
    main()
