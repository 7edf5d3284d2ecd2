"""Pipelines under an end-to-end SLO (issue 16, InferLine §6): the planner and tuner against
InferLine's two baselines, on the real zoo's profiles, in a discrete-event simulation.

Two pipelines over the real zoo (``bench.real_zoo``'s cached profiles: CPU and Lambda measured
here, GPU and Inferentia derived): **sequential** (MobileNetV3-small, then ResNet-50 on every
query) and **cascade** (ResNet-18, then ResNet-50 only when ResNet-18 is unsure: a conditional
branch taken, per query, with the probability ``measured_branches`` measures: the share of
held-out test images ResNet-18's real model is unsure of). Three arrival processes at the
same mean rate: the Azure conversation trace (``../shared/traces/``, replayed at the mean) and
Gamma renewals of CV 1 (Poisson) and CV 4 (bursty).

Systems, each paying for every replica it holds (starting ones included) at its pool's price:

- **inferline**: the planner (``modelless.pipelines.planner``: the variant-mix program over
  latency splits) on the first ``planning_s`` of the arrivals, then the tuner
  (``modelless.pipelines.tuner``) every second, per stage, on its arrival envelope;
- **coarse**: InferLine's coarse-grained baseline: the SLO split between the stages in proportion
  to their fastest variants' p99, each stage planned alone for its share (the same program), and
  scaled alone on its mean rate over the last 10 s (up at once, down after the same hold);
- **peak**: the planner's plan for the trace's peak rate (its busiest 10 s), never changed.

What is simulated: per stage a FIFO queue served by its replicas in batches of up to the plan's
batch size, each run's time drawn from a log-normal with the profile's p50 and p99 at that batch
(as ``sim.simulator`` draws them); a new replica serves ``activation_s`` after it is asked for.
A query's end-to-end latency runs from its arrival to its last stage's answer. Not simulated:
the gateway's own overhead and the network between stages (a few ms each on the real path).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, span, write_fragment
from modelless.catalog import DEFAULT_POOLS, PoolSpec
from modelless.pipelines.planner import PipelinePlan, plan_pipeline
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.tuner import StageState, TunerConfig, envelope, tune
from modelless.scaling import pool_from_spec, resource_demand
from modelless.types import VariantProfile
from sim.traces import TRACE_PATH, ArrivalTimes, gamma_arrivals, load_arrival_times, replay

PART = "pipelines"
ZOO_MODELS = ("mobilenetv3_small_100", "resnet18", "resnet50")
# The cascade's share of queries ResNet-18 is unsure of, where it cannot be measured (the zoo's
# model file is not built here): ``measured_branches`` measures it from the real model.
BRANCH_P = 0.3
MEASURE_ROWS = 400  # held-out test images the branch probability is measured on
SYSTEMS = ("inferline", "coarse", "peak")
COLOURS = {"inferline": "tab:green", "coarse": "tab:orange", "peak": "tab:blue"}
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class Plan:
    mean_qps: float = 30.0
    duration_s: float = 1800.0
    planning_s: float = 120.0
    slo_ms: float = 250.0
    activation_s: float = 10.0
    hold_s: float = 15.0
    coarse_window_s: float = 10.0
    bin_s: float = 60.0
    seed: int = 1
    # The pools the plans may use: the CPU pool, measured on this machine, by default (the
    # accelerator profiles are derived, and one derived GPU worker takes these loads alone).
    pools: tuple[str, ...] = ("cpu",)

    def pool_specs(self) -> dict[str, PoolSpec]:
        return {name: DEFAULT_POOLS[name] for name in self.pools}


def pipelines(slo_ms: float) -> dict[str, tuple[PipelineSpec, dict[str, float]]]:
    """The two pipelines, each with its branch probabilities."""
    sequential = PipelineSpec.model_validate(
        {
            "name": "sequential",
            "stages": [
                {"name": "preview", "model": "mobilenetv3_small_100", "accuracy": 0.5},
                {"name": "classify", "model": "resnet50", "accuracy": 0.9},
            ],
            "edges": [{"source": "preview", "target": "classify"}],
            "latencySlo": slo_ms,
        }
    )
    cascade = PipelineSpec.model_validate(
        {
            "name": "cascade",
            "stages": [
                {"name": "cheap", "model": "resnet18", "accuracy": 0.85},
                {"name": "expensive", "model": "resnet50", "accuracy": 0.9},
            ],
            "edges": [
                {
                    "source": "cheap",
                    "target": "expensive",
                    "when": {"kind": "confidence_below", "threshold": 0.8},
                }
            ],
            "latencySlo": slo_ms,
        }
    )
    return {"sequential": (sequential, {}), "cascade": (cascade, {"cheap->expensive": BRANCH_P})}


def zoo_profiles(state_dir: Path) -> list[VariantProfile]:
    """The real zoo's profiles as ``bench.real_zoo`` cached them (never registered here)."""
    from bench.real_zoo import _read_entry, cache_dir

    profiles: list[VariantProfile] = []
    for name in ZOO_MODELS:
        entry = _read_entry(cache_dir(state_dir) / f"{name}.json")
        if entry is None:
            raise SystemExit(f"the real zoo's {name} is not registered: run `scripts/bench real-zoo` first")
        profiles += entry.profiles
    return profiles


def measured_branches(
    spec: PipelineSpec, zoo_root: Path, rows: int = MEASURE_ROWS
) -> tuple[dict[str, float], list[str]]:
    """Per conditional edge, the share of the zoo's held-out test images on which its condition
    holds for its source stage's real model (the zoo's ONNX file, run by onnxruntime): the
    branch probability the gateway would measure. An edge whose source model is not built here
    keeps ``BRANCH_P``, and the notes say so."""
    import onnxruntime as ort

    from infra.zoo.real import MODEL_FILE, TESTSET, read_split
    from modelless.pipelines.spec import ConditionKind

    branches: dict[str, float] = {}
    notes: list[str] = []
    for edge in spec.edges:
        if edge.when.kind is ConditionKind.ALWAYS:
            continue
        model = spec.stage(edge.source).model
        directory = zoo_root / model
        if not (directory / MODEL_FILE).is_file() or not (directory / TESTSET).is_file():
            branches[edge.key] = BRANCH_P
            notes.append(
                f"{spec.name} {edge.key}: assumed {BRANCH_P:.0%} ({model} is not built in {zoo_root}: "
                f"`python -m infra.zoo.real --only {model}`)"
            )
            continue
        images = read_split(directory / TESTSET, rows)["inputs"]
        session = ort.InferenceSession(str(directory / MODEL_FILE), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        scores = np.concatenate(
            [session.run(None, {name: images[i : i + 16]})[0] for i in range(0, len(images), 16)]
        )
        branches[edge.key] = float(edge.when.holds_per_row(scores).mean())
        notes.append(
            f"{spec.name} {edge.key}: measured {branches[edge.key]:.1%} on {len(images)} held-out "
            f"test images through {model}'s ONNX model"
        )
    return branches, notes


def traces(plan: Plan) -> dict[str, ArrivalTimes]:
    conv = replay(load_arrival_times(TRACE_PATH), plan.mean_qps, min_span_s=plan.duration_s, name="conv")
    return {
        "conv": conv.window(0.0, plan.duration_s, "Azure conv trace"),
        "gamma-cv1": gamma_arrivals(plan.mean_qps, 1.0, plan.duration_s, plan.seed, "Gamma CV 1"),
        "gamma-cv4": gamma_arrivals(plan.mean_qps, 4.0, plan.duration_s, plan.seed, "Gamma CV 4"),
    }


# ----------------------------------------------------------------------------- stage configuration


@dataclass
class StageConfig:
    variant: VariantProfile
    batch: int
    capacity_qps: float  # one replica's, within the stage's budget
    replicas: int
    budget_ms: float  # the stage's share of the SLO
    throughput_qps: float  # one replica's flat out
    # The plan's other variants for the stage (a mix), each with its own replicas: they serve
    # from the same queue; scaling adds replicas of this (the main) one.
    others: list[StageConfig] = field(default_factory=list)

    def mix(self) -> list[StageConfig]:
        return [self, *self.others]

    @property
    def total(self) -> int:
        return sum(c.replicas for c in self.mix())


def configs_of(plan: PipelinePlan, profiles: Sequence[VariantProfile]) -> dict[str, StageConfig]:
    """Per stage, the plan's variants: the main one (serving most of its load) and the others
    of its mix, each with its batch and instances."""
    by_id = {p.variant_id: p for p in profiles}
    configs = {}
    for stage in plan.stages:
        if not stage.choices:
            raise SystemExit(f"{plan.pipeline}: stage {stage.stage} has no variant: {plan.explanation}")
        ranked = sorted(stage.choices, key=lambda c: -c.qps)
        mix = [
            StageConfig(
                by_id[c.variant_id], c.batch, c.capacity_qps, c.instances, stage.budget_ms, c.throughput_qps
            )
            for c in ranked
        ]
        mix[0].replicas = max(1, mix[0].replicas)
        mix[0].others = [c for c in mix[1:] if c.replicas > 0]
        configs[stage.stage] = mix[0]
    return configs


def coarse_configs(
    spec: PipelineSpec,
    profiles: Sequence[VariantProfile],
    branches: dict[str, float],
    qps: float,
    pools: dict[str, PoolSpec],
) -> dict[str, StageConfig]:
    """Each stage planned alone, for its share of the SLO in proportion to its fastest p99."""
    from modelless.pipelines.planner import stage_probabilities

    probability = stage_probabilities(spec, branches)
    fastest = {}
    for stage in spec.stages:
        floor = stage.accuracy if stage.accuracy is not None else spec.accuracy
        fastest[stage.name] = min(
            p.latency_ms(1)
            for p in profiles
            if p.model_name == stage.model and p.accuracy >= floor and p.pool in pools
        )
    worst = max(sum(fastest[s] for s in path) for path in spec.paths())
    configs = {}
    for stage in spec.stages:
        alone = PipelineSpec(
            name=stage.name,
            stages=[stage],
            latencySlo=spec.latencySlo * fastest[stage.name] / worst,
            accuracy=spec.accuracy,
        )
        own = plan_pipeline(alone, profiles, pools, qps * probability[stage.name])
        configs.update(configs_of(own, profiles))
    return configs


# ----------------------------------------------------------------------------- the simulation


@dataclass
class Replica:
    ready_at: float
    config: StageConfig  # what it runs (a re-plan starts replicas of another configuration)
    busy: bool = False
    retiring: bool = False


@dataclass
class StageSim:
    name: str
    config: StageConfig
    replicas: list[Replica] = field(default_factory=list)
    queue: deque[int] = field(default_factory=deque)
    arrivals: list[float] = field(default_factory=list)

    def current(self, replica: Replica) -> bool:
        return any(replica.config is c for c in self.config.mix())

    def held(self) -> int:
        """The replicas of the stage's current configuration (its mix) it keeps."""
        return sum(not r.retiring and self.current(r) for r in self.replicas)


@dataclass
class Outcome:
    system: str
    latencies_ms: list[float]
    finished_at: list[float]
    cost_per_bin: list[float]
    replicas_per_bin: dict[str, list[float]]
    replans: int
    configs: dict[str, str]

    @property
    def attainment(self) -> float:
        return 0.0 if not self.latencies_ms else sum(self.met) / len(self.latencies_ms)

    @property
    def met(self) -> list[bool]:
        slo = self._slo
        return [latency <= slo for latency in self.latencies_ms]

    _slo: float = 0.0

    @property
    def cost(self) -> float:
        return sum(self.cost_per_bin)


@dataclass
class _Bill:
    rate: float = 0.0  # $/s of the workers the replicas need now
    dirty: bool = True


def workers_per_second(replicas: Sequence[Replica]) -> float:
    """What the replicas' workers cost per second, as the planner's program counts them: per
    pool, whole workers, at least as many as the most copies of one variant (a worker holds one
    instance of a variant) and as the replicas' dominant resource shares add up to."""
    by_pool: dict[str, list[VariantProfile]] = {}
    for replica in replicas:
        by_pool.setdefault(replica.config.variant.pool, []).append(replica.config.variant)
    total = 0.0
    for name, variants in by_pool.items():
        pool = pool_from_spec(DEFAULT_POOLS[name])
        shares = 0.0
        copies: dict[str, int] = {}
        for variant in variants:
            demand = resource_demand(variant, DEFAULT_POOLS[name])
            shares += max(amount / pool.capacity[r] for r, amount in demand.items() if pool.capacity.get(r))
            copies[variant.variant_id] = copies.get(variant.variant_id, 0) + 1
        total += pool.price_per_worker_second * max(max(copies.values()), math.ceil(shares - 1e-9))
    return total


def service_ms(rng: random.Random, variant: VariantProfile, rows: int) -> float:
    """A run of ``rows`` queries: log-normal with the profile's p50 and p99 at that batch."""
    median, p99 = variant.median_ms(rows), variant.latency_ms(rows)
    sigma = max(0.0, math.log(max(p99, median) / median)) / Z99
    return median * math.exp(rng.gauss(0.0, sigma))


# Per stage, the replicas it should hold; under "__replanned__", the stages' new configurations.
Controller = Callable[[float, dict[str, StageSim]], dict[str, Any]]
Replanner = Callable[[float, dict[str, StageSim]], dict[str, tuple[StageConfig, dict[float, int]]]]
REPLAN_EVERY_S = 60.0  # the planner is the low-frequency loop


def simulate(
    system: str,
    spec: PipelineSpec,
    configs: dict[str, StageConfig],
    times: Sequence[float],
    branches: dict[str, float],
    plan: Plan,
    controller: Controller | None,
) -> Outcome:
    rng = random.Random(plan.seed)
    order = spec.topological_order()
    stages = {name: StageSim(name, configs[name]) for name in order}
    for stage in stages.values():
        stage.replicas = [Replica(0.0, c) for c in stage.config.mix() for _ in range(c.replicas)]
    events: list[tuple[float, int, str, Any]] = []
    sequence = itertools.count()
    arrival_at: list[float] = list(times)
    latencies: list[float] = []
    finished: list[float] = []
    bins = max(1, math.ceil(plan.duration_s / plan.bin_s))
    cost = [0.0] * bins
    held: dict[str, list[float]] = {name: [0.0] * bins for name in order}
    replans = 0

    bill = _Bill()

    def push(at: float, kind: str, data: Any) -> None:
        heapq.heappush(events, (at, next(sequence), kind, data))

    def dispatch(stage: StageSim, now: float) -> None:
        for replica in stage.replicas:
            if not stage.queue:
                return
            if replica.busy or replica.ready_at > now or replica.retiring:
                continue
            rows = [stage.queue.popleft() for _ in range(min(replica.config.batch, len(stage.queue)))]
            replica.busy = True
            push(
                now + service_ms(rng, replica.config.variant, len(rows)) / 1000.0,
                "done",
                (stage.name, replica, rows),
            )

    def arrive(name: str, query: int, now: float) -> None:
        stage = stages[name]
        stage.arrivals.append(now)
        stage.queue.append(query)
        dispatch(stage, now)

    def scale(stage: StageSim, target: int, now: float) -> None:
        bill.dirty = True
        current = stage.held()
        if target > current:
            stage.replicas += [
                Replica(now + plan.activation_s, stage.config) for _ in range(target - current)
            ]
            push(now + plan.activation_s, "ready", stage.name)
        elif target < current:
            drop = current - target
            for replica in sorted(stage.replicas, key=lambda r: (r.busy, -r.ready_at)):
                if drop == 0:
                    break
                if not replica.retiring and stage.current(replica):
                    replica.retiring = True
                    drop -= 1
            stage.replicas = [r for r in stage.replicas if not (r.retiring and not r.busy)]

    for index, at in enumerate(times):
        push(at, "arrive", index)
    for second in range(1, int(plan.duration_s) + 1):
        push(float(second), "tick", None)
    last = 0.0
    while events:
        now, _, kind, data = heapq.heappop(events)
        # The bill: the workers every replica held (starting ones included) needs, since the
        # last event.
        if now > last:
            if bill.dirty:
                bill.rate = workers_per_second([r for st in stages.values() for r in st.replicas])
                bill.dirty = False
            start = last
            while start < now:
                index = min(bins - 1, int(start // plan.bin_s))
                end = min(now, (index + 1) * plan.bin_s) if index < bins - 1 else now
                cost[index] += bill.rate * (end - start)
                for stage in stages.values():
                    held[stage.name][index] += len(stage.replicas) * (end - start) / plan.bin_s
                start = end
            last = now
        if kind == "arrive":
            arrive(order[0], data, now)
        elif kind == "ready":
            dispatch(stages[data], now)
        elif kind == "done":
            name, replica, rows = data
            replica.busy = False
            stage = stages[name]
            if replica.retiring:
                stage.replicas.remove(replica)
                bill.dirty = True
            for query in rows:
                nexts = [e.target for e in spec.outgoing(name) if rng.random() < branches.get(e.key, 1.0)]
                for target in nexts:
                    arrive(target, query, now)
                if not nexts:
                    latencies.append((now - arrival_at[query]) * 1000.0)
                    finished.append(arrival_at[query])
            dispatch(stage, now)
        elif kind == "retire":
            stage_name, old = data
            stage = stages[stage_name]
            bill.dirty = True
            for replica in stage.replicas:
                if any(replica.config is c for c in old.mix()):
                    replica.retiring = True
            stage.replicas = [r for r in stage.replicas if not (r.retiring and not r.busy)]
        elif kind == "tick" and controller is not None:
            targets = controller(now, stages)
            if "__replanned__" in targets:
                replans += 1
                for stage_name, new in targets.pop("__replanned__").items():
                    stage = stages[stage_name]
                    old = stage.config
                    stage.config = new
                    # The new configuration's replicas start; the old ones serve until then.
                    stage.replicas += [
                        Replica(now + plan.activation_s, c) for c in new.mix() for _ in range(c.replicas)
                    ]
                    bill.dirty = True
                    push(now + plan.activation_s, "ready", stage_name)
                    push(now + plan.activation_s, "retire", (stage_name, old))
            for stage_name, count in targets.items():
                scale(stages[stage_name], count, now)
                dispatch(stages[stage_name], now)
    outcome = Outcome(
        system,
        latencies,
        finished,
        cost,
        held,
        replans,
        {
            name: " + ".join(f"{m.variant.variant_id} batch {m.batch} x{m.replicas}" for m in c.mix())
            for name, c in configs.items()
        },
    )
    outcome._slo = spec.latencySlo
    return outcome


def tuner_controller(
    configs: dict[str, StageConfig], planned: dict[str, dict[float, int]], hold_s: float, replanner: Replanner
) -> Controller:
    """The tuner every tick; the planner again when the tuner says the workload's shape changed
    (at most every ``REPLAN_EVERY_S``)."""
    state = {
        name: StageState(
            c.total,
            planned[name],
            c.capacity_qps,
            c.total,
            budget_ms=c.budget_ms,
            throughput_qps=c.throughput_qps,
        )
        for name, c in configs.items()
    }
    config = TunerConfig(hold_s=hold_s)
    last_replan = 0.0

    def control(now: float, stages: dict[str, StageSim]) -> dict[str, Any]:
        nonlocal state, last_replan
        state, decisions, replans = tune(state, {n: s.arrivals for n, s in stages.items()}, now, config)
        targets: dict[str, Any] = {d.stage: d.instances for d in decisions}
        if not replans or now - last_replan < REPLAN_EVERY_S:
            return targets
        last_replan = now
        replanned: dict[str, StageConfig] = {}
        for name, (new, envelope_now) in replanner(now, stages).items():
            current = stages[name].config
            state[name] = StageState(
                new.total,
                envelope_now,
                new.capacity_qps,
                new.total,
                budget_ms=new.budget_ms,
                throughput_qps=new.throughput_qps,
            )
            if _signature(new) == _signature(current):
                current.capacity_qps, current.budget_ms = new.capacity_qps, new.budget_ms
                current.throughput_qps = new.throughput_qps
                targets[name] = new.total
            else:
                replanned[name] = new
                targets.pop(name)
        targets["__replanned__"] = replanned
        return targets

    return control


def _signature(config: StageConfig) -> list[tuple[str, int]]:
    return [(c.variant.variant_id, c.batch) for c in config.mix()]


def coarse_controller(configs: dict[str, StageConfig], window_s: float, hold_s: float) -> Controller:
    lower_since: dict[str, float | None] = dict.fromkeys(configs)

    def control(now: float, stages: dict[str, StageSim]) -> dict[str, Any]:
        targets: dict[str, Any] = {}
        for name, stage in stages.items():
            recent = len(stage.arrivals) - np.searchsorted(stage.arrivals, now - window_s)
            desired = max(1, math.ceil(recent / window_s / stage.config.capacity_qps - 1e-9))
            current = stage.held()
            if desired >= current:
                lower_since[name] = None
                targets[name] = desired
            else:
                since = lower_since[name]
                if since is None:
                    since = lower_since[name] = now
                targets[name] = desired if now - since >= hold_s else current
                if now - since >= hold_s:
                    lower_since[name] = None
        return targets

    return control


# ----------------------------------------------------------------------------- the study


def thinned(times: Sequence[float], probability: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [t for t in times if rng.random() < probability]


def run_one(
    spec: PipelineSpec,
    branches: dict[str, float],
    profiles: Sequence[VariantProfile],
    arrivals: ArrivalTimes,
    plan: Plan,
) -> dict[str, Outcome]:
    from modelless.pipelines.planner import stage_probabilities

    pools = plan.pool_specs()
    times = [float(t) for t in arrivals.times]
    sample = [t for t in times if t < plan.planning_s]
    planning_qps = max(len(sample) / plan.planning_s, 1e-3)
    probability = stage_probabilities(spec, branches)
    planned_envelopes = {
        s.name: envelope(thinned(sample, probability[s.name], plan.seed), plan.planning_s)
        for s in spec.stages
    }
    ours = configs_of(plan_pipeline(spec, profiles, pools, planning_qps, branches), profiles)
    coarse = coarse_configs(spec, profiles, branches, planning_qps, pools)
    peak_qps = arrivals.peak_qps(10.0)
    peak = configs_of(plan_pipeline(spec, profiles, pools, peak_qps, branches), profiles)

    def replanner(now: float, stages: dict[str, StageSim]) -> dict[str, tuple[StageConfig, dict[float, int]]]:
        """The planner again, for the busiest 10 s of the last minute; the envelopes it is
        planned for: the last minute's."""
        entry = stages[spec.entry]
        rate = envelope(entry.arrivals, now, (10.0,))[10.0] / 10.0
        fresh = configs_of(plan_pipeline(spec, profiles, pools, max(rate, 1e-3), branches), profiles)
        return {name: (c, envelope(stages[name].arrivals, now)) for name, c in fresh.items()}

    return {
        "inferline": simulate(
            "inferline",
            spec,
            ours,
            times,
            branches,
            plan,
            tuner_controller(ours, planned_envelopes, plan.hold_s, replanner),
        ),
        "coarse": simulate(
            "coarse",
            spec,
            coarse,
            times,
            branches,
            plan,
            coarse_controller(coarse, plan.coarse_window_s, plan.hold_s),
        ),
        "peak": simulate("peak", spec, peak, times, branches, plan, None),
    }


def attainment_per_bin(outcome: Outcome, plan: Plan) -> list[float]:
    bins = max(1, math.ceil(plan.duration_s / plan.bin_s))
    met = [0] * bins
    total = [0] * bins
    for at, ok in zip(outcome.finished_at, outcome.met, strict=True):
        index = min(bins - 1, int(at // plan.bin_s))
        total[index] += 1
        met[index] += ok
    return [m / t if t else 1.0 for m, t in zip(met, total, strict=True)]


def summary(results: dict[str, dict[str, dict[str, Outcome]]]) -> list[dict[str, Any]]:
    rows = []
    for pipeline, by_trace in results.items():
        for trace, outcomes in by_trace.items():
            ours = outcomes["inferline"]
            row: dict[str, Any] = {"pipeline": pipeline, "trace": trace}
            for system, outcome in outcomes.items():
                row[f"{system} $"] = round(outcome.cost, 5)
                row[f"{system} SLO %"] = round(100 * outcome.attainment, 2)
            miss = 1 - ours.attainment
            row["coarse/ours cost"] = round(outcomes["coarse"].cost / ours.cost, 2)
            row["peak/ours cost"] = round(outcomes["peak"].cost / ours.cost, 2)
            coarse_miss = 1 - outcomes["coarse"].attainment
            row["coarse/ours misses"] = round(coarse_miss / miss, 1) if miss > 0 else math.inf
            row["replans"] = ours.replans
            rows.append(row)
    return rows


def plot(results: dict[str, dict[str, dict[str, Outcome]]], plan: Plan, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for pipeline, by_trace in results.items():
        figure, axes = plt.subplots(
            2, len(by_trace), figsize=(4.2 * len(by_trace), 6), sharex=True, squeeze=False
        )
        for column, (trace, outcomes) in enumerate(by_trace.items()):
            cost_axis, slo_axis = axes[0][column], axes[1][column]
            for system, outcome in outcomes.items():
                minutes = [(i + 0.5) * plan.bin_s / 60 for i in range(len(outcome.cost_per_bin))]
                hourly = [c * 3600 / plan.bin_s for c in outcome.cost_per_bin]
                cost_axis.plot(minutes, hourly, label=system, color=COLOURS[system])
                slo_axis.plot(
                    minutes, [100 * a for a in attainment_per_bin(outcome, plan)], color=COLOURS[system]
                )
            cost_axis.set_title(f"{pipeline}, {trace}")
            cost_axis.set_ylabel("cost ($/h)")
            slo_axis.set_ylabel("SLO attainment (%)")
            slo_axis.set_xlabel("minute")
            for axis in (cost_axis, slo_axis):
                axis.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        figure.tight_layout()
        name = f"{PART}-{pipeline}.png"
        out_dir.mkdir(parents=True, exist_ok=True)
        figure.savefig(out_dir / name, dpi=80)
        plt.close(figure)
        names.append(name)
    return names


def headline(rows: list[dict[str, Any]]) -> str:
    def span(key: str, digits: int = 2) -> str:
        values = [r[key] for r in rows if math.isfinite(r[key])]
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "-"

    misses = [r["coarse/ours misses"] for r in rows if math.isfinite(r["coarse/ours misses"])]
    return (
        f"pipelines: cost of coarse-grained over planner + tuner {span('coarse/ours cost')}x (InferLine: "
        f"up to 7.6x), of static peak provisioning {span('peak/ours cost')}x (InferLine's tuner: up to "
        f"4.2x); SLO attainment: planner + tuner {span('inferline SLO %', 1)} %, coarse-grained "
        f"{span('coarse SLO %', 1)} %, peak {span('peak SLO %', 1)} %"
        + (f"; coarse-grained misses up to {max(misses):.1f}x as often (InferLine: 32x)" if misses else "")
    )


def markdown(
    rows: list[dict[str, Any]],
    plan: Plan,
    configs: dict[str, Any],
    command: str,
    plots: list[str],
    took: float,
    sources: Sequence[str] = (),
) -> str:
    """``sources``: where the profiles and branch probabilities came from, one line each."""
    images = "\n".join(f"![{name}]({name})" for name in plots)
    bursty = [r for r in rows if r["trace"] == "gamma-cv4"]
    steady = [r for r in rows if r["trace"] != "gamma-cv4"]
    where = "".join(f"\n- {line}" for line in sources)
    configurations = "\n".join(
        f"- {where.split('/')[0]}, {system}: "
        + "; ".join(f"{stage}: {what}" for stage, what in stages.items())
        for where, systems in configs.items()
        for system, stages in systems.items()
    )
    return f"""## Pipelines under an end-to-end SLO (InferLine)

Machine: `{machine()}`. Reproduce: `{command}` ({took:.0f} s, simulated).

Two pipelines over the real zoo's profiles (sequential: MobileNetV3-small then ResNet-50;
cascade: ResNet-18, then ResNet-50 for the queries it is unsure of: confidence below 0.8), SLO
{plan.slo_ms:g} ms end to end, {plan.mean_qps:g} QPS on average for {plan.duration_s / 60:g} min
of each arrival process, on the {", ".join(plan.pools)} pool(s) (CPU profiles measured on this
machine); replicas serve {plan.activation_s:g} s after they are asked for, and are billed as the
whole workers they need (as the planner's program counts them).
**inferline**: the planner on the first {plan.planning_s:g} s, then the envelope tuner every
second; **coarse**: the SLO split by the stages' fastest p99, each stage planned and scaled
alone on its 10 s mean rate; **peak**: the planner's plan for the busiest 10 s, static.
Costs are what each system's replicas cost (starting ones included) at their pools' prices;
SLO attainment is the share of queries answered end to end within the SLO (bench/pipelines.py).
Inputs: the real zoo's registered profiles.{where}

{markdown_table(list(rows[0]), [list(r.values()) for r in rows])}

InferLine reports up to 7.6x lower cost than coarse-grained with the highest attainment, up to
4.2x lower cost from its tuner (against provisioning for the peak) and a 32x lower miss rate.
Here: {headline(rows)}.

Why the ratios are smaller than InferLine's: the coarse-grained baseline here is strong. It
plans each stage with the same variant-mix program (InferLine's picked each stage's
configuration with a simpler per-stage rule), on one kind of hardware (the CPU pool measured
here; InferLine mixed GPUs and CPUs, where a bad split between stages costs whole GPUs), and for
these two-stage pipelines, whose second stage dominates the latency, its proportional split
needs as many workers as the best split the pipeline planner finds (which tries it too): on
the conv trace and Poisson arrivals coarse-grained costs {span((r["coarse/ours cost"] for r in steady), 2)}x
ours (below 1: ours is dearer, the tuner keeping capacity for the envelope).
Where arrivals are bursty (Gamma CV 4) the tuner provisions for the envelope: its attainment
is {span((r["inferline SLO %"] for r in bursty), 2)} % where coarse-grained autoscaling on the mean reaches
{span((r["coarse SLO %"] for r in bursty), 2)} %, and it pays for that with more replicas held through the
bursts (a burst stays in the minute-long envelope, then the hold): coarse/ours cost
{span((r["coarse/ours cost"] for r in bursty), 2)}x; static peak provisioning for the busiest 10 s
costs {span((r["peak/ours cost"] for r in bursty), 2)}x ours there, at
{span((r["peak SLO %"] for r in bursty), 2)} % attainment.
The miss-rate ratios (coarse over ours) are where InferLine's shape shows.
The first configurations (on the conv trace; `x n`: replicas, `+`: a mix the program chose):

{configurations}

{images}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipelines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--qps", type=float, default=Plan.mean_qps)
    parser.add_argument(
        "--duration", type=float, default=Plan.duration_s, help="seconds of each arrival process"
    )
    parser.add_argument("--slo", type=float, default=Plan.slo_ms, help="end-to-end SLO, ms")
    parser.add_argument(
        "--pools",
        nargs="+",
        default=list(Plan.pools),
        choices=[n for n in DEFAULT_POOLS if n != "lambda-cpu"],
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".modelless"), help="where the real zoo is cached"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5 min at 10 QPS")
    parser.add_argument("--out-dir", "--out", type=Path, default=DEFAULT_OUT_DIR, dest="out_dir")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    plan = (
        Plan(
            mean_qps=10.0,
            duration_s=300.0,
            planning_s=60.0,
            slo_ms=args.slo,
            bin_s=20.0,
            pools=tuple(args.pools),
        )
        if args.quick
        else Plan(mean_qps=args.qps, duration_s=args.duration, slo_ms=args.slo, pools=tuple(args.pools))
    )
    print(f"machine: {machine()}", flush=True)
    started = time.perf_counter()
    profiles = zoo_profiles(args.state_dir)
    sources: list[str] = []
    results: dict[str, dict[str, dict[str, Outcome]]] = {}
    configs: dict[str, Any] = {}
    for name, (spec, branches) in pipelines(plan.slo_ms).items():
        measured, notes = measured_branches(spec, args.state_dir / "zoo-real")
        branches = {**branches, **measured}
        sources += [f"branch probability: {note}" for note in notes]
        print(*notes, sep="\n", flush=True)
        results[name] = {}
        for trace, arrivals in traces(plan).items():
            results[name][trace] = run_one(spec, branches, profiles, arrivals, plan)
            configs[f"{name}/{trace}"] = {s: o.configs for s, o in results[name][trace].items()}
            print(
                f"{name} on {trace}: "
                + ", ".join(
                    f"{s} ${o.cost:.4f} {100 * o.attainment:.1f} %" for s, o in results[name][trace].items()
                ),
                flush=True,
            )
    took = time.perf_counter() - started
    rows = summary(results)
    plots = plot(results, plan, args.out_dir)
    command = " ".join(["scripts/bench", PART, *argv])
    first = {k: v for k, v in configs.items() if k.endswith("/conv")}
    data = {
        "machine": machine(),
        "plan": asdict(plan),
        "rows": rows,
        "configs": configs,
        "series": {
            p: {
                t: {
                    s: {"cost_per_bin": o.cost_per_bin, "attainment_per_bin": attainment_per_bin(o, plan)}
                    for s, o in outs.items()
                }
                for t, outs in by_trace.items()
            }
            for p, by_trace in results.items()
        },
        "headlines": [headline(rows)],
    }
    data["sources"] = sources
    write_fragment(args.out_dir, PART, markdown(rows, plan, first, command, plots, took, sources), data)
    print(headline(rows), flush=True)


if __name__ == "__main__":
    main()
