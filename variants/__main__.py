"""Child-process entry points for registration, one step per process:

    python -m variants build SOURCE OUT_DIR          -> {"recipe": "path", ...}
    python -m variants measure ARTIFACT VALSET THREADS RUNS -> Measurement as JSON

Each prints one JSON line on stdout. A fresh process per profile keeps its peak memory its own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from variants.generator import build_artifacts
from variants.profiler import measure


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "build":
        artifacts = build_artifacts(Path(args[0]), Path(args[1]))
        print(json.dumps({recipe: str(path) for recipe, path in artifacts.items()}))
    elif command == "measure":
        measured = measure(Path(args[0]), Path(args[1]), int(args[2]), int(args[3]))
        print(json.dumps(asdict(measured)))
    else:
        raise SystemExit(f"unknown command {command!r}: use build or measure")


if __name__ == "__main__":
    main(sys.argv[1:])
