"""The soak: the embedded stack under steady open-loop load at 80 % of its measured capacity for
ten minutes, counting every error and watching every process's memory.

    python -m bench.soak [--duration 600] [--load 0.8] [--latency-ms 50] [--quick] [--out-dir docs/bench]
    scripts/bench soak [the same options]

It runs the stack as a user does (``python -m infra.local.stack``, a process of its own: the
gateway's memory is the gateway's alone), with a fixed pool of real worker processes and the
local Lambda tier, on 127.0.0.1 only; registers a model over the API (the digits zoo's
``digits-mlp``, or ``--model``/``--valset``); then, with one client (``bench/loadgen.py`` in a
process of its own, as every bench here):

1. **Capacity**: the highest Poisson arrival rate served with the p99 within the query's
   latency target (``--latency-ms``, sent with every query) and no error. First the peak of
   closed-loop callers rising (1, 2, 4, ...) until throughput stops rising or the p99 passes the
   target; then open-loop rates rising from 30 % of that peak until one misses.
2. **Soak**: Poisson arrivals at ``--load`` (0.8) x capacity for ``--duration`` seconds, in
   consecutive windows (``--window``), every request's status and latency kept (latency from its
   scheduled arrival: a stack that falls behind is charged for the wait). Meanwhile the resident
   memory (``VmRSS``) of the gateway and of every process under it (workers, Lambda containers)
   is sampled every ``--sample-every`` seconds.

Reported: errors by kind (any non-2xx status, and no reply within ``--request-timeout``), p50 /
p99 / max, SLO attainment (the share of all requests answered 2xx within the target), and per
process the memory slope: the least-squares fit of RSS against time after ``--warmup``, in
MB/min. "Flat" means every process that lived through the measured part grew less than
``FLAT_MB_PER_MIN``. Writes ``<out-dir>/soak.md`` and ``soak.json`` (every sample, every window);
the stack's state and every process's log stay in ``<state-dir>/soak-stack/`` until the next run.

Bounded: every load stops at its duration and its request count (``max_requests``), replies get
at most ``--request-timeout``, the stack is stopped (SIGTERM, then every process of its session
killed) on errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from bench.real_zoo import encode_body
from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, percentile, span, write_fragment
from bench.serving import ROOT, LoadGenerator, Target, session_pids
from infra.local.ports import free_port
from modelless.client import Client
from modelless.types import QueryTargets

PART = "soak"
APP = "soak"
# A process "holds flat" when its RSS, fitted over the measured part, grows less than this:
# 10 MB over a 10-minute soak, well above the allocator's jitter on a least-squares fit of
# ~100 samples, well below what a per-request leak (bytes x thousands of requests) shows.
FLAT_MB_PER_MIN = 1.0
# What a process is, from the module it runs (``python -m <module>``).
ROLES = {
    "infra.local.stack": "gateway",
    "modelless.worker": "worker",
    "infra.local.lambda_container": "lambda",
}
NO_REPLY = "no reply"  # the error kind of a request that got no HTTP reply in time
LADDER = (1, 2, 4, 8, 16, 32, 64)  # closed-loop callers, to find the peak throughput
# Open-loop rates tried after it, as shares of the peak: from 30 % up to all of it.
RAMP = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
HALVINGS = 3  # when even the first share misses: that rate halved, at most this often
STACK_READY_S = 120.0


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 600.0
    load: float = 0.8  # the share of the measured capacity the soak sends
    latency_ms: float = 50.0  # every query's latency target: its SLO
    workers: int = 2
    lambda_concurrency: int = 2
    window_s: float = 30.0  # the soak's load is sent in windows of this length
    sample_every_s: float = 5.0
    # Memory in the soak's first seconds is not fitted (caches, arenas, first loads fill up):
    # None is a quarter of the soak, at most a minute.
    warmup_s: float | None = None
    request_timeout_s: float = 10.0
    ladder: tuple[int, ...] = LADDER
    ramp: tuple[float, ...] = RAMP
    level_s: float = 8.0  # each capacity level's measured window...
    level_warmup_s: float = 1.0  # ...after this much unmeasured load
    warm_s: float = 5.0  # load sent before the capacity ladder (loads the variant on the workers)
    capacity_qps: float | None = None  # given: no capacity ladder
    model: Path | None = None  # None: the digits zoo's digits-mlp
    valset: Path | None = None
    state_dir: Path = Path(".modelless")
    metadata: str = "memory://"
    stack_env: dict[str, str] = field(default_factory=dict)  # more environment for the stack

    @property
    def memory_warmup_s(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(60.0, self.duration_s / 4)

    @classmethod
    def quick(cls, **changes: Any) -> SoakConfig:
        """A one-minute smoke run: a short capacity ladder, short windows, frequent samples."""
        values: dict[str, Any] = {
            "duration_s": 60.0,
            "window_s": 10.0,
            "sample_every_s": 2.0,
            "ladder": (1, 2, 4, 8, 16),
            "level_s": 3.0,
            "level_warmup_s": 0.5,
        }
        return cls(**(values | changes))


# --- the stack, in a process of its own ------------------------------------------------------------



def rss_mb(pid: int) -> float | None:
    """A process's resident memory (``VmRSS``) in MB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS


def role_of(pid: int) -> str:
    """``gateway``, ``worker``, ``lambda`` or ``other <module>``, from the process's command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else Path(argv[0]).name
    return ROLES.get(module, f"other {module}")


class SoakStack:
    """``python -m infra.local.stack`` on 127.0.0.1 in a session of its own (so that every
    process it starts can be found, and stopped, by its session), serving ``memory://``."""

    def __init__(self, config: SoakConfig, state_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = state_dir / "stack.log"
        command = [
            sys.executable,
            "-m",
            "infra.local.stack",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--workers", str(config.workers), "--lambda-concurrency", str(config.lambda_concurrency)),
            *("--metadata", config.metadata, "--state-dir", str(state_dir)),
            *("--scale-every", "0"),  # a fixed pool: the capacity measured stays the capacity
        ]
        env = {
            **os.environ,
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": "ERROR",
            **config.stack_env,
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
            )
        try:
            self._wait_ready(state_dir)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, state_dir: Path) -> None:
        deadline = time.monotonic() + STACK_READY_S
        probe = Client(self.url)
        try:
            while not probe.health():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the stack did not come up; see {self.log_path}")
                time.sleep(0.2)
        finally:
            probe.close()
        self.admin_key: str = json.loads((state_dir / "stack.json").read_text())["admin_key"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def processes(self) -> dict[int, str]:
        """Every live process of the stack's session, with its role."""
        return {pid: role_of(pid) for pid in session_pids(self.pid)}

    def close(self) -> list[int]:
        """SIGTERM (the stack drains and stops its children), then SIGKILL to whatever of its
        session is left; the pids that had to be killed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        left = session_pids(self.pid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


# --- memory -------------------------------------------------------------------------------------


@dataclass
class MemorySampler:
    """Samples the RSS of every process of a stack every ``every_s`` in a thread: (seconds since
    ``started``, {pid: MB}), and each pid's role as first seen."""

    processes: Callable[[], dict[int, str]]
    every_s: float
    started: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    roles: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        at = time.monotonic() - self.started
        found: dict[int, float] = {}
        for pid, role in self.processes().items():
            mb = rss_mb(pid)
            if mb is not None:
                found[pid] = round(mb, 2)
                self.roles.setdefault(pid, role)
        self.samples.append((round(at, 2), found))

    def __enter__(self) -> MemorySampler:
        self.sample()

        def loop() -> None:
            while not self._stop.wait(self.every_s):
                self.sample()

        self._thread = threading.Thread(target=loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.every_s + 10)
        self.sample()


def slope_mb_per_min(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per minute; None under 3 points."""
    if len(points) < 3:
        return None
    times = np.array([t for t, _ in points]) / 60.0
    values = np.array([mb for _, mb in points])
    if float(np.ptp(times)) == 0.0:
        return None
    slope, _ = np.polyfit(times, values, 1)
    return float(slope)


def memory_report(sampler: MemorySampler, warmup_s: float, soak_from_s: float) -> dict[str, Any]:
    """Per process: its RSS at the start and end of the soak, its peak, and its slope after the
    warm-up (``warmup_s`` into the soak, which began ``soak_from_s`` into the sampling)."""
    fit_from = soak_from_s + warmup_s
    end = sampler.samples[-1][0] if sampler.samples else fit_from
    rows: list[dict[str, Any]] = []
    for pid, role in sorted(sampler.roles.items(), key=lambda item: (item[1], item[0])):
        series = [(t, mb[pid]) for t, mb in sampler.samples if pid in mb]
        during = [(t, mb) for t, mb in series if t >= soak_from_s]
        fitted = [(t, mb) for t, mb in series if t >= fit_from]
        if not during:
            continue  # gone before the soak began (a registration's profiling process)
        slope = slope_mb_per_min(fitted)
        # A process counts towards "flat" when it lived through most of the fitted part.
        covered = (fitted[-1][0] - fitted[0][0]) if len(fitted) > 1 else 0.0
        rows.append(
            {
                "pid": pid,
                "role": role,
                "samples": len(fitted),
                "soak_start_mb": during[0][1],
                "soak_end_mb": during[-1][1],
                "peak_mb": max(mb for _, mb in during),
                "slope_mb_per_min": None if slope is None else round(slope, 3),
                "judged": slope is not None and covered >= 0.8 * max(0.0, end - fit_from),
            }
        )
    judged: list[dict[str, Any]] = [row for row in rows if row["judged"]]
    return {
        "fit_from_s": round(warmup_s, 1),
        "flat_threshold_mb_per_min": FLAT_MB_PER_MIN,
        "processes": rows,
        "flat": bool(judged) and all(abs(row["slope_mb_per_min"]) < FLAT_MB_PER_MIN for row in judged),
        "worst_slope_mb_per_min": max((row["slope_mb_per_min"] for row in judged), default=None),
    }


# --- load ---------------------------------------------------------------------------------------


def job(target: Target, mode: str, duration_s: float, timeout_s: float, **load: Any) -> dict[str, Any]:
    """A load-generator job (bench/loadgen.py) on ``target``: bounded in time and in count."""
    import base64

    host = urlsplit(target.url).hostname
    if host != "127.0.0.1":
        raise ValueError(f"the soak sends only to 127.0.0.1, not {target.url}")
    rate = float(load.get("rate", 0.0))
    return {
        "url": target.url,
        "headers": target.headers,
        "body_b64": base64.b64encode(target.body).decode(),
        "content_type": target.content_type,
        "mode": mode,
        "duration_s": duration_s,
        "warmup_s": 0.0,
        # Open loop: twice the requests the rate should bring; closed loop: far more than any level sends.
        "max_requests": int(rate * duration_s * 2) + 100 if mode == "open" else 200_000,
        "max_connections": 512,
        "timeout_s": timeout_s,
        "keep": list(target.keep),
        **load,
    }


@dataclass
class Window:
    """One stretch of load: what came back, by status, and the latencies (ms) of every request."""

    started_s: float  # since the soak began
    seconds: float
    statuses: dict[str, int]  # "200", "503", ..., "0" (no reply)
    latencies_ms: list[float]  # every counted request, answered or not
    ok_latencies_ms: list[float]  # 2xx only
    tiers: dict[str, int]

    @classmethod
    def of(cls, answer: dict[str, Any], started_s: float) -> Window:
        results = answer["results"]
        statuses = Counter(str(r["status"]) for r in results)
        tiers = Counter(str(r["fields"].get("tier")) for r in results if r["fields"])
        return cls(
            started_s=round(started_s, 2),
            seconds=float(answer["window_s"]),
            statuses=dict(statuses),
            latencies_ms=[float(r["latency_ms"]) for r in results],
            ok_latencies_ms=[float(r["latency_ms"]) for r in results if 200 <= r["status"] < 300],
            tiers=dict(tiers),
        )

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def ok(self) -> int:
        return sum(count for status, count in self.statuses.items() if status.startswith("2"))


def error_kinds(windows: Sequence[Window], request_timeout_s: float) -> dict[str, int]:
    """Every request not answered 2xx, by kind: ``HTTP <status>``, or no reply in time."""
    kinds: Counter[str] = Counter()
    for window in windows:
        for status, count in window.statuses.items():
            if status == "0":
                kinds[f"{NO_REPLY} (connection failed or nothing within {request_timeout_s:g} s)"] += count
            elif not status.startswith("2"):
                kinds[f"HTTP {status}"] += count
    return dict(kinds)


@dataclass
class Level:
    """One capacity level: closed-loop callers, or an open-loop arrival rate."""

    mode: str  # closed | open
    offered: float  # callers (closed) or requests per second (open)
    throughput: float  # 2xx per second
    p50_ms: float
    p99_ms: float  # every request, a failed one counted as infinitely late
    errors: int
    errors_by_kind: dict[str, int]

    @classmethod
    def of(cls, mode: str, offered: float, window: Window, request_timeout_s: float) -> Level:
        tail = window.ok_latencies_ms + [float("inf")] * (window.sent - window.ok)
        return cls(
            mode,
            offered,
            round(window.ok / window.seconds, 1),
            round(percentile(tail, 50), 3),
            round(percentile(tail, 99), 3),
            window.sent - window.ok,
            error_kinds([window], request_timeout_s),
        )

    def within(self, latency_ms: float) -> bool:
        return self.p99_ms <= latency_ms and self.errors == 0


def measure_capacity(
    loadgen: LoadGenerator, target: Target, config: SoakConfig, log: Callable[[str], None]
) -> tuple[float, list[Level]]:
    """The highest arrival rate served with the p99 within the latency target and no error.

    First the peak: closed-loop callers rising through ``config.ladder`` until throughput stops
    rising or the p99 passes the target. It overstates what open arrivals get (callers wait for
    their reply; Poisson arrivals bunch up and queue), so then open-loop rates rise through
    ``config.ramp`` (shares of that peak) until one misses; the last that held is the capacity
    (when the first misses, its rate halved, up to ``HALVINGS`` times). Every level measured is
    returned."""
    levels: list[Level] = []

    def measure(mode: str, offered: float) -> Level:
        load = {"concurrency": int(offered)} if mode == "closed" else {"rate": offered}
        answer = loadgen.run(
            job(
                target, mode, config.level_s, config.request_timeout_s, warmup_s=config.level_warmup_s, **load
            )
        )
        level = Level.of(mode, offered, Window.of(answer, 0.0), config.request_timeout_s)
        levels.append(level)
        what = f"{int(offered):>3} callers" if mode == "closed" else f"{offered:7.1f} q/s offered"
        log(
            f"  {mode:<6} {what}: {level.throughput:8.1f} q/s  p50 {level.p50_ms:8.2f} ms  "
            f"p99 {level.p99_ms:8.2f} ms  errors {level.errors} {level.errors_by_kind or ''}"
        )
        return level

    peak = 0.0
    for callers in config.ladder:
        level = measure("closed", callers)
        if level.within(config.latency_ms):
            rising = level.throughput >= peak * 1.05
            peak = max(peak, level.throughput)
            if rising:
                continue
        break  # past the target, or saturated: more callers only queue
    capacity = 0.0
    for share in config.ramp if peak > 0 else ():
        rate = round(share * peak, 1)
        if not measure("open", rate).within(config.latency_ms):
            break
        capacity = rate
    # Even the lowest share missed (a machine busy with other work): halve it until one holds.
    rate = config.ramp[0] * peak if config.ramp else 0.0
    for _ in range(HALVINGS if capacity == 0 else 0):
        rate = round(rate / 2, 1)
        if rate > 0 and measure("open", rate).within(config.latency_ms):
            capacity = rate
            break
    return capacity, levels


def run_open_loop(
    loadgen: LoadGenerator,
    target: Target,
    rate: float,
    duration_s: float,
    config: SoakConfig,
    log: Callable[[str], None],
    first_seed: int = 1,
) -> list[Window]:
    """Poisson arrivals at ``rate`` for ``duration_s``, in windows of ``config.window_s``."""
    windows: list[Window] = []
    began = time.monotonic()
    index = 0
    while (left := duration_s - (time.monotonic() - began)) > 0.5:
        length = min(config.window_s, left)
        started_s = time.monotonic() - began
        answer = loadgen.run(
            job(target, "open", length, config.request_timeout_s, rate=rate, seed=first_seed + index)
        )
        window = Window.of(answer, started_s)
        windows.append(window)
        ok_tail = window.ok_latencies_ms or [float("nan")]
        log(
            f"  {started_s:6.0f} s: {window.sent:6d} sent, {window.sent - window.ok} errors, "
            f"p50 {percentile(ok_tail, 50):7.2f} ms, p99 {percentile(ok_tail, 99):7.2f} ms"
        )
        index += 1
    return windows


# --- a session: the stack, the client, the registered model --------------------------------------


@dataclass
class Session:
    stack: SoakStack
    loadgen: LoadGenerator
    target: Target
    model: str


def default_model(state_dir: Path) -> tuple[Path, Path]:
    """The digits zoo's MLP and its validation set (trained once, cached in the state dir)."""
    from infra.zoo.digits import build_zoo

    zoo_dir = state_dir / "demo"
    build_zoo(zoo_dir)
    return zoo_dir / "digits-mlp.onnx", zoo_dir / "valset.npz"


def query_target(url: str, api_key: str, valset: Path, latency_ms: float) -> Target:
    """One row of the validation set as a binary (``.npy``) query, the latency target with it."""
    from bench.real_zoo import query_path

    with np.load(valset, allow_pickle=False) as data:
        key = "inputs" if "inputs" in data.files else data.files[0]
        row = np.ascontiguousarray(data[key][:1])
    content_type, body = encode_body(row)
    path = query_path(QueryTargets(app_id=APP, latency_ms=latency_ms), binary=True)
    return Target("soak", f"{url}{path}", {"X-Api-Key": api_key}, body, content_type, ("tier",))


@contextlib.contextmanager
def session(config: SoakConfig, log: Callable[[str], None]) -> Iterator[Session]:
    """The stack started, a model registered over the API, the load generator ready; all of it
    stopped afterwards."""
    model, valset = (
        (config.model, config.valset) if config.model and config.valset else default_model(config.state_dir)
    )
    # The stack's own state (its repository, cache and every process's log), kept after the run
    # for a look at what went wrong, and started afresh by the next.
    stack_dir = config.state_dir / "soak-stack"
    shutil.rmtree(stack_dir, ignore_errors=True)
    stack_dir.mkdir(parents=True)
    with contextlib.ExitStack() as cleanup:
        log(
            f"starting the stack ({config.workers} workers, Lambda tier up to {config.lambda_concurrency})..."
        )
        stack = SoakStack(config, stack_dir)
        cleanup.callback(lambda: log(f"stack stopped; processes left and killed: {stack.close() or 'none'}"))
        admin = Client(stack.url, admin_key=stack.admin_key)
        api_key = admin.create_app(APP)
        admin.close()
        client = Client(stack.url, api_key=api_key, timeout_s=300)
        name = model.stem
        started = time.monotonic()
        reply = client.register_model(name, model, valset, APP)
        final = client.wait_for_registration(reply["registrationId"], timeout_s=900)
        client.close()
        if final.get("status") != "ready":
            raise RuntimeError(f"registering {name} failed: {final}")
        log(f"registered {name} in {time.monotonic() - started:.1f} s")
        loadgen = LoadGenerator()
        cleanup.callback(loadgen.close)
        yield Session(stack, loadgen, query_target(stack.url, api_key, valset, config.latency_ms), name)


# --- the soak -----------------------------------------------------------------------------------


def soak(config: SoakConfig, live: Session, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Capacity (unless given), then the soak at ``config.load`` of it, memory sampled all along;
    the report (see ``summarise``)."""
    with MemorySampler(live.stack.processes, config.sample_every_s) as sampler:
        log(f"warming up for {config.warm_s:g} s (the variant loads on the workers)...")
        live.loadgen.run(job(live.target, "closed", config.warm_s, config.request_timeout_s, concurrency=2))
        levels: list[Level] = []
        if config.capacity_qps is None:
            log(f"capacity: closed loop, p99 within {config.latency_ms:g} ms and no error...")
            capacity, levels = measure_capacity(live.loadgen, live.target, config, log)
            if capacity <= 0:
                raise RuntimeError(f"no load met {config.latency_ms:g} ms at p99 without errors: {levels}")
        else:
            capacity = config.capacity_qps
        rate = round(config.load * capacity, 1)
        log(f"capacity {capacity:.1f} q/s; soaking at {rate:.1f} q/s for {config.duration_s:g} s...")
        soak_from_s = time.monotonic() - sampler.started
        windows = run_open_loop(live.loadgen, live.target, rate, config.duration_s, config, log)
    memory = memory_report(sampler, config.memory_warmup_s, soak_from_s)
    return summarise(config, live.model, capacity, levels, rate, windows, memory, sampler)


def summarise(
    config: SoakConfig,
    model: str,
    capacity: float,
    levels: Sequence[Level],
    rate: float,
    windows: Sequence[Window],
    memory: dict[str, Any],
    sampler: MemorySampler | None = None,
) -> dict[str, Any]:
    """The soak's report: totals, errors by kind, latency, SLO attainment, memory, every window."""
    sent = sum(w.sent for w in windows)
    ok = sum(w.ok for w in windows)
    answered = [ms for w in windows for ms in w.ok_latencies_ms]
    within = sum(1 for ms in answered if ms <= config.latency_ms)
    seconds = sum(w.seconds for w in windows)
    tiers: Counter[str] = Counter()
    for window in windows:
        tiers.update(window.tiers)
    return {
        "machine": machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "model": model,
        "capacity_qps": capacity,
        "capacity_levels": [asdict(level) for level in levels],
        "rate_qps": rate,
        "totals": {
            "seconds": round(seconds, 1),
            "sent": sent,
            "ok": ok,
            "errors": sent - ok,
            "errors_by_kind": error_kinds(windows, config.request_timeout_s),
            "achieved_qps": round(ok / seconds, 1) if seconds else 0.0,
            "p50_ms": round(percentile(answered, 50), 3) if answered else None,
            "p99_ms": round(percentile(answered, 99), 3) if answered else None,
            "max_ms": round(max(answered), 3) if answered else None,
            "slo_ms": config.latency_ms,
            "slo_attainment": round(within / sent, 5) if sent else None,
            "tiers": dict(tiers),
        },
        "windows": [
            {
                "started_s": w.started_s,
                "sent": w.sent,
                "errors": w.sent - w.ok,
                "statuses": w.statuses,
                "p50_ms": round(percentile(w.ok_latencies_ms, 50), 3) if w.ok_latencies_ms else None,
                "p99_ms": round(percentile(w.ok_latencies_ms, 99), 3) if w.ok_latencies_ms else None,
            }
            for w in windows
        ],
        "memory": memory,
        "memory_samples": [] if sampler is None else [[t, mb] for t, mb in sampler.samples],
    }


# --- the write-up -------------------------------------------------------------------------------


def headline(report: dict[str, Any]) -> str:
    totals, memory = report["totals"], report["memory"]
    minutes = round(report["config"]["duration_s"] / 60, 1)
    worst = memory["worst_slope_mb_per_min"]
    return (
        f"Soak, {minutes:g} min at {100 * report['config']['load']:g} % of measured capacity "
        f"({report['rate_qps']:g} of {report['capacity_qps']:g} q/s): {totals['errors']} errors in "
        f"{totals['sent']:,} queries, p99 {totals['p99_ms']} ms, SLO attainment "
        f"{100 * (totals['slo_attainment'] or 0):.2f} %; memory "
        f"{'flat' if memory['flat'] else 'NOT flat'} (worst slope "
        f"{'—' if worst is None else f'{worst:+.2f}'} MB/min)"
    )


def markdown(report: dict[str, Any], command: str) -> str:
    totals, memory, config = report["totals"], report["memory"], report["config"]
    levels = markdown_table(
        [
            "load",
            "q/s (2xx)",
            "p50 ms",
            "p99 ms",
            "errors",
            f"p99 within {config['latency_ms']:g} ms, no error",
        ],
        [
            [
                f"{lv['offered']:g} callers" if lv["mode"] == "closed" else f"{lv['offered']:g} q/s arriving",
                lv["throughput"],
                lv["p50_ms"],
                lv["p99_ms"],
                lv["errors"],
                "yes" if lv["p99_ms"] <= config["latency_ms"] and lv["errors"] == 0 else "no",
            ]
            for lv in report["capacity_levels"]
        ],
    )
    errors = (
        ", ".join(f"{kind}: {count}" for kind, count in sorted(totals["errors_by_kind"].items())) or "none"
    )
    processes = markdown_table(
        ["process", "pid", "RSS at start MB", "at end MB", "peak MB", "slope MB/min", "judged"],
        [
            [
                p["role"],
                p["pid"],
                p["soak_start_mb"],
                p["soak_end_mb"],
                p["peak_mb"],
                "—" if p["slope_mb_per_min"] is None else f"{p['slope_mb_per_min']:+.3f}",
                "yes" if p["judged"] else "no (short-lived)",
            ]
            for p in memory["processes"]
        ],
    )
    served_by = ", ".join(f"{tier}: {count:,}" for tier, count in sorted(totals["tiers"].items()))
    per_window = (
        f"errors {span([w['errors'] for w in report['windows']], 0)}, "
        f"p99 {span([w['p99_ms'] for w in report['windows']], 2)} ms"
    )
    outcome = markdown_table(
        ["", ""],
        [
            ["queries", f"{totals['sent']:,} ({totals['achieved_qps']:g} q/s answered 2xx)"],
            ["errors", f"**{totals['errors']}** ({errors})"],
            [
                "latency of 2xx replies",
                f"p50 {totals['p50_ms']} ms, p99 {totals['p99_ms']} ms, max {totals['max_ms']} ms",
            ],
            [
                f"SLO attainment (2xx within {config['latency_ms']:g} ms, of all)",
                f"{100 * (totals['slo_attainment'] or 0):.2f} %",
            ],
            ["served by", served_by],
            ["per window", per_window],
        ],
    )
    flat = "flat" if memory["flat"] else "not flat"
    minutes = round(config["duration_s"] / 60, 1)
    return f"""## Soak: {minutes:g} min at {100 * config["load"]:g} % of measured capacity

Machine: `{report["machine"]}`. Reproduce: `{command}`.

The embedded stack as a user runs it (`python -m infra.local.stack`, its own process, metadata
`{config["metadata"]}`, {config["workers"]} worker processes, no scaler, the local Lambda tier up
to {config["lambda_concurrency"]} containers) on 127.0.0.1, `{report["model"]}` registered over the
API; every query one row as `.npy` with a {config["latency_ms"]:g} ms latency target; one client
(`bench/loadgen.py`, its own process).

**Capacity**: the highest Poisson arrival rate served with the p99 within {config["latency_ms"]:g} ms
and no error: **{report["capacity_qps"]:g} q/s**. Found in two steps: the peak throughput of
closed-loop callers (rising until throughput stops rising or the p99 passes the target), then
open-loop rates rising from {100 * config["ramp"][0]:g} % of that peak until one misses (halved
when even that one misses).

{levels if report["capacity_levels"] else "Given on the command line (`--capacity`), not measured."}

**Soak**: Poisson arrivals at {report["rate_qps"]:g} q/s for {totals["seconds"]:g} s, in
{len(report["windows"])} windows of {config["window_s"]:g} s; latency from each request's scheduled
arrival.

{outcome}

**Memory**: resident set (`VmRSS`) of every process of the stack every {config["sample_every_s"]:g}
s; slope by least squares after the first {memory["fit_from_s"]:g} s of the soak. Flat: under
{FLAT_MB_PER_MIN:g} MB/min for every process that lived through it: **{flat}**.

{processes}
"""


def write_outputs(report: dict[str, Any], command: str, out_dir: Path) -> Path:
    return write_fragment(
        out_dir,
        PART,
        markdown(report, command),
        {**report, "command": command, "headlines": [headline(report)]},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    base = SoakConfig()
    parser.add_argument(
        "--duration", type=float, help=f"seconds of soak (default {base.duration_s:g}; --quick 60)"
    )
    parser.add_argument("--load", type=float, default=base.load, help="share of the measured capacity")
    parser.add_argument("--latency-ms", type=float, default=base.latency_ms, help="every query's target")
    parser.add_argument("--capacity", type=float, help="q/s: skip measuring it")
    parser.add_argument("--workers", type=int, default=base.workers)
    parser.add_argument("--lambda-concurrency", type=int, default=base.lambda_concurrency)
    parser.add_argument("--window", type=float, help=f"seconds per load window (default {base.window_s:g})")
    parser.add_argument(
        "--sample-every", type=float, help=f"seconds between RSS samples ({base.sample_every_s:g})"
    )
    parser.add_argument(
        "--warmup", type=float, help="seconds of soak before the memory fit (default: a quarter, at most 60)"
    )
    parser.add_argument("--request-timeout", type=float, default=base.request_timeout_s)
    parser.add_argument("--model", type=Path, help="an ONNX model (default: the digits zoo's digits-mlp)")
    parser.add_argument("--valset", type=Path, help="its validation set (.npz), with --model")
    parser.add_argument("--state-dir", type=Path, default=base.state_dir)
    parser.add_argument("--quick", action="store_true", help="a one-minute smoke run, short capacity ladder")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if (args.model is None) != (args.valset is None):
        parser.error("--model and --valset go together")
    if not 0 < args.load <= 1.5:
        parser.error("--load is a share of the capacity, in (0, 1.5]")
    options: dict[str, Any] = {
        "load": args.load,
        "latency_ms": args.latency_ms,
        "capacity_qps": args.capacity,
        "workers": args.workers,
        "lambda_concurrency": args.lambda_concurrency,
        "request_timeout_s": args.request_timeout,
        "model": args.model,
        "valset": args.valset,
        "state_dir": args.state_dir,
    }
    # Given on the command line: wins over the defaults (--quick's too).
    given = {
        "duration_s": args.duration,
        "window_s": args.window,
        "sample_every_s": args.sample_every,
        "warmup_s": args.warmup,
    }
    options |= {name: value for name, value in given.items() if value is not None}
    config = SoakConfig.quick(**options) if args.quick else SoakConfig(**options)
    command = " ".join(["scripts/bench soak", *argv])
    print(f"machine: {machine()}", flush=True)

    def log(line: str) -> None:
        print(line, flush=True)

    with session(config, log) as live:
        report = soak(config, live, log)
    log(headline(report))
    write_outputs(report, command, args.out_dir)


if __name__ == "__main__":
    main()
