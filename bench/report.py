"""What every benchmark shares: the machine it ran on, percentiles and min-max spans, and the
Markdown fragments that ``scripts/bench all`` assembles into ``docs/BENCHMARKS.md``.

Each benchmark part writes ``<out-dir>/<part>.md`` (its section of the write-up, starting with a
``## `` heading, stating the machine, the date, the command and the spread over repeats) and
``<out-dir>/<part>.json`` (the raw numbers, with an optional ``headlines`` list of one-line
results that the assembled document's summary quotes).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_OUT_DIR = Path("docs/bench")


def machine() -> str:
    """The machine and the moment, as every benchmark prints them."""
    return (
        f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def today() -> str:
    return f"{datetime.now(UTC):%Y-%m-%d}"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and v == v and abs(v) != float("inf")]


def span(values: Iterable[float | None], digits: int = 2, unit: str = "") -> str:
    """``min-max`` of the finite values (one value when they print alike); ``—`` when none."""
    kept = finite(values)
    if not kept:
        return "—"
    low, high = f"{min(kept):.{digits}f}", f"{max(kept):.{digits}f}"
    return (low if low == high else f"{low}\u2013{high}") + unit


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_fragment(out_dir: Path, part: str, markdown: str, data: dict[str, Any]) -> Path:
    """Write ``<part>.md`` and ``<part>.json`` under ``out_dir``; returns the Markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{part}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    path = out_dir / f"{part}.md"
    path.write_text(markdown.rstrip() + "\n")
    print(f"wrote {path} and {part}.json", flush=True)
    return path


def headlines(out_dir: Path, part: str) -> list[str]:
    """The one-line results a part recorded in its JSON (none when it has not run)."""
    path = out_dir / f"{part}.json"
    if not path.exists():
        return []
    try:
        found = json.loads(path.read_text()).get("headlines", [])
    except (ValueError, AttributeError):
        return []
    return [str(line) for line in found]
