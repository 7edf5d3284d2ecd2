"""Benchmark of the variant-mix program (docs/ARCHITECTURE.md §5): the exact solver's time and proven gap,
and the greedy's gap. Writes its write-up to ``<out>/scaler.md`` and the raw numbers to
``<out>/scaler.json``.

    python -m bench.scaler [--sizes 10,50,100,500,2000] [--repeats 3] [--limit 1]
        [--deadline-sizes 10000,30000] [--instance-counts 1,10,100,1000,10000,30000]
        [--gap-instances 50] [--compact-sizes 10,50] [--out docs/bench]

INFaaS reports Gurobi taking 23 s for 50 architectures and 50 s for 100 (§4.2.1) and gives up on
the exact program; this measures HiGHS (``scipy.optimize``) on the same scale and beyond.

Instances are random but shaped like the catalog, and like what the scaler builds: every
architecture has 8 variants (fp32 and int8, two optimisation levels, one or two threads) on each
of 4 provisioned pools (c5.large, c5.2xlarge, g4dn.xlarge with 4 instances per T4, inf1.xlarge
with 4 per Inferentia chip), with batch latency tables, peak memory and load times; a worker holds
one instance of a variant (``one_instance_per_worker``, as ``ScalerConfig`` has it); two latency
classes of load per architecture (some idle, some with an accuracy class only fp32 meets); a
Lambda price per query for about half the groups; one variant per architecture already running
for half of them, on ready workers (a worker start-up of 60 s for the others); INFaaS's
λ = 0.01/s; slack 0.1. Seeded: the same arguments give the same instances.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import DEFAULT_OUT_DIR, machine, span, today, write_fragment
from modelless.scaling import (
    PlanStatus,
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    solve_compact,
    solve_exact,
    solve_greedy,
    violations,
)
from modelless.scaling.deadline import Deadline
from modelless.scaling.exact import POOR_GAP
from sim.problems import (
    make_problem,
)

TIMES = "\u00d7"  # for the Markdown: the multiplication sign


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gap(reference: float, objective: float) -> float:
    """How much more ``objective`` is than ``reference``, in percent."""
    return 100.0 * (objective - reference) / reference if reference > 0 else 0.0


def _check(problem: ScalingProblem, plan: ScalingPlan) -> None:
    broken = violations(problem, plan)
    if broken:
        raise AssertionError(f"{plan.solver} plan breaks constraints: {broken[:3]}")


def _timed(solve: Any, problem: ScalingProblem, *args: Any) -> tuple[ScalingPlan, float]:
    started = time.perf_counter()
    plan = solve(problem, *args)
    return plan, time.perf_counter() - started


def _timed_cpu(solve: Any, problem: ScalingProblem, *args: Any) -> tuple[ScalingPlan, float, float]:
    """The plan, its wall time and the process's CPU time for it (HiGHS's threads included)."""
    cpu = time.process_time()
    plan, seconds = _timed(solve, problem, *args)
    return plan, seconds, time.process_time() - cpu


def instances_problem(count: int) -> ScalingProblem:
    """One pool, two variants: ``count`` instances of one (one per worker, as the project's
    workers hold a variant) for a group Lambda may not serve, and ``count / 2`` of the other (four
    to a worker) for a group Lambda may serve at a worker's price: the plan's reading, its
    packing above all, at a given number of instances."""
    pool = ScalingPool("cpu", 0.17 / 3600, {"vcpu": 4.0, "memory_mb": 8192.0})
    one = ScalingVariant("one", "cpu", {"tight": 10.0}, {"vcpu": 1.0, "memory_mb": 1000.0}, max_per_worker=1)
    four = ScalingVariant("four", "cpu", {"lax": 20.0}, {"vcpu": 1.0, "memory_mb": 1500.0})
    groups = [
        ScalingGroup("tight", 10.0 * (count - 0.5), 50.0, None),
        ScalingGroup("lax", 20.0 * count / 2, 200.0, pool.price_per_worker_second / 20.0),
    ]
    return ScalingProblem([one, four], [pool], groups)


def bench_instances(counts: Sequence[int], limit_s: float) -> list[dict[str, Any]]:
    """The scaler's call (``solve_exact`` under its limit) at 1 to 30,000 instances of a variant."""
    found = []
    for count in counts:
        problem = instances_problem(count)
        plan, seconds, cpu = _timed_cpu(solve_exact, problem, limit_s)
        _check(problem, plan)
        _check_deadline(plan, seconds, limit_s)
        found.append({"instances_of_one_variant": count, "instances": plan.total_instances,
                      "workers": sum(plan.workers.values()), "seconds": seconds, "cpu_seconds": cpu,
                      "status": plan.status.value, "overrun_s": max(0.0, seconds - limit_s)})  # fmt: skip
        print(f"  {count:,} instances of one variant: {seconds:.3f} s ({cpu:.3f} CPU-s), "
              f"{plan.status.value}, "
              f"{plan.total_instances:,} instances on {sum(plan.workers.values()):,} workers", flush=True)
    return found


def bench_size(size: int, repeats: int, time_limit_s: float, limit_s: float, compact: bool) -> dict[str, Any]:
    """One size: per repeat, the exact solve to its proof, what the scaler's limit returns, the
    greedy, and (``compact``) the compact program INFaaS writes, all checked for validity."""
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        problem = make_problem(size, seed=1000 * size + repeat)
        exact, exact_s = _timed(solve_exact, problem, time_limit_s)
        limited, limited_s, limited_cpu = _timed_cpu(solve_exact, problem, limit_s)
        _check_deadline(limited, limited_s, limit_s)
        greedy, greedy_s = _timed(solve_greedy, problem)
        for plan in (exact, limited, greedy):
            _check(problem, plan)
        optimum = exact.objective if exact.status is PlanStatus.OPTIMAL else None
        run: dict[str, Any] = {
            "seed": 1000 * size + repeat,
            "variants": len(problem.variants),
            "groups": len(problem.groups),
            "exact": {"seconds": exact_s, "status": exact.status.value, "objective": exact.objective,
                      "lower_bound": exact.lower_bound, "certified_gap_pct": _pct(exact.gap)},
            "limited": {"seconds": limited_s, "cpu_seconds": limited_cpu, "status": limited.status.value,
                        "solver": limited.solver,
                        "objective": limited.objective, "lower_bound": limited.lower_bound,
                        "certified_gap_pct": _pct(limited.gap),
                        "overrun_s": max(0.0, limited_s - limit_s),
                        "gap_to_optimum_pct": None if optimum is None else _gap(optimum, limited.objective)},
            "greedy": {"seconds": greedy_s, "objective": greedy.objective,
                       "gap_to_optimum_pct": None if optimum is None else _gap(optimum, greedy.objective)},
        }  # fmt: skip
        if compact:
            reference, reference_s = _timed(solve_compact, problem, time_limit_s)
            _check(problem, reference)
            both = {exact.status, reference.status} == {PlanStatus.OPTIMAL}
            if both and abs(reference.objective - exact.objective) > 2e-4 * reference.objective:
                raise AssertionError(f"seed {run['seed']}: the two programs' optima differ")
            run["compact"] = {"seconds": reference_s, "status": reference.status.value,
                              "objective": reference.objective}  # fmt: skip
        runs.append(run)
        print(f"  {size} architectures, seed {run['seed']}: exact {exact_s:.3f} s ({exact.status.value}), "
              f"{limit_s:g} s limit: {limited_s:.3f} s, certified gap {_fmt(_pct(limited.gap))} %, "
              f"greedy {greedy_s * 1000:.0f} ms"
              + (f", compact {run['compact']['seconds']:.2f} s" if compact else ""), flush=True)  # fmt: skip
    return {"architectures": size, "runs": runs}


# What a call may take beyond its deadline before the bench says it overran: the clock is read
# between steps, and the last one (reading the plan) is bounded, not instantaneous.
DEADLINE_TOLERANCE = 0.1


def _check_deadline(plan: ScalingPlan, seconds: float, limit_s: float) -> None:
    if seconds > limit_s * (1 + DEADLINE_TOLERANCE):
        print(f"  OVERRUN: {plan.solver} took {seconds:.3f} s under a {limit_s:g} s deadline", flush=True)


def bench_deadline(size: int, repeats: int, limit_s: float) -> dict[str, Any]:
    """One size beyond what the proof can reach: only the scaler's call (the exact solver under
    its limit) and the greedy under the same deadline, each timed and checked."""
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        seed = 1000 * size + repeat
        problem = make_problem(size, seed=seed)
        limited, limited_s, limited_cpu = _timed_cpu(solve_exact, problem, limit_s)
        greedy, greedy_s = _timed(lambda p: solve_greedy(p, deadline=Deadline.after(limit_s)), problem)
        for plan, seconds in ((limited, limited_s), (greedy, greedy_s)):
            _check(problem, plan)
            _check_deadline(plan, seconds, limit_s)
        runs.append({
            "seed": seed,
            "variants": len(problem.variants),
            "groups": len(problem.groups),
            "limited": {"seconds": limited_s, "cpu_seconds": limited_cpu, "status": limited.status.value,
                        "solver": limited.solver, "objective": limited.objective,
                        "certified_gap_pct": _pct(limited.gap), "unmet_qps": sum(limited.unmet_qps.values()),
                        "overrun_s": max(0.0, limited_s - limit_s),
                        "holding": any("holding plan" in note for note in limited.notes)},
            "greedy": {"seconds": greedy_s, "status": greedy.status.value, "objective": greedy.objective,
                       "unmet_qps": sum(greedy.unmet_qps.values()), "overrun_s": max(0.0, greedy_s - limit_s),
                       "holding": any("holding plan" in note for note in greedy.notes)},
        })  # fmt: skip
        print(f"  {size} architectures, seed {seed}: exact under {limit_s:g} s: {limited_s:.3f} s "
              f"({limited_cpu:.3f} CPU-s, {limited.status.value}, certified gap "
              f"{_fmt(_pct(limited.gap))} %), greedy under the same "
              f"deadline {greedy_s:.3f} s ({greedy.status.value})", flush=True)  # fmt: skip
    return {"architectures": size, "runs": runs}


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _fmt(value: float | None, digits: int = 2) -> str:
    return "\u2014" if value is None else f"{value:.{digits}f}"


def bench_gap(instances: int, architectures: int, time_limit_s: float) -> dict[str, Any]:
    """The greedy against the proven optimum on many small random problems."""
    gaps: list[float] = []
    proven = 0
    for seed in range(instances):
        problem = make_problem(architectures, seed=90_000 + seed)
        exact = solve_exact(problem, time_limit_s)
        greedy = solve_greedy(problem)
        _check(problem, exact)
        _check(problem, greedy)
        if exact.status is PlanStatus.OPTIMAL:
            proven += 1
            gaps.append(_gap(exact.objective, greedy.objective))
    return {
        "instances": instances,
        "architectures": architectures,
        "proven_optimal": proven,
        "gaps_pct": gaps,
        "mean_pct": statistics.mean(gaps) if gaps else None,
        "median_pct": statistics.median(gaps) if gaps else None,
        "max_pct": max(gaps) if gaps else None,
        "greedy_optimal": sum(g < 0.01 for g in gaps),
    }


def _spread(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    """median (min-max)"""
    if not values:
        return "\u2014"
    scaled = [v * scale for v in values]
    middle = f"{statistics.median(scaled):.{digits}f}"
    spread = span(scaled, digits)
    return f"{middle} ({spread})" if "\u2013" in spread else middle


def _largest_gap(runs: Sequence[dict[str, Any]]) -> float | None:
    """The largest gap the scaler's limit proved, over the runs."""
    gaps = [g for run in runs if (g := run["limited"]["certified_gap_pct"]) is not None]
    return max(gaps, default=None)


def write_report(out: Path, report: dict[str, Any]) -> None:
    """``scaler.md`` (a fragment of docs/BENCHMARKS.md) and ``scaler.json``."""
    limit = report["limit_s"]
    lines = [
        "## The scaler's variant-mix program (docs/ARCHITECTURE.md §5)",
        "",
        f"Machine: `{report['machine']}` ({report['cpu']}); {report['date']}. "
        f"Reproduce: `{report['command']}` "
        f"(this run: {report['seconds']:.0f} s). {report['repeats']} problem(s) per size; every figure is "
        "the median and the min\u2013max over them. Other work may have shared the cores: the times are "
        "noisy, the gaps and statuses are not.",
        "",
        "Problems: seeded, shaped like the catalog and like what the scaler builds "
        f"(`bench/scaler.py`): per architecture 8 variants (fp32/int8 {TIMES} two optimisation levels "
        f"{TIMES} one or two threads) on each of 4 provisioned pools (c5.large, c5.2xlarge, g4dn.xlarge with "
        "4 instances per T4, inf1.xlarge with 4 per chip), a worker holding one instance of a variant "
        "(`ScalerConfig.one_instance_per_worker`, the row `n[v] <= w[p]`), batch-latency tables, memory "
        "and load times that grow with model size, two latency classes of load per architecture, a "
        "Lambda price for about half the groups, one variant already running for half the "
        "architectures, pool limits. Every plan is checked against the program's constraints "
        "(`violations()`); the bench fails if one breaks them.",
        "",
        "| architectures | variants | groups | exact, to its proof: seconds | status "
        f"| the scaler's {limit:g} s limit: seconds | CPU seconds | its certified gap, % "
        "| its gap to the optimum, % | greedy: ms | greedy's gap to the optimum, % "
        "| the compact program (INFaaS's formulation): seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in report["sizes"]:
        runs = size["runs"]
        optimal = [r for r in runs if r["exact"]["status"] == "optimal"]
        statuses = "/".join(sorted({r["exact"]["status"] for r in runs}))
        limited_statuses = sorted({r["limited"]["status"] for r in runs})
        from_greedy = sum(r["limited"]["solver"] == "greedy" for r in runs)
        limited_how = "/".join(limited_statuses) + (
            f"; the greedy's plan in {from_greedy}" if from_greedy else ""
        )
        compact = [r["compact"]["seconds"] for r in runs if "compact" in r]
        lines.append(
            "| " + " | ".join([
                str(size["architectures"]),
                f"{statistics.median(r['variants'] for r in runs):,.0f}",
                f"{statistics.median(r['groups'] for r in runs):,.0f}",
                _spread([r["exact"]["seconds"] for r in runs]),
                f"{statuses} ({len(optimal)}/{len(runs)})",
                _spread([r["limited"]["seconds"] for r in runs]) + f" ({limited_how})",
                _spread([c for r in runs if (c := r["limited"].get("cpu_seconds")) is not None]),
                _spread([g for r in runs if (g := r["limited"]["certified_gap_pct"]) is not None], digits=2),
                _spread([r["limited"]["gap_to_optimum_pct"] for r in optimal], digits=2),
                _spread([r["greedy"]["seconds"] for r in runs], scale=1000, digits=0),
                _spread([r["greedy"]["gap_to_optimum_pct"] for r in optimal], digits=2),
                _spread(compact, digits=2) if compact else "not run",
            ]) + " |"
        )  # fmt: skip
    proven = ", ".join(
        f"{size['architectures']}: {sum(r['limited']['status'] == 'optimal' for r in size['runs'])}"
        f"/{len(size['runs'])}"
        for size in report["sizes"]
    )
    worst = ", ".join(
        f"{size['architectures']}: {_fmt(_largest_gap(size['runs']))} %" for size in report["sizes"]
    )
    calls = [r["limited"] for size in report["sizes"] for r in size["runs"]]
    calls += [
        r[k] for size in report.get("deadline_sizes", []) for r in size["runs"] for k in ("limited", "greedy")
    ]
    calls += report.get("instance_counts", [])
    longest = max((c["seconds"] for c in calls), default=0.0)
    overran = sum(c["seconds"] > limit * (1 + DEADLINE_TOLERANCE) for c in calls)
    lines += [
        "",
        f"Plans proven optimal within the scaler's {limit:g} s limit, per size: {proven}; the largest "
        f"gap proven for the others: {worst}. INFaaS reports Gurobi taking 23 s for 50 architectures "
        "and 50 s for 100 on its program (§4.2.1), and uses a greedy instead.",
        "",
        f"**The deadline.** {len(calls)} calls under the {limit:g} s limit (every size, the table below "
        f"included): the longest took {longest:.3f} s; {overran} took more than "
        f"{100 * DEADLINE_TOLERANCE:g} % over the limit.",
    ]
    if report.get("deadline_sizes"):
        lines += [
            "",
            f"Beyond what a proof reaches, the scaler's call alone (the exact solver under its {limit:g} s "
            "limit) and the greedy under the same deadline (`solve_greedy(..., deadline=...)`); where "
            "neither finds a plan in time, the *holding plan* (`modelless.scaling.deadline`): what runs "
            "now keeps running, Lambda takes what it may, the rest is reported unmet.",
            "",
            f"| architectures | variants | groups | exact under {limit:g} s: seconds | CPU seconds "
            "| its status "
            "| certified gap, % | unmet QPS | greedy under the same deadline: seconds | its status "
            "| unmet QPS |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for size in report["deadline_sizes"]:
            runs = size["runs"]

            def how(kind: str, runs: list[dict[str, Any]] = runs) -> str:
                statuses = "/".join(sorted({r[kind]["status"] for r in runs}))
                held = sum(r[kind]["holding"] for r in runs)
                return statuses + (f" (holding plan in {held})" if held else "")

            lines.append(
                "| " + " | ".join([
                    f"{size['architectures']:,}",
                    f"{statistics.median(r['variants'] for r in runs):,.0f}",
                    f"{statistics.median(r['groups'] for r in runs):,.0f}",
                    _spread([r["limited"]["seconds"] for r in runs]),
                    _spread([c for r in runs if (c := r["limited"].get("cpu_seconds")) is not None]),
                    how("limited"),
                    _spread([g for r in runs if (g := r["limited"]["certified_gap_pct"]) is not None],
                            digits=2),
                    _spread([r["limited"]["unmet_qps"] for r in runs], digits=0),
                    _spread([r["greedy"]["seconds"] for r in runs]),
                    how("greedy"),
                    _spread([r["greedy"]["unmet_qps"] for r in runs], digits=0),
                ]) + " |"
            )  # fmt: skip
    if report.get("instance_counts"):
        lines += [
            "",
            f"**Instances per variant.** The scaler's call under its {limit:g} s limit on one pool with "
            "`n` instances of one variant (one per worker) for a group Lambda may not serve and `n / 2` "
            "of another (four to a worker) beside it (`bench.scaler.instances_problem`): reading the "
            "plan back, its packing above all, at every count. The packing goes by counts per variant "
            "and run of identical workers, not instance by instance.",
            "",
            f"| instances of one variant | instances | workers | seconds under {limit:g} s | CPU seconds "
            "| status |",
            "|---|---|---|---|---|---|",
        ]
        for row in report["instance_counts"]:
            lines.append(
                f"| {row['instances_of_one_variant']:,} | {row['instances']:,} | {row['workers']:,} | "
                f"{row['seconds']:.3f} | {row['cpu_seconds']:.3f} | {row['status']} |"
            )
    gap = report["greedy_gap"]
    lines += [
        "",
        f"Greedy against the proven optimum on {gap['instances']} random problems of "
        f"{gap['architectures']} architectures ({gap['proven_optimal']} proven optimal): gap mean "
        f"{_fmt(gap['mean_pct'])} %, median {_fmt(gap['median_pct'])} %, max {_fmt(gap['max_pct'])} %; "
        f"the greedy found the optimum in {gap['greedy_optimal']} of them.",
        "",
        "Columns: *exact, to its proof* is `solve_exact` with a limit of "
        f"{report['time_limit_s']:g} s, the time to a plan proven optimal (within HiGHS's 0.01 % "
        f"gap); *the scaler's {limit:g} s limit* is what the scaler runs (`ScalerConfig.time_limit_s`: a "
        "deadline for the whole call): the plan it returns, the gap it proves against its own lower "
        "bound (`ScalingPlan.gap`, 0 when proven optimal), and its actual gap to the optimum found by "
        "the run to the proof; where the deadline stopped HiGHS with a certified gap over "
        f"{100 * POOR_GAP:g} %, the greedy's plan (under the same deadline) replaces its plan when "
        'cheaper ("the greedy\'s plan in n"); '
        "*the compact program* is `solve_compact`, the same program written as "
        "INFaaS does (integer instances per variant, no patterns), on the same problems, to the same "
        "optimum.",
        "",
        "How `solve_exact` gets there (its module docstring has the details): the groups are coupled "
        "only through the pools, so each component (an architecture's groups here) is written as "
        "patterns, a binary per way of serving it with one instance (or two, where LP duality says "
        "a second may pay), whose LP relaxation is far tighter than the compact program's; ways with "
        "more instances are first replaced by stand-ins that relax them (least resources, least "
        "cost), and only where the optimum picks a stand-in do they get their true patterns or "
        "compact rows. That search only finds plans: the pattern program is a restriction, so the plan's "
        "lower bound (its certified gap, and \"optimal\") comes from the compact program alone, a "
        "relaxation of every plan that packs: its LP's bound, then HiGHS on its MILP with the plan's "
        "objective as the cutoff (`bounds.certify`, issue 32). Where that does not finish within the "
        "limit, the plan has no certified gap (\u2014).",
    ]
    write_fragment(out, "scaler", "\n".join(lines), {**report, "headlines": _headlines(report)})


def _headlines(report: dict[str, Any]) -> list[str]:
    """The one-line results docs/BENCHMARKS.md's summary quotes."""
    found = []
    limit = report["limit_s"]
    for size in report["sizes"]:
        runs = size["runs"]
        proven = sum(r["limited"]["status"] == "optimal" for r in runs)
        to_proof = sum(r["exact"]["status"] == "optimal" for r in runs)
        uncertified = sum(r["limited"]["certified_gap_pct"] is None for r in runs)
        found.append(
            f"variant-mix program, {size['architectures']} architectures: proven optimal in "
            f"{_spread([r['exact']['seconds'] for r in runs], digits=2)} s ({to_proof}/{len(runs)} "
            f"proven within {report['time_limit_s']:g} s); within the scaler's {limit:g} s limit "
            f"{proven}/{len(runs)} proven, largest certified gap {_fmt(_largest_gap(runs))} %"
            + (f" ({uncertified} without a certified gap)" if uncertified else "")
        )
    gap = report["greedy_gap"]
    found.append(
        f"greedy vs the optimum on {gap['instances']} problems of {gap['architectures']} architectures: "
        f"mean {_fmt(gap['mean_pct'])} %, max {_fmt(gap['max_pct'])} %"
    )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,50,100,500,2000", help="architecture counts, comma separated")
    parser.add_argument(
        "--deadline-sizes",
        default="10000,30000",
        help="sizes run under the limit only (no proof), comma separated",
    )
    parser.add_argument("--deadline-repeats", type=int, default=1, help="problems per deadline size")
    parser.add_argument(
        "--instance-counts",
        default="1,10,100,1000,10000,30000",
        help="instances of one variant to plan under the limit, comma separated ('' for none)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="problems per size (median, min-max)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="the run to the proof: its limit, s")
    parser.add_argument("--limit", type=float, default=1.0, help="the scaler's time limit, s")
    parser.add_argument("--gap-instances", type=int, default=50)
    parser.add_argument("--gap-architectures", type=int, default=5)
    parser.add_argument(
        "--compact-sizes", default="10,50", help="sizes to solve with the compact program too ('' for none)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help="where scaler.md and .json go")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    compact_sizes = {int(s) for s in args.compact_sizes.split(",") if s}
    started = time.perf_counter()
    print(f"machine: {machine()} ({cpu_model()})", flush=True)
    results = [
        bench_size(size, args.repeats, args.time_limit, args.limit, size in compact_sizes) for size in sizes
    ]
    deadline_sizes = [int(s) for s in args.deadline_sizes.split(",") if s]
    beyond = [bench_deadline(size, args.deadline_repeats, args.limit) for size in deadline_sizes]
    per_variant = bench_instances([int(s) for s in args.instance_counts.split(",") if s], args.limit)
    gap = bench_gap(args.gap_instances, args.gap_architectures, args.time_limit)
    print(
        f"greedy vs exact on {gap['instances']} problems of {gap['architectures']} architectures: mean "
        f"{_fmt(gap['mean_pct'])} %, median {_fmt(gap['median_pct'])} %, max {_fmt(gap['max_pct'])} %, "
        f"greedy optimal in {gap['greedy_optimal']}"
    )
    command = "scripts/bench scaler" + ("" if argv is None and len(sys.argv) <= 1 else " " + " ".join(
        sys.argv[1:] if argv is None else list(argv)))  # fmt: skip
    report = {
        "machine": machine(),
        "cpu": cpu_model(),
        "date": today(),
        "command": command.strip(),
        "seconds": time.perf_counter() - started,
        "repeats": args.repeats,
        "time_limit_s": args.time_limit,
        "limit_s": args.limit,
        "sizes": results,
        "deadline_sizes": beyond,
        "instance_counts": per_variant,
        "greedy_gap": gap,
    }
    write_report(args.out, report)
    print(f"bench took {report['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
