"""The pipeline planner (InferLine §4, the low-frequency planner): for an arrival rate, every
stage's variant (across architectures' variants, precisions and pools), batch size and instance
count, at the least cost that keeps the end-to-end p99 within the SLO.

It reuses the variant-mix program (``modelless.scaling``): a pipeline at ``qps`` is one
``ScalingProblem`` with a group per stage, whose load is ``qps`` times the stage's probability of
running (measured branch probabilities) and whose latency budget is the stage's share of the
SLO. A variant's capacity within a budget (``saturation_for_budget``) already holds its queue's
p99 wait, so if every path's budgets sum to at most the SLO, so does every path's p99. What is
left is how to split the SLO between the stages: the planner enumerates splits (weights per
stage, each stage's share scaled so that its longest path sums to the SLO), solves each split's
problem with the scaler's own solver, and keeps the cheapest plan that serves all the load.

Pure: profiles, pools and branch probabilities in; a plan, with the reasons for it, out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from modelless.catalog import PoolKind, PoolSpec
from modelless.pipelines.spec import ConditionKind, PipelineSpec
from modelless.scaling import (
    ScalingGroup,
    ScalingPlan,
    ScalingProblem,
    one_instance_per_worker,
    pool_from_spec,
    solve_exact,
    variant_from_profile,
)
from modelless.scaling.problem import batch_rate, lambda_option
from modelless.types import VariantProfile

# An edge never measured is taken this often when it has a condition (an "always" edge: 1).
UNMEASURED_BRANCH_PROBABILITY = 0.5
MAX_SPLITS = 128  # latency splits solved per plan (InferLine's planner searches a similar few)
SOLVE_TIME_LIMIT_S = 0.5

Solver = Callable[[ScalingProblem], ScalingPlan]


@dataclass(frozen=True)
class VariantChoice:
    variant_id: str
    pool: str
    precision: str
    batch: int  # the batch size its capacity within the budget is planned at
    p99_ms: float  # its profiled p99 at that batch
    qps: float  # the stage's load it serves
    instances: int  # its instances in the plan (shared by the stages of its model)
    capacity_qps: float  # what one instance takes within the stage's budget, its queue included
    throughput_qps: float  # what one instance runs flat out at that batch (batch over its p99)


@dataclass(frozen=True)
class StagePlan:
    stage: str
    model: str
    probability: float  # that a query reaches the stage
    load_qps: float
    budget_ms: float  # the stage's share of the SLO
    choices: list[VariantChoice]
    lambda_qps: float = 0.0
    unmet_qps: float = 0.0


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: str
    arrival_qps: float
    slo_ms: float
    feasible: bool  # every stage's load is served within its budget
    cost_per_second: float
    stages: list[StagePlan]
    critical_path_ms: float  # the largest sum of budgets along a path (<= the SLO)
    splits_tried: int
    workers: Mapping[str, int] = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)

    def budgets(self) -> dict[str, float]:
        return {s.stage: s.budget_ms for s in self.stages}

    def instances(self) -> dict[str, int]:
        """Per stage, the instances of the variants serving it."""
        return {s.stage: sum(c.instances for c in s.choices) for s in self.stages}


def stage_probabilities(
    spec: PipelineSpec,
    measured: Mapping[str, float | None],
    unmeasured: float = UNMEASURED_BRANCH_PROBABILITY,
) -> dict[str, float]:
    """Per stage, the probability that a query reaches it: 1 for the entry; else one less the
    chance that none of its incoming edges is taken, each taken with its source's probability
    times its own (``measured`` per edge key; an edge not measured yet: 1 when unconditional,
    else ``unmeasured``), the edges taken as independent."""
    probability: dict[str, float] = {}
    for name in spec.topological_order():
        incoming = spec.incoming(name)
        if not incoming:
            probability[name] = 1.0
            continue
        none_taken = 1.0
        for edge in incoming:
            taken = measured.get(edge.key)
            if taken is None:
                taken = 1.0 if edge.when.kind is ConditionKind.ALWAYS else unmeasured
            none_taken *= 1.0 - probability[edge.source] * taken
        probability[name] = 1.0 - none_taken
    return probability


def latency_splits(
    spec: PipelineSpec, max_splits: int = MAX_SPLITS, extra: Sequence[Mapping[str, float]] = ()
) -> list[dict[str, float]]:
    """Shares of the SLO per stage (fractions), each split's paths summing to at most 1: from
    weights per stage, each stage's share its weight over the heaviest path through it. The
    weights: ``extra`` first (e.g. in proportion to the stages' fastest latencies, the split a
    per-stage planner would make), then a grid of 1.. ``max_splits ** (1 / stages)`` per stage."""
    names = [s.name for s in spec.stages]
    levels = max(1, math.floor(max_splits ** (1.0 / len(names)) + 1e-9))
    paths = spec.paths()
    splits: dict[tuple[float, ...], dict[str, float]] = {}
    grid = (
        dict(zip(names, w, strict=True)) for w in itertools.product(range(1, levels + 1), repeat=len(names))
    )
    for weight in itertools.chain(extra, grid):
        share = {
            name: weight[name] / max(sum(weight[s] for s in path) for path in paths if name in path)
            for name in names
        }
        splits.setdefault(tuple(round(share[n], 6) for n in names), share)
    return list(splits.values())[: max_splits + len(extra)]


def plan_pipeline(
    spec: PipelineSpec,
    profiles: Sequence[VariantProfile],
    pools: Mapping[str, PoolSpec],
    arrival_qps: float,
    branch_probabilities: Mapping[str, float | None] | None = None,
    *,
    lambda_allowed: bool = False,
    max_splits: int = MAX_SPLITS,
    solver: Solver | None = None,
) -> PipelinePlan:
    """The cheapest plan that serves ``arrival_qps`` through ``spec`` within its SLO (``profiles``:
    the app's variant profiles; ``pools``: the catalog). Without ``lambda_allowed`` every stage is
    provisioned (the Lambda tier is for bursts the plan did not foresee). Infeasible at every
    split: the plan leaving the least load unmet, ``feasible`` False, with the reasons."""
    solve = solver or (lambda problem: solve_exact(problem, SOLVE_TIME_LIMIT_S))
    probability = stage_probabilities(spec, branch_probabilities or {})
    provisioned = {name: p for name, p in pools.items() if p.kind is not PoolKind.LAMBDA}
    by_stage = {
        s.name: [
            p
            for p in profiles
            if p.model_name == s.model and p.accuracy >= _floor(spec, s.name) and p.pool in pools
        ]
        for s in spec.stages
    }
    # Besides the grid: the split in proportion to each stage's fastest qualifying p99 (where
    # every stage has one), so that the plan is never worse than planning each stage alone.
    fastest = {
        name: min((p.latency_ms(1) for p in found if p.pool in provisioned or lambda_allowed), default=0.0)
        for name, found in by_stage.items()
    }
    extra = [fastest] if all(v > 0 for v in fastest.values()) else []
    best: tuple[tuple[float, float, float], dict[str, float], ScalingProblem, ScalingPlan] | None = None
    tried = 0
    for share in latency_splits(spec, max_splits, extra):
        budgets = {name: share[name] * spec.latencySlo for name in share}
        problem = _problem(spec, budgets, by_stage, provisioned, arrival_qps, probability, lambda_allowed)
        plan = solve(problem)
        tried += 1
        unmet = sum(plan.unmet_qps.values())
        # The least unmet load first, then the cheapest, then the most even split (ties).
        rank = (round(unmet, 9), round(plan.cost_per_second, 12), -min(share.values()))
        if best is None or rank < best[0]:
            best = (rank, budgets, problem, plan)
    assert best is not None  # a spec has a stage, so at least one split
    _, budgets, problem, plan = best
    return _explained(spec, arrival_qps, budgets, probability, by_stage, problem, plan, tried)


def _problem(
    spec: PipelineSpec,
    budgets: Mapping[str, float],
    by_stage: Mapping[str, list[VariantProfile]],
    pools: Mapping[str, PoolSpec],
    arrival_qps: float,
    probability: Mapping[str, float],
    lambda_allowed: bool,
) -> ScalingProblem:
    groups: dict[str, ScalingGroup] = {}
    for stage in spec.stages:
        option = lambda_option((p for p in by_stage[stage.name] if p.pool not in pools), budgets[stage.name])
        groups[stage.name] = ScalingGroup(
            id=stage.name,
            load_qps=arrival_qps * probability[stage.name],
            latency_budget_ms=budgets[stage.name],
            lambda_price_per_query=None if option is None else option[0],
            lambda_seconds_per_query=0.0 if option is None else option[1],
        )
    # A variant serves every stage of its model (time sharing its instances between them).
    stages_of: dict[str, tuple[VariantProfile, list[ScalingGroup]]] = {}
    for stage in spec.stages:
        for profile in by_stage[stage.name]:
            if profile.pool in pools:
                stages_of.setdefault(profile.variant_id, (profile, []))[1].append(groups[stage.name])
    variants = [
        variant
        for profile, its_groups in stages_of.values()
        if (variant := variant_from_profile(profile, pools[profile.pool], its_groups)).saturation_qps
    ]
    used_pools = sorted({v.pool for v in variants})
    scaling_pools, variants = one_instance_per_worker(
        [pool_from_spec(pools[p]) for p in used_pools], variants
    )
    return ScalingProblem(variants, scaling_pools, list(groups.values()), lambda_allowed=lambda_allowed)


def _explained(
    spec: PipelineSpec,
    arrival_qps: float,
    budgets: Mapping[str, float],
    probability: Mapping[str, float],
    by_stage: Mapping[str, list[VariantProfile]],
    problem: ScalingProblem,
    plan: ScalingPlan,
    tried: int,
) -> PipelinePlan:
    profiles = {p.variant_id: p for ps in by_stage.values() for p in ps}
    capacities = {(v.id, g): q for v in problem.variants for g, q in v.saturation_qps.items()}
    stages: list[StagePlan] = []
    lines = [
        f"{spec.name}: {arrival_qps:g} QPS under an end-to-end SLO of {spec.latencySlo:g} ms; "
        f"{tried} latency splits solved with the variant-mix program ({plan.solver}, {plan.status.value}), "
        f"the cheapest that serves all the load kept: ${plan.cost_per_second * 3600:.4f}/h"
    ]
    for stage in spec.stages:
        budget = budgets[stage.name]
        choices = []
        for (variant_id, group_id), qps in sorted(plan.served.items()):
            if group_id != stage.name or qps <= 0:
                continue
            profile = profiles[variant_id]
            batch = _planned_batch(profile, budget)
            choices.append(
                VariantChoice(
                    variant_id,
                    profile.pool,
                    profile.precision,
                    batch,
                    round(profile.latency_ms(batch), 3),
                    round(qps, 6),
                    plan.instances.get((variant_id, profile.pool), 0),
                    round(capacities[(variant_id, stage.name)], 6),
                    round(batch * 1000.0 / profile.latency_ms(batch), 6),
                )
            )
        stage_plan = StagePlan(
            stage=stage.name,
            model=stage.model,
            probability=round(probability[stage.name], 6),
            load_qps=round(arrival_qps * probability[stage.name], 6),
            budget_ms=round(budget, 3),
            choices=choices,
            lambda_qps=round(plan.lambda_qps.get(stage.name, 0.0), 6),
            unmet_qps=round(plan.unmet_qps.get(stage.name, 0.0), 6),
        )
        stages.append(stage_plan)
        served = ", ".join(
            f"{c.instances} x {c.variant_id} (batch {c.batch}, p99 {c.p99_ms:g} ms, {c.qps:g} QPS)"
            for c in choices
        )
        line = (
            f"stage {stage.name} ({stage.model}): reached by {probability[stage.name]:.0%} of queries, "
            f"{stage_plan.load_qps:g} QPS within {budget:.1f} ms: {served or 'nothing provisioned'}"
        )
        if stage_plan.unmet_qps:
            line += f"; {stage_plan.unmet_qps:g} QPS unmet ({plan.unmet.get(stage.name, '')})"
        lines.append(line)
    critical = max(sum(budgets[s] for s in path) for path in spec.paths())
    lines.append(f"critical path: {critical:.1f} ms of budgets <= the SLO of {spec.latencySlo:g} ms")
    return PipelinePlan(
        pipeline=spec.name,
        arrival_qps=arrival_qps,
        slo_ms=spec.latencySlo,
        feasible=not plan.unmet_qps,
        cost_per_second=plan.cost_per_second,
        stages=stages,
        critical_path_ms=round(critical, 3),
        splits_tried=tried,
        workers={p: n for p, n in plan.workers.items() if n},
        explanation=lines,
    )


def _planned_batch(profile: VariantProfile, budget_ms: float) -> int:
    """The batch size at which the variant's capacity within ``budget_ms`` is reached (as
    ``saturation_for_budget`` picks it: batches above one only within half the budget)."""
    best, best_rate = 1, -1.0
    for batch, p99 in sorted(profile.latency_p99_ms.items()):
        if p99 <= 0 or (batch > 1 and 2.0 * p99 > budget_ms):
            continue
        rate = batch_rate(batch, profile.median_ms(batch), p99, budget_ms)
        if rate > best_rate:
            best, best_rate = batch, rate
    return best


def _floor(spec: PipelineSpec, stage: str) -> float:
    own = spec.stage(stage).accuracy
    return spec.accuracy if own is None else own
