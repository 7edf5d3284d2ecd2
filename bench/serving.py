"""Serving overhead, measured live on 127.0.0.1.

    python -m bench.serving [--repeats 3] [--quick] [--out-dir docs/bench] [--no-ray]

What it measures, all in one run, with one client (``bench/loadgen.py``, a process of its own):

1. **Overhead** of the project's serving path (HTTP -> gateway -> selection -> worker) over a
   direct, in-process onnxruntime call of the very artifact the project serves: median and p99
   with one caller and near saturation (rising closed-loop concurrency), split by the times each
   reply reports, and the CPU time each process spends per query.
2. **The project against Ray Serve** (``bench/ray_serve_app.py``, run by a separate virtual
   environment, ``.venv-ray``, made here with pip when missing): the same ONNX file with the same
   onnxruntime options and threads, one model instance each (one worker process holding one
   instance; one replica), batching on for both (the project's AIMD batcher; ``@serve.batch``
   with the same largest batch and fill delay) and off for both. p50 latency with one caller,
   and the throughput at which p99 stays within 100 ms, from closed-loop callers and open-loop
   (Poisson) arrival rates up to the closed-loop peak.
3. **Adaptive batching gain**: the project's throughput within a 50 ms p99 with AIMD batching
   and with ``--no-batching`` workers (every query carries that 50 ms as its latency target).

The project runs as ``scripts/run`` runs it (``infra.local.stack.start_stack``, the in-memory
store, uvicorn's defaults), with one cpu worker holding one instance slot, no scaler loop, and the
local Lambda tier at its smallest (one container, started before the clock runs so that no load
pays its cold start). The variant is the cheapest one-thread cpu variant that registration kept,
loaded on the worker ahead of the queries as the scaler's plan would. Selection still decides
every query: when it finds the instance Overloaded or Interfered it sends queries elsewhere (the
Lambda container, or a second variant), and the share served elsewhere is reported per load.

Systems are measured in turns within each repeat (so that other work on a shared machine weighs
on all of them alike), and every figure is given as the min-max over the repeats.

The whole run happens inside a private network namespace (``unshare -n``, loopback only) when it
can (root, util-linux's ``unshare``): Ray opens ports on all interfaces, which in there exist on
loopback only; the project and the client run in the same namespace, so both systems are
measured in the same conditions. Without a namespace the project is still measured (it binds
127.0.0.1 only) and Ray is left out, with the reason printed.

The model is a wide MLP on scikit-learn's digits (``digits-wide-mlp``: 64 -> 3072 -> 3072 -> 10),
trained and exported with the demo zoo's own code (``infra.zoo.digits``) in a child process (the
serving process never imports torch), cached under ``--state-dir``: milliseconds per run in FP32,
most of it reading the weights, so that batching can matter. Its variants are generated and
profiled by the project's registration, as any model's.

Outputs: ``<out-dir>/serving.md`` (tables, commands, reading), ``serving.json`` (every load
measured), ``serving_latency_throughput.png`` and ``serving_batching.png``; ``--report-only
serving.json`` redraws them from a saved run. Every load is bounded in time and count; every
process started is stopped, on errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.report import finite, machine, percentile, span

if TYPE_CHECKING:
    from modelless.types import VariantProfile

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "digits-wide-mlp"
HIDDEN = 3072
APP = "serving-bench"
RAY_VENV = ROOT / ".venv-ray"
NETNS_MARK = "MODELLESS_BENCH_NETNS"
RAY_BUDGET_MS = 100.0  # the Ray comparison: throughput at p99 <= this
BATCH_BUDGET_MS = 50.0  # the batching gain: throughput at p99 <= this; also each query's budget
START_TIMEOUT_S = 240.0
REST_TIMEOUT_S = 10.0  # the longest a load waits for the instance to be reported Active again
TIMES = "\u00d7"  # the multiplication sign, for ratios in the write-up

PROJECT_BATCHED = "project, AIMD batching"
PROJECT_PLAIN = "project, no batching"
RAY_BATCHED = "Ray Serve, @serve.batch"
RAY_PLAIN = "Ray Serve, no batching"
SYSTEMS = (PROJECT_BATCHED, RAY_BATCHED, RAY_PLAIN, PROJECT_PLAIN)


# --- the measurement plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    repeats: int
    sequential_s: float  # one caller: the low-load latency
    duration_s: float  # each closed-loop level and open-loop rate
    warmup_s: float  # sent before each load's window, not counted
    concurrency: tuple[int, ...]  # closed-loop callers, above one
    rate_fractions: tuple[float, ...]  # open-loop rates, as fractions of the closed-loop peak
    direct_runs: int
    profile_runs: int  # MODELLESS_PROFILE_RUNS for the registration

    @classmethod
    def full(cls, repeats: int) -> Plan:
        return cls(repeats, 3.0, 2.5, 0.5, (4, 16, 48), (0.3, 0.6, 0.85, 1.0), 2000, 20)

    @classmethod
    def quick(cls) -> Plan:
        return cls(1, 1.5, 1.2, 0.3, (16,), (0.8,), 500, 5)


# --- small helpers ----------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, flush=True)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time the processes have used so far (those gone count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def session_pids(session: int) -> list[int]:
    """Every process of a session (Ray's processes all descend from its app's session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == session:
                pids.append(int(entry.name))
    return pids


# --- the network namespace and the Ray environment --------------------------------------------


def in_private_netns() -> bool:
    return os.environ.get(NETNS_MARK) == "1"


def reexec_in_netns(argv: list[str]) -> int | None:
    """Run this benchmark again inside ``unshare -n`` with loopback up; its exit code, or None
    when no namespace can be made here (then the caller goes on outside one)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        log("no private network namespace here (needs root, unshare and ip); measuring outside one")
        return None
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        log(f"no private network namespace here ({probe.stderr.decode().strip()}); measuring outside one")
        return None
    command = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    command += [sys.executable, "-m", "bench.serving", *argv]
    child = subprocess.Popen(command, env={**os.environ, NETNS_MARK: "1"}, cwd=ROOT)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        return child.wait()


def ensure_ray_venv() -> Path | None:
    """``.venv-ray`` with ray[serve] and this venv's onnxruntime and numpy versions, made with pip
    (from PyPI) when missing. Its interpreter, or None when it cannot be made."""
    python = RAY_VENV / "bin" / "python"
    check = [str(python), "-c", "import ray, ray.serve, onnxruntime, numpy"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return python
    import numpy
    import onnxruntime

    log(f"making {RAY_VENV.name} (ray[serve], onnxruntime {onnxruntime.__version__}); once")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(RAY_VENV)], check=True, timeout=300)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "ray[serve]", f"onnxruntime=={onnxruntime.__version__}", f"numpy=={numpy.__version__}"],
            check=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as error:
        log(f"could not make {RAY_VENV.name}: {error}; Ray Serve is left out")
        return None
    return python


def ray_version(python: Path) -> str:
    answer = subprocess.run(
        [str(python), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True, check=False
    )
    return answer.stdout.strip() or "?"


# --- the model --------------------------------------------------------------------------------


def build_model(out_dir: Path) -> None:
    """Train and export the wide MLP with the demo zoo's code (torch: a child process only)."""
    from torch import nn

    from infra.zoo import digits as zoo

    def wide() -> nn.Module:
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, zoo.NUM_CLASSES),
        )

    recipe = zoo.Recipe(MODEL_NAME, wide, epochs=4, lr=1e-3, weight_decay=1e-4, augment=False, log_every=2)
    out_dir.mkdir(parents=True, exist_ok=True)
    splits = zoo.load_splits()
    model, _ = zoo.train(recipe, splits["train"], splits["val"], zoo.SEED)
    data = zoo.export_onnx(model)
    session = zoo.ort_session(data)
    zoo.check_parity(model, session, splits["val"][0])
    (out_dir / zoo.VALSET).write_bytes(zoo._npz(splits["val"]))
    (out_dir / zoo.TESTSET).write_bytes(zoo._npz(splits["test"]))
    (out_dir / f"{MODEL_NAME}.onnx").write_bytes(data)
    accuracy = round(zoo.ort_accuracy(session, splits["val"]), 4)
    manifest = {"name": MODEL_NAME, "hidden": HIDDEN, "val_accuracy": accuracy}
    (out_dir / "model.json").write_text(json.dumps(manifest) + "\n")  # last: the cache's mark


def ensure_model(state_dir: Path) -> tuple[Path, dict[str, Any]]:
    out_dir = state_dir / "bench-serving"
    try:
        manifest: dict[str, Any] = json.loads((out_dir / "model.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    if (manifest.get("name"), manifest.get("hidden")) != (MODEL_NAME, HIDDEN) or not (
        out_dir / f"{MODEL_NAME}.onnx"
    ).exists():
        log(f"training {MODEL_NAME} (64 -> {HIDDEN} -> {HIDDEN} -> 10) with infra.zoo.digits' code...")
        (out_dir / "model.json").unlink(missing_ok=True)
        subprocess.run(
            [sys.executable, "-m", "bench.serving", "--build-model", str(out_dir)],
            check=True,
            cwd=ROOT,
            timeout=900,
        )
        manifest = json.loads((out_dir / "model.json").read_text())
    return out_dir, manifest


# --- processes: the load generator, the project's stack, Ray Serve ----------------------------


class LoadGenerator:
    """``bench.loadgen`` in a child process: one JSON job in, one JSON answer out."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(job) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("the load generator died")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"load generator: {answer['error']}")
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@dataclass(frozen=True)
class Target:
    """Where a system is reached and what to send it (the same body for every system)."""

    name: str
    url: str
    headers: dict[str, str]
    body: str
    keep: tuple[str, ...] = ()


class ProjectStack:
    """The embedded stack (``infra.local.stack.start_stack``) with its gateway on 127.0.0.1,
    uvicorn in a thread of this process, as ``scripts/bench live`` runs it."""

    def __init__(self, state_dir: Path, lambda_concurrency: int) -> None:
        from infra.local.stack import ThreadedGateway, start_stack

        self.port = 18100 + os.getpid() % 500
        self.worker_id = ""
        self.stack = start_stack(state_dir, "127.0.0.1", self.port, 0, lambda_concurrency, "memory://")
        self.gateway = ThreadedGateway(self.stack, self.port)
        self.repository = Path(self.stack.services.settings.repository_url)

    def run_worker(self, batching: bool, preload: VariantProfile | None = None) -> None:
        """(Re)start the pool's one worker, with or without adaptive batching, wait until the
        gateway has its first report (a query decided before it would find no worker and spill),
        and load ``preload`` on it, as the scaler's plan does, so that selection finds it Active."""
        import httpx

        pool, store = self.stack.pool, self.stack.services.store
        pool.scale_to(0, stopping=store.remove_worker)
        # One instance slot: one model instance per worker process, as a replica is in Ray.
        pool.worker_args = ("--slots", "1", *(() if batching else ("--no-batching",)))
        pool.scale_to(1)
        [(worker_id, child)] = pool.workers().items()
        self.worker_id = worker_id
        deadline = time.monotonic() + 30
        while worker_id not in {w.worker_id for w in store.list_workers()}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker_id} never reported")
            time.sleep(0.05)
        if preload is not None:
            body = {"variant": preload.to_json()}
            httpx.post(f"{child.address}/load", json=body, timeout=60).raise_for_status()
            self.wait_active(preload.variant_id, 30)
        self.stack.services.dispatcher.live_view.forget_snapshots()

    def warm_lambda(self, variant: VariantProfile, sample: Any) -> None:
        """Start the Lambda tier's container and load ``variant`` in it, so that no load measured
        pays its cold start (a process start and a model load: seconds here)."""
        import numpy as np

        from modelless.runtime import invocation_payload

        inputs = np.ascontiguousarray(sample[None], dtype=np.float32)
        self.stack.lambda_tier.invoke(invocation_payload(variant, inputs, "bench-warm-up"), 120)

    def instance_state(self, variant_id: str) -> str:
        for worker in self.stack.services.store.list_workers():
            if worker.worker_id == self.worker_id:
                for instance in worker.instances:
                    if instance.variant_id == variant_id:
                        return instance.state.value
        return "not loaded"

    def wait_active(self, variant_id: str, timeout_s: float) -> str:
        """Wait (at most ``timeout_s``) until the worker reports the instance Active: a load
        starts from a worker at rest, not one still Overloaded by the load before (Overloaded is
        left only once the 5 s window has cooled down). The state it ended in."""
        deadline = time.monotonic() + timeout_s
        while (state := self.instance_state(variant_id)) != "active" and time.monotonic() < deadline:
            time.sleep(0.1)
        return state

    def worker_batches(self) -> tuple[int, int]:
        """The worker's batches run and requests served so far (its batchers' counters)."""
        import httpx

        batches = requests = 0
        for child in self.stack.pool.workers().values():
            stats = httpx.get(f"{child.address}/stats", timeout=10).json()
            for counters in stats["batching"].values():
                batches += counters["batches"]
                requests += counters["requests"]
        return batches, requests

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: this process (the gateway: uvicorn, FastAPI, the dispatcher), the
        worker, the Lambda tier's containers."""
        workers = [child.process.pid for child in self.stack.pool.workers().values()]
        containers = [c.child.process.pid for c in list(self.stack.lambda_tier._containers)]
        return {
            "gateway": cpu_seconds([os.getpid()]),
            "worker": cpu_seconds(workers),
            "lambda": cpu_seconds(containers),
        }

    def close(self) -> None:
        self.gateway.close()


class RayServe:
    """``bench.ray_serve_app`` under ``.venv-ray``'s interpreter, in a session of its own: every
    process Ray starts is counted with it (CPU time) and killed with it if its shutdown fails."""

    def __init__(
        self, python: Path, model: Path, threads: int, max_batch: int, wait_ms: float, sample: Path
    ) -> None:
        self.port = 18700 + os.getpid() % 200
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rayb-", dir="/tmp"))  # short: socket paths
        self.log_path = self.temp_dir / "serve-app.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in close())
        arguments = {
            "--model": model,
            "--threads": threads,
            "--port": self.port,
            "--max-batch": max_batch,
            "--batch-wait-ms": wait_ms,
            "--sample": sample,
            "--temp-dir": self.temp_dir,
        }
        self._process = subprocess.Popen(
            [str(python), "-m", "bench.ray_serve_app", *[str(a) for pair in arguments.items() for a in pair]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "OMP_NUM_THREADS": "1",  # as the project's workers have it
                "RAY_USAGE_STATS_ENABLED": "0",
            },
            start_new_session=True,
        )
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self._readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not ready or not ready[0].startswith("READY"):
            self.close()
            raise RuntimeError(f"Ray Serve did not start in {START_TIMEOUT_S:.0f} s")

    def _readline(self) -> str:
        assert self._process.stdout is not None
        return self._process.stdout.readline().decode()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}/{route}"

    def processes(self) -> int:
        return len(session_pids(self._process.pid))

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of every Ray process (proxy, router, replicas, raylet, GCS, ...)."""
        return {"ray": cpu_seconds(session_pids(self._process.pid))}

    def close(self) -> None:
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # the app shuts Serve and Ray down
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(20)
        # Whatever Ray left in the session (raylet, workers, GCS) goes with it.
        for pid in session_pids(self._process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Level:
    """One load of one system in one repeat."""

    system: str
    repeat: int
    mode: str  # sequential | closed | open
    load: float  # callers (closed) or offered requests per second (open)
    sent: int  # counted requests (arrived in the window)
    ok: int
    errors: int  # no reply, a timeout, or not 200
    throughput: float  # answered (200) per second of the window
    p50_ms: float
    p99_ms: float  # over every counted request, a failed one counted as infinitely late
    max_ms: float
    cpu_ms: dict[str, float] = field(default_factory=dict)  # CPU time per query, by process
    # From the project's replies (timingsMs): per query, client latency minus the worker's
    # inference run ("overhead"), and minus its queue too ("path": gateway, selection, transport).
    overhead_p50_ms: float | None = None
    overhead_p99_ms: float | None = None
    path_p50_ms: float | None = None
    path_p99_ms: float | None = None
    queue_p50_ms: float | None = None
    inference_p50_ms: float | None = None
    selection_p50_ms: float | None = None
    mean_batch: float | None = None  # the worker's requests per batch run during the load
    served_elsewhere: float | None = None  # share not answered by the preloaded instance
    served_by: dict[str, int] = field(default_factory=dict)
    state_before: str = ""  # the instance's reported state when the load began (project)


def summarise(
    system: str, repeat: int, mode: str, load: float, answer: dict[str, Any], variant_id: str
) -> Level:
    results = answer["results"]
    ok = [r for r in results if r["status"] == 200]
    failed = len(results) - len(ok)
    tail = [r["latency_ms"] for r in ok] + [float("inf")] * failed
    level = Level(
        system=system,
        repeat=repeat,
        mode=mode,
        load=load,
        sent=len(results),
        ok=len(ok),
        errors=failed,
        throughput=len(ok) / answer["window_s"],
        p50_ms=percentile(tail, 50),
        p99_ms=percentile(tail, 99),
        max_ms=max(tail) if tail else float("nan"),
    )
    timed = [(r["latency_ms"], r["fields"]) for r in ok if r["fields"].get("timingsMs")]
    if timed:
        timings = [f["timingsMs"] for _, f in timed]
        level.overhead_p50_ms = percentile(
            [ms - t["inference_ms"] for (ms, _), t in zip(timed, timings, strict=True)], 50
        )
        level.overhead_p99_ms = percentile(
            [ms - t["inference_ms"] for (ms, _), t in zip(timed, timings, strict=True)], 99
        )
        path = [ms - t["inference_ms"] - t["queue_ms"] for (ms, _), t in zip(timed, timings, strict=True)]
        level.path_p50_ms = percentile(path, 50)
        level.path_p99_ms = percentile(path, 99)
        level.queue_p50_ms = percentile([t["queue_ms"] for t in timings], 50)
        level.inference_p50_ms = percentile([t["inference_ms"] for t in timings], 50)
        level.selection_p50_ms = percentile([t["selection_ms"] for t in timings], 50)
        where = Counter(
            f"{f.get('tier')} {f.get('worker') or ''} {str(f.get('variant')).split('/', 2)[-1]}".replace(
                "  ", " "
            )
            for _, f in timed
        )
        level.served_by = dict(where)
        home = sum(1 for _, f in timed if f.get("tier") == "worker" and f.get("variant") == variant_id)
        level.served_elsewhere = 1 - home / len(timed)
    return level


def job(target: Target, plan: Plan, mode: str, **load: float) -> dict[str, Any]:
    return {
        "url": target.url,
        "headers": target.headers,
        "body": target.body,
        "mode": "closed" if mode == "sequential" else mode,
        "duration_s": plan.sequential_s if mode == "sequential" else plan.duration_s,
        "warmup_s": plan.warmup_s,
        "max_requests": 40_000,
        "max_connections": 256,
        "timeout_s": 10.0,
        "keep": list(target.keep),
        **load,
    }


def measure(
    loadgen: LoadGenerator,
    target: Target,
    plan: Plan,
    repeat: int,
    cpu: Callable[[], dict[str, float]],
    project: ProjectStack | None = None,
    variant_id: str = "",
) -> list[Level]:
    """One system, one repeat: one caller, rising closed-loop concurrency, then open-loop rates
    up to the closed-loop peak (arrivals at fixed rates, whatever the replies do: what a p99 at
    a rate means)."""
    levels: list[Level] = []

    def level(mode: str, load: float, **spec: float) -> None:
        state = ""
        if project is not None:
            state = project.wait_active(variant_id, REST_TIMEOUT_S)
            before = project.worker_batches()
        spent = cpu()
        answer = loadgen.run(job(target, plan, mode, **spec))
        used = cpu()
        measured = summarise(target.name, repeat, mode, load, answer, variant_id)
        measured.state_before = state
        sent = max(1, int(answer["sent"]))  # the warm-up's requests too: they ran in the same CPU window
        measured.cpu_ms = {k: round((used[k] - spent.get(k, 0.0)) * 1000 / sent, 3) for k in used}
        if project is not None:
            after = project.worker_batches()
            batches, requests = after[0] - before[0], after[1] - before[1]
            measured.mean_batch = requests / batches if batches else 1.0  # no batcher: one each
        levels.append(measured)
        log(
            f"  {measured.system:<24} {mode:<10} {load:>7g}  {measured.throughput:7.1f} q/s  "
            f"p50 {measured.p50_ms:7.2f}  p99 {measured.p99_ms:8.2f} ms  errors {measured.errors}  "
            f"cpu/q {sum(measured.cpu_ms.values()):.2f} ms"
            + (
                f"  overhead p50 {measured.overhead_p50_ms:.2f} ms  batch {measured.mean_batch:.2f}  "
                f"elsewhere {100 * (measured.served_elsewhere or 0):.0f} %  ({state})"
                if measured.overhead_p50_ms is not None and measured.mean_batch is not None
                else ""
            )
        )

    loadgen.run({**job(target, plan, "closed", concurrency=4), "duration_s": 1.0, "keep": []})  # warm
    level("sequential", 1, concurrency=1)
    for callers in plan.concurrency:
        level("closed", callers, concurrency=callers)
    peak = max(m.throughput for m in levels)
    for index, fraction in enumerate(plan.rate_fractions):
        rate = round(peak * fraction, 1)
        level("open", rate, rate=rate, seed=repeat * 100 + index)
    return levels


@dataclass
class Direct:
    """The same artifact run directly in this process: the baseline every path is compared with."""

    p50_ms: float
    p99_ms: float
    batch_ms: dict[int, float]  # median run time per batch size


def measure_direct(artifact: Path, threads: int, sample: Any, runs: int) -> Direct:
    import numpy as np

    from modelless.runtime import make_session

    session = make_session(artifact, threads)
    name = session.get_inputs()[0].name
    one = np.ascontiguousarray(sample[None], dtype=np.float32)
    for _ in range(50):
        session.run(None, {name: one})
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, {name: one})
        timings.append((time.perf_counter() - started) * 1000)
    batch_ms = {}
    for batch in (1, 4, 8, 16, 32, 64):
        inputs = np.ascontiguousarray(np.repeat(one, batch, axis=0))
        runs_at = []
        for _ in range(max(10, runs // (4 * batch))):
            started = time.perf_counter()
            session.run(None, {name: inputs})
            runs_at.append((time.perf_counter() - started) * 1000)
        batch_ms[batch] = round(statistics.median(runs_at), 4)
    return Direct(round(percentile(timings, 50), 4), round(percentile(timings, 99), 4), batch_ms)


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Run:
    machine: str
    date: str
    command: str
    plan: Plan
    model: dict[str, Any]
    variant: dict[str, Any]
    ray: str  # "measured" or why not
    ray_version: str
    netns: bool
    direct: list[Direct] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Run:
        plan = raw["plan"]
        return cls(
            **{k: v for k, v in raw.items() if k not in ("plan", "direct", "levels", "headlines")},
            plan=Plan(
                repeats=int(plan["repeats"]),
                sequential_s=float(plan["sequential_s"]),
                duration_s=float(plan["duration_s"]),
                warmup_s=float(plan["warmup_s"]),
                concurrency=tuple(plan["concurrency"]),
                rate_fractions=tuple(plan["rate_fractions"]),
                direct_runs=int(plan["direct_runs"]),
                profile_runs=int(plan["profile_runs"]),
            ),
            direct=[
                Direct(d["p50_ms"], d["p99_ms"], {int(b): ms for b, ms in d["batch_ms"].items()})
                for d in raw["direct"]
            ],
            levels=[Level(**level) for level in raw["levels"]],
        )


def run_bench(args: argparse.Namespace, plan: Plan, command: str) -> Run:
    import numpy as np

    from modelless.batching import DEFAULT_MAX_DELAY_S, max_limit_for
    from modelless.client import Client
    from modelless.observability import logger as gateway_logger
    from modelless.types import VariantProfile

    started = time.monotonic()
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # EMF on stdout would drown the report
    os.environ["MODELLESS_PROFILE_RUNS"] = str(plan.profile_runs)
    gateway_logger.setLevel("WARNING")
    ray_python: Path | None = RAY_VENV / "bin" / "python"
    if args.no_ray:
        ray_python, ray_state = None, "left out (--no-ray)"
    elif ray_python is None or not ray_python.exists():
        ray_python, ray_state = None, f"left out: {RAY_VENV.name} could not be made"
    elif not in_private_netns():
        ray_python, ray_state = None, "left out: no private network namespace (Ray listens on all interfaces)"
    else:
        ray_state = "measured"
    model_dir, model = ensure_model(args.state_dir)
    with np.load(model_dir / "testset.npz", allow_pickle=False) as test:
        sample = test["inputs"][0]
    body = json.dumps({"appID": APP, "inputs": sample.tolist(), "latency": BATCH_BUDGET_MS})

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="modelless-serving-") as tmp:
        project = ProjectStack(Path(tmp), args.lambda_concurrency)
        stack.callback(project.close)
        admin = project.gateway.admin(ready_s=60)
        key = admin.create_app(APP)
        client = Client(admin.url, api_key=key, timeout_s=120)
        project.run_worker(batching=True)
        log(f"registering {MODEL_NAME} (variants generated and profiled, {plan.profile_runs} runs each)...")
        registered = time.monotonic()
        reply = client.register_model(
            MODEL_NAME, model_dir / f"{MODEL_NAME}.onnx", model_dir / "valset.npz", APP
        )
        final = client.wait_for_registration(reply["registrationId"], timeout_s=900)
        if final["status"] != "ready":
            raise RuntimeError(f"registration failed: {final['message']}")
        registration_s = time.monotonic() - registered
        log(
            f"  {len(final['variantIds'])} variants kept, {final['pruned']} pruned, in {registration_s:.0f} s"
        )
        # The instance to serve with: the cheapest one-thread variant of the cpu pool (what the
        # Active rule prefers once loaded, and what the scaler's plan places), loaded ahead on
        # the worker. Left to the first query, the Inactive rule would pick the lowest load +
        # inference latency, where load-time noise can outweigh a 10x slower run.
        profiles = [VariantProfile.from_json(json.dumps(v)) for v in client.variants()]
        variant = min(
            (v for v in profiles if v.pool == "cpu" and v.threads == 1),
            key=lambda v: (v.cost_per_query(1), v.variant_id),
        )
        project.run_worker(batching=True, preload=variant)
        project.warm_lambda(variant, sample)
        served = client.online_query(sample, APP, latency=BATCH_BUDGET_MS)
        artifact = project.repository / variant.artifact_key
        max_batch = max_limit_for(variant)
        log(
            f"serving with {variant.variant_id}: profiled p99 {variant.latency_ms(1):.3f} ms at batch 1, "
            f"batch limit {max_batch}; a first query was answered by {served['variant']} ({served['tier']})"
        )
        run = Run(
            machine=machine(),
            date=datetime.now(UTC).strftime("%Y-%m-%d"),
            command=command,
            plan=plan,
            model={
                **model,
                "kept": len(final["variantIds"]),
                "pruned": final["pruned"],
                "registration_s": round(registration_s, 1),
            },
            variant={
                "id": variant.variant_id,
                "precision": variant.precision,
                "opt_level": variant.opt_level,
                "threads": variant.threads,
                "max_batch": max_batch,
                "batch_delay_ms": DEFAULT_MAX_DELAY_S * 1000,
                "profile_p50_ms": variant.latency_p50_ms,
                "profile_p99_ms": variant.latency_p99_ms,
                "load_ms": variant.load_latency_ms,
                "accuracy": variant.accuracy,
            },
            ray=ray_state,
            ray_version=ray_version(ray_python) if ray_python is not None else "",
            netns=in_private_netns(),
        )
        sample_path = Path(tmp) / "sample.json"
        sample_path.write_text(body)
        loadgen = LoadGenerator()
        stack.callback(loadgen.close)
        ray = None
        if ray_python is not None:
            log(f"starting Ray Serve {run.ray_version} (inside the namespace, on 127.0.0.1)...")
            try:
                ray = RayServe(
                    ray_python, artifact, variant.threads, max_batch, DEFAULT_MAX_DELAY_S * 1000, sample_path
                )
            except RuntimeError as error:
                run.ray = f"left out: {error}"
                log(run.ray)
            else:
                stack.callback(ray.close)
                log(f"  Ray Serve is up: {ray.processes()} processes")
        headers = {"X-Api-Key": key}
        keep = ("timingsMs", "tier", "worker", "variant")
        to_project = Target(PROJECT_BATCHED, f"{admin.url}/v1/online_query", headers, body, keep)
        for repeat in range(plan.repeats):
            log(f"repeat {repeat + 1}/{plan.repeats}")
            run.direct.append(measure_direct(artifact, variant.threads, sample, plan.direct_runs))
            direct = run.direct[-1]
            log(
                f"  direct onnxruntime: p50 {direct.p50_ms:.3f} ms, p99 {direct.p99_ms:.3f} ms, "
                f"per batch size {direct.batch_ms}"
            )
            project.run_worker(batching=True, preload=variant)
            run.levels += measure(loadgen, to_project, plan, repeat, project.cpu, project, variant.variant_id)
            if ray is not None:
                for name, route in ((RAY_BATCHED, "batched"), (RAY_PLAIN, "plain")):
                    target = Target(name, ray.url(route), headers, body)
                    run.levels += measure(loadgen, target, plan, repeat, ray.cpu)
            project.run_worker(batching=False, preload=variant)
            target = dataclasses.replace(to_project, name=PROJECT_PLAIN)
            run.levels += measure(loadgen, target, plan, repeat, project.cpu, project, variant.variant_id)
        run.seconds = round(time.monotonic() - started, 1)
    return run


# --- what the levels say ----------------------------------------------------------------------


def levels_of(run: Run, system: str, repeat: int) -> list[Level]:
    return [m for m in run.levels if m.system == system and m.repeat == repeat]


def sequential(levels: list[Level]) -> Level | None:
    return next((m for m in levels if m.mode == "sequential"), None)


def saturated(levels: list[Level]) -> Level | None:
    """The closed-loop load with the highest throughput: the system near saturation."""
    closed = [m for m in levels if m.mode == "closed"]
    return max(closed, key=lambda m: m.throughput) if closed else None


def within(levels: list[Level], budget_ms: float) -> Level | None:
    """The load with the highest throughput whose p99 stayed within ``budget_ms`` (no errors)."""
    fitting = [m for m in levels if m.p99_ms <= budget_ms and m.errors == 0]
    return max(fitting, key=lambda m: m.throughput) if fitting else None


def per_repeat(run: Run, system: str, pick: Callable[[list[Level]], float | None]) -> list[float | None]:
    return [pick(levels_of(run, system, r)) for r in range(run.plan.repeats) if levels_of(run, system, r)]


def ratios(run: Run, a: str, b: str, pick: Callable[[list[Level]], float | None]) -> list[float]:
    """``a``'s figure over ``b``'s, repeat by repeat (the two were measured minutes apart)."""
    out = []
    for r in range(run.plan.repeats):
        x, y = pick(levels_of(run, a, r)), pick(levels_of(run, b, r))
        if x is not None and y is not None and y > 0:
            out.append(x / y)
    return out


def throughput_within(budget_ms: float) -> Callable[[list[Level]], float | None]:
    def pick(levels: list[Level]) -> float | None:
        if not levels:
            return None
        found = within(levels, budget_ms)
        return found.throughput if found is not None else 0.0

    return pick


def p50_one_caller(levels: list[Level]) -> float | None:
    found = sequential(levels)
    return found.p50_ms if found else None


def p99_one_caller(levels: list[Level]) -> float | None:
    found = sequential(levels)
    return found.p99_ms if found else None


def one_caller(attr: str) -> Callable[[list[Level]], float | None]:
    def pick(levels: list[Level]) -> float | None:
        found = sequential(levels)
        value = getattr(found, attr) if found is not None else None
        return float(value) if value is not None else None

    return pick


def one_caller_cpu(part: str) -> Callable[[list[Level]], float | None]:
    def pick(levels: list[Level]) -> float | None:
        found = sequential(levels)
        return found.cpu_ms.get(part) if found is not None else None

    return pick


def peak(levels: list[Level]) -> float | None:
    return max((m.throughput for m in levels), default=None)


def cpu_at_peak(levels: list[Level]) -> float | None:
    found = saturated(levels)
    return sum(found.cpu_ms.values()) if found else None


def has(run: Run, system: str) -> bool:
    return any(m.system == system for m in run.levels)


# --- the write-up -----------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(values: list[float], good: Callable[[float], bool]) -> str:
    if not values:
        return "not measured"
    met = sum(1 for v in values if good(v))
    if met == len(values):
        return "met in every repeat"
    if met == 0:
        return "missed in every repeat"
    return f"met in {met} of {len(values)} repeats"


def overhead_section(run: Run) -> str:
    sys_ = PROJECT_BATCHED
    direct_p50 = [d.p50_ms for d in run.direct]
    direct_p99 = [d.p99_ms for d in run.direct]

    def at(pick: Callable[[list[Level]], Level | None], attr: str) -> list[float | None]:
        out: list[float | None] = []
        for r in range(run.plan.repeats):
            found = pick(levels_of(run, sys_, r))
            out.append(getattr(found, attr) if found is not None else None)
        return out

    def cpu(pick: Callable[[list[Level]], Level | None], part: str) -> list[float | None]:
        out: list[float | None] = []
        for r in range(run.plan.repeats):
            found = pick(levels_of(run, sys_, r))
            out.append(found.cpu_ms.get(part) if found is not None else None)
        return out

    over_p50 = [
        (x - d.p50_ms) if x is not None else None
        for x, d in zip(at(sequential, "p50_ms"), run.direct, strict=False)
    ]
    over_p99 = [
        (x - d.p99_ms) if x is not None else None
        for x, d in zip(at(sequential, "p99_ms"), run.direct, strict=False)
    ]
    sat_load = span(at(saturated, "load"), 0)
    sat_qps = span(at(saturated, "throughput"), 0)
    rows = [
        [
            "direct onnxruntime call, in process (the baseline)",
            span(direct_p50, 3),
            span(direct_p99, 3),
            "",
            "",
        ],
        [
            "project, client round trip",
            span(at(sequential, "p50_ms")),
            span(at(sequential, "p99_ms")),
            span(at(saturated, "p50_ms")),
            span(at(saturated, "p99_ms")),
        ],
        ["**overhead over the direct call** (round trip - direct)", span(over_p50), span(over_p99), "", ""],
        [
            "per query: round trip - the worker's inference run",
            span(at(sequential, "overhead_p50_ms")),
            span(at(sequential, "overhead_p99_ms")),
            span(at(saturated, "overhead_p50_ms")),
            span(at(saturated, "overhead_p99_ms")),
        ],
        [
            "… of it outside the worker's queue (gateway, selection, transport)",
            span(at(sequential, "path_p50_ms")),
            span(at(sequential, "path_p99_ms")),
            span(at(saturated, "path_p50_ms")),
            span(at(saturated, "path_p99_ms")),
        ],
        [
            "selection (`timingsMs.selection_ms`)",
            span(at(sequential, "selection_p50_ms"), 3),
            "",
            span(at(saturated, "selection_p50_ms"), 3),
            "",
        ],
        [
            "inference run in the worker (`inference_ms`)",
            span(at(sequential, "inference_p50_ms"), 3),
            "",
            span(at(saturated, "inference_p50_ms"), 3),
            "",
        ],
        [
            "CPU per query: gateway process / worker / Lambda container",
            " / ".join(span(cpu(sequential, p)) for p in ("gateway", "worker", "lambda")),
            "",
            " / ".join(span(cpu(saturated, p)) for p in ("gateway", "worker", "lambda")),
            "",
        ],
        [
            "share not served by the preloaded instance (Lambda tier, another variant)",
            span([100 * (v or 0) for v in at(sequential, "served_elsewhere")], 0, " %"),
            "",
            span([100 * (v or 0) for v in at(saturated, "served_elsewhere")], 0, " %"),
            "",
        ],
    ]
    return "\n".join(
        [
            "### Per-query overhead of the serving path",
            "",
            f"The project with AIMD batching, one caller (sequential queries) and near saturation (the "
            f"closed-loop load with the highest throughput: {sat_load} callers, {sat_qps} queries/s). "
            "Milliseconds; min\u2013max over the repeats.",
            "",
            table(["", "one caller: median", "p99", "near saturation: median", "p99"], rows),
        ]
    )


def ray_section(run: Run) -> str:
    systems = [s for s in SYSTEMS if has(run, s)]
    rows = []
    for system in systems:
        rows.append(
            [
                system,
                span(per_repeat(run, system, p50_one_caller)),
                span(per_repeat(run, system, p99_one_caller)),
                span(per_repeat(run, system, peak), 0),
                span(per_repeat(run, system, throughput_within(RAY_BUDGET_MS)), 0),
                span(per_repeat(run, system, cpu_at_peak)),
            ]
        )
    header = [
        "system",
        "one caller: p50 ms",
        "p99 ms",
        "peak queries/s",
        f"queries/s at p99 ≤ {RAY_BUDGET_MS:.0f} ms",
        "CPU ms per query at peak",
    ]
    parts = ["### The project against Ray Serve", "", table(header, rows)]
    if has(run, RAY_BATCHED):
        ratio_rows = []
        for mine, theirs, label in (
            (PROJECT_BATCHED, RAY_BATCHED, "batching on (AIMD / @serve.batch)"),
            (PROJECT_PLAIN, RAY_PLAIN, "batching off"),
        ):
            p50 = ratios(run, mine, theirs, p50_one_caller)
            qps = ratios(run, mine, theirs, throughput_within(RAY_BUDGET_MS))
            cpu = ratios(run, mine, theirs, cpu_at_peak)
            ratio_rows.append(
                [
                    label,
                    f"{span(p50)} ({verdict(p50, lambda v: v <= 1.0)})",
                    f"{span(qps)} ({verdict(qps, lambda v: v >= 1.0)})",
                    span(cpu),
                ]
            )
        parts += [
            "",
            "Ratios, project over Ray Serve, repeat by repeat (target: p50 ratio ≤ 1, throughput ratio ≥ 1):",
            "",
            table(
                [
                    "",
                    "p50 latency, one caller",
                    f"throughput at p99 ≤ {RAY_BUDGET_MS:.0f} ms",
                    "CPU per query at peak",
                ],
                ratio_rows,
            ),
        ]
    return "\n".join(parts)


def batching_section(run: Run) -> str:
    pick = throughput_within(BATCH_BUDGET_MS)

    def batch_at(system: str) -> list[float | None]:
        out: list[float | None] = []
        for r in range(run.plan.repeats):
            found = within(levels_of(run, system, r), BATCH_BUDGET_MS)
            out.append(found.mean_batch if found is not None else None)
        return out

    rows = [
        [
            PROJECT_BATCHED,
            span(per_repeat(run, PROJECT_BATCHED, pick), 0),
            span(batch_at(PROJECT_BATCHED)),
            span(per_repeat(run, PROJECT_BATCHED, peak), 0),
        ],
        [
            PROJECT_PLAIN,
            span(per_repeat(run, PROJECT_PLAIN, pick), 0),
            "1 (no batcher)",
            span(per_repeat(run, PROJECT_PLAIN, peak), 0),
        ],
    ]
    gain = ratios(run, PROJECT_BATCHED, PROJECT_PLAIN, pick)
    lines = [
        "### Adaptive batching",
        "",
        f"Throughput within a {BATCH_BUDGET_MS:.0f} ms p99 (every query carries "
        f"{BATCH_BUDGET_MS:.0f} ms as its "
        f"latency target, so the batcher's budget is the same), the AIMD batch limit capped at "
        f"{run.variant['max_batch']} (the variant's largest useful batch) and a fill delay of at most "
        f"{run.variant['batch_delay_ms']:g} ms:",
        "",
        table(
            [
                "system",
                f"queries/s at p99 ≤ {BATCH_BUDGET_MS:.0f} ms",
                "mean batch there",
                "peak queries/s",
            ],
            rows,
        ),
        "",
        f"Gain of AIMD batching at the {BATCH_BUDGET_MS:.0f} ms budget: {TIMES}{span(gain)} "
        "(repeat by repeat).",
    ]
    if has(run, RAY_BATCHED):
        ray_gain = ratios(run, RAY_BATCHED, RAY_PLAIN, pick)
        lines[-1] += (
            f" Ray Serve's `@serve.batch` over its unbatched deployment, the same way: "
            f"{TIMES}{span(ray_gain)}."
        )
    return "\n".join(lines)


def overhead_over_direct(run: Run) -> list[float]:
    """Per repeat: the project's one-caller median minus a direct onnxruntime call's (ms)."""
    return [
        (x - d.p50_ms)
        for x, d in zip(per_repeat(run, PROJECT_BATCHED, p50_one_caller), run.direct, strict=False)
        if x is not None
    ]


def against_ray(run: Run, batched: str, plain: str) -> list[tuple[str, list[float], list[float]]]:
    """(label, one-caller p50 ratios, throughput-within-budget ratios) of the project over Ray
    Serve, with batching and without."""
    return [
        (
            label,
            ratios(run, mine, theirs, p50_one_caller),
            ratios(run, mine, theirs, throughput_within(RAY_BUDGET_MS)),
        )
        for mine, theirs, label in (
            (PROJECT_BATCHED, RAY_BATCHED, batched),
            (PROJECT_PLAIN, RAY_PLAIN, plain),
        )
    ]


def reading(run: Run) -> str:
    """The paragraph that says what the tables mean, with the figures it rests on."""
    say = []
    over = overhead_over_direct(run)
    path = per_repeat(run, PROJECT_BATCHED, one_caller("path_p50_ms"))
    gateway_cpu = per_repeat(run, PROJECT_BATCHED, one_caller_cpu("gateway"))
    say.append(
        f"With one caller, a query through the project costs {span(over)} ms more (median) than calling "
        f"onnxruntime directly, {span(path)} ms of it outside the worker's queue and inference, and the "
        f"gateway process spends {span(gateway_cpu)} ms of CPU on each: the Python HTTP stack (uvicorn "
        "with httptools, FastAPI, pydantic) and the hop to the worker, not selection, which takes well under "
        "0.2 ms."
    )
    if has(run, RAY_BATCHED):
        for label, p50, qps in against_ray(run, "with batching", "without batching"):
            say.append(
                f"Against Ray Serve {label}, the project's one-caller p50 is {TIMES}{span(p50)} Ray's "
                f"(target ≤ 1: {verdict(p50, lambda v: v <= 1.0)}) and its throughput at a "
                f"{RAY_BUDGET_MS:.0f} ms p99 {TIMES}{span(qps)} Ray's "
                f"(target ≥ 1: {verdict(qps, lambda v: v >= 1.0)})."
            )
    else:
        say.append(f"Ray Serve was {run.ray}, so the comparison targets are not assessed.")
    gain = ratios(run, PROJECT_BATCHED, PROJECT_PLAIN, throughput_within(BATCH_BUDGET_MS))
    batch = finite(m.mean_batch for m in run.levels if m.system == PROJECT_BATCHED and m.mode == "closed")
    gateway = finite(m.cpu_ms.get("gateway") for m in run.levels if m.system == PROJECT_BATCHED)
    worker = finite(m.cpu_ms.get("worker") for m in run.levels if m.system == PROJECT_BATCHED)
    say.append(
        f"AIMD batching changes the project's throughput at a {BATCH_BUDGET_MS:.0f} ms p99 by "
        f"{TIMES}{span(gain)}, with a mean batch of {span(batch)} under closed-loop load, although the "
        "model itself runs a row several times cheaper in batches (the direct runs below): the "
        f"gateway process spends {span(gateway)} ms of CPU per query against the worker's "
        f"{span(worker)} ms, so queries reach the worker about one at a time, and the dispatcher "
        "spills a query elsewhere once 8 of its own are outstanding on the instance, before a queue "
        "long enough for large batches can form."
    )
    elsewhere = finite(m.served_elsewhere for m in run.levels if m.system in (PROJECT_BATCHED, PROJECT_PLAIN))
    if elsewhere:
        say.append(
            f"Across all loads, {span([100 * v for v in elsewhere], 0)} % of the project's queries were not "
            "answered by the preloaded worker instance: selection found it Overloaded (8 of its own queries "
            "outstanding, or busy ≥ 90 %) or Interfered (its inference p99 over twice the profile, which "
            "the other work on this shared machine causes) and sent them to the Lambda container or "
            "another variant; the project therefore had a second model instance at times, which Ray did not."
        )
    say.append(
        "The machine is a shared 2-core VM: other work ran during the measurements, which the spread "
        "between repeats shows; compare figures within a repeat (the ratios), not across runs."
    )
    return " ".join(say)


def write_markdown(run: Run, out_dir: Path) -> Path:
    plan = run.plan
    batches = sorted(run.direct[0].batch_ms) if run.direct else []
    direct_rows = [
        [
            str(batch),
            span([d.batch_ms.get(batch) for d in run.direct], 3),
            span([d.batch_ms.get(batch, 0.0) / batch for d in run.direct], 4),
        ]
        for batch in batches
    ]
    text = "\n".join(
        [
            "## Serving overhead, measured live on 127.0.0.1",
            "",
            f"Machine: `{run.machine}`; {run.date}. Ray Serve: {run.ray}"
            + (f" (ray {run.ray_version})" if run.ray_version else "")
            + (
                "; the whole run in a private network namespace (`unshare -n`, loopback only)."
                if run.netns
                else "."
            ),
            f"Reproduce everything here: `{run.command}` (this run: {run.seconds / 60:.1f} min; `--quick` "
            "is a 2-minute smoke run). "
            f"{plan.repeats} repeat(s); each load ran {plan.duration_s:g} s after {plan.warmup_s:g} s "
            f"of warm-up (one caller: {plan.sequential_s:g} s); closed loop at "
            f"{', '.join(map(str, plan.concurrency))} callers, open loop (Poisson arrivals) at "
            f"{', '.join(f'{f:g}' for f in plan.rate_fractions)} {TIMES} the closed-loop "
            "peak. Every figure is the min\u2013max over the repeats.",
            "",
            f"Model: `{run.model['name']}` (64 → {run.model['hidden']} → {run.model['hidden']} → 10, "
            "validation "
            f"accuracy {run.model.get('val_accuracy', '?')}), registered through the API: "
            f"{run.model['kept']} variants kept, {run.model['pruned']} pruned, in "
            f"{run.model['registration_s']:g} s. "
            f"Served by `{run.variant['id']}` ({run.variant['precision']}, optimisation level "
            f"{run.variant['opt_level']}, {run.variant['threads']} thread; profiled p99 at batch 1: "
            f"{run.variant['profile_p99_ms'].get('1', run.variant['profile_p99_ms'].get(1, '?'))} ms), "
            "the cheapest one-thread cpu variant, loaded on the worker ahead of the queries. Ray Serve runs "
            "the same artifact with the same onnxruntime session options. One client for both: "
            "`bench/loadgen.py` (asyncio, keep-alive HTTP/1.1, its own process), sending the same request "
            "body (an `online_query` with a 50 ms latency target; Ray's deployment reads its `inputs`).",
            "",
            "Set-up, both sides one model instance: the project's embedded stack (gateway with the "
            "in-memory store, one worker process with one instance slot, the local Lambda tier limited to "
            "one container and warm, no scaler loop); Ray Serve with one replica per deployment "
            "(`max_ongoing_requests` 256: at Ray's default of 5, its router backs off for up to 0.5 s "
            "and a 32-caller load collapsed to 10\u201320 queries/s in trial runs), per-request access logs "
            "off on both.",
            "",
            overhead_section(run),
            "",
            ray_section(run),
            "",
            batching_section(run),
            "",
            "Direct onnxruntime runs of the artifact, per batch size (median ms; per row):",
            "",
            table(["batch", "run ms", "ms per row"], direct_rows),
            "",
            "![latency against throughput](serving_latency_throughput.png)",
            "![batching on and off](serving_batching.png)",
            "",
            "**Reading.** " + reading(run),
            "",
        ]
    )
    path = out_dir / "serving.md"
    path.write_text(text)
    return path


def plot(run: Run, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        PROJECT_BATCHED: "tab:blue",
        PROJECT_PLAIN: "tab:cyan",
        RAY_BATCHED: "tab:red",
        RAY_PLAIN: "tab:orange",
    }
    written = []

    def curves(axes: Any, systems: Sequence[str], budget_ms: float) -> None:
        """p50 (left) and p99 (right) against answered queries/s: open-loop rates as circles on
        solid lines, one caller and closed-loop callers as squares on dashed lines."""
        for system in systems:
            for r in range(run.plan.repeats):
                levels = levels_of(run, system, r)
                closed = sorted((m for m in levels if m.mode != "open"), key=lambda m: m.load)
                opened = sorted((m for m in levels if m.mode == "open"), key=lambda m: m.load)
                for ax, attr in zip(axes, ("p50_ms", "p99_ms"), strict=True):
                    for group, style in ((closed, "s--"), (opened, "o-")):
                        if group:
                            ax.plot(
                                [m.throughput for m in group],
                                [min(getattr(m, attr), 1e4) for m in group],
                                style,
                                color=colours[system],
                                alpha=0.75,
                                label=system if r == 0 and style == "o-" else None,
                            )
        for ax, name in zip(axes, ("p50", "p99"), strict=True):
            ax.set_yscale("log")
            ax.set_xlabel("answered queries per second")
            ax.set_ylabel(f"{name} latency, ms")
            ax.axhline(budget_ms, color="grey", linestyle=":", linewidth=1)
            ax.grid(True, which="both", alpha=0.3)
        axes[1].legend(fontsize=8)

    shape = run.variant["id"].split("/", 1)[-1]
    for name, systems, budget, title in (
        (
            "serving_latency_throughput.png",
            [s for s in SYSTEMS if has(run, s)],
            RAY_BUDGET_MS,
            f"{shape}, one instance each: circles open loop, squares closed loop",
        ),
        (
            "serving_batching.png",
            [PROJECT_BATCHED, PROJECT_PLAIN],
            BATCH_BUDGET_MS,
            f"The project with and without AIMD batching ({BATCH_BUDGET_MS:.0f} ms budget dotted)",
        ),
    ):
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        curves(axes, systems, budget)
        figure.suptitle(title, fontsize=10)
        figure.tight_layout()
        written.append(out_dir / name)
        figure.savefig(written[-1], dpi=100)
        plt.close(figure)
    return written


def serving_headlines(run: Run) -> list[str]:
    """The one-line results BENCHMARKS.md's summary quotes."""
    overhead = span(overhead_over_direct(run))
    lines = [f"Serving overhead over a direct onnxruntime call, one caller: {overhead} ms median"]
    if has(run, RAY_BATCHED):
        for label, p50, qps in against_ray(run, "batching on", "batching off"):
            lines.append(
                f"Against Ray Serve ({label}): p50 latency {TIMES}{span(p50)} Ray's, throughput at a "
                f"{RAY_BUDGET_MS:.0f} ms p99 {TIMES}{span(qps)} Ray's"
            )
    gain = ratios(run, PROJECT_BATCHED, PROJECT_PLAIN, throughput_within(BATCH_BUDGET_MS))
    lines.append(f"AIMD batching: throughput at a {BATCH_BUDGET_MS:.0f} ms p99 {TIMES}{span(gain)} batch 1's")
    return lines


def write_outputs(run: Run, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {**asdict(run), "headlines": serving_headlines(run)}
    (out_dir / "serving.json").write_text(json.dumps(data, indent=1) + "\n")
    markdown = write_markdown(run, out_dir)
    plots = plot(run, out_dir)
    log(f"wrote {markdown}, {', '.join(str(p) for p in plots)} and {out_dir / 'serving.json'}")
    log("")
    log(markdown.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (one repeat, short loads)")
    parser.add_argument("--out-dir", type=Path, default=Path("docs/bench"))
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    parser.add_argument("--no-ray", action="store_true", help="measure the project only")
    parser.add_argument("--lambda-concurrency", type=int, default=1, help="the local Lambda tier's limit")
    parser.add_argument("--report-only", type=Path, help="redraw the report from a saved serving.json")
    parser.add_argument("--build-model", type=Path, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.build_model is not None:
        build_model(args.build_model)
        return
    if args.report_only is not None:
        write_outputs(Run.from_json(json.loads(args.report_only.read_text())), args.out_dir)
        return
    if not in_private_netns():
        if not args.no_ray:
            ensure_ray_venv()  # needs PyPI: before the namespace, which has no network
        code = reexec_in_netns(argv)
        if code is not None:
            raise SystemExit(code)
    plan = Plan.quick() if args.quick else Plan.full(args.repeats)
    command = " ".join([".venv/bin/python -m bench.serving", *argv])
    run = run_bench(args, plan, command)
    write_outputs(run, args.out_dir)


if __name__ == "__main__":
    main()
