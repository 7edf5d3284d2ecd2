"""The simulator checked against the real thing: a short run of the embedded stack (gateway,
worker processes, local Lambda tier, the scaler on its 5 s loop) under Poisson load over the zoo,
then the very same arrivals, with the very same measured profiles and the stack's own settings,
through the simulator; their p99 latency and SLO attainment are compared.

The latency compared is what a query's latency budget covers (README, "What the targets mean"),
as each reply's ``timingsMs`` reports it: queue + load + Lambda cold start + inference. The
gateway's own time (HTTP, JSON, selection) is not in the budget and not simulated: it is
reported beside, measured. A refused query (422: no variant meets the targets now) or a failed
one counts as an SLO violation in both.

The measured inputs of the simulation come from this run: the workers' start-up time (spawn to
ready) and the Lambda tier's cold start (a container's spawn to ready, timed by the tier itself)
measured on fresh containers just before the run.

    python -m bench.sim_validation --replay JOB.json OUT.json   # the load generator's process

The zoo is the real one (``bench.real_zoo``): queries carry one held-out example of their model's
test set as a binary body (``.npy``, or ``.npz`` for the text model's two inputs), and the rate is
set from the zoo's measured latencies (``validation_rate_qps``) so that the stack is loaded, not
swamped, on the machine it runs on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import Connection
from bench.real_zoo import RegisteredModel, encode_body, held_out_batch, query_path
from bench.sim_profiles import Zoo, developer_cpu_variant
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.scaling.controller import ScalerConfig
from modelless.types import VariantProfile
from sim.simulator import (
    Arrival,
    HostCalibration,
    Modelless,
    SimConfig,
    Simulation,
    exact_to_optimality,
    percentile_of,
)
from sim.traces import Mix, RateCurve, arrivals

# The embedded stack as ``infra.local.stack`` starts it (start_stack's scaler settings).
STACK_WORKERS = 2
STACK_LAMBDA_CONCURRENCY = 4
STACK_LAMBDA_KEEP_WARM_S = 300.0  # LocalLambdaTier's idle_timeout_s
STACK_SCALER = ScalerConfig(window_s=10, min_workers={"cpu": 1}, max_workers={"cpu": 4})
STACK_SCALE_EVERY_S = 5.0
MIN_SAMPLES = 20  # a model's own calibration needs this many replies; else its tier's
IDLE_REUSE_S = 2.0  # the replayer reuses a connection idle this long at most
# The validation load: this share of what the machine's cores could serve of the zoo's mix on its
# fastest accurate CPU variants (profiled medians), at most MAX_VALIDATION_QPS.
VALIDATION_LOAD = 0.4
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


def measure_lambda_cold_starts(zoo: Zoo, state_dir: Path, runs: int = 3) -> list[float]:
    """Cold starts of the local Lambda tier: ``runs`` fresh containers, each invoked once; the
    tier times each container from its spawn to ready (process start and imports). The model's
    load is not in it (the simulator adds the variant's profiled load time)."""

    from infra.local.lambda_container import local_lambda_tier
    from modelless.runtime import invocation_payload
    from modelless.tensors import example_batch

    variant = min(
        (p for p in zoo.measured() if p.pool == "lambda-cpu"), key=lambda p: (p.load_latency_ms, p.variant_id)
    )
    record = next(m.record for m in zoo.models if m.name == variant.model_name)
    inputs = example_batch(record.input_specs, 1)
    cold: list[float] = []
    for run in range(runs):
        tier = local_lambda_tier(str(zoo.repository), state_dir / "logs", state_dir / "cache", concurrency=1)
        try:
            body = tier.invoke(invocation_payload(variant, inputs, f"cold-{run}"), 60.0)
            if body.get("cold_start"):
                cold.append(float(body["init_ms"]))
        finally:
            tier.close()
    return cold


def validation_rate_qps(zoo: Zoo, mix: Mix) -> float:
    """The validation's arrival rate: ``VALIDATION_LOAD`` of what this machine's cores could
    serve of the mix, each query on its architecture's fastest CPU variant that meets its
    accuracy target (profiled median at batch 1), at most ``MAX_VALIDATION_QPS``."""
    by_model = zoo.by_model()
    mean_ms = 0.0
    for a, share in zip(mix.architectures, mix.shares, strict=True):
        eligible = [
            p for p in by_model[a.model] if p.pool == "cpu" and p.accuracy >= a.targets.min_accuracy
        ] or [developer_cpu_variant(by_model[a.model])]
        mean_ms += share * min(p.median_ms(1) for p in eligible)
    capacity = (os.cpu_count() or 1) * 1000.0 / max(mean_ms, 1e-3)
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
    from modelless.observability import logger as gateway_logger

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    gateway_logger.setLevel("ERROR")
    lambda_cold = measure_lambda_cold_starts(zoo, state_dir)
    with tempfile.TemporaryDirectory(prefix="modelless-validate-") as tmp:
        # The stack serves the zoo cache's artifacts where they are (read only: nothing registers).
        (Path(tmp) / "repo").symlink_to(zoo.repository.resolve(), target_is_directory=True)
        port = 19080 + os.getpid() % 1000
        stack = start_stack(
            Path(tmp), "127.0.0.1", port, STACK_WORKERS, STACK_LAMBDA_CONCURRENCY, "memory://", max_workers=4
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
            subprocess.run(
                [sys.executable, "-m", "bench.sim_validation", "--replay", str(job_path), str(out_path)],
                check=True,
                timeout=phases.total_s + 60,
            )
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
    return LiveRun(queries, worker_startup, lambda_cold, phases, profiles)


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


def simulate_schedule(
    zoo: Zoo,
    schedule: Sequence[Arrival],
    live: LiveRun,
    seed: int,
    calibration: HostCalibration | None = None,
) -> Simulation:
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
    sim = Simulation(
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


def compare(live: LiveRun, sims: Sequence[Simulation]) -> list[Comparison]:
    """One comparison per simulated repeat, all against the one live run."""
    kept = [q for q in live.queries if q.at >= live.phases.compared_from]
    answered = [q.budgeted_ms for q in kept if q.budgeted_ms is not None]
    met = sum(1 for q in kept if q.budgeted_ms is not None and q.budgeted_ms <= q.slo_ms)
    gateway = [q.gateway_ms for q in kept if q.gateway_ms is not None]
    out = []
    for sim in sims:
        result = sim._result("modelless")
        out.append(
            Comparison(
                measured_p99_ms=percentile_of(answered, 99),
                simulated_p99_ms=result.p99_ms,
                measured_attainment=met / len(kept) if kept else float("nan"),
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
    if len(argv) != 3 or argv[0] != "--replay":
        raise SystemExit("usage: python -m bench.sim_validation --replay JOB.json OUT.json")
    job = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(asyncio.run(_replay(job))))


if __name__ == "__main__":
    main()
