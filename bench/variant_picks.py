"""Which variant each (latency, accuracy) target picks across the real zoo.

    python -m bench.variant_picks [--quick] [--only NAME ...] [--out-dir docs/bench]
    scripts/bench variant-picks [the same options]

The registered zoo (``bench.real_zoo``: measured CPU and Lambda profiles only, none derived) is
published into an in-memory metadata store and every target goes through the project's own
``Dispatcher.select`` (profile cache, live view, ``InfaasPolicy.get_variant``) as a gateway's
query would, without HTTP and without running anything. Two states of the fleet:

- **warm**: every kept variant loaded and idle (one idle worker per CPU pool holding all of that
  pool's variants, every Lambda variant warm): the pick is the cheapest loaded variant whose
  profiled latency meets the target, what serving settles on;
- **cold**: nothing loaded, workers with room: the pick is the variant with the lowest load +
  inference latency that meets the target (a query's first answer; large models' loads take
  longer than tight targets allow, so many of these are refused).

Targets: latency 10, 30, 100 and 300 ms against accuracy levels taken from the zoo's measured
spread (quantiles of the kept variants' accuracies, per app), "no accuracy target", and each model
named. Each cell gives the picked variant, its profiled batch-1 p50 and its accuracy with the
profile's 95 % interval; "refused" when the project answers 4xx (nothing meets the targets).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.real_zoo import RealZoo, accuracy_with_ci, fmt_ms, real_zoo
from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, today, write_fragment
from modelless.catalog import DEFAULT_POOLS, PoolKind
from modelless.config import Settings
from modelless.dispatch import Dispatcher
from modelless.exceptions import ModellessError
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.selection import InfaasPolicy
from modelless.serving.invocation import Invocation, Reply
from modelless.types import Decision, InstanceState, InstanceStats, QueryTargets, VariantProfile, WorkerState

PART = "variant-picks"
LATENCIES_MS = (10.0, 30.0, 100.0, 300.0)
ACCURACY_QUANTILES = (0.0, 1 / 3, 2 / 3, 1.0)


@dataclass(frozen=True)
class Pick:
    """What one target got: the variant, or why nothing."""

    variant: VariantProfile | None
    refused: str = ""

    def cell(self) -> str:
        if self.variant is None:
            return f"refused{': ' + self.refused if self.refused else ''}"
        v = self.variant
        short = v.variant_id.split("/", 1)[-1]
        return f"`{short}` {fmt_ms(v.median_ms(1))} ms, {accuracy_with_ci(v)}"


@dataclass(frozen=True)
class Row:
    label: str
    app: str
    min_accuracy: float | None  # None: no accuracy target
    model_name: str | None = None


class _NoInvocations:
    """A Lambda tier that is never called: selection only needs to know one exists (and, with
    no ``tier_state``, takes it as warm, as it does in AWS)."""

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        raise RuntimeError("the variant-picks benchmark runs no query")


class _SelectionOnly(Dispatcher):
    """The gateway's dispatcher, asked for decisions only: a target that a variant meets once
    loaded is reported as such (the error's ``warming`` detail), and the load it would start on
    a worker is not started (the fleet's workers are descriptions, with no process behind them)."""

    def _start_warmup(self, decision: Decision) -> None:
        pass


def accuracy_levels(profiles: Sequence[VariantProfile]) -> list[float]:
    """Accuracy targets from the measured spread: quantiles of the kept variants' accuracies,
    rounded down to the thousandth (so that the variant at each quantile meets its level)."""
    accuracies = sorted(p.accuracy for p in profiles)
    if not accuracies:
        return []
    levels = []
    for q in ACCURACY_QUANTILES:
        value = accuracies[min(len(accuracies) - 1, round(q * (len(accuracies) - 1)))]
        levels.append(math.floor(value * 1000 + 1e-9) / 1000)
    return sorted(set(levels))


def rows_for(zoo: RealZoo, app: str) -> list[Row]:
    measured = [p for m in zoo.models if m.app == app for p in m.measured()]
    rows = [Row(f"accuracy ≥ {level:.3f}", app, level) for level in accuracy_levels(measured)]
    rows.append(Row("no accuracy target", app, None))
    rows += [Row(f"named: `{m.name}`", app, None, m.name) for m in zoo.models if m.app == app]
    return rows


def fleet(zoo: RealZoo, warm: bool) -> list[WorkerState]:
    """The workers selection sees: one idle worker per CPU pool of the catalog (every kept
    variant of that pool loaded when ``warm``, none otherwise, with room to load them), and the
    Lambda tier's warm containers (when ``warm``)."""
    far = time.time() + 10 * 365 * 86400  # never stale
    workers = []
    for pool in DEFAULT_POOLS.values():
        if pool.device != "cpu":
            continue
        loaded = [p for p in zoo.measured() if p.pool == pool.name] if warm else []
        if pool.kind is PoolKind.LAMBDA and not warm:
            continue
        workers.append(
            WorkerState(
                worker_id=f"{pool.name}-0",
                pool=pool.name,
                address="http://127.0.0.1:9",  # never called
                utilisation=0.0,
                free_slots=0 if warm else len(zoo.measured()),  # room for any variant
                reported_at=far,
                instances=tuple(
                    InstanceStats(p.variant_id, InstanceState.ACTIVE, 0.0, 0.0, 0.0, 0) for p in loaded
                ),
            )
        )
    return workers


def picks(
    zoo: RealZoo, warm: bool, extra_rows: Sequence[Row] = ()
) -> dict[str, dict[tuple[str, float], Pick]]:
    """Per app, per (row label, latency target): the pick through ``Dispatcher.select``, for the
    app's rows (``rows_for``) and ``extra_rows``."""
    store: MetadataStore = open_metadata_store("memory://")
    zoo.publish(store, measured_only=True)
    for worker in fleet(zoo, warm):
        store.put_worker_state(worker)
    # Configured as the gateway's (bench/__main__.py's new_dispatcher), with a Lambda tier.
    settings = Settings()
    dispatcher = _SelectionOnly(
        store,
        InfaasPolicy(DEFAULT_POOLS, settings.accuracy_tolerance),
        HttpWorkerInvoker(),
        _NoInvocations(),
        cache_ttl_s=settings.profile_cache_ttl_s,
    )
    found: dict[str, dict[tuple[str, float], Pick]] = {}
    for app in zoo.apps:
        table = found.setdefault(app, {})
        for row in [*rows_for(zoo, app), *(r for r in extra_rows if r.app == app)]:
            for latency in LATENCIES_MS:
                targets = QueryTargets(app, latency_ms=latency, model_name=row.model_name)
                if row.min_accuracy is not None:
                    targets = QueryTargets(
                        app, latency_ms=latency, min_accuracy=row.min_accuracy, model_name=row.model_name
                    )
                try:
                    table[(row.label, latency)] = Pick(dispatcher.select(targets).variant)
                except ModellessError as error:
                    table[(row.label, latency)] = Pick(None, _why(error))
    return found


def _why(error: ModellessError) -> str:
    closest = error.details.get("closest")
    if isinstance(closest, dict) and closest.get("variant"):
        short = str(closest["variant"]).split("/", 1)[-1]
        return f"closest `{short}` {closest.get('latency_ms')} ms p99"
    return type(error).__name__


def table(zoo: RealZoo, app: str, found: dict[tuple[str, float], Pick]) -> str:
    header = ["target", *(f"latency ≤ {latency:g} ms" for latency in LATENCIES_MS)]
    rows = [
        [row.label, *(found[(row.label, latency)].cell() for latency in LATENCIES_MS)]
        for row in rows_for(zoo, app)
    ]
    return markdown_table(header, rows)


def write_report(zoo: RealZoo, out_dir: Path, command: str) -> Path:
    warm, cold = picks(zoo, warm=True), picks(zoo, warm=False)
    sections = []
    for app in zoo.apps:
        models = ", ".join(f"`{m.name}`" for m in zoo.models if m.app == app)
        sections.append(
            f"### App `{app}` ({models})\n\nWarm (every kept variant loaded and idle):\n\n"
            f"{table(zoo, app, warm[app])}\n\n<details><summary>Cold (nothing loaded: load + inference "
            f"must meet the target)</summary>\n\n{table(zoo, app, cold[app])}\n\n</details>\n"
        )
    distinct = {
        pick.variant.variant_id for per_app in warm.values() for pick in per_app.values() if pick.variant
    }
    refused = sum(1 for per_app in warm.values() for pick in per_app.values() if pick.variant is None)
    total = sum(len(per_app) for per_app in warm.values())
    markdown = f"""## Which variant each target picks (the real zoo)

Machine: `{machine()}`; {today()}. Reproduce: `{command}` (the zoo's registrations come from the
cache `scripts/bench real-zoo` fills). Deterministic: the project's `Dispatcher.select` on the
registered profiles, no timing is measured here, so there are no repeats; the latencies and
accuracies quoted are the profiles' (batch-1 median; accuracy with its 95 % interval where the
profile has one).

Every target goes through the gateway's own decision (`Dispatcher.select`: the profile cache, the
live view, `InfaasPolicy.get_variant`) over the zoo's measured CPU and Lambda profiles, in two
states of the fleet: **warm**, every kept variant loaded and idle (the cheapest loaded variant
that meets the target wins), and **cold**, nothing loaded (the lowest load + inference latency
that meets the target wins). Accuracy levels are quantiles of the kept variants' measured
accuracies in each app; "no accuracy target" and "named" rows are served as the project serves
such queries. Cells: the variant (`model/recipe/placement`), its batch-1 p50, its accuracy
[95 % interval].

{chr(10).join(sections)}
Warm picks: {len(distinct)} distinct variants answer the {total - refused} targets met; {refused} of {total}
targets refused (nothing meets them).
"""
    return write_fragment(
        out_dir,
        PART,
        markdown,
        {
            "machine": machine(),
            "date": today(),
            "command": command,
            "warm": {
                app: {f"{label} @ {latency:g} ms": p.cell() for (label, latency), p in per_app.items()}
                for app, per_app in warm.items()
            },
            "cold": {
                app: {f"{label} @ {latency:g} ms": p.cell() for (label, latency), p in per_app.items()}
                for app, per_app in cold.items()
            },
            "headlines": [
                f"Variant picks (real zoo, warm fleet): {len(distinct)} distinct variants answer "
                f"{total - refused} of {total} (latency, accuracy) targets from 10 to 300 ms; "
                f"{refused} refused"
            ],
        },
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the two quick models of the zoo only")
    parser.add_argument("--only", nargs="+", help="these models of the zoo only")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    args = parser.parse_args(list(argv) if argv is not None else None)
    print(f"machine: {machine()}", flush=True)
    zoo = real_zoo(args.only, quick=args.quick, state_dir=args.state_dir)
    command = " ".join(
        ["scripts/bench variant-picks", *(["--quick"] if args.quick else [])]
        + (["--only", *args.only] if args.only else [])
    )
    path = write_report(zoo, args.out_dir, command)
    print(path.read_text())


if __name__ == "__main__":
    main()
