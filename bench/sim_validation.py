"""The simulator checked against the real thing: a run of the embedded stack (gateway, worker
processes, local Lambda tier, the scaler on its 5 s loop) under load over the zoo, then the very
same arrivals, with the very same measured profiles and the stack's own settings, through the
simulator; their p99 latency and SLO attainment are compared.

Two loads. ``bench.costs`` runs a short one of Poisson arrivals (``validation_schedule``) before its
cost study. This module's own part (``scripts/bench sim-validation``) replays minutes of the real
trace (``sim.traces.TRACE_PATH``: Azure's LLM conversation trace) at its recorded arrival times,
compressed so that their mean is what two cores can serve (``validation_rate_qps``): per seed a
window of consecutive recorded arrivals (``trace_window``; its bursts and lulls kept, no
Poissonisation) and a draw of the architecture each query asks for; one live run per seed, and
``--sim-repeats`` simulations of it; per seed its live and simulated p99 and SLO attainment, and
whether they are within ``P99_TOLERANCE`` and ``ATTAINMENT_TOLERANCE_POINTS``.

The latency compared is what a query's latency budget covers (README, "What the targets mean"),
as each reply's ``timingsMs`` reports it: queue + load + Lambda cold start + inference. The
gateway's own time (HTTP, JSON, selection) is not in the budget and not simulated: it is
reported beside, measured. A refused query (422: no variant meets the targets now) or a failed
one counts as an SLO violation in both.

The measured inputs of the simulation come from this run: the workers' start-up time (spawn to
ready) and the Lambda tier's cold start (a container's spawn to ready, timed by the tier itself)
measured on fresh containers just before the run; with the host calibration, the inference
slowdown and hand-off measured in the run's calibration phase (``calibrate``), never in the
compared one.

    python -m bench.sim_validation [--seeds 1 2] [--duration-s 180] [--calibration-s 30]
        [--warmup-s 10] [--sim-repeats 3] [--trace PATH] [--only MODEL ...] [--quick]
        [--state-dir .modelless] [--out-dir docs/bench] [--reuse-live]
    python -m bench.sim_validation --replay JOB.json OUT.json   # the load generator's process

Each live run is saved under ``<state-dir>/bench/sim-validation/`` (every reply), so that
``--reuse-live`` simulates again against it without loading the machine. Writes
``<out-dir>/sim-validation.md`` and ``.json``.

The zoo is the real one (``bench.real_zoo``): queries carry one held-out example of their model's
test set as a binary body (``.npy``, or ``.npz`` for the text model's two inputs), and the rate is
set from the zoo's measured latencies (``validation_rate_qps``) so that the stack is loaded, not
swamped, on the machine it runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import Connection
from bench.real_zoo import RegisteredModel, encode_body, held_out_batch, query_path
from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, span, write_fragment
from bench.sim_profiles import Zoo, developer_cpu_variant
from modelless.catalog import DEFAULT_POOLS, PoolSpec
from modelless.scaling.controller import ScalerConfig
from modelless.types import VariantProfile
from sim.simulator import (
    Arrival,
    HostCalibration,
    Instance,
    Modelless,
    Query,
    SimConfig,
    Simulation,
    exact_to_optimality,
    percentile_of,
)
from sim.traces import TRACE_PATH, ArrivalTimes, Mix, RateCurve, arrivals, arrivals_at, load_trace, replay

# The embedded stack as ``infra.local.stack`` starts it (start_stack's scaler settings).
STACK_WORKERS = 2
STACK_LAMBDA_CONCURRENCY = 4
STACK_LAMBDA_KEEP_WARM_S = 300.0  # LocalLambdaTier's idle_timeout_s
STACK_SCALER = ScalerConfig(window_s=10, min_workers={"cpu": 1}, max_workers={"cpu": 4})
STACK_SCALE_EVERY_S = 5.0
MIN_SAMPLES = 20  # a model's own calibration needs this many replies; else its tier's
IDLE_REUSE_S = 2.0  # the replayer reuses a connection idle this long at most
# The validation load: this share of what the machine's cores could serve of the zoo's mix on its
# fastest accurate CPU variants, each query holding as many cores as its variant has threads for
# its profiled median (``validation_rate_qps``), at most MAX_VALIDATION_QPS. A small share,
# because serving a query costs the host about three times its profiled inference (measured on
# the real zoo, 2 cores, 6 QPS: 0.59 cores busy, ~98 core-ms a query against ~33 profiled: HTTP,
# 600 KB bodies decoded and re-encoded for the Lambda tier, co-located processes slowing each
# other), and a recorded trace's busiest 10 s run at about twice its mean; at 0.4 of the
# profiled capacity (30 QPS there) the stack was swamped: 14-26 % SLO attainment, the Lambda
# tier at its concurrency limit, inference 9x slower than profiled.
VALIDATION_LOAD = 0.1
MAX_VALIDATION_QPS = 30.0


@dataclass
class LiveQuery:
    at: float  # scheduled arrival, seconds from the start of the load
    model: str
    slo_ms: float
    status: int
    client_ms: float  # the load generator's round trip, from the scheduled arrival
    budgeted_ms: float | None  # queue + load + cold start + inference, from the reply
    gateway_ms: float | None  # the gateway's total, from the reply
    tier: str | None
    timings: dict[str, float] | None = None  # the reply's timingsMs
    error: str = ""  # why there was no reply (the load generator's view)
    variant: str | None = None  # the variant that answered


@dataclass(frozen=True)
class Phases:
    """The live run's load: ``warmup_s`` then ``calibration_s`` at ``calibration_qps`` (the
    calibration is measured on the latter), then ``duration_s`` at ``rate_qps`` (compared)."""

    rate_qps: float = 30.0
    duration_s: float = 40.0
    calibration_qps: float = 30.0
    calibration_s: float = 20.0
    warmup_s: float = 10.0

    @property
    def compared_from(self) -> float:
        return self.warmup_s + self.calibration_s

    @property
    def total_s(self) -> float:
        return self.compared_from + self.duration_s

    def curve(self) -> RateCurve:
        before = int(self.compared_from)
        rates = [self.calibration_qps] * before + [self.rate_qps] * int(self.duration_s)
        return RateCurve("validation", 1.0, tuple(rates))


@dataclass
class LiveRun:
    queries: list[LiveQuery]
    worker_startup_ms: list[float]
    lambda_cold_start_ms: list[float]
    phases: Phases
    profiles: dict[str, VariantProfile] = field(default_factory=dict)
    # Over the load's span, in cores (CPU seconds per second): the whole host's busy time, and
    # the part of it this run's own processes took (the gateway, its workers and Lambda
    # containers, the load generator); the rest is other work on the machine. NaN off Linux.
    host_cpu_cores: float = float("nan")
    own_cpu_cores: float = float("nan")


def measure_lambda_cold_starts(zoo: Zoo, state_dir: Path, runs: int = 3) -> list[float]:
    """Cold starts of the local Lambda tier: ``runs`` fresh containers, each invoked once; the
    tier times each container from its spawn to ready (process start and imports). The model's
    load is not in it (the simulator adds the variant's profiled load time)."""

    from infra.local.lambda_container import local_lambda_tier
    from modelless.inputs.tensors import example_batch
    from modelless.serving.invocation import Invocation

    variant = min(
        (p for p in zoo.measured() if p.pool == "lambda-cpu"), key=lambda p: (p.load_latency_ms, p.variant_id)
    )
    record = next(m.record for m in zoo.models if m.name == variant.model_name)
    inputs = example_batch(record.input_specs, 1)
    cold: list[float] = []
    for run in range(runs):
        tier = local_lambda_tier(str(zoo.repository), state_dir / "logs", state_dir / "cache", concurrency=1)
        try:
            reply = tier.invoke(Invocation(variant, inputs, f"cold-{run}"), 60.0)
            if reply.cold_start:
                cold.append(reply.init_ms)
        finally:
            tier.close()
    return cold


def validation_rate_qps(zoo: Zoo, mix: Mix) -> float:
    """The validation's arrival rate: ``VALIDATION_LOAD`` of what this machine's cores could
    serve of the mix, each query on its architecture's fastest CPU variant that meets its
    accuracy target (profiled median at batch 1), holding as many cores as that variant has
    threads, at most ``MAX_VALIDATION_QPS``."""
    by_model = zoo.by_model()
    mean_core_ms = 0.0
    for a, share in zip(mix.architectures, mix.shares, strict=True):
        eligible = [
            p for p in by_model[a.model] if p.pool == "cpu" and p.accuracy >= a.targets.min_accuracy
        ] or [developer_cpu_variant(by_model[a.model])]
        fastest = min(eligible, key=lambda p: (p.median_ms(1), p.threads, p.variant_id))
        mean_core_ms += share * fastest.median_ms(1) * max(1, fastest.threads)
    capacity = (os.cpu_count() or 1) * 1000.0 / max(mean_core_ms, 1e-3)
    return round(max(1.0, min(MAX_VALIDATION_QPS, VALIDATION_LOAD * capacity)), 1)


def _requests(zoo: Zoo, mix: Mix, keys: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per architecture, its query as the replayer sends it: the path with the targets, the
    binary body (one held-out example), its content type and the app's API key."""
    models: dict[str, RegisteredModel] = {m.name: m for m in zoo.models}
    requests = {}
    for a in mix.architectures:
        content_type, body = encode_body(held_out_batch(models[a.model], 1))
        requests[a.model] = {
            "path": query_path(a.targets, binary=True),
            "content_type": content_type,
            "body_b64": base64.b64encode(body).decode(),
            "api_key": keys[a.targets.app_id],
        }
    return requests


def run_live(zoo: Zoo, mix: Mix, schedule: Sequence[Arrival], phases: Phases, state_dir: Path) -> LiveRun:
    """Start the embedded stack in this process, publish the zoo (its measured profiles and
    artifacts) into it, replay ``schedule`` from a load-generator process, and collect replies."""

    from infra.local.stack import ThreadedGateway, start_stack
    from modelless.observability.metrics import logger as gateway_logger

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    gateway_logger.setLevel("ERROR")
    lambda_cold = measure_lambda_cold_starts(zoo, state_dir)
    with tempfile.TemporaryDirectory(prefix="modelless-validate-") as tmp:
        # The stack serves the zoo cache's artifacts where they are (read only: nothing registers).
        (Path(tmp) / "repo").symlink_to(zoo.repository.resolve(), target_is_directory=True)
        port = 19080 + os.getpid() % 1000
        # Tuning off: the simulator models instances as profiled, and the two must run the same.
        stack = start_stack(
            Path(tmp),
            "127.0.0.1",
            port,
            STACK_WORKERS,
            STACK_LAMBDA_CONCURRENCY,
            "memory://",
            max_workers=4,
            tune="off",
        )
        serving = ThreadedGateway(stack, port, log_level="error")
        try:
            admin = serving.admin()
            keys = {app: admin.create_app(app) for app in sorted({m.app for m in zoo.models})}
            store = stack.services.store
            for model in zoo.models:
                store.add_model(model.record, model.registration)
                store.publish_variants(model.record, model.measured(), model.registration)
            worker_startup = [child.started_ms for child in stack.pool.workers().values()]
            stack.start_scaling(STACK_SCALE_EVERY_S)
            job = {
                "host": "127.0.0.1",
                "port": port,
                "requests": _requests(zoo, mix, keys),
                "schedule": [[a.at, a.model] for a in schedule],
                "timeout_s": 10.0,
            }
            job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
            job_path.write_text(json.dumps(job))
            before, began = cpu_seconds(), time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "bench.sim_validation", "--replay", str(job_path), str(out_path)],
                check=True,
                timeout=phases.total_s + 60,
            )
            after, wall_s = cpu_seconds(), time.perf_counter() - began
            records = json.loads(out_path.read_text())
        finally:
            serving.close()
    slo = {a.model: a.slo_ms for a in mix.architectures}
    queries = []
    for at, model, status, client_ms, timings, tier, error, variant in records:
        budgeted = gateway = None
        if status == 200 and timings:
            budgeted = sum(
                float(timings.get(k, 0.0)) for k in ("queue_ms", "load_ms", "cold_start_ms", "inference_ms")
            )
            gateway = float(timings.get("total_ms", 0.0))
        queries.append(
            LiveQuery(
                at, model, slo[model], status, client_ms, budgeted, gateway, tier, timings, error, variant
            )
        )
    profiles = {p.variant_id: p for p in zoo.measured()}
    host_cores, own_cores = ((a - b) / wall_s for a, b in zip(after, before, strict=True))
    return LiveRun(queries, worker_startup, lambda_cold, phases, profiles, host_cores, own_cores)


def _proc_stat_fields(pid: int) -> list[str]:
    # The fields after the command's closing parenthesis (a command may hold spaces).
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds() -> tuple[float, float]:
    """(the host's busy CPU seconds since boot, this process tree's CPU seconds: its own and its
    live descendants', each with its reaped children's), from /proc; NaN where there is none.
    Differences over an interval say how much of the machine a run took, and how much others did."""
    try:
        ticks = float(os.sysconf("SC_CLK_TCK"))
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
        host = sum(float(v) for i, v in enumerate(cpu[:8]) if i not in (3, 4)) / ticks
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    children.setdefault(int(_proc_stat_fields(int(entry.name))[1]), []).append(
                        int(entry.name)
                    )
                except (OSError, IndexError, ValueError):
                    continue  # gone meanwhile
        own, pending = 0.0, [os.getpid()]
        while pending:
            pid = pending.pop()
            try:
                fields = _proc_stat_fields(pid)
            except OSError:
                continue
            # utime stime cutime cstime: fields 14-17 of stat, 12-15 after the command.
            own += sum(float(v) for v in fields[11:15]) / ticks
            pending += children.get(pid, [])
        return host, own
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")


def calibrate(live: LiveRun) -> HostCalibration:
    """The host's effect on serving, from the calibration phase's replies (never the compared
    phase's): inference time over the answering variant's profiled median, per tier and model
    where a model has ``MIN_SAMPLES`` of them, and per tier; the queue time per tier (the
    hand-off, and the little queueing at that rate, which the simulator then adds again: a
    conservative double count)."""
    ratios: dict[tuple[str, str], list[float]] = {}
    handoff: dict[str, list[float]] = {}
    for q in live.queries:
        if not (live.phases.warmup_s <= q.at < live.phases.compared_from) or q.timings is None:
            continue
        profile = live.profiles.get(q.variant or "")
        if profile is None or q.tier is None or q.timings.get("load_ms") or q.timings.get("cold_start_ms"):
            continue
        ratio = float(q.timings["inference_ms"]) / profile.median_ms(1)
        ratios.setdefault((q.tier, ""), []).append(ratio)
        ratios.setdefault((q.tier, profile.model_name), []).append(ratio)
        handoff.setdefault(q.tier, []).append(float(q.timings["queue_ms"]))
    kept = {key: values for key, values in ratios.items() if not key[1] or len(values) >= MIN_SAMPLES}
    return HostCalibration(kept, handoff)


class TracedSimulation(Simulation):
    """The simulation, noting for each measured query a worker served its wait before its batch
    started (queue, and the instance's load when it waited for one) and its batch's service time:
    what the diagnosis sets beside the live replies' ``timingsMs``."""

    def __init__(
        self,
        profiles: Sequence[VariantProfile],
        pools: Mapping[str, PoolSpec],
        config: SimConfig,
        duration_s: float,
        warmup_s: float = 0.0,
        calibration: HostCalibration | None = None,
    ) -> None:
        super().__init__(profiles, pools, config, duration_s, warmup_s, calibration)
        self.served_on_workers: list[tuple[str, float, float]] = []  # (model, wait ms, service ms)

    def _finish(self, job: tuple[Instance, list[Query], float, float]) -> None:
        _, batch, service_ms, started = job
        for query in batch:
            if query.measured:
                self.served_on_workers.append((query.model, (started - query.arrived) * 1000, service_ms))
        super()._finish(job)


def simulate_schedule(
    zoo: Zoo,
    schedule: Sequence[Arrival],
    live: LiveRun,
    seed: int,
    calibration: HostCalibration | None = None,
) -> TracedSimulation:
    """The same arrivals through the simulator, configured as the stack was: its pools and
    catalog prices, its scaler settings and period, its workers, its Lambda tier's limit, and
    the start-up times measured in this run."""
    config = SimConfig(
        lambda_init_ms=statistics.median(live.lambda_cold_start_ms),
        worker_startup_s=statistics.median(live.worker_startup_ms) / 1000,
        lambda_keep_warm_s=STACK_LAMBDA_KEEP_WARM_S,
        lambda_concurrency=STACK_LAMBDA_CONCURRENCY,
        scaler_period_s=STACK_SCALE_EVERY_S,
        seed=seed,
    )
    phases = live.phases
    sim = TracedSimulation(
        zoo.measured(), DEFAULT_POOLS, config, phases.duration_s, phases.compared_from, calibration
    )
    system = Modelless(
        DEFAULT_POOLS,
        STACK_SCALER,
        exact_to_optimality,
        "modelless",
        initial_workers={"cpu": STACK_WORKERS},
        scale_in="newest",
    )
    sim.run(system, iter(schedule))
    return sim


@dataclass(frozen=True)
class Comparison:
    measured_p99_ms: float
    simulated_p99_ms: float
    measured_attainment: float
    simulated_attainment: float
    measured_queries: int
    simulated_queries: int
    gateway_p50_ms: float
    gateway_p99_ms: float
    measured_refused: int
    simulated_refused: int
    measured_on_lambda: int
    simulated_on_lambda: int

    @property
    def p99_error(self) -> float:
        return self.simulated_p99_ms / self.measured_p99_ms - 1 if self.measured_p99_ms else float("nan")

    @property
    def attainment_gap_points(self) -> float:
        return 100 * (self.simulated_attainment - self.measured_attainment)


def live_figures(live: LiveRun) -> tuple[list[LiveQuery], float, float]:
    """The compared phase's queries, their p99 (of the answered ones' budgeted latency) and SLO
    attainment (a refused or failed query violates it)."""
    kept = [q for q in live.queries if q.at >= live.phases.compared_from]
    answered = [q.budgeted_ms for q in kept if q.budgeted_ms is not None]
    met = sum(1 for q in kept if q.budgeted_ms is not None and q.budgeted_ms <= q.slo_ms)
    return kept, percentile_of(answered, 99), met / len(kept) if kept else float("nan")


def compare(live: LiveRun, sims: Sequence[Simulation]) -> list[Comparison]:
    """One comparison per simulated repeat, all against the one live run."""
    kept, p99_ms, attainment = live_figures(live)
    gateway = [q.gateway_ms for q in kept if q.gateway_ms is not None]
    out = []
    for sim in sims:
        result = sim._result("modelless")
        out.append(
            Comparison(
                measured_p99_ms=p99_ms,
                simulated_p99_ms=result.p99_ms,
                measured_attainment=attainment,
                simulated_attainment=1 - result.violation_ratio,
                measured_queries=len(kept),
                simulated_queries=result.queries,
                gateway_p50_ms=percentile_of(gateway, 50),
                gateway_p99_ms=percentile_of(gateway, 99),
                measured_refused=sum(1 for q in kept if q.status != 200),
                simulated_refused=result.failed,
                measured_on_lambda=sum(1 for q in kept if q.tier == "lambda"),
                simulated_on_lambda=result.lambda_served,
            )
        )
    return out


def validation_schedule(mix: Mix, phases: Phases, seed: int) -> list[Arrival]:
    return list(arrivals(phases.curve(), mix, seed))


# --- the trace-driven validation (``scripts/bench sim-validation``) ---------------------------------

PART = "sim-validation"
# Issue 14's targets, per seed: the simulated p99 within 15 % of the live one, and the simulated
# SLO attainment within 1 percentage point of the live one.
P99_TOLERANCE = 0.15
ATTAINMENT_TOLERANCE_POINTS = 1.0
DEFAULT_SEEDS = (1, 2)
DEFAULT_SIM_REPEATS = 10  # cheap (about a second each), and the simulator's own spread is wide
# Live runs per seed: the second measures the live stack against itself (its noise on this machine).
DEFAULT_LIVE_REPEATS = 2
# Per seed: 30 s for the stack to settle (its workers' first placements, the Lambda tier's first
# containers: their starts and model loads take the cores, and a calibration measured over them
# slowed the simulator's inference by more than the compared phase saw), a minute whose replies
# calibrate the simulator (the trace's slowdowns come and go with its bursts: a short phase
# catches too few), then 3 minutes compared.
TRACE_PHASES = Phases(duration_s=180.0, calibration_s=60.0, warmup_s=30.0)
QUICK_PHASES = Phases(duration_s=30.0, calibration_s=15.0, warmup_s=15.0)
DIAGNOSIS_BIN_S = 10.0
KINDS = (("calibrated", "host-calibrated"), ("uncalibrated", "isolated profiles"))


@dataclass(frozen=True)
class TraceWindow:
    """The recorded arrivals one seed replays: ``count`` consecutive arrivals of the trace from
    its ``first``-th, recorded between ``recorded_from_s`` and ``recorded_to_s`` (seconds into the
    trace), their times divided by ``compression`` (``sim.traces.replay``'s ``compress``: every gap,
    burst and lull kept in proportion) so that their mean rate is the one asked for."""

    seed: int
    first: int
    count: int
    recorded_from_s: float
    recorded_to_s: float
    compression: float
    times: ArrivalTimes

    def describe(self) -> dict[str, Any]:
        bursts = self.times.burstiness()
        return {
            "seed": self.seed,
            "first_arrival": self.first,
            "arrivals": self.count,
            "recorded_from_s": round(self.recorded_from_s, 3),
            "recorded_to_s": round(self.recorded_to_s, 3),
            "compression": round(self.compression, 4),
            "replayed_s": round(self.times.duration_s, 3),
            "mean_qps": round(self.times.mean_qps, 3),
            "cv": round(bursts.cv, 3),
            "peak_over_mean": {f"{w:g}s": round(r, 3) for w, r in bursts.peak_over_mean},
        }


def trace_window(offsets: Sequence[float], rate_qps: float, duration_s: float, seed: int) -> TraceWindow:
    """Seed ``seed``'s window of the recorded trace ``offsets`` (seconds, sorted) replayed at a mean
    of ``rate_qps`` over ``duration_s``: the ``round(rate_qps * duration_s)`` consecutive recorded
    arrivals from the ``(seed - 1)``-th multiple of that count (seeds 1, 2, ... take successive,
    disjoint windows as far as the trace goes, then wrap around), their times compressed."""
    count = round(rate_qps * duration_s)
    if count < 2:
        raise ValueError(f"{rate_qps:g} QPS over {duration_s:g} s is fewer than two arrivals")
    if count > len(offsets):
        raise ValueError(
            f"the trace holds {len(offsets)} arrivals, fewer than {count} "
            f"({rate_qps:g} QPS over {duration_s:g} s)"
        )
    first = ((seed - 1) * count) % (len(offsets) - count + 1)
    recorded = [float(t) for t in offsets[first : first + count]]
    times = replay(recorded, rate_qps, method="compress", name=f"conv trace window {seed}")
    span_s = recorded[-1] - recorded[0]
    recorded_period_s = span_s + span_s / (count - 1)  # as replay() counts it: one mean gap more
    return TraceWindow(
        seed, first, count, recorded[0], recorded[-1], recorded_period_s / times.duration_s, times
    )


def trace_schedule(window: TraceWindow, mix: Mix, seed: int) -> list[Arrival]:
    """The window's arrivals, each for an architecture drawn from ``mix`` (seeded)."""
    return list(arrivals_at(window.times.times, mix, seed))


@dataclass(frozen=True)
class Verdict:
    """One seed's live run against its simulations: the simulated figures are the median over
    the simulator's repeats (the range beside them)."""

    live_p99_ms: float
    simulated_p99_ms: float
    simulated_p99_range_ms: tuple[float, float]
    live_attainment_pct: float
    simulated_attainment_pct: float
    simulated_attainment_range_pct: tuple[float, float]
    live_queries: int = 0

    @property
    def p99_difference(self) -> float:
        """Simulated over live, minus one (+0.10: the simulator's p99 is 10 % higher)."""
        return self.simulated_p99_ms / self.live_p99_ms - 1 if self.live_p99_ms else float("nan")

    @property
    def attainment_difference_points(self) -> float:
        return self.simulated_attainment_pct - self.live_attainment_pct

    @property
    def live_attainment_standard_error_points(self) -> float:
        """The live attainment's own sampling noise (binomial standard error, in points): a
        difference well within it is not told apart from the live run's luck."""
        share = self.live_attainment_pct / 100
        return 100 * math.sqrt(share * (1 - share) / self.live_queries) if self.live_queries else math.nan

    @property
    def live_within_simulated_range(self) -> tuple[bool, bool]:
        """Whether the live p99, and the live attainment, lie within the simulations' range: the
        simulator's own spread over its repeats covers what was measured."""
        low, high = self.simulated_p99_range_ms
        a_low, a_high = self.simulated_attainment_range_pct
        return (
            low <= self.live_p99_ms <= high,
            a_low <= self.live_attainment_pct <= a_high,
        )

    @property
    def p99_met(self) -> bool:
        return abs(self.p99_difference) <= P99_TOLERANCE

    @property
    def attainment_met(self) -> bool:
        return abs(self.attainment_difference_points) <= ATTAINMENT_TOLERANCE_POINTS

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items()},
            "p99_difference": self.p99_difference,
            "attainment_difference_points": self.attainment_difference_points,
            "live_attainment_standard_error_points": self.live_attainment_standard_error_points,
            "live_within_simulated_range": self.live_within_simulated_range,
            "p99_met": self.p99_met,
            "attainment_met": self.attainment_met,
        }


def judge(comparisons: Sequence[Comparison]) -> Verdict:
    """The verdict on one live run from its simulations (``compare``'s, all against that run)."""
    if not comparisons:
        raise ValueError("no simulation to judge")
    p99s = [c.simulated_p99_ms for c in comparisons]
    attained = [100 * c.simulated_attainment for c in comparisons]
    return Verdict(
        comparisons[0].measured_p99_ms,
        statistics.median(p99s),
        (min(p99s), max(p99s)),
        100 * comparisons[0].measured_attainment,
        statistics.median(attained),
        (min(attained), max(attained)),
        comparisons[0].measured_queries,
    )


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile_of(values, 50),
        "p90": percentile_of(values, 90),
        "p99": percentile_of(values, 99),
    }


def diagnose(
    live: LiveRun, schedule: Sequence[Arrival], sims: Mapping[str, Sequence[TracedSimulation]]
) -> dict[str, Any]:
    """Where live and simulated differ, in the compared phase: per architecture, its queries and
    their violations (late or refused; the simulations' mean); per ``DIAGNOSIS_BIN_S`` of time,
    the arrivals and violations; the wait before service and the service time of the queries
    workers served (live: the reply's queue + load and inference; simulated: the batch's start
    less the arrival, and its service time); and the inference slowdown over the profiled median
    in the calibration phase against the compared one (what the calibration assumed against
    what happened)."""
    phases = live.phases
    compared = [q for q in live.queries if q.at >= phases.compared_from]
    bins = max(1, int(-(-phases.duration_s // DIAGNOSIS_BIN_S)))

    def bin_of(at: float) -> int:
        return min(bins - 1, int((at - phases.compared_from) // DIAGNOSIS_BIN_S))

    models = sorted({a.model for a in schedule})
    per_model: dict[str, dict[str, Any]] = {}
    for model in models:
        mine = [q for q in compared if q.model == model]
        answered = [q.budgeted_ms for q in mine if q.budgeted_ms is not None]
        per_model[model] = {
            "queries": len(mine),
            "slo_ms": mine[0].slo_ms if mine else None,
            "live_late": sum(1 for q in mine if q.budgeted_ms is not None and q.budgeted_ms > q.slo_ms),
            "live_refused": sum(1 for q in mine if q.budgeted_ms is None),
            "live_p99_ms": percentile_of(answered, 99),
            "live_on_lambda": sum(1 for q in mine if q.tier == "lambda"),
        }
    arrivals_per_bin = [0] * bins
    live_violations = [0] * bins
    for q in compared:
        arrivals_per_bin[bin_of(q.at)] += 1
        if q.budgeted_ms is None or q.budgeted_ms > q.slo_ms:
            live_violations[bin_of(q.at)] += 1
    ratios: dict[str, list[float]] = {"calibration": [], "compared": []}
    live_wait: list[float] = []
    live_service: list[float] = []
    for q in live.queries:
        profile = live.profiles.get(q.variant or "")
        if q.timings is None or q.tier != "worker" or profile is None or q.at < phases.warmup_s:
            continue
        phase = "compared" if q.at >= phases.compared_from else "calibration"
        inference = float(q.timings.get("inference_ms", 0.0))
        if not q.timings.get("load_ms") and not q.timings.get("cold_start_ms"):
            ratios[phase].append(inference / profile.median_ms(1))
        if phase == "compared":
            live_wait.append(float(q.timings.get("queue_ms", 0.0)) + float(q.timings.get("load_ms", 0.0)))
            live_service.append(inference)
    out: dict[str, Any] = {
        "per_model": per_model,
        "bin_s": DIAGNOSIS_BIN_S,
        "arrivals_per_bin": arrivals_per_bin,
        "live_violations_per_bin": live_violations,
        "inference_ratio": {phase: _quantiles(values) for phase, values in ratios.items()},
        "live_worker_wait_ms": _quantiles(live_wait),
        "live_worker_inference_ms": _quantiles(live_service),
    }
    for kind, runs in sims.items():
        if not runs:
            continue
        late: dict[str, float] = {}
        refused: dict[str, float] = {}
        for sim in runs:
            result = sim._result("modelless")
            for (model, why), count in result.violations_by.items():
                into = late if why == "late" else refused
                into[model] = into.get(model, 0.0) + count / len(runs)
        for model in models:
            per_model[model][f"{kind}_late"] = round(late.get(model, 0.0), 2)
            per_model[model][f"{kind}_refused"] = round(refused.get(model, 0.0), 2)
        out[f"{kind}_violations_per_bin"] = [
            round(
                sum(
                    sim.seconds[second].violations
                    for sim in runs
                    for second in range(b * int(DIAGNOSIS_BIN_S), (b + 1) * int(DIAGNOSIS_BIN_S))
                    if second < len(sim.seconds)
                )
                / len(runs),
                2,
            )
            for b in range(bins)
        ]
        served = runs[0].served_on_workers
        out[f"{kind}_worker_wait_ms"] = _quantiles([wait for _, wait, _ in served])
        out[f"{kind}_worker_service_ms"] = _quantiles([service for _, _, service in served])
    return out


def live_path(state_dir: Path, seed: int, repeat: int = 0) -> Path:
    """Where a seed's live run is saved (``repeat`` > 0: the same arrivals run live again)."""
    suffix = f"-again-{repeat}" if repeat else ""
    return state_dir / "bench" / PART / f"live-seed-{seed}{suffix}.json"


def live_against_live(first: LiveRun, again: LiveRun, repeat: int) -> dict[str, Any]:
    """The same arrivals run live twice: how far the second run's p99 and SLO attainment are from
    the first's. The live stack's own run-to-run noise on this machine (its speed drifts, its
    neighbours come and go), the floor under any simulator's agreement with one live run."""
    _, p99_ms, attainment = live_figures(first)
    again_kept, again_p99_ms, again_attainment = live_figures(again)
    return {
        "repeat": repeat,
        "live_p99_ms": p99_ms,
        "again_p99_ms": again_p99_ms,
        "p99_difference": again_p99_ms / p99_ms - 1 if p99_ms else float("nan"),
        "live_attainment_pct": 100 * attainment,
        "again_attainment_pct": 100 * again_attainment,
        "attainment_difference_points": 100 * (again_attainment - attainment),
        "again_on_lambda": sum(1 for q in again_kept if q.tier == "lambda"),
    }


def save_live(path: Path, zoo: Zoo, live: LiveRun, window: TraceWindow, ran_on: str, live_s: float) -> None:
    """The live run, with the zoo it served (its registered models, profiles included): a later
    ``--reuse-live`` simulates with exactly those profiles, whatever the cache holds by then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": ran_on,
        "repository": str(zoo.repository),
        "models": [m.to_json() for m in zoo.models],
        "live_s": live_s,
        "window": {"first": window.first, "count": window.count},
        "phases": live.phases.__dict__,
        "worker_startup_ms": live.worker_startup_ms,
        "lambda_cold_start_ms": live.lambda_cold_start_ms,
        "host_cpu_cores": live.host_cpu_cores,
        "own_cpu_cores": live.own_cpu_cores,
        "queries": [q.__dict__ for q in live.queries],
    }
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def saved_zoo(path: Path) -> Zoo:
    """The zoo a saved live run served (never registers anything)."""
    try:
        data = json.loads(path.read_text())
        models = [RegisteredModel.from_json(m) for m in data["models"]]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(
            f"{path}: no saved live run with its zoo ({error!r}): run without --reuse-live"
        ) from error
    return Zoo([p for m in models for p in m.profiles], Path(data["repository"]), models)


def load_live(path: Path, zoo: Zoo, window: TraceWindow, phases: Phases) -> tuple[LiveRun, str, float]:
    """A saved live run, checked to be of this window, these phases and this zoo: (run, machine,
    seconds)."""
    data = json.loads(path.read_text())
    if [m.get("key") for m in data.get("models", [])] != [m.key for m in zoo.models]:
        raise SystemExit(f"{path} is a live run of another zoo: run without --reuse-live")
    if data["window"] != {"first": window.first, "count": window.count} or Phases(**data["phases"]) != phases:
        raise SystemExit(
            f"{path} is a live run of another window or phases ({data['window']}, {data['phases']}): "
            "run without --reuse-live"
        )
    live = LiveRun(
        [LiveQuery(**q) for q in data["queries"]],
        [float(v) for v in data["worker_startup_ms"]],
        [float(v) for v in data["lambda_cold_start_ms"]],
        phases,
        {p.variant_id: p for p in zoo.measured()},
        float(data.get("host_cpu_cores", "nan")),
        float(data.get("own_cpu_cores", "nan")),
    )
    return live, str(data["machine"]), float(data["live_s"])


def live_or_saved(
    zoo: Zoo,
    mix: Mix,
    schedule: Sequence[Arrival],
    window: TraceWindow,
    phases: Phases,
    state_dir: Path,
    path: Path,
    reuse_live: bool,
) -> tuple[LiveRun, str, float] | None:
    """The live run saved at ``path`` when reusing (None when there is none), else one run now and
    saved there: (run, machine, seconds)."""
    if reuse_live:
        return load_live(path, zoo, window, phases) if path.exists() else None
    ran_on = machine()
    started = time.perf_counter()
    live = run_live(zoo, mix, schedule, phases, state_dir)
    live_s = time.perf_counter() - started
    save_live(path, zoo, live, window, ran_on, live_s)
    return live, ran_on, live_s


def validate_seed(
    zoo: Zoo,
    mix: Mix,
    offsets: Sequence[float],
    phases: Phases,
    seed: int,
    state_dir: Path,
    sim_repeats: int,
    reuse_live: bool,
    live_repeats: int = 1,
) -> dict[str, Any]:
    """One seed: its trace window, live (or the saved live run), then simulated ``sim_repeats``
    times with isolated profiles and host-calibrated; the verdicts and the diagnosis. With
    ``live_repeats`` > 1, the same arrivals run live again that many times less one, each set
    against the first (``live_against_live``): the simulations are judged against the first."""
    window = trace_window(offsets, phases.rate_qps, phases.total_s, seed)
    schedule = trace_schedule(window, mix, seed)
    saved = live_path(state_dir, seed)
    if not reuse_live:
        print(
            f"  seed {seed}: live, {len(schedule)} queries over {phases.total_s:g} s (recorded arrivals "
            f"{window.first}-{window.first + window.count - 1}, times / {window.compression:.2f})...",
            flush=True,
        )
    first = live_or_saved(zoo, mix, schedule, window, phases, state_dir, saved, reuse_live)
    if first is None:
        raise SystemExit(f"no saved live run of seed {seed} at {saved}: run without --reuse-live")
    live, ran_on, live_s = first
    if reuse_live:
        print(f"  seed {seed}: the live run saved in {saved} ({ran_on})", flush=True)
    repeats = []
    for repeat in range(1, live_repeats):
        again_path = live_path(state_dir, seed, repeat)
        if not reuse_live:
            print(
                f"  seed {seed}: the same arrivals live again ({repeat} of {live_repeats - 1})...", flush=True
            )
        found_again = live_or_saved(zoo, mix, schedule, window, phases, state_dir, again_path, reuse_live)
        if found_again is None:
            print(f"  seed {seed}: no saved live repeat {repeat} ({again_path}): left out", flush=True)
            continue
        again = found_again[0]
        repeats.append(live_against_live(live, again, repeat))
        found = repeats[-1]
        print(
            f"  seed {seed} live again {repeat}: p99 {found['again_p99_ms']:.2f} ms against "
            f"{found['live_p99_ms']:.2f} ({100 * found['p99_difference']:+.1f} %); SLO attainment "
            f"{found['again_attainment_pct']:.2f} % against {found['live_attainment_pct']:.2f} % "
            f"({found['attainment_difference_points']:+.2f} pp)",
            flush=True,
        )
    calibration = calibrate(live)
    sim_seeds = [seed * 1000 + repeat for repeat in range(sim_repeats)]
    started = time.perf_counter()
    sims = {
        "calibrated": [simulate_schedule(zoo, schedule, live, s, calibration) for s in sim_seeds],
        "uncalibrated": [simulate_schedule(zoo, schedule, live, s) for s in sim_seeds],
    }
    sim_s = time.perf_counter() - started
    comparisons = {kind: compare(live, runs) for kind, runs in sims.items()}
    verdicts = {kind: judge(found) for kind, found in comparisons.items()}
    for kind, verdict in verdicts.items():
        print(
            f"  seed {seed} {kind:<12}: p99 live {verdict.live_p99_ms:.2f} ms, simulated "
            f"{verdict.simulated_p99_ms:.2f} ms ({100 * verdict.p99_difference:+.1f} %); SLO attainment live "
            f"{verdict.live_attainment_pct:.2f} %, simulated {verdict.simulated_attainment_pct:.2f} % "
            f"({verdict.attainment_difference_points:+.2f} pp)",
            flush=True,
        )
    return {
        "seed": seed,
        "machine": ran_on,
        "live_s": round(live_s, 1),
        "sim_s": round(sim_s, 1),
        "sim_seeds": sim_seeds,
        "window": window.describe(),
        "compared_qps": round(
            sum(1 for q in live.queries if q.at >= phases.compared_from) / phases.duration_s, 3
        ),
        "worker_startup_ms": live.worker_startup_ms,
        "lambda_cold_start_ms": live.lambda_cold_start_ms,
        "host_cpu_cores": live.host_cpu_cores,
        "own_cpu_cores": live.own_cpu_cores,
        "calibration_ratio_median": {
            f"{t}/{m or '*'}": statistics.median(v) for (t, m), v in calibration.inference_ratio.items()
        },
        "calibration_samples": {
            f"{t}/{m or '*'}": len(v) for (t, m), v in calibration.inference_ratio.items()
        },
        "handoff_ms_median": {t: statistics.median(v) for t, v in calibration.handoff_ms.items() if v},
        "verdicts": {kind: verdict.to_json() for kind, verdict in verdicts.items()},
        "comparisons": {kind: [c.__dict__ for c in found] for kind, found in comparisons.items()},
        "diagnosis": diagnose(live, schedule, sims),
        "live_repeats": repeats,
    }


def _pct(value: float, digits: int = 1) -> str:
    return f"{100 * value:+.{digits}f} %"


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def verdict_table(seeds: Sequence[dict[str, Any]], kind: str) -> str:
    rows = []
    for result in seeds:
        v = result["verdicts"][kind]
        window = result["window"]
        low, high = v["simulated_p99_range_ms"]
        a_low, a_high = v["simulated_attainment_range_pct"]
        rows.append(
            [
                str(result["seed"]),
                f"{window['recorded_from_s'] / 60:.1f}\u2013{window['recorded_to_s'] / 60:.1f} min, "
                f"÷{window['compression']:.2f}",
                str(result["comparisons"][kind][0]["measured_queries"]),
                f"{v['live_p99_ms']:.1f} ms",
                f"{v['simulated_p99_ms']:.1f} ms ({span([low, high], 1)})",
                _pct(v["p99_difference"]),
                _met(v["p99_met"]),
                f"{v['live_attainment_pct']:.2f} % (±{v['live_attainment_standard_error_points']:.2f})",
                f"{v['simulated_attainment_pct']:.2f} % ({span([a_low, a_high], 2)})",
                f"{v['attainment_difference_points']:+.2f} pp",
                _met(v["attainment_met"]),
                " / ".join("yes" if inside else "no" for inside in v["live_within_simulated_range"]),
            ]
        )
    return markdown_table(
        [
            "seed",
            "trace window (recorded; time ÷)",
            "queries compared",
            "p99 live",
            "p99 simulated (median; range)",
            "difference",
            f"within {100 * P99_TOLERANCE:g} %",
            "SLO attainment live (± s.e.)",
            "simulated (median; range)",
            "difference",
            f"within {ATTAINMENT_TOLERANCE_POINTS:g} pp",
            "live within the simulated range (p99 / SLO)",
        ],
        rows,
    )


def live_repeats_table(seeds: Sequence[dict[str, Any]]) -> str:
    rows = [
        [
            str(result["seed"]),
            str(again["repeat"]),
            f"{again['live_p99_ms']:.1f} ms",
            f"{again['again_p99_ms']:.1f} ms",
            _pct(again["p99_difference"]),
            _met(abs(again["p99_difference"]) <= P99_TOLERANCE),
            f"{again['live_attainment_pct']:.2f} %",
            f"{again['again_attainment_pct']:.2f} %",
            f"{again['attainment_difference_points']:+.2f} pp",
            _met(abs(again["attainment_difference_points"]) <= ATTAINMENT_TOLERANCE_POINTS),
        ]
        for result in seeds
        for again in result.get("live_repeats", [])
    ]
    return markdown_table(
        [
            "seed",
            "run again",
            "p99 first live run",
            "p99 live again",
            "difference",
            f"within {100 * P99_TOLERANCE:g} %",
            "SLO attainment first",
            "again",
            "difference",
            f"within {ATTAINMENT_TOLERANCE_POINTS:g} pp",
        ],
        rows,
    )


def where_table(seeds: Sequence[dict[str, Any]]) -> str:
    rows = []
    for result in seeds:
        live = result["comparisons"]["calibrated"][0]
        for kind, label in KINDS:
            found = result["comparisons"][kind]
            rows.append(
                [
                    str(result["seed"]),
                    label,
                    f"{live['measured_on_lambda']} / {span([c['simulated_on_lambda'] for c in found], 0)}",
                    f"{live['measured_refused']} / {span([c['simulated_refused'] for c in found], 0)}",
                ]
            )
    return markdown_table(
        ["seed", "simulator fed", "on Lambda (live / simulated)", "refused (live / simulated)"], rows
    )


def diagnosis_table(seeds: Sequence[dict[str, Any]]) -> str:
    rows = []
    for result in seeds:
        for model, m in result["diagnosis"]["per_model"].items():
            rows.append(
                [
                    str(result["seed"]),
                    f"`{model}`",
                    f"{m['slo_ms']:g} ms" if m["slo_ms"] is not None else "—",
                    str(m["queries"]),
                    f"{m['live_late']} + {m['live_refused']}",
                    f"{m.get('calibrated_late', 0):g} + {m.get('calibrated_refused', 0):g}",
                    f"{m.get('uncalibrated_late', 0):g} + {m.get('uncalibrated_refused', 0):g}",
                    f"{m['live_p99_ms']:.1f} ms",
                    str(m["live_on_lambda"]),
                ]
            )
    return markdown_table(
        [
            "seed",
            "architecture",
            "SLO",
            "queries",
            "violations live (late + refused)",
            "host-calibrated (mean)",
            "isolated profiles (mean)",
            "p99 live",
            "on Lambda live",
        ],
        rows,
    )


def _p50_p99(quantiles: Mapping[str, float]) -> str:
    return f"{quantiles['p50']:.1f} / {quantiles['p99']:.1f}"


def components_table(seeds: Sequence[dict[str, Any]]) -> str:
    rows = []
    for result in seeds:
        d = result["diagnosis"]
        ratio_cal, ratio_cmp = d["inference_ratio"]["calibration"], d["inference_ratio"]["compared"]
        rows.append(
            [
                str(result["seed"]),
                f"{ratio_cal['p50']:.2f} / {ratio_cal['p90']:.2f} / {ratio_cal['p99']:.2f}",
                f"{ratio_cmp['p50']:.2f} / {ratio_cmp['p90']:.2f} / {ratio_cmp['p99']:.2f}",
                _p50_p99(d["live_worker_wait_ms"]),
                _p50_p99(d["calibrated_worker_wait_ms"]),
                _p50_p99(d["live_worker_inference_ms"]),
                _p50_p99(d["calibrated_worker_service_ms"]),
            ]
        )
    return markdown_table(
        [
            "seed",
            "inference ÷ profiled median, calibration phase (p50 / p90 / p99)",
            "compared phase",
            "wait before service, live (p50 / p99 ms)",
            "simulated, host-calibrated",
            "inference, live (p50 / p99 ms)",
            "service, simulated host-calibrated",
        ],
        rows,
    )


def busiest_bins_text(result: dict[str, Any], top: int = 3) -> str:
    """The bins holding the most live violations, with the simulated ones beside."""
    d = result["diagnosis"]
    live, sim, arrivals_per_bin = (
        d["live_violations_per_bin"],
        d["calibrated_violations_per_bin"],
        d["arrivals_per_bin"],
    )
    mean_arrivals = sum(arrivals_per_bin) / len(arrivals_per_bin) if arrivals_per_bin else 0.0
    order = sorted(range(len(live)), key=lambda b: -live[b])[:top]
    parts = [
        f"{b * d['bin_s']:g}\u2013{(b + 1) * d['bin_s']:g} s: {live[b]} live / {sim[b]:g} simulated "
        f"({arrivals_per_bin[b] / mean_arrivals:.2f}x the mean arrivals)"
        for b in order
        if live[b]
    ]
    total_live, total_sim = sum(live), sum(sim)
    head = f"seed {result['seed']}: {total_live} live and {total_sim:g} simulated violations"
    if not parts:
        return head
    return f"{head}; the {d['bin_s']:g} s bins with the most live ones: " + "; ".join(parts)


def cpu_text(result: dict[str, Any]) -> str:
    host, own = result.get("host_cpu_cores", math.nan), result.get("own_cpu_cores", math.nan)
    if math.isnan(host):
        return f"seed {result['seed']}: not measured (no /proc)"
    return (
        f"seed {result['seed']}: busy {host:.2f} cores, of which this run's processes {own:.2f} "
        f"and other work on the machine {host - own:.2f}"
    )


def headline_lines(seeds: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for result in seeds:
        v = result["verdicts"]["calibrated"]
        lines.append(
            f"simulator vs the live embedded stack on the conv trace (seed {result['seed']}, "
            "host-calibrated): "
            f"p99 {v['simulated_p99_ms']:.1f} vs {v['live_p99_ms']:.1f} ms ({_pct(v['p99_difference'])}, "
            f"{'within' if v['p99_met'] else 'outside'} {100 * P99_TOLERANCE:g} %), SLO attainment "
            f"{v['simulated_attainment_pct']:.2f} vs {v['live_attainment_pct']:.2f} % "
            f"({v['attainment_difference_points']:+.2f} pp, {'within' if v['attainment_met'] else 'outside'} "
            f"{ATTAINMENT_TOLERANCE_POINTS:g} pp)"
            + "".join(
                f"; the same arrivals live again: p99 {_pct(again['p99_difference'])}, SLO attainment "
                f"{again['attainment_difference_points']:+.2f} pp"
                for again in result.get("live_repeats", [])
            )
        )
    return lines


def part_markdown(data: dict[str, Any]) -> str:
    seeds = data["seeds"]
    phases = data["phases"]
    first = seeds[0]
    architectures_text = ", ".join(
        f"`{a['model']}` {100 * a['share']:.1f} % (SLO {a['slo_ms']:g} ms)" for a in data["mix"]
    )
    machines = sorted({r["machine"] for r in seeds})
    ratio_medians = "; ".join(
        f"seed {r['seed']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["calibration_ratio_median"].items())
        for r in seeds
    )
    windows = "; ".join(
        f"seed {r['seed']}: arrivals {r['window']['first_arrival']}\u2013"
        f"{r['window']['first_arrival'] + r['window']['arrivals'] - 1} (CV of gaps {r['window']['cv']:.2f}, "
        f"busiest 1 s {r['window']['peak_over_mean']['1s']:.2f}x the mean, busiest 10 s "
        f"{r['window']['peak_over_mean']['10s']:.2f}x)"
        for r in seeds
    )
    met = [
        r["verdicts"]["calibrated"]["p99_met"] and r["verdicts"]["calibrated"]["attainment_met"]
        for r in seeds
    ]
    missed = [str(r["seed"]) for r, ok in zip(seeds, met, strict=True) if not ok]
    overall = "Both targets met on every seed." if not missed else f"Missed on seed(s) {', '.join(missed)}."
    return f"""## The simulator against the embedded stack, on the conv trace

Machine: `{"`, `".join(machines)}` (live runs); written {data["written"]}. Reproduce:
`{data["command"]}` ({data["wall_s"] / 60:.1f} min).

Each seed replays a window of the Azure LLM conversation trace (`{data["trace"]}`, {data["trace_arrivals"]:,}
arrivals over {data["trace_span_s"] / 60:.0f} min) at its recorded arrival times, compressed so that its
mean is {phases["rate_qps"]:g} QPS (`validation_rate_qps`: {100 * VALIDATION_LOAD:g} % of what this
machine's {data["cores"]} cores could serve of the mix on its fastest accurate CPU variants), against a live
embedded stack (`infra.local.stack`: the gateway in this process, {STACK_WORKERS} worker processes, the
local Lambda tier with {STACK_LAMBDA_CONCURRENCY} containers at most, the scaler every
{STACK_SCALE_EVERY_S:g} s, in-memory metadata); then the very same arrivals go through the simulator
({data["sim_repeats"]} repeat(s) per seed: the simulator's own draws of service times and hand-offs),
configured as the stack was, with the workers' start-up and the Lambda cold starts measured in
that run. The first {phases["warmup_s"]:g} s warm
up, the next {phases["calibration_s"]:g} s calibrate the simulator, the last {phases["duration_s"]:g} s
are compared. The seed picks the trace window (disjoint, successive windows of
{first["window"]["arrivals"]:,} recorded arrivals: {windows}) and the draw of each query's
architecture from the Zipf mix ({architectures_text}; the cost study's targets, except that an
architecture whose accurate CPU variants all miss its target at batch 1 gets a cold model's,
`cpu_servable_architectures`: this stack has no accelerator, and its every query would be refused,
live and simulated alike). Compared: each query's latency as the project's
budget counts it (queue + load + cold start + inference, from the reply's `timingsMs`) and its SLO
(refused or failed queries violate it); the gateway's own time is not simulated.

**Targets (issue 14), per seed, for the host-calibrated simulator: p99 within
{100 * P99_TOLERANCE:g} % and SLO attainment within {ATTAINMENT_TOLERANCE_POINTS:g} point of the live run.**
{overall}

Host-calibrated (inference drawn as the profiled median times the slowdowns measured in the
calibration phase; the hand-off before the queue measured there):

{verdict_table(seeds, "calibrated")}

Isolated profiles (the simulator as the cost study uses it: the profiler's latencies, each variant
alone in its process):

{verdict_table(seeds, "uncalibrated")}

Where the queries went:

{where_table(seeds)}

Per architecture, over the compared phase:

{diagnosis_table(seeds)}

The host's effect and the queries' time on workers, compared phase (the simulated figures from the
first host-calibrated repeat; the calibration's median slowdowns: {ratio_medians}):

{components_table(seeds)}

The machine during each live run (CPU seconds per second over the load, of {data["cores"]} cores):
{chr(10).join(f"- {cpu_text(r)}" for r in seeds)}

When the violations happened:

{chr(10).join(f"- {busiest_bins_text(r)}" for r in seeds)}

The simulated figure per seed is the median over the simulator's repeats (its own draws of service
times and hand-offs); the ± beside the live attainment is its binomial standard error (the live
run's own sampling noise over that many queries).

{repeats_text(seeds)}
"""


def repeats_text(seeds: Sequence[dict[str, Any]]) -> str:
    if not any(result.get("live_repeats") for result in seeds):
        return (
            "The live run was made once per seed, so its own run-to-run noise is not in the tables "
            "(`--live-repeats 2` measures it)."
        )
    return f"""**The live stack against itself.** The same arrivals (same window, same draws, same zoo)
were run live again on the same machine, right after the first run, and compared with the same
figures and the same tolerances: how far one live run is from another is the floor under any
simulator's agreement with one live run on this machine.

{live_repeats_table(seeds)}"""


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (the options that change what runs)."""
    extra = []
    if args.quick:
        extra.append("--quick")
    if list(args.seeds) != list(DEFAULT_SEEDS if not args.quick else DEFAULT_SEEDS[:1]):
        extra.append(f"--seeds {' '.join(str(s) for s in args.seeds)}")
    defaults = QUICK_PHASES if args.quick else TRACE_PHASES
    for name in ("duration_s", "calibration_s", "warmup_s"):
        if getattr(args, name) != getattr(defaults, name):
            extra.append(f"--{name.replace('_', '-')} {getattr(args, name):g}")
    if args.rate:
        extra.append(f"--rate {args.rate:g}")
    if args.sim_repeats != DEFAULT_SIM_REPEATS:
        extra.append(f"--sim-repeats {args.sim_repeats}")
    if args.live_repeats != DEFAULT_LIVE_REPEATS:
        extra.append(f"--live-repeats {args.live_repeats}")
    if args.only:
        extra.append(f"--only {' '.join(args.only)}")
    if args.trace != TRACE_PATH:
        extra.append(f"--trace {args.trace}")
    return " ".join(["scripts/bench", PART, *extra])


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"scripts/bench {PART}",
        description="The simulator against a live run of the embedded stack, replaying the conv trace.",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", help=f"trace windows and draws (default {DEFAULT_SEEDS})"
    )
    parser.add_argument("--duration-s", type=float, help="compared seconds per seed")
    parser.add_argument("--calibration-s", type=float, help="seconds whose replies calibrate the simulator")
    parser.add_argument("--warmup-s", type=float, help="seconds of warm-up before the calibration")
    parser.add_argument("--sim-repeats", type=int, default=DEFAULT_SIM_REPEATS)
    parser.add_argument(
        "--live-repeats",
        type=int,
        default=DEFAULT_LIVE_REPEATS,
        help="live runs of each seed's arrivals (2 or more: the live stack against itself)",
    )
    parser.add_argument("--rate", type=float, help="mean QPS (default: validation_rate_qps, from the zoo)")
    parser.add_argument("--trace", type=Path, default=TRACE_PATH)
    parser.add_argument("--only", nargs="+", help="these models of the real zoo only")
    parser.add_argument("--quick", action="store_true", help="two models, one seed, 60 s per seed")
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument(
        "--reuse-live", action="store_true", help="simulate again against the live runs saved by the last run"
    )
    args = parser.parse_args(list(argv))
    defaults = QUICK_PHASES if args.quick else TRACE_PHASES
    args.seeds = args.seeds or list(DEFAULT_SEEDS[:1] if args.quick else DEFAULT_SEEDS)
    for name in ("duration_s", "calibration_s", "warmup_s"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(defaults, name))
    if args.sim_repeats < 1:
        parser.error("--sim-repeats must be at least 1")
    if args.live_repeats < 1:
        parser.error("--live-repeats must be at least 1")
    return args


def run_part(args: argparse.Namespace) -> dict[str, Any]:
    from bench.sim_profiles import cpu_servable_architectures, measured_zoo

    began = time.perf_counter()
    print(f"machine: {machine()}", flush=True)
    # Reusing live runs: the zoo they served, as saved with them (the cache may hold another by
    # now, and a missing entry must not start a registration).
    reused = live_path(args.state_dir, args.seeds[0]) if args.reuse_live else None
    zoo = saved_zoo(reused) if reused else measured_zoo(args.state_dir, quick=args.quick, only=args.only)
    # The bursty workloads' mix (bench.costs), with targets a CPU can meet: the stack here has no
    # accelerator to serve a popular model's 50 ms where its CPU variants take longer.
    mix = Mix.zipf(cpu_servable_architectures(zoo))
    rate = args.rate or validation_rate_qps(zoo, mix)
    phases = Phases(rate, args.duration_s, rate, args.calibration_s, args.warmup_s)
    offsets = load_trace(args.trace)
    print(
        f"{PART}: {len(zoo.models)} models, {rate:g} QPS, {phases.total_s:g} s per seed "
        f"({phases.duration_s:g} compared), seeds {args.seeds}, {args.sim_repeats} simulations each",
        flush=True,
    )
    seeds = [
        validate_seed(
            zoo,
            mix,
            offsets,
            phases,
            seed,
            args.state_dir,
            args.sim_repeats,
            args.reuse_live,
            args.live_repeats,
        )
        for seed in args.seeds
    ]
    data: dict[str, Any] = {
        "written": machine(),
        "command": command_line(args),
        "wall_s": round(time.perf_counter() - began, 1),
        "cores": os.cpu_count(),
        "trace": args.trace.name,
        "trace_arrivals": len(offsets),
        "trace_span_s": offsets[-1],
        "phases": phases.__dict__,
        "sim_repeats": args.sim_repeats,
        "live_repeats": args.live_repeats,
        "tolerances": {"p99": P99_TOLERANCE, "attainment_points": ATTAINMENT_TOLERANCE_POINTS},
        "mix": [
            {"model": a.model, "share": share, "slo_ms": a.slo_ms}
            for a, share in zip(mix.architectures, mix.shares, strict=True)
        ],
        "seeds": seeds,
    }
    data["headlines"] = headline_lines(seeds)
    write_fragment(args.out_dir, PART, part_markdown(data), data)
    return data


# --- the load generator's process -----------------------------------------------------------------


async def _replay(job: dict[str, Any]) -> list[list[Any]]:
    """Send each scheduled query at its time (open loop: whatever the replies do), each on an idle
    connection or a new one; latency from the scheduled time (no coordinated omission)."""
    host, port = str(job["host"]), int(job["port"])
    requests = {}
    for model, request in job["requests"].items():
        data = base64.b64decode(request["body_b64"])
        head = (
            f"POST {request['path']} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: {request['content_type']}\r\n"
            f"X-Api-Key: {request['api_key']}\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        requests[model] = head.encode() + data
    timeout_s = float(job["timeout_s"])
    # (connection, when it was last used): uvicorn closes a keep-alive connection idle for 5 s,
    # and a request written to one it just closed would be lost; older ones are not reused.
    idle: list[tuple[Connection, float]] = []
    records: list[list[Any]] = []
    started = time.perf_counter()

    def take() -> Connection | None:
        while idle:
            connection, used = idle.pop()
            if time.perf_counter() - used < IDLE_REUSE_S:
                return connection
            connection.close()
        return None

    async def send(at: float, model: str) -> None:
        connection = take()
        status, timings, tier, error, variant = 0, None, None, "", None
        try:
            if connection is None:
                connection = await Connection.open(host, port)
            status, body, reusable = await asyncio.wait_for(connection.exchange(requests[model]), timeout_s)
            reply = json.loads(body)
            if status == 200:
                timings, tier, variant = reply.get("timingsMs"), reply.get("tier"), reply.get("variant")
            else:
                error = str(reply.get("error", reply))[:200]
            if reusable:
                idle.append((connection, time.perf_counter()))
            else:
                connection.close()
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as failure:
            error = f"{type(failure).__name__}: {failure}"[:200]
            if connection is not None:
                connection.close()
        latency_ms = (time.perf_counter() - started - at) * 1000
        records.append([at, model, status, round(latency_ms, 4), timings, tier, error, variant])

    tasks = []
    for at, model in job["schedule"]:
        wait = started + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(send(float(at), str(model))))
    await asyncio.gather(*tasks)
    for connection, _ in idle:
        connection.close()
    return records


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--replay"]:  # the load generator's process (run_live starts it)
        if len(argv) != 3:
            raise SystemExit("usage: python -m bench.sim_validation --replay JOB.json OUT.json")
        job = json.loads(Path(argv[1]).read_text())
        Path(argv[2]).write_text(json.dumps(asyncio.run(_replay(job))))
        return
    run_part(parse(argv))


if __name__ == "__main__":
    main()
