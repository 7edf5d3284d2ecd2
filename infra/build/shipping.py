"""What never ships: the benchmarks (bench/), the simulator (sim/) and this repository's own
infrastructure (infra/: the embedded stack, build tools, model zoos). Neither a Lambda package
(infra/build/lambda_artifacts.py) nor the EC2 worker's wheel (infra/build/publish_worker.py) may
hold any of them; both checks use this."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

NOT_SHIPPED = ("bench", "sim", "infra")


def unshipped(paths: Iterable[str]) -> list[str]:
    """The paths, relative to a package root (an archive's names, a directory's files), that lie in
    a top-level ``bench``, ``sim`` or ``infra`` package or are such a module."""
    found = []
    for path in paths:
        parts = PurePosixPath(path.replace("\\", "/")).parts
        if not parts:
            continue
        top = parts[0]
        if top in NOT_SHIPPED or (len(parts) == 1 and top.removesuffix(".py") in NOT_SHIPPED):
            found.append(path)
    return sorted(found)
