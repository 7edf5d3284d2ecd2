"""A hunt for wrong answers of the scaler's exact solver: many random problems, each solved by
``solve_exact`` and by the independent references of ``tests/scaling_reference.py`` (integral
packing: CBC on explicit workers, and the brute force where the problem is small enough).

    .venv/bin/python -m bench.scaler_check --count 300
    .venv/bin/python -m bench.scaler_check --case small:17          # one instance again
    .venv/bin/python -m bench.scaler_check --replay /tmp/scaler_check/false_bound-small-17.json

Per instance it records what is wrong, by kind:

- ``violations``: ``violations(problem, plan)`` is not empty;
- ``not_packable``: the plan's instances do not fit its workers (exact packing);
- ``unmet_mismatch``: the plan leaves more (or less) QPS unmet than the least possible;
- ``false_bound``: ``plan.lower_bound`` is above the optimum;
- ``false_optimal``: status "optimal" with an objective above the optimum (beyond the 0.01 % gap);
- ``dearer``: not called optimal, and above the optimum by more than 0.01 % (by how much: the
  table says; with a true lower bound this is a weak plan, not a wrong claim);
- ``cheaper_than_optimum``: an objective below the optimum at the same unmet (the plan or a
  reference is wrong);
- ``objective_mismatch``: ``plan.objective`` is not ``plan_costs`` of the plan;
- ``references_disagree``: the brute force and CBC differ (a reference is wrong);
- ``reference_timeout``: CBC stopped before proving its optimum (nothing else is judged);
- ``solver_error``: ``solve_exact`` raised.

Every instance with a finding is written to ``--out`` (``/tmp/scaler_check``) as
``<kind>-<source>-<seed>.json``: the problem (``problem_from_json`` reads it back), the
reference's answer, the plan's, and the command that reproduces it.

Sources: ``tiny`` (:func:`random_problem` at its tiny size: brute force and CBC), ``small`` (up to
3 pools, 4 groups, 6 variants: CBC, and the brute force where it is small enough), ``medium``
(up to 8 variants, needs up to 8 times larger: dozens of instances; CBC), ``mp1`` and ``mp2``
(``sim.problems.make_problem`` with 1 and 2 architectures: CBC). ``--case`` also takes the oracle
test's shapes (``tests/scaling_shapes.py``), e.g. ``--case must_cover_and_lax:17``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import modelless.scaling
from modelless.scaling.exact import solve_exact
from modelless.scaling.problem import PlanStatus, ScalingPlan, ScalingProblem, plan_costs, violations
from tests.scaling_reference import (
    ABSOLUTE,
    BOUND_REL,
    OPTIMAL_REL,
    TINY_COMBINATIONS,
    UNMET_REL,
    Reference,
    brute_force,
    case_problem,
    combinations,
    compact_cbc,
    packs,
    problem_from_json,
    problem_to_json,
)

DEFAULT_OUT = Path("/tmp/scaler_check")
SOLVER_LIMIT_S = 10.0  # solve_exact's time limit per instance
REFERENCE_LIMIT_S = 60.0  # CBC's, per stage
BRUTE_LIMIT = 10_000  # instance vectors up to which the brute force checks CBC (a few seconds)
# Of ten instances: four tiny, three small, one medium, one of make_problem's at each size.
SOURCES = ("tiny", "small", "tiny", "medium", "mp1", "tiny", "small", "tiny", "small", "mp2")
FAILURES = (
    "violations",
    "not_packable",
    "unmet_mismatch",
    "false_bound",
    "false_optimal",
    "cheaper_than_optimum",
    "objective_mismatch",
    "references_disagree",
    "solver_error",
)


@dataclass
class Outcome:
    case: str
    kinds: dict[str, str] = field(default_factory=dict)  # kind -> what, in words
    plan_objective: float | None = None
    reference_objective: float | None = None
    status: str = ""
    lower_bound: float | None = None
    size: str = ""  # variants/pools/groups
    seconds: float = 0.0  # solve_exact's


def solver_version() -> str:
    """A digest of the scaler's sources (the solver is being rewritten: which one was judged)."""
    folder = Path(modelless.scaling.__file__).parent
    digest = hashlib.sha1()
    newest = 0.0
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
        newest = max(newest, path.stat().st_mtime)
    changed = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(newest))
    return f"modelless/scaling sha1 {digest.hexdigest()[:12]} (last changed {changed} UTC)"


def unmet_total(plan: ScalingPlan) -> float:
    return sum(plan.unmet_qps.values())


def same(a: float, b: float, relative: float) -> bool:
    return abs(a - b) <= relative * max(1.0, abs(a), abs(b))


def references(
    problem: ScalingProblem, source: str, brute_limit: int = BRUTE_LIMIT
) -> tuple[Reference, dict[str, str]]:
    """CBC's answer, checked against the brute force's where the problem is small enough (the
    brute force's then: it is exact by construction)."""
    found: dict[str, str] = {}
    cbc = compact_cbc(problem, REFERENCE_LIMIT_S)
    if source == "tiny" or combinations(problem) <= brute_limit:
        brute = brute_force(problem, max(brute_limit, TINY_COMBINATIONS))
        if (
            not same(brute.unmet_qps, cbc.unmet_qps, UNMET_REL)
            or abs(brute.objective - cbc.objective) > BOUND_REL * brute.objective + ABSOLUTE
        ):
            found["references_disagree"] = (
                f"brute force {brute.objective:.9g} (unmet {brute.unmet_qps:.6g}) vs CBC "
                f"{cbc.objective:.9g} (unmet {cbc.unmet_qps:.6g}, proven {cbc.proven})"
            )
        return brute, found  # exact by construction
    return cbc, found


def judge(problem: ScalingProblem, plan: ScalingPlan, reference: Reference) -> dict[str, str]:
    """What is wrong with ``plan`` against the optimum (module docstring's kinds)."""
    found: dict[str, str] = {}
    broken = violations(problem, plan)
    if broken:
        found["violations"] = "; ".join(broken[:3])
    unpacked = packs(problem, plan)
    if unpacked:
        found["not_packable"] = "; ".join(unpacked[:3])
    _, objective = plan_costs(problem, plan.instances, plan.workers, plan.lambda_qps)
    if abs(objective - plan.objective) > 1e-9 * max(abs(objective), 1e-12):
        found["objective_mismatch"] = f"plan says {plan.objective:.9g}, plan_costs {objective:.9g}"
    if not reference.proven:
        found["reference_timeout"] = f"CBC stopped at {reference.objective:.9g}, unproven"
        return found
    optimum = reference.objective
    unmet = unmet_total(plan)
    unmet_equal = same(unmet, reference.unmet_qps, UNMET_REL)
    if not unmet_equal:
        found["unmet_mismatch"] = f"plan leaves {unmet:.6g} QPS unmet, the least is {reference.unmet_qps:.6g}"
    if plan.lower_bound is not None and plan.lower_bound > optimum * (1 + BOUND_REL) + ABSOLUTE:
        found["false_bound"] = (
            f"lower bound {plan.lower_bound:.9g} > optimum {optimum:.9g} "
            f"(+{(plan.lower_bound / optimum - 1) * 100 if optimum > 0 else math.inf:.3g} %)"
        )
    above = plan.objective > optimum * (1 + OPTIMAL_REL) + ABSOLUTE
    excess = (plan.objective / optimum - 1) * 100 if optimum > 0 else math.inf
    if above and plan.status is PlanStatus.OPTIMAL:
        found["false_optimal"] = f"'optimal' at {plan.objective:.9g}, optimum {optimum:.9g} (+{excess:.3g} %)"
    elif above and unmet_equal:
        found["dearer"] = (
            f"{plan.status.value} at {plan.objective:.9g}, optimum {optimum:.9g} (+{excess:.3g} %)"
        )
    if unmet_equal and plan.objective < optimum * (1 - BOUND_REL) - ABSOLUTE:
        found["cheaper_than_optimum"] = f"plan {plan.objective:.9g} < optimum {optimum:.9g}"
    return found


def check(
    case: str, problem: ScalingProblem | None = None, brute_limit: int = BRUTE_LIMIT
) -> tuple[Outcome, Reference | None, ScalingPlan | None]:
    problem = case_problem(case) if problem is None else problem
    source = case.partition(":")[0]
    outcome = Outcome(case, size=f"{len(problem.variants)}v/{len(problem.pools)}p/{len(problem.groups)}g")
    started = time.perf_counter()
    try:
        plan = solve_exact(problem, time_limit_s=SOLVER_LIMIT_S)
    except Exception:  # a crash is a finding, not the end of the hunt
        outcome.kinds["solver_error"] = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return outcome, None, None
    outcome.seconds = time.perf_counter() - started
    outcome.plan_objective = plan.objective
    outcome.status = plan.status.value
    outcome.lower_bound = plan.lower_bound
    reference, disagreements = references(problem, source, brute_limit)
    outcome.reference_objective = reference.objective
    outcome.kinds.update(disagreements)
    outcome.kinds.update(judge(problem, plan, reference))
    return outcome, reference, plan


def plan_json(plan: ScalingPlan) -> dict[str, Any]:
    return {
        "objective": plan.objective,
        "status": plan.status.value,
        "lower_bound": plan.lower_bound,
        "instances": {f"{v}@{p}": n for (v, p), n in plan.instances.items()},
        "workers": dict(plan.workers),
        "lambda_qps": dict(plan.lambda_qps),
        "unmet_qps": dict(plan.unmet_qps),
        "served": {f"{v}->{g}": qps for (v, g), qps in plan.served.items()},
        "notes": list(plan.notes),
    }


def save(
    out: Path,
    outcome: Outcome,
    problem: ScalingProblem,
    reference: Reference | None,
    plan: ScalingPlan | None,
    version: str,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    source, _, seed = outcome.case.partition(":")
    record = {
        "case": outcome.case,
        "kinds": outcome.kinds,
        "solver_version": version,
        "reproduce": f".venv/bin/python -m bench.scaler_check --case {outcome.case}",
        "load": "tests.scaling_reference.problem_from_json(json.load(open(PATH))['problem'])",
        "reference": None if reference is None else asdict(reference),
        "plan": None if plan is None else plan_json(plan),
        "problem": problem_to_json(problem),
    }
    written = []
    for kind in outcome.kinds:
        path = out / f"{kind}-{source}-{seed}.json"
        path.write_text(json.dumps(record, indent=1, sort_keys=True))
        written.append(path)
    return written


def row(outcome: Outcome) -> str:
    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.6g}"

    kinds = ",".join(outcome.kinds) or "agree"
    return (
        f"{outcome.case:<11} {outcome.size:<10} {outcome.status:<19} {number(outcome.plan_objective):>12} "
        f"{number(outcome.reference_objective):>12} {number(outcome.lower_bound):>12} "
        f"{outcome.seconds:6.2f}  {kinds}"
    )


HEADER = (
    f"{'case':<11} {'size':<10} {'status':<19} {'objective':>12} {'optimum':>12} {'lower bound':>12} "
    f"{'secs':>6}  findings"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=300, help="instances (default 300)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--case", action="append", default=[], help="source:seed, e.g. small:17 (repeatable)")
    parser.add_argument("--replay", type=Path, action="append", default=[], help="a saved instance")
    parser.add_argument("--budget-s", type=float, default=600.0, help="start no instance after this")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--brute-limit",
        type=int,
        default=BRUTE_LIMIT,
        help=f"check CBC by the brute force up to this many instance vectors (default {BRUTE_LIMIT})",
    )
    parser.add_argument("--quiet", action="store_true", help="print only instances with findings")
    args = parser.parse_args(argv)

    jobs: list[tuple[str, ScalingProblem | None]] = []
    for path in args.replay:
        saved = json.loads(path.read_text())
        jobs.append((saved["case"], problem_from_json(saved["problem"])))
    jobs += [(case, None) for case in args.case]
    if not jobs:
        jobs = [(f"{SOURCES[i % len(SOURCES)]}:{args.first_seed + i}", None) for i in range(args.count)]

    version = solver_version()
    print(f"judging solve_exact of {version}")
    started = time.perf_counter()
    tally: Counter[str] = Counter()
    excess: list[float] = []
    done = 0
    failing: list[Outcome] = []
    print(HEADER, flush=True)
    for case, given in jobs:
        if time.perf_counter() - started > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: {done} of {len(jobs)} instances checked")
            break
        problem = case_problem(case) if given is None else given
        outcome, reference, plan = check(case, problem, args.brute_limit)
        done += 1
        tally.update(list(outcome.kinds) or ["agree"])
        if "dearer" in outcome.kinds and outcome.plan_objective and outcome.reference_objective:
            excess.append((outcome.plan_objective / outcome.reference_objective - 1) * 100)
        if outcome.kinds:
            save(args.out, outcome, problem, reference, plan, version)
            failing.append(outcome)
        if outcome.kinds or not args.quiet:
            print(row(outcome), flush=True)
            for kind, what in outcome.kinds.items():
                print(f"    {kind}: {what}", flush=True)

    print(f"\n{done} instances in {time.perf_counter() - started:.0f} s")
    for kind, count in sorted(tally.items(), key=lambda item: (-item[1], item[0])):
        marker = "FAIL" if kind in FAILURES else "    "
        print(f"  {marker} {kind:<22} {count}")
    if excess:
        print(f"  dearer by: median {sorted(excess)[len(excess) // 2]:.3g} %, worst {max(excess):.3g} %")
    if failing:
        print(f"instances with findings written to {args.out}/<kind>-<source>-<seed>.json")
    return 1 if any(kind in FAILURES for kind in tally) else 0


if __name__ == "__main__":
    raise SystemExit(main())
