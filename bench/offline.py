"""Offline job throughput (inputs/s), alone and beside online load, on real parts: a real worker
process, Redis, and S3 (moto's server, started here unless ``--s3-endpoint`` names one).

    python -m bench.offline [--repeats 3] [--inputs 400] [--online-qps 40] [--quick]
                                  [--out-dir docs/bench] [--runner process|thread]
    scripts/bench offline [the same options]

Each repeat measures, on the same worker (one instance of the model loaded):

1. **offline alone**: an offline job over ``--inputs`` ``.npy`` objects on an idle worker;
2. **online alone**: ``--online-qps`` paced online queries (through the Dispatcher, as the
   gateway sends them) for as long as (1) took, at least 5 s: their latency without offline
   work, and the worker's own online p99 over the variant's profile (the figure the throttle's
   latency threshold is compared with);
3. **offline beside online load**: the same job again (a fresh output prefix) while the same
   online load runs, with the deployment's default thresholds (pause above 40 % online
   utilisation or 2x the profiled latency, resume below 30 % and 1.5x).

Throughput is the job's own clock (from its first run to its completion, pauses included; a
child runner's start-up is not in it). The model is a 64-``--hidden``-10 MLP (random weights:
accuracy is not what is measured), profiled here as registration would. ``--runner process``
(the default) runs each job in a process of its own, as the offline function and the embedded
stack with Redis do; ``thread`` in this process, as the embedded stack does with the in-memory
store. The write-up goes to ``<out-dir>/offline.md`` and ``offline.json`` (min-max over the
repeats); ``--quick`` is a smoke run (one repeat, 100 inputs).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.report import (
    DEFAULT_OUT_DIR,
    machine,
    markdown_table,
    percentile,
    span,
    today,
    write_fragment,
)
from infra.local.ports import free_port
from modelless.catalog import CPU_POOL, DEFAULT_POOLS
from modelless.config import Settings
from modelless.dispatch import Dispatcher
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.jobs import JobSpec
from modelless.offline.service import OfflineService
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.selection import InfaasPolicy
from modelless.types import ModelRecord, QueryTargets, Registration, RegistrationStatus, VariantProfile

APP = "bench-offline"
MODEL = "mlp"
ARTIFACT = f"apps/{APP}/{MODEL}/variants/fp32.onnx"
DEFAULT_HIDDEN = 2048
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def mlp_onnx(hidden: int) -> bytes:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.1, (64, hidden)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.1, (hidden, 10)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def profile(model: bytes) -> VariantProfile:
    """Median latency per batch size on one thread; p99 as 3x the median plus 2 ms (what a busy
    shared machine shows: a tighter one has the worker judge its instance Interfered, and
    selection skip it, for other processes' noise alone)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    p50: dict[int, float] = {}
    for batch in BATCHES:
        inputs = np.random.default_rng(batch).random((batch, 1, 8, 8), dtype=np.float32)
        session.run(None, {"input": inputs})
        times = []
        for _ in range(20):
            started = time.perf_counter()
            session.run(None, {"input": inputs})
            times.append((time.perf_counter() - started) * 1000)
        p50[batch] = statistics.median(times)
    return VariantProfile(
        variant_id=f"{APP}/{MODEL}/fp32-basic/cpu-1t",
        app_id=APP,
        model_name=MODEL,
        pool="cpu",
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=ARTIFACT,
        size_bytes=len(model),
        load_latency_ms=30.0,
        latency_p50_ms=p50,
        latency_p99_ms={b: 3 * ms + 2.0 for b, ms in p50.items()},
        peak_memory_mb=10.0,
        accuracy=0.9,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware=platform.processor() or platform.machine(),
        measured_on_target=True,
    )


def publish(store: RedisMetadataStore, variant: VariantProfile) -> None:
    model = ModelRecord(
        APP, MODEL, "input", [1, 8, 8], "float32", 10, "reg-bench", f"apps/{APP}/{MODEL}/source.onnx"
    )
    registration = Registration("reg-bench", APP, MODEL)
    store.add_model(model, registration)
    registration.status = RegistrationStatus.READY
    registration.variant_ids = [variant.variant_id]
    store.publish_variants(ModelRecord(**{**model.__dict__, "ready": True}), [variant], registration)
    store.create_app(APP, f"bench-{uuid.uuid4().hex}")



@contextmanager
def s3_endpoint(given: str | None) -> Iterator[str]:
    """The S3 endpoint: the one given, or moto's server started (and stopped) here."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if given:
        os.environ["AWS_ENDPOINT_URL"] = given
        yield given
        return
    binary = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    port = free_port()
    server = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(100):
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        os.environ["AWS_ENDPOINT_URL"] = url
        yield url
    finally:
        server.terminate()
        server.wait(10)


@dataclass
class OnlineLoad:
    """Paced online queries (two threads) through a Dispatcher; their latencies."""

    dispatcher: Dispatcher
    qps: float
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    failure_kinds: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> OnlineLoad:
        for index in range(2):
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)

    def _loop(self, index: int) -> None:
        inputs = np.random.default_rng(index).random((1, 1, 8, 8), dtype=np.float32)
        targets = QueryTargets(APP, latency_ms=100.0)
        next_at = time.monotonic() + index / (2 * self.qps)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.dispatcher.online_query(targets, inputs)
                self.latencies.append((time.perf_counter() - started) * 1000)
            except Exception as error:
                self.failures += 1
                kind = f"{type(error).__name__}: {str(error)[:80]}"
                self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1
            next_at += 2 / self.qps
            self.stop.wait(max(0.0, next_at - time.monotonic()))
            if time.monotonic() - next_at > 1.0:
                next_at = time.monotonic()  # fell behind (a stall): no burst to catch up

    def measured(self) -> OnlineStats:
        ordered = sorted(self.latencies)
        return OnlineStats(
            queries=len(ordered),
            failed=self.failures,
            p50_ms=round(statistics.median(ordered), 3) if ordered else float("nan"),
            p99_ms=round(percentile(ordered, 99), 3),
            failure_kinds=dict(self.failure_kinds),
        )


@dataclass
class OnlineStats:
    queries: int
    failed: int
    p50_ms: float
    p99_ms: float
    failure_kinds: dict[str, int] = field(default_factory=dict)
    # The worker's own online p99 over the variant's profile (queueing included), sampled once a
    # second: what the throttle compares with its latency threshold.
    worker_ratio_min: float = float("nan")
    worker_ratio_max: float = float("nan")

    def line(self, qps: float) -> str:
        text = (
            f"online {self.queries} queries at {qps:g} q/s: p50 {self.p50_ms:.1f} ms, "
            f"p99 {self.p99_ms:.1f} ms, {self.failed} failed"
        )
        return text + "".join(f"\n    {count} x {kind}" for kind, count in self.failure_kinds.items())


@dataclass
class JobStats:
    inputs: int
    inputs_per_s: float
    elapsed_s: float
    paused_s: float
    launch_s: float  # launching the runner and hearing back, beyond the job's own clock
    pauses: list[str] = field(default_factory=list)  # distinct reasons seen (the first few)

    def line(self) -> str:
        return (
            f"{self.inputs_per_s:7.1f} inputs/s ({self.inputs} in {self.elapsed_s:.1f} s, "
            f"paused {self.paused_s:.1f} s)"
        )


@dataclass
class Repeat:
    alone: JobStats
    online_alone: OnlineStats
    beside: JobStats
    online_beside: OnlineStats
    online_utilisation_beside: float


def upload_inputs(s3: Any, bucket: str, prefix: str, count: int) -> None:
    rng = np.random.default_rng(1)
    for index in range(count):
        buffer = io.BytesIO()
        np.save(buffer, rng.random((1, 8, 8), dtype=np.float32), allow_pickle=False)
        s3.put_object(Bucket=bucket, Key=f"{prefix}x-{index:05d}.npy", Body=buffer.getvalue())


class NoLaunch:
    def launch(self, job_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def run_job(
    service: OfflineService, bucket: str, output: str, in_process: bool, metadata_url: str
) -> JobStats:
    """One job over the uploaded inputs, run in this process (as the embedded stack's gateway
    thread does) or in a process of its own (as the offline function does); the distinct
    reasons it paused for are collected from its record while it runs."""
    job = service.submit(JobSpec(APP, f"s3://{bucket}/in/", f"s3://{bucket}/{output}/", 0.5))
    started = time.perf_counter()
    reasons: list[str] = []
    if in_process:
        report = service.run(job.job_id)
        reasons = list(report.pauses)
    else:
        env = {**os.environ, "MODELLESS_METADATA_URL": metadata_url}
        child = subprocess.Popen(
            [sys.executable, "-m", "modelless.offline", "run", job.job_id], env=env, stdout=subprocess.DEVNULL
        )
        while child.poll() is None:
            current = service.store.get_job(job.job_id)
            if current is not None and current.paused and current.pause_reason not in reasons:
                reasons.append(current.pause_reason)
            time.sleep(0.2)
        if child.returncode != 0:
            raise SystemExit(f"the offline runner exited with {child.returncode}")
    launched_s = time.perf_counter() - started
    finished = service.store.get_job(job.job_id)
    if finished is None or finished.status.value != "completed" or finished.started_at is None:
        raise SystemExit(f"offline job did not complete: {finished}")
    assert finished.finished_at is not None
    # The job's own clock: from its first run to its completion (a child's start-up is not in it).
    elapsed = finished.finished_at - finished.started_at
    return JobStats(
        inputs=finished.done,
        inputs_per_s=round(finished.done / elapsed, 2),
        elapsed_s=round(elapsed, 3),
        paused_s=round(max(0.0, elapsed - finished.active_s), 3),
        launch_s=round(max(0.0, launched_s - elapsed), 3),
        pauses=reasons[:5],
    )


def worker_ratio(store: RedisMetadataStore) -> float:
    workers = store.list_workers()
    return workers[0].online_latency_ratio if workers else float("nan")


def measure_repeat(
    service: OfflineService,
    store: RedisMetadataStore,
    dispatcher: Dispatcher,
    bucket: str,
    index: int,
    online_qps: float,
    in_process: bool,
    metadata_url: str,
    online_min_s: float,
) -> Repeat:
    window_s = 5.5  # the worker's report window forgets what came before
    alone = run_job(service, bucket, f"out-{index}-alone", in_process, metadata_url)
    print(f"  offline alone:      {alone.line()}", flush=True)
    time.sleep(window_s)
    ratios: list[float] = []
    with OnlineLoad(dispatcher, online_qps) as load:
        until = time.monotonic() + max(online_min_s, alone.elapsed_s)
        while time.monotonic() < until:
            time.sleep(1.0)
            ratios.append(worker_ratio(store))
    online_alone = load.measured()
    online_alone.worker_ratio_min, online_alone.worker_ratio_max = min(ratios), max(ratios)
    print(
        f"  online alone:       {online_alone.line(online_qps)}; worker online p99/profile "
        f"{min(ratios):.2f}..{max(ratios):.2f}x",
        flush=True,
    )
    time.sleep(window_s)
    with OnlineLoad(dispatcher, online_qps) as load:
        time.sleep(3.0)  # the worker's report shows the online load first
        before = len(load.latencies)
        sampling = threading.Event()
        beside_ratios: list[float] = []

        def sample() -> None:
            while not sampling.wait(0.5):
                beside_ratios.append(worker_ratio(store))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            beside = run_job(service, bucket, f"out-{index}-beside", in_process, metadata_url)
        finally:
            sampling.set()
            sampler.join(5)
        load.latencies = load.latencies[before:]  # only the queries beside the job
    online_beside = load.measured()
    if beside_ratios:
        online_beside.worker_ratio_min, online_beside.worker_ratio_max = (
            min(beside_ratios),
            max(beside_ratios),
        )
    utilisation = store.list_workers()[0].online_utilisation
    print(
        f"  beside online load: {beside.line()}; {online_beside.line(online_qps)}; worker online utilisation "
        f"{utilisation:.0%}" + "".join(f"\n    paused: {reason}" for reason in beside.pauses),
        flush=True,
    )
    time.sleep(window_s)
    return Repeat(alone, online_alone, beside, online_beside, round(utilisation, 4))


@dataclass
class Plan:
    repeats: int
    inputs: int
    online_qps: float
    hidden: int
    runner: str
    online_min_s: float


def bench(plan: Plan, redis_url: str, s3_given: str | None) -> dict[str, Any]:
    import boto3

    in_process = plan.runner == "thread"
    where = "in this process (a gateway thread)" if in_process else "in a process of their own"
    print(
        f"offline jobs: {plan.inputs} .npy inputs, a 64-{plan.hidden}-10 MLP, one worker (2 slots), jobs run "
        f"{where}, {plan.repeats} repeat(s); machine: {machine()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-offline-") as tmp, s3_endpoint(s3_given) as endpoint:
        root = Path(tmp)
        repository = LocalModelRepository(root / "repo")
        model = mlp_onnx(plan.hidden)
        onnx.checker.check_model(onnx.load_from_string(model))
        repository.put(ARTIFACT, model)
        variant = profile(model)
        prefix = f"bench-offline-{os.getpid()}:"
        url = f"{redis_url}?prefix={prefix}"
        store = RedisMetadataStore.from_url(url)
        pool = LocalWorkerPool(CPU_POOL, str(root / "repo"), url, "", root / "logs", root / "cache")
        s3 = boto3.client("s3", endpoint_url=endpoint)
        bucket = f"bench-offline-{uuid.uuid4().hex[:10]}"
        invoker = HttpWorkerInvoker()
        service: OfflineService | None = None
        try:
            publish(store, variant)
            s3.create_bucket(Bucket=bucket)
            store.set_offline_buckets(APP, [bucket])
            upload_inputs(s3, bucket, "in/", plan.inputs)
            pool.scale_to(1)
            deadline = time.monotonic() + 15
            while not store.list_workers() and time.monotonic() < deadline:
                time.sleep(0.1)
            # The deployment's settings: the throttle at its defaults.
            settings = Settings()
            policy = InfaasPolicy(DEFAULT_POOLS, settings.accuracy_tolerance)
            dispatcher = Dispatcher(store, policy, invoker, None)
            dispatcher.online_query(QueryTargets(APP), np.zeros((1, 1, 8, 8), dtype=np.float32))  # load it
            service = OfflineService.from_settings(
                settings, store, DEFAULT_POOLS, live_workers=store.list_workers
            )
            service.launcher = NoLaunch()
            config = service.throttle_config()
            rows = service.runner_config().max_rows
            print(
                f"variant p50 at batch 1/8/32: {variant.median_ms(1):.2f}/{variant.median_ms(8):.2f}/"
                f"{variant.median_ms(32):.2f} ms; offline runs of up to {rows} rows within "
                f"{service.settings.offline_run_ms:g} ms; throttle: pause above "
                f"{config.pause_utilisation:.0%} online utilisation or "
                f"{config.pause_latency_ratio:g}x the profile",
                flush=True,
            )
            repeats: list[Repeat] = []
            for index in range(plan.repeats):
                print(f"repeat {index + 1}/{plan.repeats}", flush=True)
                repeats.append(
                    measure_repeat(
                        service,
                        store,
                        dispatcher,
                        bucket,
                        index,
                        plan.online_qps,
                        in_process,
                        url,
                        plan.online_min_s,
                    )
                )
        finally:
            if service is not None:
                service.close()
            invoker.close()
            pool.close()
            store.flush_namespace()
            store.close()
            paginator = s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket):
                for item in page.get("Contents", []):
                    s3.delete_object(Bucket=bucket, Key=item["Key"])
            s3.delete_bucket(Bucket=bucket)
    return {
        "variant": {
            "id": variant.variant_id,
            "profile_p50_ms": variant.latency_p50_ms,
            "profile_p99_ms": variant.latency_p99_ms,
        },
        "throttle": asdict(config),
        "offline_run_ms": service.settings.offline_run_ms,
        "max_rows": rows,
        "repeats": [asdict(r) for r in repeats],
    }


def write_up(plan: Plan, results: dict[str, Any], command: str, seconds: float, out_dir: Path) -> None:
    repeats: list[dict[str, Any]] = results["repeats"]

    def values(*path: str) -> list[float]:
        found = []
        for repeat in repeats:
            value: Any = repeat
            for key in path:
                value = value[key]
            found.append(float(value))
        return found

    alone_rate, beside_rate = values("alone", "inputs_per_s"), values("beside", "inputs_per_s")
    online_p99, beside_p99 = values("online_alone", "p99_ms"), values("online_beside", "p99_ms")
    ratios = values("online_alone", "worker_ratio_min") + values("online_alone", "worker_ratio_max")
    beside_ratios = values("online_beside", "worker_ratio_max")
    throttle = results["throttle"]
    rows = [
        [
            "offline job alone",
            span(alone_rate, 1),
            span(values("alone", "paused_s"), 1),
            "—",
            "—",
            "—",
        ],
        [
            f"online alone ({plan.online_qps:g} q/s)",
            "—",
            "—",
            span(values("online_alone", "p50_ms"), 1),
            span(online_p99, 1),
            span(values("online_alone", "failed"), 0),
        ],
        [
            "offline job beside the online load",
            span(beside_rate, 1),
            span(values("beside", "paused_s"), 1),
            span(values("online_beside", "p50_ms"), 1),
            span(beside_p99, 1),
            span(values("online_beside", "failed"), 0),
        ],
    ]
    pauses = sorted({reason for repeat in repeats for reason in repeat["beside"]["pauses"]})
    headline = (
        f"offline jobs: {span(alone_rate, 0)} inputs/s alone, {span(beside_rate, 0)} beside "
        f"{plan.online_qps:g} q/s of online load (online p99 {span(beside_p99, 1)} ms beside it, "
        f"{span(online_p99, 1)} ms alone)"
    )
    p50 = results["variant"]["profile_p50_ms"]
    where = (
        "in the measuring process (the embedded stack's in-memory way)"
        if plan.runner == "thread"
        else "in a process of its own (the offline function's way)"
    )
    header = [
        "",
        "offline inputs/s",
        "offline paused (s)",
        "online p50 (ms)",
        "online p99 (ms)",
        "online failed",
    ]
    why = (
        "Why the job paused beside the online load: " + "; ".join(f"`{p}`" for p in pauses) + "."
        if pauses
        else "The job did not pause beside the online load."
    )
    markdown = f"""## Offline jobs: throughput alone and beside online load

Machine: `{machine()}`; {today()}. Reproduce: `{command}` (this run: {seconds / 60:.1f} min).
{plan.repeats} repeat(s); every figure is the min\u2013max over the repeats.

Set-up: a real worker process (2 slots, one instance of a 64-{plan.hidden}-10 MLP loaded;
profiled p50 at batch 1/8/32: {p50[1]:.2f}/{p50[8]:.2f}/{p50[32]:.2f} ms), Redis, moto's S3.
A job over {plan.inputs} `.npy` objects, run {where}, in runs of up to {results["max_rows"]}
rows within {results["offline_run_ms"]:g} ms; online queries through the Dispatcher at
{plan.online_qps:g} q/s from two paced threads. The throttle at the deployment's defaults: pause
above {throttle["pause_utilisation"]:.0%} online utilisation or {throttle["pause_latency_ratio"]:g}x
the profiled latency, resume below {throttle["resume_utilisation"]:.0%} and
{throttle["resume_latency_ratio"]:g}x. Throughput is the job's own clock, from its first run to
its completion, pauses included.

{markdown_table(header, rows)}

The worker's own online p99 over the profile (queueing included, sampled every second over its
5 s window), the figure the throttle compares with its {throttle["pause_latency_ratio"]:g}x threshold:
{span(ratios, 2)}x with the online load alone, at most {span(beside_ratios, 2)}x beside the job.
{why}

Online latency as a client sees it beside the job also carries what the job's runner takes from
the same two cores here (reading and writing S3 through moto's server, decoding, its Redis
calls): the worker-side figure is what offline work does to the worker, the client-side one what
it does to this machine.
"""
    write_fragment(
        out_dir,
        "offline",
        markdown,
        {
            "machine": machine(),
            "date": today(),
            "command": command,
            "seconds": round(seconds, 1),
            "plan": asdict(plan),
            **results,
            "headlines": [headline],
        },
    )
    print(headline, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.offline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=400, help="inputs per job")
    parser.add_argument(
        "--online-qps", type=float, default=40.0, help="online queries per second beside the job"
    )
    parser.add_argument(
        "--redis", default=os.environ.get("MODELLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    parser.add_argument("--s3-endpoint", help="an S3 endpoint to use (default: start moto's server here)")
    parser.add_argument(
        "--hidden", type=int, default=DEFAULT_HIDDEN, help="the MLP's hidden width (its cost)"
    )
    parser.add_argument(
        "--runner",
        choices=["process", "thread"],
        default="process",
        help="run jobs in a process of their own (the offline function) or in this one (a gateway thread)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: one repeat, 100 inputs")
    parser.add_argument("--out-dir", "--out", type=Path, default=DEFAULT_OUT_DIR, dest="out_dir")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    plan = Plan(
        repeats=1 if args.quick else args.repeats,
        inputs=100 if args.quick else args.inputs,
        online_qps=args.online_qps,
        hidden=args.hidden,
        runner=args.runner,
        online_min_s=3.0 if args.quick else 5.0,
    )
    started = time.perf_counter()
    results = bench(plan, args.redis, args.s3_endpoint)
    command = " ".join([".venv/bin/python -m bench.offline", *argv])
    write_up(plan, results, command, time.perf_counter() - started, args.out_dir)


if __name__ == "__main__":
    main()
