"""Size a deployment before you build it: replay an arrival trace (or a flat rate) against an
app's measured variant profiles through the simulator, which runs the project's own selection
policy, batching controller, monitoring and scaler (the exact variant-mix program), and print
what it would cost and how many queries would miss their targets.

    python -m sim --variants variants.json --rate 50 --duration 600 --latency-ms 100 --accuracy 0.9
    python -m sim --variants variants.json --trace arrivals.csv --mean-qps 200 --latency-ms 50
    modelless-sim …                           # the same, as installed with the package

``--variants``: what ``GET /v1/variants?appID=…`` answers (``{"appID", "variants": [...]}``), or a
JSON list of profiles. ``--trace``: a CSV whose first column, ``TIMESTAMP``, holds one arrival per
row (``YYYY-MM-DD HH:MM:SS.fff``, as the Azure LLM inference traces); its per-``--bin-s`` arrival
counts give the load's shape, scaled to ``--mean-qps`` when given. Every query carries the same
targets (``--latency-ms``, ``--accuracy``; or ``--model`` to name a model instead).

Two bills are reported, as in the cost study (docs/BENCHMARKS.md): INFaaS's (each running
instance by its memory per second, Lambda by GB-s and requests, in INFaaS's normalised units) and
AWS's list prices in dollars (whole workers by the hour, Lambda per GB-s and per request).
Profiles that were not measured on the pool's hardware (``measured_on_target``: false) make a
forecast of the same standing: the output says how many such variants it used.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelless.catalog import DEFAULT_POOLS
from modelless.scaling.controller import ScalerConfig
from modelless.types import QueryTargets, VariantProfile
from sim.simulator import Modelless, SimConfig, SimResult, Simulation
from sim.traces import Architecture, Mix, RateCurve, arrivals, load_trace, trace_curve

# A Lambda container's start before its model loads, when none is given: the order of a Python
# process importing onnxruntime (0.6-0.9 s measured on an idle 2-core VM; 1-3 s is common in AWS).
DEFAULT_LAMBDA_INIT_MS = 1000.0
WARMUP_S = 60.0  # simulated before the measured part, at the load's first rate: the scaler settles


def load_variants(path: Path) -> list[VariantProfile]:
    """Profiles from a ``GET /v1/variants`` reply or a JSON list of profiles."""
    try:
        raw: Any = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"error: cannot read variants from {path}: {error}") from None
    rows = raw.get("variants") if isinstance(raw, dict) else raw
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"error: {path} holds no variant profiles (expected GET /v1/variants' reply)")
    profiles = []
    for index, row in enumerate(rows):
        try:
            profiles.append(VariantProfile.from_json(json.dumps(row)))
        except (TypeError, KeyError, ValueError, AttributeError) as error:
            raise SystemExit(f"error: {path}: variant #{index} is not a profile: {error}") from None
    apps = {p.app_id for p in profiles}
    if len(apps) != 1:
        raise SystemExit(f"error: {path}: the variants of one app, please (found {sorted(apps)})")
    return profiles


def pool_caps(items: Sequence[str]) -> dict[str, int]:
    """``pool=N`` pairs: the pools the scaler manages and their worker caps."""
    caps: dict[str, int] = {}
    for item in items:
        pool, _, count = item.partition("=")
        if pool not in DEFAULT_POOLS or not count.isdigit():
            raise SystemExit(
                f"error: --max-workers {item!r}: expected POOL=N with POOL one of {sorted(DEFAULT_POOLS)}"
            )
        caps[pool] = int(count)
    return caps


def load_curve(args: argparse.Namespace) -> RateCurve:
    if args.trace is not None:
        try:
            curve = trace_curve(load_trace(args.trace), args.bin_s, name=args.trace.name)
        except (OSError, ValueError) as error:
            raise SystemExit(f"error: cannot read the trace: {error}") from None
        if args.duration is not None:
            curve = curve.window(0.0, args.duration)
        return curve.scaled_to_mean(args.mean_qps) if args.mean_qps is not None else curve
    rate = args.rate if args.rate is not None else 10.0
    duration = args.duration if args.duration is not None else 600.0
    return RateCurve("flat", 1.0, (rate,) * max(1, math.ceil(duration)))


def simulate(
    profiles: Sequence[VariantProfile],
    curve: RateCurve,
    targets: QueryTargets,
    max_workers: dict[str, int],
    lambda_init_ms: float,
    seed: int,
) -> SimResult:
    config = SimConfig(lambda_init_ms=lambda_init_ms, seed=seed)
    sim = Simulation(profiles, DEFAULT_POOLS, config, curve.duration_s, WARMUP_S)
    name = targets.model_name or "model-less"
    mix = Mix.zipf([Architecture(name, targets, targets.latency_ms or math.inf)])
    system = Modelless(DEFAULT_POOLS, ScalerConfig(max_workers=max_workers))
    return sim.run(system, arrivals(curve, mix, seed, WARMUP_S))


def summary(result: SimResult, curve: RateCurve, profiles: Sequence[VariantProfile]) -> dict[str, Any]:
    hours = curve.duration_s / 3600
    peak_instances: dict[str, int] = {}
    for second in result.seconds:
        for pool, count in second.instances.items():
            peak_instances[pool] = max(peak_instances.get(pool, 0), count)
    return {
        "load": {
            "name": curve.name,
            "seconds": curve.duration_s,
            "mean_qps": curve.mean,
            "peak_qps": curve.peak,
        },
        "queries": result.queries,
        "violations": result.violations,
        "violation_ratio": result.violation_ratio,
        "violations_by": {f"{arch}/{kind}": n for (arch, kind), n in sorted(result.violations_by.items())},
        "p99_ms": result.p99_ms,
        "lambda_share": result.lambda_served / result.queries if result.queries else 0.0,
        "cost_infaas_units": result.total_cost,
        "cost_aws_dollars": result.total_aws_cost,
        "cost_aws_dollars_per_hour": result.total_aws_cost / hours if hours else 0.0,
        "peak_instances": peak_instances,
        "variants": len(profiles),
        "variants_not_measured_on_target": sum(not p.measured_on_target for p in profiles),
        "notes": result.notes,
    }


def print_text(report: dict[str, Any]) -> None:
    load = report["load"]
    print(
        f"load: {load['name']}, {load['seconds']:.0f} s, mean {load['mean_qps']:.1f} q/s, "
        f"peak {load['peak_qps']:.1f} q/s"
    )
    print(
        f"queries: {report['queries']}, violations: {report['violations']} "
        f"({100 * report['violation_ratio']:.3f} %), p99 {report['p99_ms']:.1f} ms, "
        f"on Lambda {100 * report['lambda_share']:.1f} %"
    )
    for kind, count in report["violations_by"].items():
        print(f"  {kind}: {count}")
    print(
        f"cost: ${report['cost_aws_dollars']:.4f} on AWS's list prices "
        f"(${report['cost_aws_dollars_per_hour']:.4f}/h), {report['cost_infaas_units']:.4f} INFaaS units"
    )
    print(f"peak instances per pool: {report['peak_instances'] or 'none'}")
    if report["variants_not_measured_on_target"]:
        print(
            f"note: {report['variants_not_measured_on_target']} of {report['variants']} variants were not "
            "measured on their pool's hardware (imported or derived): the forecast is as good as they are"
        )
    for note in report["notes"]:
        print(f"scaler: {note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modelless-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", type=Path, required=True, help="GET /v1/variants' reply (JSON)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--trace", type=Path, help="CSV of arrivals (TIMESTAMP column first)")
    load.add_argument("--rate", type=float, help="a flat load, queries per second (default 10)")
    parser.add_argument("--mean-qps", type=float, help="scale the trace to this mean rate")
    parser.add_argument("--bin-s", type=float, default=1.0, help="the trace's rate bins (default 1 s)")
    parser.add_argument("--duration", type=float, help="seconds to simulate (default: 600, or the trace)")
    parser.add_argument("--latency-ms", type=float, help="every query's latency target")
    parser.add_argument("--accuracy", type=float, default=0.0, help="every query's accuracy floor")
    parser.add_argument("--model", help="name the model instead of model-less targets")
    parser.add_argument(
        "--max-workers", nargs="*", default=["cpu=4"], metavar="POOL=N", help="pools to scale and their caps"
    )
    parser.add_argument("--lambda-init-ms", type=float, default=DEFAULT_LAMBDA_INIT_MS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    for name in ("rate", "mean_qps", "duration", "latency_ms"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{name.replace('_', '-')} must be a positive number")
    if args.mean_qps is not None and args.trace is None:
        parser.error("--mean-qps scales a --trace; give --rate for a flat load")
    if not 0.0 <= args.accuracy <= 1.0:
        parser.error("--accuracy must be between 0 and 1")

    profiles = load_variants(args.variants)
    if args.model is not None and args.model not in {p.model_name for p in profiles}:
        parser.error(f"--model {args.model!r} is not among the variants' models")
    targets = QueryTargets(profiles[0].app_id, args.latency_ms, args.accuracy, args.model)
    curve = load_curve(args)
    print(
        f"simulating {curve.duration_s:.0f} s (+{WARMUP_S:.0f} s warm-up) of {curve.name} at mean "
        f"{curve.mean:.1f} q/s over {len(profiles)} variants…",
        file=sys.stderr,
    )
    result = simulate(profiles, curve, targets, pool_caps(args.max_workers), args.lambda_init_ms, args.seed)
    report = summary(result, curve, profiles)
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
