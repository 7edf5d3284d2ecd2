"""Serving the real zoo, measured live on 127.0.0.1.

    python -m bench.serving [--repeats 3] [--quick] [--out-dir docs/bench] [--no-ray]
    scripts/bench serving [the same options]

What it measures, all in one run, with one client (``bench/loadgen.py``, a process of its own),
on ResNet-50 and MobileNetV3-Small from the real zoo (``bench.real_zoo``; ``--quick``: ResNet-18
and MobileNetV3-Small), every query carrying a ``BUDGET_MS`` latency target:

1. **Overhead** of the project's serving path, seen from the client's side (encoding the query,
   sending it, the gateway, selection, the hop to the worker, decoding the reply) over a direct,
   in-process onnxruntime call of the very artifact served, with the same session options
   (``modelless.serving.runtime.make_session``): one caller, sequential queries, on the binary path
   (``application/x-npy``) and, for contrast, with today's JSON body. The client's encoding is
   timed in this process (the load generator sends bytes encoded once) and added. Targets: on
   ResNet-50 at most 10 % of its direct p50, and at most 2 ms absolute.
2. **Adaptive batching gain**: the project's throughput within a ``BUDGET_MS`` p99 with its AIMD
   batching and with ``--no-batching`` workers (batch 1), closed loop with rising concurrency
   until the p99 passes the budget; the batch sizes the batcher chose (requests per run, its
   AIMD limit, the largest batch); whether the model's per-row cost falls with the batch size
   (its profile, and direct runs here). Target: at least 2x where the per-row cost falls.
3. **The project against Ray Serve** on ResNet-50 (``bench/ray_serve_app.py``, run by a separate
   virtual environment, ``.venv-ray``, made here with pip when missing): the same ONNX file with
   the same onnxruntime options and threads, the same binary body from the same client, one model
   instance each (one worker process holding one instance; one replica), batching on for both
   (AIMD; ``@serve.batch`` with the same largest batch and fill delay) and off for both: p50 at
   one caller and throughput at p99 ≤ ``BUDGET_MS``. Target: the project's throughput at least
   1.5x Ray's.

The project runs as ``scripts/run`` runs it (``infra.local.stack.start_stack``, the in-memory
store, uvicorn's defaults), with one cpu worker holding one instance slot, no scaler loop, and
the local Lambda tier at its smallest (one container, warm). The zoo's registrations (cached by
``bench.real_zoo``) are published into the stack's store and its artifacts served from the
cache's repository. The variant served is the cheapest one-thread cpu variant registration
kept, loaded on the worker ahead of the queries as the scaler's plan would. Selection still
decides every query: when it finds the instance Overloaded or Interfered it sends queries
elsewhere (the Lambda container, or another variant), and the share served elsewhere is reported.

Systems are measured in turns within each repeat (other work on a shared machine weighs on all
of them alike), and every figure is given as the min-max over the repeats.

The whole run happens inside a private network namespace (``unshare -n``, loopback only) when it
can (root, util-linux's ``unshare``): Ray opens ports on all interfaces, which in there exist on
loopback only; the project and the client run in the same namespace. Without a namespace the
project is still measured (it binds 127.0.0.1 only) and Ray is left out, with the reason printed.

Outputs: ``<out-dir>/serving.md`` (tables, commands, reading), ``serving.json`` (every load
measured) and ``serving_batching.png``; ``--report-only serving.json`` redraws them from a saved
run. Every load is bounded in time and count; every process started is stopped, on errors too.
"""

from __future__ import annotations

import argparse
import base64
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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.real_zoo import fmt_ms, ms_digits
from bench.report import finite, machine, percentile, span

if TYPE_CHECKING:
    import numpy as np

    from bench.real_zoo import RealZoo, RegisteredModel
    from modelless.types import VariantProfile

ROOT = Path(__file__).resolve().parent.parent
RAY_VENV = ROOT / ".venv-ray"
NETNS_MARK = "MODELLESS_BENCH_NETNS"
BUDGET_MS = 200.0  # throughput at p99 <= this; also every query's latency target
START_TIMEOUT_S = 240.0
REST_TIMEOUT_S = 10.0  # the longest a load waits for the instance to be reported Active again
TIMES = "\u00d7"  # the multiplication sign, for ratios in the write-up
# The models (the real zoo's names), and the one Ray Serve is compared on.
MODELS = ("resnet50", "mobilenetv3_small_100")
QUICK_MODELS = ("resnet18", "mobilenetv3_small_100")
# Targets of the issue.
OVERHEAD_SHARE_TARGET = 0.10  # of ResNet-50's direct p50
OVERHEAD_TARGET_MS = 2.0
BATCHING_GAIN_TARGET = 2.0
RAY_RATIO_TARGET = 1.5
# The per-row cost "falls" with the batch size when the largest profiled batch costs at most
# this share of the batch-1 latency per row.
PER_ROW_FALLS = 0.8

PROJECT_BATCHED = "project, AIMD batching"
PROJECT_PLAIN = "project, batch 1 (no batching)"
PROJECT_JSON = "project, JSON body"
RAY_BATCHED = "Ray Serve, @serve.batch"
RAY_PLAIN = "Ray Serve, no batching"
SYSTEMS = (PROJECT_BATCHED, PROJECT_PLAIN, RAY_BATCHED, RAY_PLAIN)


# --- the measurement plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    repeats: int
    sequential_s: float  # one caller: the low-load latency
    duration_s: float  # each closed-loop level
    warmup_s: float  # sent before each load's window, not counted
    concurrency: tuple[int, ...]  # closed-loop callers, rising until the p99 passes the budget
    direct_s: float  # direct onnxruntime runs at batch 1, at most this long...
    direct_runs: int  # ...and at most this many

    @classmethod
    def full(cls, repeats: int) -> Plan:
        return cls(repeats, 10.0, 8.0, 1.0, (1, 2, 4, 8, 16, 32, 64), 10.0, 500)

    @classmethod
    def quick(cls) -> Plan:
        return cls(1, 3.0, 3.0, 0.5, (1, 2, 4, 8), 3.0, 100)


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
    body: bytes
    content_type: str
    keep: tuple[str, ...] = ()


class ProjectStack:
    """The embedded stack (``infra.local.stack.start_stack``) with its gateway on 127.0.0.1,
    uvicorn in a thread of this process, as ``scripts/bench live`` runs it, serving the
    registered zoo from its cache's repository."""

    def __init__(self, state_dir: Path, zoo: RealZoo, lambda_concurrency: int) -> None:
        from infra.local.stack import ThreadedGateway, start_stack

        # The stack's repository is the zoo cache's (read only here: nothing is registered).
        (state_dir / "repo").symlink_to(zoo.repository.resolve(), target_is_directory=True)
        self.port = 18100 + os.getpid() % 500
        self.worker_id = ""
        self.stack = start_stack(state_dir, "127.0.0.1", self.port, 0, lambda_concurrency, "memory://")
        self.gateway = ThreadedGateway(self.stack, self.port)
        self.repository = zoo.repository
        zoo.publish(self.stack.services.store, measured_only=True)

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
            httpx.post(f"{child.address}/load", json=body, timeout=120).raise_for_status()
            self.wait_active(preload.variant_id, 60)
        self.stack.services.dispatcher.live_view.forget_snapshots()

    def warm_lambda(self, variant: VariantProfile, sample: np.ndarray) -> None:
        """Start the Lambda tier's container and load ``variant`` in it, so that no load measured
        pays its cold start (a process start and a model load: seconds here)."""
        from modelless.serving.invocation import Invocation

        self.stack.lambda_tier.invoke(Invocation(variant, sample, "bench-warm-up"), 180)

    def instance(self, variant_id: str) -> tuple[str, int]:
        """The instance's reported state and batch limit (rows per run) on the worker."""
        for worker in self.stack.services.store.list_workers():
            if worker.worker_id == self.worker_id:
                for instance in worker.instances:
                    if instance.variant_id == variant_id:
                        return instance.state.value, instance.batch_limit
        return "not loaded", 0

    def wait_active(self, variant_id: str, timeout_s: float) -> str:
        """Wait (at most ``timeout_s``) until the worker reports the instance Active: a load
        starts from a worker at rest, not one still Overloaded by the load before (Overloaded is
        left only once the 5 s window has cooled down). The state it ended in."""
        deadline = time.monotonic() + timeout_s
        while (state := self.instance(variant_id)[0]) != "active" and time.monotonic() < deadline:
            time.sleep(0.1)
        return state

    def batcher(self, variant_id: str) -> dict[str, Any]:
        """The worker's batcher counters for ``variant_id`` (empty when it does not batch)."""
        import httpx

        for child in self.stack.pool.workers().values():
            stats = httpx.get(f"{child.address}/stats", timeout=10).json()
            found: dict[str, Any] = stats.get("batching", {}).get(variant_id, {})
            if found:
                return found
        return {}

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
        self,
        python: Path,
        model: Path,
        threads: int,
        max_batch: int,
        wait_ms: float,
        sample: Path,
        sample_type: str,
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
            "--sample-type": sample_type,
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
    """One load of one system on one model in one repeat."""

    model: str
    system: str
    repeat: int
    mode: str  # sequential | closed
    load: float  # callers
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
    path_p50_ms: float | None = None
    path_p99_ms: float | None = None
    decode_p50_ms: float | None = None
    queue_p50_ms: float | None = None
    inference_p50_ms: float | None = None
    selection_p50_ms: float | None = None
    mean_batch: float | None = None  # the worker's requests per batch run during the load
    batch_limit: int | None = None  # the AIMD limit the batcher ended the load with
    largest_batch: int | None = None  # the largest batch it had run by then
    served_elsewhere: float | None = None  # share not answered by the preloaded instance
    served_by: dict[str, int] = field(default_factory=dict)
    state_before: str = ""  # the instance's reported state when the load began (project)


def _timing(timings: dict[str, Any], *names: str) -> float:
    for name in names:
        if name in timings:
            return float(timings[name])
    return 0.0


def summarise(
    model: str, system: str, repeat: int, mode: str, load: float, answer: dict[str, Any], variant_id: str
) -> Level:
    results = answer["results"]
    ok = [r for r in results if r["status"] == 200]
    failed = len(results) - len(ok)
    tail = [r["latency_ms"] for r in ok] + [float("inf")] * failed
    level = Level(
        model=model,
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
        inference = [_timing(t, "inference_ms") for t in timings]
        queue = [_timing(t, "queue_ms") for t in timings]
        level.overhead_p50_ms = percentile([ms - i for (ms, _), i in zip(timed, inference, strict=True)], 50)
        path = [ms - i - q for (ms, _), i, q in zip(timed, inference, queue, strict=True)]
        level.path_p50_ms = percentile(path, 50)
        level.path_p99_ms = percentile(path, 99)
        level.decode_p50_ms = percentile([_timing(t, "decode_ms", "decode") for t in timings], 50)
        level.queue_p50_ms = percentile(queue, 50)
        level.inference_p50_ms = percentile(inference, 50)
        level.selection_p50_ms = percentile([_timing(t, "selection_ms") for t in timings], 50)
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
        "body_b64": base64.b64encode(target.body).decode(),
        "content_type": target.content_type,
        "mode": "closed",
        "duration_s": plan.sequential_s if mode == "sequential" else plan.duration_s,
        "warmup_s": plan.warmup_s,
        "max_requests": 40_000,
        "max_connections": 256,
        "timeout_s": 10.0,
        "keep": list(target.keep),
        **load,
    }


@dataclass
class Measurer:
    """Runs loads of one system on one model and records them."""

    loadgen: LoadGenerator
    plan: Plan
    repeat: int
    model: str
    cpu: Callable[[], dict[str, float]]
    project: ProjectStack | None = None
    variant_id: str = ""
    levels: list[Level] = field(default_factory=list)

    def level(self, target: Target, mode: str, callers: int) -> Level:
        state = ""
        before: dict[str, Any] = {}
        if self.project is not None:
            state = self.project.wait_active(self.variant_id, REST_TIMEOUT_S)
            before = self.project.batcher(self.variant_id)
        spent = self.cpu()
        answer = self.loadgen.run(job(target, self.plan, mode, concurrency=callers))
        used = self.cpu()
        measured = summarise(self.model, target.name, self.repeat, mode, callers, answer, self.variant_id)
        measured.state_before = state
        sent = max(1, int(answer["sent"]))  # the warm-up's requests too: they ran in the same CPU window
        measured.cpu_ms = {k: round((used[k] - spent.get(k, 0.0)) * 1000 / sent, 3) for k in used}
        if self.project is not None:
            after = self.project.batcher(self.variant_id)
            batches = after.get("batches", 0) - before.get("batches", 0)
            requests = after.get("requests", 0) - before.get("requests", 0)
            measured.mean_batch = requests / batches if batches else 1.0  # no batcher: one each
            measured.batch_limit = after.get("limit") if after else 1
            measured.largest_batch = after.get("largest_batch") if after else 1
        self.levels.append(measured)
        log(
            f"  {self.model:<22} {measured.system:<31} {mode:<10} {callers:>3}  "
            f"{measured.throughput:7.1f} q/s  p50 {measured.p50_ms:8.2f}  p99 {measured.p99_ms:8.2f} ms  "
            f"errors {measured.errors}"
            + (
                f"  path p50 {measured.path_p50_ms:.2f} ms  batch {measured.mean_batch:.2f} "
                f"(limit {measured.batch_limit})  elsewhere {100 * (measured.served_elsewhere or 0):.0f} % "
                f"({state})"
                if measured.path_p50_ms is not None and measured.mean_batch is not None
                else ""
            )
        )
        return measured

    def warm(self, target: Target) -> None:
        self.loadgen.run({**job(target, self.plan, "closed", concurrency=2), "duration_s": 1.0, "keep": []})

    def ladder(self, target: Target) -> None:
        """One caller, then rising closed-loop concurrency until the p99 passes the budget (that
        level is recorded too: it shows where the budget breaks)."""
        self.warm(target)
        for callers in self.plan.concurrency:
            measured = self.level(target, "sequential" if callers == 1 else "closed", callers)
            if measured.p99_ms > BUDGET_MS:
                break


@dataclass
class Direct:
    """The same artifact run directly in this process: the baseline every path is compared with."""

    model: str
    p50_ms: float
    p99_ms: float
    runs: int
    batch_ms: dict[int, float]  # median run time per batch size
    encode_npy_ms: float  # the client's encoding of one query: .npy...
    encode_json_ms: float  # ... and the JSON body


def measure_direct(
    model: str, artifact: Path, threads: int, sample: np.ndarray, plan: Plan, largest_batch: int
) -> Direct:
    """Batch-1 runs of ``artifact`` for at most ``plan.direct_s`` (after a warm-up that ends
    when two consecutive runs agree within 5 %), then per batch size up to ``largest_batch``
    (at least 3 runs each, at most ~3 s), with the session options of serving."""
    import numpy as np

    from bench.real_zoo import encode_body, json_body
    from modelless.inputs.tensors import to_feeds
    from modelless.serving.runtime import make_session
    from modelless.types import QueryTargets

    session = make_session(artifact, threads)
    names = [i.name for i in session.get_inputs()]
    one = to_feeds(sample, names)

    def run(feeds: dict[str, np.ndarray]) -> float:
        started = time.perf_counter()
        session.run(None, feeds)
        return (time.perf_counter() - started) * 1000

    previous = run(one)
    for _ in range(50):
        current = run(one)
        if abs(current - previous) <= 0.05 * previous:
            break
        previous = current
    timings: list[float] = []
    began = time.monotonic()
    while len(timings) < plan.direct_runs and (time.monotonic() - began < plan.direct_s or len(timings) < 10):
        timings.append(run(one))
    batch_ms: dict[int, float] = {}
    batch = 1
    while batch <= largest_batch:
        feeds = to_feeds(np.repeat(sample, batch, axis=0), names)
        runs_at: list[float] = []
        began = time.monotonic()
        while len(runs_at) < 3 or (time.monotonic() - began < 3.0 and len(runs_at) < 50):
            runs_at.append(run(feeds))
        batch_ms[batch] = round(statistics.median(runs_at), 4)
        if batch_ms[batch] > 2000:
            break
        batch *= 2
    targets = QueryTargets("serving-bench", latency_ms=BUDGET_MS)
    encode_npy = _median_ms(lambda: encode_body(sample), 50)
    encode_json = _median_ms(lambda: json_body(sample, targets), 10)
    return Direct(
        model,
        round(percentile(timings, 50), 4),
        round(percentile(timings, 99), 4),
        len(timings),
        batch_ms,
        round(encode_npy, 4),
        round(encode_json, 4),
    )


def _median_ms(action: Callable[[], object], runs: int) -> float:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Served:
    """One model as served in the run: the variant, what it was registered with, its profile."""

    name: str
    variant: dict[str, Any]
    registration: dict[str, Any]


@dataclass
class Run:
    machine: str
    date: str
    command: str
    plan: Plan
    models: list[Served]
    ray_model: str
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
            **{k: v for k, v in raw.items() if k not in ("plan", "models", "direct", "levels", "headlines")},
            plan=Plan(
                repeats=int(plan["repeats"]),
                sequential_s=float(plan["sequential_s"]),
                duration_s=float(plan["duration_s"]),
                warmup_s=float(plan["warmup_s"]),
                concurrency=tuple(plan["concurrency"]),
                direct_s=float(plan["direct_s"]),
                direct_runs=int(plan["direct_runs"]),
            ),
            models=[Served(**m) for m in raw["models"]],
            direct=[
                Direct(**{**d, "batch_ms": {int(b): ms for b, ms in d["batch_ms"].items()}})
                for d in raw["direct"]
            ],
            levels=[Level(**level) for level in raw["levels"]],
        )

    def served(self, model: str) -> Served:
        return next(m for m in self.models if m.name == model)


def serving_variant(model: RegisteredModel) -> VariantProfile:
    """The instance to serve with: the cheapest one-thread variant of the cpu pool (what the
    Active rule prefers once loaded, and what the scaler's plan places), loaded ahead on the
    worker. Left to the first query, the Inactive rule would pick the lowest load + inference
    latency, where load-time noise can outweigh a slower run."""
    return min(
        (v for v in model.measured() if v.pool == "cpu" and v.threads == 1),
        key=lambda v: (v.cost_per_query(1), v.variant_id),
    )


def run_bench(args: argparse.Namespace, plan: Plan, command: str) -> Run:
    from bench.real_zoo import encode_body, held_out_batch, json_body, query_path, real_zoo
    from modelless.observability.metrics import logger as gateway_logger
    from modelless.serving.batching import DEFAULT_MAX_DELAY_S, max_limit_for
    from modelless.types import QueryTargets

    started = time.monotonic()
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # EMF on stdout would drown the report
    gateway_logger.setLevel("WARNING")
    names = list(args.models or (QUICK_MODELS if args.quick else MODELS))
    ray_model = names[0]
    ray_python: Path | None = RAY_VENV / "bin" / "python"
    if args.no_ray:
        ray_python, ray_state = None, "left out (--no-ray)"
    elif ray_python is None or not ray_python.exists():
        ray_python, ray_state = None, f"left out: {RAY_VENV.name} could not be made"
    elif not in_private_netns():
        ray_python, ray_state = None, "left out: no private network namespace (Ray listens on all interfaces)"
    else:
        ray_state = "measured"
    zoo = real_zoo(names, state_dir=args.state_dir)

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="modelless-serving-") as tmp:
        project = ProjectStack(Path(tmp), zoo, args.lambda_concurrency)
        stack.callback(project.close)
        admin = project.gateway.admin(ready_s=60)
        keys = {app: admin.create_app(app) for app in zoo.apps}
        models = {m.name: m for m in zoo.models}
        variants = {name: serving_variant(models[name]) for name in names}
        samples = {name: held_out_batch(models[name], 1) for name in names}
        run = Run(
            machine=machine(),
            date=datetime.now(UTC).strftime("%Y-%m-%d"),
            command=command,
            plan=plan,
            models=[
                Served(
                    name,
                    {
                        "id": v.variant_id,
                        "precision": v.precision,
                        "opt_level": v.opt_level,
                        "threads": v.threads,
                        "max_batch": max_limit_for(v),
                        "batch_delay_ms": DEFAULT_MAX_DELAY_S * 1000,
                        "profile_p50_ms": {str(b): ms for b, ms in v.latency_p50_ms.items()},
                        "profile_p99_ms": {str(b): ms for b, ms in v.latency_p99_ms.items()},
                        "p50_ci_pct": v.p50_ci_pct,
                        "load_ms": v.load_latency_ms,
                        "accuracy": v.accuracy,
                    },
                    {
                        "kept": len(models[name].kept),
                        "pruned": models[name].registration.pruned,
                        "registered": models[name].measured_at,
                    },
                )
                for name, v in variants.items()
            ],
            ray_model=ray_model,
            ray=ray_state,
            ray_version=ray_version(ray_python) if ray_python is not None else "",
            netns=in_private_netns(),
        )
        loadgen = LoadGenerator()
        stack.callback(loadgen.close)
        targets = {name: QueryTargets(models[name].app, latency_ms=BUDGET_MS) for name in names}
        bodies = {name: encode_body(samples[name]) for name in names}
        ray = None
        if ray_python is not None:
            log(
                f"starting Ray Serve {run.ray_version} on {ray_model} (inside the namespace, on 127.0.0.1)..."
            )
            sample_path = Path(tmp) / "sample.bin"
            sample_path.write_bytes(bodies[ray_model][1])
            variant = variants[ray_model]
            try:
                ray = RayServe(
                    ray_python,
                    project.repository / variant.artifact_key,
                    variant.threads,
                    max_limit_for(variant),
                    DEFAULT_MAX_DELAY_S * 1000,
                    sample_path,
                    bodies[ray_model][0],
                )
            except RuntimeError as error:
                run.ray = f"left out: {error}"
                log(run.ray)
            else:
                stack.callback(ray.close)
                log(f"  Ray Serve is up: {ray.processes()} processes")
        keep = ("timingsMs", "tier", "worker", "variant")
        for repeat in range(plan.repeats):
            log(f"repeat {repeat + 1}/{plan.repeats}")
            for name in names:
                variant = variants[name]
                artifact = project.repository / variant.artifact_key
                direct = measure_direct(
                    name, artifact, variant.threads, samples[name], plan, max_limit_for(variant)
                )
                run.direct.append(direct)
                log(
                    f"  {name}: direct onnxruntime p50 {direct.p50_ms:.3f} ms, p99 {direct.p99_ms:.3f} ms "
                    f"({direct.runs} runs); per batch size {direct.batch_ms}; client encode: npy "
                    f"{direct.encode_npy_ms:.3f} ms, JSON {direct.encode_json_ms:.3f} ms"
                )
                headers = {"X-Api-Key": keys[models[name].app]}
                content_type, body = bodies[name]
                binary = Target(
                    PROJECT_BATCHED,
                    f"{project.gateway.stack.url}{query_path(targets[name], binary=True)}",
                    headers,
                    body,
                    content_type,
                    keep,
                )
                as_json = Target(
                    PROJECT_JSON,
                    f"{project.gateway.stack.url}{query_path(targets[name], binary=False)}",
                    headers,
                    json_body(samples[name], targets[name]),
                    "application/json",
                    keep,
                )
                project.run_worker(batching=True, preload=variant)
                if repeat == 0:
                    project.warm_lambda(variant, samples[name])
                on_project = Measurer(
                    loadgen, plan, repeat, name, project.cpu, project, variant.variant_id, run.levels
                )
                on_project.warm(as_json)
                on_project.level(as_json, "sequential", 1)
                on_project.ladder(binary)
                if ray is not None and name == ray_model:
                    on_ray = Measurer(loadgen, plan, repeat, name, ray.cpu, levels=run.levels)
                    for system, route in ((RAY_BATCHED, "batched"), (RAY_PLAIN, "plain")):
                        on_ray.ladder(Target(system, ray.url(route), headers, body, content_type))
                project.run_worker(batching=False, preload=variant)
                on_project.ladder(dataclasses.replace(binary, name=PROJECT_PLAIN))
        run.seconds = round(time.monotonic() - started, 1)
    return run


# --- what the levels say ----------------------------------------------------------------------


def levels_of(run: Run, model: str, system: str, repeat: int) -> list[Level]:
    return [m for m in run.levels if m.model == model and m.system == system and m.repeat == repeat]


def sequential(levels: list[Level]) -> Level | None:
    return next((m for m in levels if m.mode == "sequential"), None)


def within(levels: list[Level], budget_ms: float = BUDGET_MS) -> Level | None:
    """The load with the highest throughput whose p99 stayed within ``budget_ms`` (no errors)."""
    fitting = [m for m in levels if m.p99_ms <= budget_ms and m.errors == 0]
    return max(fitting, key=lambda m: m.throughput) if fitting else None


def per_repeat(
    run: Run, model: str, system: str, pick: Callable[[list[Level]], float | None]
) -> list[float | None]:
    return [
        pick(levels_of(run, model, system, r))
        for r in range(run.plan.repeats)
        if levels_of(run, model, system, r)
    ]


def ratios(run: Run, model: str, a: str, b: str, pick: Callable[[list[Level]], float | None]) -> list[float]:
    """``a``'s figure over ``b``'s, repeat by repeat (the two were measured minutes apart)."""
    out = []
    for r in range(run.plan.repeats):
        x, y = pick(levels_of(run, model, a, r)), pick(levels_of(run, model, b, r))
        if x is not None and y is not None and y > 0:
            out.append(x / y)
    return out


def throughput_within(levels: list[Level]) -> float | None:
    if not levels:
        return None
    found = within(levels)
    return found.throughput if found is not None else 0.0


def one_caller(attr: str) -> Callable[[list[Level]], float | None]:
    def pick(levels: list[Level]) -> float | None:
        found = sequential(levels)
        value = getattr(found, attr) if found is not None else None
        return float(value) if value is not None else None

    return pick


def at_budget(attr: str) -> Callable[[list[Level]], float | None]:
    def pick(levels: list[Level]) -> float | None:
        found = within(levels)
        value = getattr(found, attr) if found is not None else None
        return float(value) if value is not None else None

    return pick


def peak(levels: list[Level]) -> float | None:
    return max((m.throughput for m in levels), default=None)


def has(run: Run, model: str, system: str) -> bool:
    return any(m.model == model and m.system == system for m in run.levels)


def directs(run: Run, model: str) -> list[Direct]:
    return [d for d in run.direct if d.model == model]


def overheads(run: Run, model: str, system: str) -> list[float]:
    """Per repeat: the client's view of one query (encoding it, then the round trip's median)
    minus a direct onnxruntime call's median (ms), ``system`` the binary or the JSON path."""
    round_trips = per_repeat(run, model, system, one_caller("p50_ms"))
    out = []
    for rt, direct in zip(round_trips, directs(run, model), strict=False):
        if rt is None:
            continue
        encode = direct.encode_json_ms if system == PROJECT_JSON else direct.encode_npy_ms
        out.append(rt + encode - direct.p50_ms)
    return out


def per_row_falls(run: Run, model: str) -> tuple[bool, str]:
    """Whether the served variant's per-row cost falls with the batch size, from its profile,
    and the figures that say so."""
    profile = {int(b): float(ms) for b, ms in run.served(model).variant["profile_p50_ms"].items()}
    largest = max(profile)
    share = (profile[largest] / largest) / profile[1] if profile.get(1) else 1.0
    falls = largest > 1 and share <= PER_ROW_FALLS
    return falls, (
        f"profiled p50 per row at batch {largest}: {fmt_ms(profile[largest] / largest)} ms against "
        f"{fmt_ms(profile[1])} ms at batch 1 ({100 * share:.0f} %)"
    )


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


def path_rows(run: Run, system: str, encode: str) -> list[tuple[str, Callable[[str], tuple[str, str]]]]:
    """The overhead table's rows for one path (binary or JSON): per model, median and p99 cells."""

    def encoding(m: str) -> tuple[str, str]:
        return span([getattr(d, encode) for d in directs(run, m)], 3), ""

    def round_trip(m: str) -> tuple[str, str]:
        return (
            span(per_repeat(run, m, system, one_caller("p50_ms"))),
            span(per_repeat(run, m, system, one_caller("p99_ms"))),
        )

    def overhead(m: str) -> tuple[str, str]:
        return f"**{span(overheads(run, m, system))}**", ""

    def decode(m: str) -> tuple[str, str]:
        return span(per_repeat(run, m, system, one_caller("decode_p50_ms")), 3), ""

    return [
        ("client encoding", encoding),
        ("round trip (send, gateway, selection, worker, reply)", round_trip),
        ("**overhead over the direct call** (encoding + round trip - direct)", overhead),
        ("… of it: the gateway reading and decoding the body (`decode_ms`)", decode),
    ]


def overhead_section(run: Run) -> str:
    header = [""]
    for served in run.models:
        header += [f"`{served.name}` median", "p99"]
    rows: list[list[str]] = []

    def row(label: str, cells: Callable[[str], tuple[str, str]]) -> None:
        out = [label]
        for served in run.models:
            out += list(cells(served.name))
        rows.append(out)

    row(
        "direct onnxruntime call, in process (the baseline)",
        lambda m: (
            span([d.p50_ms for d in directs(run, m)], 3),
            span([d.p99_ms for d in directs(run, m)], 3),
        ),
    )
    for system, encode, label in (
        (PROJECT_BATCHED, "encode_npy_ms", "binary (`application/x-npy`)"),
        (PROJECT_JSON, "encode_json_ms", "JSON body"),
    ):
        for stage, cells in path_rows(run, system, encode):
            row(f"{label}: {stage}", cells)
    row(
        "binary: selection (`selection_ms`)",
        lambda m: (span(per_repeat(run, m, PROJECT_BATCHED, one_caller("selection_p50_ms")), 3), ""),
    )
    row(
        "binary: inference run in the worker (`inference_ms`)",
        lambda m: (span(per_repeat(run, m, PROJECT_BATCHED, one_caller("inference_p50_ms")), 2), ""),
    )
    row(
        "binary: outside the worker's queue and inference (gateway, selection, transport)",
        lambda m: (
            span(per_repeat(run, m, PROJECT_BATCHED, one_caller("path_p50_ms"))),
            span(per_repeat(run, m, PROJECT_BATCHED, one_caller("path_p99_ms"))),
        ),
    )

    def cpu_cells(m: str) -> tuple[str, str]:
        def part(name: str) -> Callable[[list[Level]], float | None]:
            def pick(levels: list[Level]) -> float | None:
                found = sequential(levels)
                return found.cpu_ms.get(name) if found is not None else None

            return pick

        return (
            " / ".join(span(per_repeat(run, m, PROJECT_BATCHED, part(p))) for p in ("gateway", "worker")),
            "",
        )

    row("binary: CPU ms per query, gateway process / worker", cpu_cells)
    checks = []
    for served in run.models:
        over = overheads(run, served.name, PROJECT_BATCHED)
        checks.append(
            f"`{served.name}` ≤ {OVERHEAD_TARGET_MS:g} ms: {verdict(over, lambda v: v <= OVERHEAD_TARGET_MS)}"
        )
    share_model = "resnet50" if any(m.name == "resnet50" for m in run.models) else run.models[0].name
    shares = [
        o / d.p50_ms
        for o, d in zip(overheads(run, share_model, PROJECT_BATCHED), directs(run, share_model), strict=False)
    ]
    checks.insert(
        0,
        f"`{share_model}` ≤ {100 * OVERHEAD_SHARE_TARGET:.0f} % of its direct p50: "
        f"{span([100 * s for s in shares], 1)} % "
        f"({verdict(shares, lambda v: v <= OVERHEAD_SHARE_TARGET)})",
    )
    return "\n".join(
        [
            "### Overhead of the serving path, seen from the client",
            "",
            f"One caller, sequential queries, each with a {BUDGET_MS:g} ms latency target, on the served "
            "variant loaded and idle. Milliseconds; min\u2013max over the repeats.",
            "",
            table(header, rows),
            "",
            "Targets (binary path): " + "; ".join(checks) + ".",
        ]
    )


def batching_section(run: Run) -> str:
    rows = []
    notes = []
    for served in run.models:
        m = served.name
        falls, why = per_row_falls(run, m)
        for system in (PROJECT_BATCHED, PROJECT_PLAIN):
            rows.append(
                [
                    f"`{m}`",
                    system,
                    span(per_repeat(run, m, system, throughput_within), 1),
                    span(per_repeat(run, m, system, at_budget("load")), 0),
                    span(per_repeat(run, m, system, at_budget("mean_batch"))),
                    span(per_repeat(run, m, system, at_budget("batch_limit")), 0)
                    + " / "
                    + span(per_repeat(run, m, system, at_budget("largest_batch")), 0)
                    if system == PROJECT_BATCHED
                    else "1 / 1",
                    span(per_repeat(run, m, system, peak), 1),
                ]
            )
        gain = ratios(run, m, PROJECT_BATCHED, PROJECT_PLAIN, throughput_within)
        target = (
            f"target ≥ {BATCHING_GAIN_TARGET:g}{TIMES}: {verdict(gain, lambda v: v >= BATCHING_GAIN_TARGET)}"
            if falls
            else "no target: batching cannot pay where a row costs as much in a batch"
        )
        direct_share = [
            (d.batch_ms[max(d.batch_ms)] / max(d.batch_ms)) / d.batch_ms[1]
            for d in directs(run, m)
            if d.batch_ms
        ]
        notes.append(
            f"- `{m}` (`{served.variant['id'].split('/', 1)[-1]}`): AIMD over batch 1 at a {BUDGET_MS:g} ms "
            f"p99: {TIMES}{span(gain)} ({target}). Per-row cost {'falls' if falls else 'does not fall'} with "
            f"the batch size: {why}; direct runs here: {span([100 * s for s in direct_share], 0)} % of "
            "batch 1's per row at the largest batch."
        )
    return "\n".join(
        [
            "### Adaptive batching against batch 1",
            "",
            f"Closed loop, callers rising ({', '.join(map(str, run.plan.concurrency))}) until the p99 passes "
            f"{BUDGET_MS:g} ms; every query carries {BUDGET_MS:g} ms as its latency target, so the "
            "batcher's budget is the same. Throughput within the budget is the best level whose p99 "
            "stayed within it (no errors); the batch sizes are the worker's at that level: requests per "
            "batch run, its AIMD limit and the largest batch it had run.",
            "",
            table(
                [
                    "model",
                    "system",
                    f"queries/s at p99 ≤ {BUDGET_MS:g} ms",
                    "callers there",
                    "mean batch there",
                    "AIMD limit / largest batch",
                    "peak queries/s",
                ],
                rows,
            ),
            "",
            *notes,
        ]
    )


def ray_section(run: Run) -> str:
    m = run.ray_model
    rows = []
    for system in SYSTEMS:
        if not has(run, m, system):
            continue
        rows.append(
            [
                system,
                span(per_repeat(run, m, system, one_caller("p50_ms"))),
                span(per_repeat(run, m, system, one_caller("p99_ms"))),
                span(per_repeat(run, m, system, throughput_within), 1),
                span(per_repeat(run, m, system, peak), 1),
            ]
        )
    parts = [
        f"### The project against Ray Serve (`{m}`)",
        "",
        f"Ray Serve {run.ray}" + (f" (ray {run.ray_version})" if run.ray_version else "") + ".",
        "",
        table(
            [
                "system",
                "one caller: p50 ms",
                "p99 ms",
                f"queries/s at p99 ≤ {BUDGET_MS:g} ms",
                "peak queries/s",
            ],
            rows,
        ),
    ]
    if has(run, m, RAY_BATCHED):
        ratio_rows = []
        for mine, theirs, label in (
            (PROJECT_BATCHED, RAY_BATCHED, "batching on (AIMD / @serve.batch)"),
            (PROJECT_PLAIN, RAY_PLAIN, "batching off"),
        ):
            p50 = ratios(run, m, mine, theirs, one_caller("p50_ms"))
            qps = ratios(run, m, mine, theirs, throughput_within)
            ratio_rows.append(
                [
                    label,
                    span(p50),
                    f"{span(qps)} ({verdict(qps, lambda v: v >= RAY_RATIO_TARGET)})",
                ]
            )
        parts += [
            "",
            "Ratios, project over Ray Serve, repeat by repeat (target: throughput ratio ≥ "
            f"{RAY_RATIO_TARGET:g}):",
            "",
            table(["", "p50 latency, one caller", f"throughput at p99 ≤ {BUDGET_MS:g} ms"], ratio_rows),
        ]
    return "\n".join(parts)


def reading(run: Run) -> str:
    say = []
    for served in run.models:
        m = served.name
        over = overheads(run, m, PROJECT_BATCHED)
        json_over = overheads(run, m, PROJECT_JSON)
        path = per_repeat(run, m, PROJECT_BATCHED, one_caller("path_p50_ms"))
        say.append(
            f"On `{m}` a query on the binary path costs {span(over)} ms more (median) than calling "
            f"onnxruntime directly, {span(path)} ms of it outside the worker's queue and inference; with "
            f"a JSON body {span(json_over)} ms (the input written, sent and parsed as decimal text)."
        )
    elsewhere = finite(m.served_elsewhere for m in run.levels if m.system in (PROJECT_BATCHED, PROJECT_PLAIN))
    if elsewhere and max(elsewhere) == 0:
        say.append("Every query of every load was answered by the preloaded worker instance.")
    elif elsewhere:
        say.append(
            f"Across all loads, {span([100 * v for v in elsewhere], 0)} % of the project's queries were not "
            "answered by the preloaded worker instance: selection found it Overloaded or Interfered and sent "
            "them to the Lambda container or another variant, so the project had a second model instance at "
            "times, which Ray did not."
        )
    say.append(
        "The machine is shared: other work ran during the measurements, which the spread between repeats "
        "shows; compare figures within a repeat (the ratios), not across runs."
    )
    return " ".join(say)


def write_markdown(run: Run, out_dir: Path) -> Path:
    plan = run.plan
    served_rows = [
        [
            f"`{s.name}`",
            f"`{s.variant['id'].split('/', 1)[-1]}`",
            fmt_ms(float(s.variant["profile_p50_ms"].get("1", 0.0))),
            f"{s.variant['max_batch']}",
            f"{s.registration['kept']} / {s.registration['pruned']}",
            str(s.registration["registered"]),
        ]
        for s in run.models
    ]
    direct_rows = []
    for served in run.models:
        found = directs(run, served.name)
        for batch in sorted(found[0].batch_ms) if found else []:
            runs = [d.batch_ms[batch] for d in found if batch in d.batch_ms]
            rows = [ms / batch for ms in runs]
            direct_rows.append(
                [f"`{served.name}`", str(batch), span(runs, ms_digits(runs)), span(rows, ms_digits(rows))]
            )
    text = "\n".join(
        [
            "## Serving the real zoo, measured live on 127.0.0.1",
            "",
            f"Machine: `{run.machine}`; {run.date}. Ray Serve: {run.ray}"
            + (f" (ray {run.ray_version})" if run.ray_version else "")
            + (
                "; the whole run in a private network namespace (`unshare -n`, loopback only)."
                if run.netns
                else "."
            ),
            f"Reproduce everything here: `{run.command}` (this run: {run.seconds / 60:.1f} min; `--quick` "
            "is a smoke run on smaller models). "
            f"{plan.repeats} repeat(s); each load ran {plan.duration_s:g} s after {plan.warmup_s:g} s of "
            f"warm-up (one caller: {plan.sequential_s:g} s); direct runs for {plan.direct_s:g} s. Every "
            "figure is the min\u2013max over the repeats.",
            "",
            "Models, from the real zoo's cached registrations (`scripts/bench real-zoo`), each served by the "
            "cheapest one-thread cpu variant registration kept, loaded on the worker ahead of the queries; "
            "Ray Serve runs the same artifact with the same onnxruntime session options. One client for "
            "all: `bench/loadgen.py` (asyncio, keep-alive HTTP/1.1, its own process), sending the same "
            "binary body (one held-out test example as `.npy`, `.npz` for a model of several inputs; "
            "the project's targets in the query string).",
            "",
            table(
                [
                    "model",
                    "variant served",
                    "profiled batch-1 p50 ms",
                    "largest batch",
                    "variants kept / pruned",
                    "registered",
                ],
                served_rows,
            ),
            "",
            "Set-up, both sides one model instance: the project's embedded stack (gateway with the "
            "in-memory store, one worker process with one instance slot, the local Lambda tier limited to "
            "one container and warm, no scaler loop); Ray Serve with one replica per deployment "
            "(`max_ongoing_requests` 256), per-request access logs off on both.",
            "",
            overhead_section(run),
            "",
            batching_section(run),
            "",
            ray_section(run),
            "",
            "Direct onnxruntime runs of the served artifacts, per batch size (median ms; per row):",
            "",
            table(["model", "batch", "run ms", "ms per row"], direct_rows),
            "",
            "![throughput against p99, batching on and off](serving_batching.png)",
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
    figure, axes = plt.subplots(1, len(run.models), figsize=(5.5 * len(run.models), 4.5), squeeze=False)
    for ax, served in zip(axes[0], run.models, strict=True):
        for system in SYSTEMS:
            for r in range(run.plan.repeats):
                levels = sorted(levels_of(run, served.name, system, r), key=lambda m: m.load)
                if levels:
                    ax.plot(
                        [m.throughput for m in levels],
                        [min(m.p99_ms, 1e5) for m in levels],
                        "s--",
                        color=colours[system],
                        alpha=0.75,
                        label=system if r == 0 else None,
                    )
        ax.set_yscale("log")
        ax.set_xlabel("answered queries per second")
        ax.set_ylabel("p99 latency, ms")
        ax.axhline(BUDGET_MS, color="grey", linestyle=":", linewidth=1)
        ax.set_title(served.name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle(f"Closed loop, rising callers; the {BUDGET_MS:g} ms budget dotted", fontsize=10)
    figure.tight_layout()
    path = out_dir / "serving_batching.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [path]


def serving_headlines(run: Run) -> list[str]:
    """The one-line results BENCHMARKS.md's summary quotes."""
    lines = []
    for served in run.models:
        m = served.name
        over = span(overheads(run, m, PROJECT_BATCHED))
        lines.append(
            f"Serving overhead on `{m}`, client side, one caller, binary body: {over} ms over a direct "
            f"onnxruntime call (JSON body: {span(overheads(run, m, PROJECT_JSON))} ms)"
        )
        gain = ratios(run, m, PROJECT_BATCHED, PROJECT_PLAIN, throughput_within)
        lines.append(
            f"AIMD batching on `{m}`: throughput at a {BUDGET_MS:g} ms p99 {TIMES}{span(gain)} batch 1's"
        )
    if has(run, run.ray_model, RAY_BATCHED):
        for mine, theirs, label in (
            (PROJECT_BATCHED, RAY_BATCHED, "batching on"),
            (PROJECT_PLAIN, RAY_PLAIN, "off"),
        ):
            qps = ratios(run, run.ray_model, mine, theirs, throughput_within)
            lines.append(
                f"Against Ray Serve on `{run.ray_model}` ({label}): throughput at a {BUDGET_MS:g} ms p99 "
                f"{TIMES}{span(qps)} Ray's"
            )
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
    parser.add_argument("--quick", action="store_true", help="a short smoke run on smaller models")
    parser.add_argument("--models", nargs="+", help=f"the real zoo's models (default: {' '.join(MODELS)})")
    parser.add_argument("--out-dir", type=Path, default=Path("docs/bench"))
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    parser.add_argument("--no-ray", action="store_true", help="measure the project only")
    parser.add_argument("--lambda-concurrency", type=int, default=1, help="the local Lambda tier's limit")
    parser.add_argument("--report-only", type=Path, help="redraw the report from a saved serving.json")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
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
    command = " ".join(["scripts/bench serving", *argv])
    run = run_bench(args, plan, command)
    write_outputs(run, args.out_dir)


if __name__ == "__main__":
    main()
