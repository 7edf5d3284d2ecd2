"""SLO-aware parallelism tuning on a real worker (RRL, Qin et al. SC '19; ``modelless.tuning``).

    python -m bench.tuning [--out docs/bench] [--quick] [--model mobilenetv3_small_100]
                           [--window-s 3] [--state-dir .modelless]

One real worker process (``modelless.worker``) serves one variant of a real-zoo model; Poisson
arrivals (``bench.loadgen``, open loop, latency from each query's scheduled arrival) come at three
load levels, a fraction of the capacity the default configuration measured here (closed loop,
eight callers). Every query carries the same latency budget (SLO): ``BUDGET_FACTOR`` times the
default configuration's median latency with one caller. At each level:

- **static sweep**: the worker with ``--tune off``, each configuration of the space set by
  ``POST /configure`` and measured for a window: the *default* configuration (the variant's
  profiled threads, sequential, one batch at a time: what registration guessed) and the *best
  static* one (fewest violations, then least CPU: ``modelless.tuning.base.score``) come from it;
- **tuners**: a fresh worker with ``--tune region`` (RRL's region-based search) and one with
  ``--tune ucb`` (a UCB1 bandit over the grid), under the same load until the tuner converges (at
  most ``TUNE_WINDOWS`` windows), then measured for a window on what it reached. The trials are
  the windows the tuner observed before it converged (the worker's own count, ``/stats``).

p99 and violations are measured at the client (a reply after its budget, or no reply, is a
violation). Ratios are within one run, on one machine. ``--quick``: one level, short windows.
When the real zoo's registration is not cached yet, the model's built ONNX file is used with a
latency profile measured here (said so in the write-up).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.real_zoo import RegisteredModel, cache_dir, held_out_batch
from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, percentile, write_fragment
from bench.serving import LoadGenerator
from modelless.inputs.tensors import to_feeds
from modelless.pools.processes import ChildProcess, spawn
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import Invocation
from modelless.serving.runtime import default_config, make_session
from modelless.serving.wire import FRAMES_MEDIA_TYPE, encode_frames
from modelless.tuning.base import ParallelConfig, config_space, observe_window, score
from modelless.types import VariantProfile

PART = "tuning"
DEFAULT_MODEL = "mobilenetv3_small_100"
LEVELS: tuple[tuple[str, float], ...] = (("low", 0.3), ("medium", 0.7), ("high", 1.0))
QUICK_LEVELS: tuple[tuple[str, float], ...] = (("medium", 0.7),)
BUDGET_FACTOR = 4.0  # the SLO: this many times the default configuration's latency alone
TUNE_WINDOWS = 14  # at most this many tuning windows per tuner and level
MIN_QUERIES = 20  # a tuning window's fewest queries
CAPACITY_CALLERS = 8
SETTLE_LIMIT_S = 30.0
PROFILE_BATCHES = (1, 2, 4, 8)
SYSTEMS = ("default", "best static", "region", "ucb")
RESULT_HEADER = ("load", "system", "configuration", "p99 ms", "p99 vs default", "violations %", "trials")
SEARCH_HEADER = ("load", "policy", "trials", "converged", "seconds", "violations % while searching")
COLOURS = {"default": "#999999", "best static": "#4C72B0", "region": "#C44E52", "ucb": "#DD8452"}


@dataclass(frozen=True)
class Subject:
    """What the worker serves: a variant, the repository that holds its artifact, one query."""

    name: str
    variant: VariantProfile
    repository: Path
    inputs: np.ndarray
    source: str  # where the variant's profile comes from, for the write-up


@dataclass
class Window:
    """One measured load window."""

    label: str
    rate: float
    queries: int
    p99_ms: float
    p50_ms: float
    violation_pct: float
    errors: int
    score: float  # the tuner's objective on this window (client-side latencies)


@dataclass
class LevelResult:
    level: str
    fraction: float
    rate: float
    sweep: dict[str, Window]  # config label -> its window
    default: str
    best: str
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)  # policy -> outcome

    def window(self, system: str) -> Window:
        if system == "default":
            return self.sweep[self.default]
        if system == "best static":
            return self.sweep[self.best]
        final: Window = self.tuned[system]["final"]
        return final


# --- the subject ---------------------------------------------------------------------------


def registered_subject(name: str, state_dir: Path) -> Subject | None:
    """The model's variant as the real zoo's registration profiled it (its cache), or None when
    that registration is not cached (yet). The variant: fp32, one thread, where there is one."""
    entry = cache_dir(state_dir) / f"{name}.json"
    if not entry.exists():
        return None
    model = RegisteredModel.from_json(json.loads(entry.read_text()))
    measured = [p for p in model.measured() if p.pool == "cpu"] or model.measured()
    if not measured:
        return None
    measured.sort(key=lambda p: (p.threads != 1, p.precision != "fp32", p.latency_ms(1)))
    variant = measured[0]
    repository = cache_dir(state_dir) / "repo"
    return Subject(name, variant, repository, held_out_batch(model, 1), "the real zoo's registration profile")


def built_subject(name: str, onnx_path: Path, inputs: np.ndarray, workdir: Path) -> Subject:
    """The model's ONNX file, profiled here (median and p99 of a few runs per batch size, one
    thread): for a model whose registration is not cached, and for tests' tiny models."""
    key = f"apps/bench-tuning/{name}/variants/fp32.onnx"
    repository = workdir / "repo"
    LocalModelRepository(repository).put(key, onnx_path.read_bytes())
    session = make_session(onnx_path, 1)
    input_names = [declared.name for declared in session.get_inputs()]
    p50: dict[int, float] = {}
    p99: dict[int, float] = {}
    for batch in PROFILE_BATCHES:
        feeds = to_feeds(np.concatenate([inputs] * batch), input_names)
        session.run(None, feeds)  # warm
        times = []
        for _ in range(7):
            started = time.perf_counter()
            session.run(None, feeds)
            times.append((time.perf_counter() - started) * 1000)
        p50[batch] = statistics.median(times)
        p99[batch] = max(times)
    variant = VariantProfile(
        variant_id=f"bench-tuning/{name}/fp32/cpu",
        app_id="bench-tuning",
        model_name=name,
        pool="cpu",
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key=key,
        size_bytes=onnx_path.stat().st_size,
        load_latency_ms=0.0,
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        peak_memory_mb=0.0,
        accuracy=0.0,
        price_per_second=0.0,
        request_price=0.0,
        hardware=machine(),
        measured_on_target=True,
        max_useful_batch=max(PROFILE_BATCHES),
    )
    return Subject(name, variant, repository, inputs, "a profile measured by this benchmark (one thread)")


def subject_for(name: str, state_dir: Path, workdir: Path) -> Subject:
    found = registered_subject(name, state_dir)
    if found is not None:
        return found
    built = state_dir / "zoo-real" / name
    onnx_path, testset = built / "model.onnx", built / "testset.npz"
    if not onnx_path.exists():
        raise SystemExit(
            f"{name} is neither registered nor built under {state_dir}: run `scripts/bench real-zoo`"
        )
    with np.load(testset, allow_pickle=False) as data:
        inputs = np.ascontiguousarray(data[data.files[0] if "inputs" not in data.files else "inputs"][:1])
    return built_subject(name, onnx_path, inputs, workdir)


# --- the worker and the load -------------------------------------------------------------------


@contextmanager
def worker(subject: Subject, workdir: Path, name: str, *extra: str) -> Iterator[ChildProcess]:
    child = spawn(
        name,
        "modelless.worker",
        [
            *("--worker-id", name, "--pool", "cpu", "--slots", "1"),
            *("--repository", str(subject.repository), "--cache-dir", str(workdir / "cache")),
            *("--report-url", "memory://", *extra),
        ],
        workdir / "logs",
    )
    try:
        yield child
    finally:
        child.stop()


def body_of(subject: Subject, budget_ms: float) -> bytes:
    return encode_frames(Invocation(subject.variant, subject.inputs, "bench-tuning", budget_ms).to_message())


def load_job(address: str, body: bytes, mode: str, duration_s: float, **load: float) -> dict[str, Any]:
    return {
        "url": f"{address}/invoke",
        "body_b64": base64.b64encode(body).decode(),
        "content_type": FRAMES_MEDIA_TYPE,
        "mode": mode,
        "duration_s": duration_s,
        "warmup_s": 0.3,
        "max_requests": 100_000,
        "max_connections": 64,
        "timeout_s": 10.0,
        **load,
    }


def window_of(
    label: str, rate: float, answer: dict[str, Any], budget_ms: float, config: ParallelConfig
) -> Window:
    results = answer["results"]
    latencies = [float(r["latency_ms"]) for r in results]
    # No reply is a violation: its latency is taken as past the budget.
    judged = [
        lat if r["status"] == 200 else max(lat, 2 * budget_ms)
        for lat, r in zip(latencies, results, strict=True)
    ]
    violations = sum(1 for lat in judged if lat > budget_ms)
    observed = observe_window(judged, [budget_ms] * len(judged), 0.0, config)
    return Window(
        label=label,
        rate=rate,
        queries=len(results),
        p99_ms=percentile(judged, 99) if judged else float("nan"),
        p50_ms=percentile(judged, 50) if judged else float("nan"),
        violation_pct=100.0 * violations / len(results) if results else 100.0,
        errors=sum(1 for r in results if r["status"] != 200),
        score=score(observed),
    )


def configure(address: str, variant_id: str, config: ParallelConfig) -> None:
    answer = httpx.post(
        f"{address}/configure", json={"variant_id": variant_id, "config": config.to_dict()}, timeout=60.0
    )
    answer.raise_for_status()


def settle(address: str, limit_s: float = SETTLE_LIMIT_S) -> None:
    """Wait until the worker holds no query (a configuration that fell behind leaves a backlog
    that the next window must not inherit), for at most ``limit_s``."""
    ends = time.monotonic() + limit_s
    while time.monotonic() < ends:
        state = httpx.get(f"{address}/stats", timeout=5.0).json()["state"]
        if all(instance["queue_length"] == 0 for instance in json.loads(state)["instances"]):
            return
        time.sleep(0.1)


def tuning_report(address: str, variant_id: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = httpx.get(f"{address}/stats", timeout=5.0).json()["tuning"].get(variant_id)
    return found


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Run:
    model: str
    source: str
    variant_id: str
    cores: int
    space: list[str]
    budget_ms: float
    alone_ms: float
    capacity_qps: float
    window_s: float
    levels: list[LevelResult]
    machine: str
    command: str
    seconds: float = 0.0


def measure(
    subject: Subject,
    workdir: Path,
    levels: Sequence[tuple[str, float]],
    window_s: float,
    cores: int,
    log: Any = print,
    tune_windows: int = TUNE_WINDOWS,
) -> tuple[float, float, float, list[LevelResult], list[ParallelConfig]]:
    """(budget ms, default's latency alone ms, default's capacity QPS, per level results, space)."""
    space = config_space(cores)
    default = default_config(subject.variant)
    if default not in space:
        space = sorted({*space, default})
    generator = LoadGenerator()
    try:
        with worker(subject, workdir, "tuning-static") as static:
            variant_id = subject.variant.variant_id
            loose = body_of(subject, 10_000.0)
            generator.run(load_job(static.address, loose, "closed", 1.0, concurrency=1))  # loads it, warms up
            alone = generator.run(load_job(static.address, loose, "closed", window_s, concurrency=1))
            alone_ms = statistics.median(float(r["latency_ms"]) for r in alone["results"])
            budget_ms = BUDGET_FACTOR * alone_ms
            busy = generator.run(
                load_job(static.address, loose, "closed", window_s, concurrency=CAPACITY_CALLERS)
            )
            capacity = sum(1 for r in busy["results"] if r["status"] == 200) / busy["window_s"]
            log(
                f"default {default.label()}: {alone_ms:.2f} ms alone, "
                f"budget {budget_ms:.1f} ms, {capacity:.1f} QPS"
            )
            body = body_of(subject, budget_ms)
            results = []
            for level, fraction in levels:
                rate = fraction * capacity
                sweep: dict[str, Window] = {}
                for config in space:
                    settle(static.address)
                    configure(static.address, variant_id, config)
                    answer = generator.run(
                        load_job(static.address, body, "open", window_s, rate=rate, seed=7)
                    )
                    sweep[config.label()] = window_of(config.label(), rate, answer, budget_ms, config)
                    got = sweep[config.label()]
                    log(
                        f"  {level} {rate:.1f} QPS {config.label()}: "
                        f"p99 {got.p99_ms:.1f} ms, {got.violation_pct:.1f} % late"
                    )
                best = min(space, key=lambda c: (round(sweep[c.label()].score, 6), c.threads))
                results.append(LevelResult(level, fraction, rate, sweep, default.label(), best.label()))
            configure(static.address, variant_id, default)
        for result in results:
            for policy in ("region", "ucb"):
                result.tuned[policy] = tune(
                    subject,
                    workdir,
                    generator,
                    policy,
                    result.rate,
                    budget_ms,
                    window_s,
                    body,
                    log,
                    tune_windows,
                )
    finally:
        generator.close()
    return budget_ms, alone_ms, capacity, results, space


def tune(
    subject: Subject,
    workdir: Path,
    generator: LoadGenerator,
    policy: str,
    rate: float,
    budget_ms: float,
    window_s: float,
    body: bytes,
    log: Any,
    tune_windows: int = TUNE_WINDOWS,
) -> dict[str, Any]:
    """A worker tuning under ``rate``: windows until its tuner converges (at most TUNE_WINDOWS),
    then one window measured on what it reached."""
    variant_id = subject.variant.variant_id
    flags = ("--tune", policy, "--tune-window-s", str(window_s), "--tune-min-queries", str(MIN_QUERIES))
    with worker(subject, workdir, f"tuning-{policy}", *flags) as tuning:
        # Loads the variant; its queries already count towards the tuner's first window.
        generator.run(load_job(tuning.address, body, "closed", 0.5, concurrency=1))
        windows: list[Window] = []
        report: dict[str, Any] | None = None
        started = time.perf_counter()
        for _ in range(tune_windows):
            answer = generator.run(load_job(tuning.address, body, "open", window_s, rate=rate, seed=11))
            windows.append(window_of("tuning", rate, answer, budget_ms, ParallelConfig()))
            report = tuning_report(tuning.address, variant_id)
            if report is not None and report["converged"]:
                break
        search_s = time.perf_counter() - started
        assert report is not None, "the tuner saw no window"
        settle(tuning.address)
        # Two windows' worth: what the tuner reached is the result, so it is measured the longer.
        answer = generator.run(load_job(tuning.address, body, "open", 2 * window_s, rate=rate, seed=7))
        reached = ParallelConfig.from_dict(report["config"])
        final = window_of(reached.label(), rate, answer, budget_ms, reached)
        report = tuning_report(tuning.address, variant_id) or report
    late = sum(w.violation_pct * w.queries for w in windows) / max(1, sum(w.queries for w in windows))
    log(
        f"  {policy} at {rate:.1f} QPS: {report['trials']} trials, converged {report['converged']}, "
        f"reached {final.label}: p99 {final.p99_ms:.1f} ms, {final.violation_pct:.1f} % late"
    )
    return {
        "trials": report["trials"],
        "converged": report["converged"],
        "config": final.label,
        "search_s": round(search_s, 1),
        "search_violation_pct": round(late, 2),
        "final": final,
        "history": report["history"],
    }


# --- the write-up ------------------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "—"


def headline_lines(run: Run) -> list[str]:
    lines = []
    for level in run.levels:
        default, region = level.window("default"), level.window("region")
        best, ucb = level.window("best static"), level.window("ucb")
        lines.append(
            f"tuning ({run.model}, {level.level} load {level.rate:.0f} QPS): RRL-style tuner p99 "
            f"{region.p99_ms:.1f} ms vs default {default.p99_ms:.1f} ms "
            f"({ratio(region.p99_ms, default.p99_ms)}), "
            f"violations {region.violation_pct:.1f} % vs {default.violation_pct:.1f} % (best static "
            f"{best.violation_pct:.1f} %); {level.tuned['region']['trials']} trials vs UCB's "
            f"{level.tuned['ucb']['trials']} (UCB reached {ucb.violation_pct:.1f} %)"
        )
    return lines


def markdown(run: Run, plots: Sequence[str]) -> str:
    rows = []
    for level in run.levels:
        default = level.window("default")
        for system in SYSTEMS:
            got = level.window(system)
            config = (
                level.default
                if system == "default"
                else level.best
                if system == "best static"
                else level.tuned[system]["config"]
            )
            trials = "—" if system in ("default", "best static") else str(level.tuned[system]["trials"])
            if system in ("region", "ucb") and not level.tuned[system]["converged"]:
                trials = f">{trials} (not converged)"
            rows.append(
                [
                    f"{level.level} ({level.rate:.1f} QPS)",
                    system,
                    f"`{config}`",
                    f"{got.p99_ms:.1f}",
                    ratio(got.p99_ms, default.p99_ms),
                    f"{got.violation_pct:.1f}",
                    trials,
                ]
            )
    sweep_rows = []
    for level in run.levels:
        for label, got in level.sweep.items():
            sweep_rows.append(
                [
                    level.level,
                    f"`{label}`",
                    f"{got.p99_ms:.1f}",
                    f"{got.violation_pct:.1f}",
                    f"{got.score:.4f}",
                ]
            )
    search_rows = [
        [
            level.level,
            policy,
            str(level.tuned[policy]["trials"]),
            "yes" if level.tuned[policy]["converged"] else "no",
            f"{level.tuned[policy]['search_s']:.0f}",
            f"{level.tuned[policy]['search_violation_pct']:.1f}",
        ]
        for level in run.levels
        for policy in ("region", "ucb")
    ]
    images = "\n".join(f"![{name}]({name})" for name in plots)
    return f"""## Parallelism tuning (RRL) on a real worker

*{run.machine}; `{run.command}`; {run.seconds:.0f} s. Model: {run.model} (`{run.variant_id}`,
profile: {run.source}). Configuration space on {run.cores} cores: {len(run.space)} configurations
(intra-op threads x inter-op threads x concurrent batches). SLO {run.budget_ms:.1f} ms
({BUDGET_FACTOR:g}x the default configuration's {run.alone_ms:.2f} ms alone); load levels as a share of
the default configuration's measured capacity, {run.capacity_qps:.1f} QPS with {CAPACITY_CALLERS}
callers. Windows of {run.window_s:g} s, Poisson arrivals, latency at the client from each query's
scheduled arrival. Ratios are to the default configuration in the same run.*

One worker process serves the variant. *default*: the configuration registration profiled it
with; *best static*: the best of an exhaustive sweep of the space at that load (fewest
violations, then least CPU); *region*: the worker's RRL-style tuner (`--tune region`, region-based
estimates of untried configurations from tried neighbours); *ucb*: a UCB1 bandit over the same
grid (`--tune ucb`). A tuner's row is measured on the configuration it converged to (or was at
after {TUNE_WINDOWS} windows), over two windows; its trials are the windows it observed before
converging.

{markdown_table(RESULT_HEADER, rows)}

The search itself (queries late while the tuner tried configurations):

{markdown_table(SEARCH_HEADER, search_rows)}

{images}

<details><summary>The static sweep</summary>

{markdown_table(["load", "configuration", "p99 ms", "violations %", "score"], sweep_rows)}

</details>

RRL reports up to 79 % lower latency and 49.9 % fewer violations than static settings on
TensorFlow Serving with 10-core hosts and a far larger space; on this {run.cores}-core host the
space has {len(run.space)} configurations, so the gains available are the sweep's spread above.
Timings on a shared machine vary from run to run; the ratios are within this run.
"""


def plot(run: Run, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (p99_axis, late_axis, trials_axis) = plt.subplots(1, 3, figsize=(13, 4))
    names = [level.level for level in run.levels]
    width = 0.2
    for index, system in enumerate(SYSTEMS):
        xs = [i + (index - 1.5) * width for i in range(len(names))]
        p99_axis.bar(
            xs,
            [level.window(system).p99_ms for level in run.levels],
            width,
            color=COLOURS[system],
            label=system,
        )
        late_axis.bar(
            xs,
            [level.window(system).violation_pct for level in run.levels],
            width,
            color=COLOURS[system],
            label=system,
        )
    for index, policy in enumerate(("region", "ucb")):
        xs = [i + (index - 0.5) * width for i in range(len(names))]
        trials_axis.bar(
            xs,
            [level.tuned[policy]["trials"] for level in run.levels],
            width,
            color=COLOURS[policy],
            label=policy,
        )
    trials_axis.axhline(len(run.space), color="black", lw=0.8, ls="--", label="configurations")
    p99_axis.axhline(run.budget_ms, color="black", lw=0.8, ls="--", label="SLO")
    p99_axis.set_yscale("log")  # an overloaded configuration's tail is orders of magnitude longer
    for axis, title in (
        (p99_axis, "p99 latency (ms)"),
        (late_axis, "SLO violations (%)"),
        (trials_axis, "trials to converge"),
    ):
        axis.set_xticks(range(len(names)), names)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=7)
    figure.suptitle(f"{run.model}: tuned vs static parallelism, {run.cores} cores", fontsize=10)
    figure.tight_layout()
    name = "tuning.png"
    figure.savefig(out_dir / name, dpi=90)
    plt.close(figure)
    return [name]


def to_json(run: Run) -> dict[str, Any]:
    data = asdict(run)
    data["headlines"] = headline_lines(run)
    return data


def write(run: Run, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(run, out_dir)
    return write_fragment(out_dir, PART, markdown(run, plots), to_json(run))


def run_bench(
    subject: Subject,
    workdir: Path,
    levels: Sequence[tuple[str, float]],
    window_s: float,
    cores: int,
    command: str,
    log: Any = print,
    tune_windows: int = TUNE_WINDOWS,
) -> Run:
    started = time.perf_counter()
    budget_ms, alone_ms, capacity, results, space = measure(
        subject, workdir, levels, window_s, cores, log, tune_windows
    )
    return Run(
        model=subject.name,
        source=subject.source,
        variant_id=subject.variant.variant_id,
        cores=cores,
        space=[c.label() for c in space],
        budget_ms=budget_ms,
        alone_ms=alone_ms,
        capacity_qps=capacity,
        window_s=window_s,
        levels=results,
        machine=machine(),
        command=command,
        seconds=time.perf_counter() - started,
    )


def main(argv: Sequence[str] | None = None) -> None:
    import os
    import sys

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", "--out-dir", dest="out", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--quick", action="store_true", help="one load level, short windows")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model of the real zoo")
    parser.add_argument(
        "--window-s", type=float, default=None, help="length of a window (default 3, quick 1)"
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    args = parser.parse_args(argv)
    window_s = args.window_s or (1.0 if args.quick else 3.0)
    command = "scripts/bench tuning " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-tuning-") as tmp:
        subject = subject_for(args.model, args.state_dir, Path(tmp))
        print(f"{subject.name}: {subject.variant.variant_id} ({subject.source})", flush=True)
        run = run_bench(
            subject,
            Path(tmp),
            QUICK_LEVELS if args.quick else LEVELS,
            window_s,
            os.cpu_count() or 1,
            command.strip(),
        )
    path = write(run, args.out)
    for line in headline_lines(run):
        print(line)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
