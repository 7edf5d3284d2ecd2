"""Measure one variant artifact: its latency table at one thread count (load latency, median and
p99 per batch size, saturation throughput, resident memory) and, apart, its accuracy.

Meant to run in a fresh child process per measurement, so that the memory it measures is the
variant's own and nothing else in the parent disturbs the timings. The session is made exactly as
serving makes it (``modelless.serving.runtime.make_session``), so a profiled median is what a query sees.

Timing runs until the estimate is stable, not a fixed number of times: per batch size, a warm-up
until two consecutive runs agree, then timed runs until the 95 % confidence interval of the
median (distribution-free, ``variants.stats``) is narrower than the stability target, with a
minimum run count, a maximum, and a time budget per batch size. Batch sizes double from 1 up to
the largest a request can carry; once a doubling raises throughput by less than 5 % the larger
ones are only timed briefly (a warm-up and three runs), and once a median passes a ceiling no
larger power of two is; the largest a request can carry is always timed, so that a query of any
batch size has a measured latency at the next size up.

Accuracy is measured the way queries run: at each batch size asked for (quantised variants: at
batch 1 and at the largest serving batch, since dynamic quantisation scales activations per
batch), and the lower is recorded, with the share of examples whose top-1 answer equals the
registered model's (``agreement``) and a Wilson interval from the number of examples.
"""

from __future__ import annotations

import itertools
import os
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelless.inputs.tensors import to_feeds
from modelless.serving.runtime import make_session
from variants.examples import read_examples, rows, session_specs
from variants.recipes import ACCURACY_METRICS
from variants.stats import median_ci_pct, wilson_interval

WORTH_IT_GAIN = 1.05  # a larger batch is worth it while it raises throughput by 5 % or more
WARMUP_AGREEMENT = 0.10  # warm once two consecutive runs are within 10 % of each other...
WARMUP_SLACK_MS = 0.002  # ...plus timer resolution on microsecond models
WARMUP_MAX_RUNS = 10
RUNS_FLOOR = 3  # a very slow batch size stops at this many runs once it has used 3x its budget
REFERENCE_BATCH = 16  # rows per run when the registered model's own answers are computed

Clock = Callable[[], float]


@dataclass(frozen=True)
class TimingPlan:
    """How long to time each batch size, and which batch sizes (Settings' profile_* fields)."""

    max_runs: int = 200
    min_runs: int = 10
    stability_pct: float = 3.0  # target half-width of the median's 95 % interval
    batch_budget_s: float = 3.0  # seconds of timed runs per batch size, once min_runs are done
    max_batch: int = 64  # the largest batch a request can carry
    ceiling_ms: float = 2000.0  # stop doubling once the median passes this


@dataclass(frozen=True)
class BatchTiming:
    timings_ms: list[float]
    warmup_runs: int

    @property
    def p50_ms(self) -> float:
        return float(np.percentile(self.timings_ms, 50))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.timings_ms, 99))

    @property
    def ci_pct(self) -> float:
        return median_ci_pct(self.timings_ms)


@dataclass(frozen=True)
class Measurement:
    load_latency_ms: float
    latency_p50_ms: dict[int, float]
    latency_p99_ms: dict[int, float]
    throughput_qps: dict[int, float]  # batch * 1000 / p50: one instance, saturated
    saturation_qps: float
    max_useful_batch: int
    peak_memory_mb: float
    size_bytes: int
    runs_per_batch: dict[int, int]
    profile_runs: int  # timed runs, all batch sizes together
    p50_ci_pct: float  # half-width of the batch-1 median's 95 % interval, in %
    ci_pct_per_batch: dict[int, float]
    hardware: str


@dataclass(frozen=True)
class AccuracyMeasurement:
    accuracy: float  # the lowest over the batch sizes measured
    accuracy_low: float
    accuracy_high: float
    accuracy_metric: str
    accuracy_examples: int
    accuracy_by_batch: dict[int, float]
    agreement: float | None  # the lowest over the batch sizes; None without the reference answers
    agreement_by_batch: dict[int, float] = field(default_factory=dict)


def hardware_description(threads: int, device: str = "cpu") -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {cpu} {device}, {os.cpu_count()} cores, {threads} intra-op thread(s)"


def resident_kb() -> int:
    """Current resident set size (Linux /proc; elsewhere the process's peak, which is coarser)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def max_useful_batch(throughput: dict[int, float]) -> int:
    """The largest batch size up to which every doubling still paid (throughput +5 %)."""
    sizes = sorted(throughput)
    best = sizes[0]
    for previous, size in itertools.pairwise(sizes):
        if throughput[size] < throughput[previous] * WORTH_IT_GAIN:
            break
        best = size
    return best


def top_k_correct(logits: np.ndarray, labels: np.ndarray, metric: str) -> int:
    if metric == "top1":
        return int((np.argmax(logits, axis=1) == labels).sum())
    top5 = np.argsort(logits, axis=1)[:, -5:]
    return int((top5 == labels[:, None]).any(axis=1).sum())


def _timed(run: Callable[[], object], clock: Clock) -> float:
    begin = clock()
    run()
    return (clock() - begin) * 1000


def warm_up(run: Callable[[], object], budget_s: float, clock: Clock = time.perf_counter) -> int:
    """Run until two consecutive runs agree (within 10 %, plus timer slack), at most
    WARMUP_MAX_RUNS times and, past two runs, for at most ``budget_s``; returns the runs made."""
    started = clock()
    previous = _timed(run, clock)
    runs = 1
    while runs < WARMUP_MAX_RUNS:
        current = _timed(run, clock)
        runs += 1
        if abs(current - previous) <= WARMUP_AGREEMENT * max(current, previous) + WARMUP_SLACK_MS:
            break
        if clock() - started >= budget_s:
            break
        previous = current
    return runs


def time_batch(run: Callable[[], object], plan: TimingPlan, clock: Clock = time.perf_counter) -> BatchTiming:
    """Warm up, then time ``run`` until its median is stable (see the module's docstring)."""
    warmup = warm_up(run, plan.batch_budget_s, clock)
    timings: list[float] = []
    started = clock()
    while len(timings) < plan.max_runs:
        timings.append(_timed(run, clock))
        n, elapsed = len(timings), clock() - started
        stable = n >= plan.min_runs and median_ci_pct(timings) <= plan.stability_pct
        if stable or (n >= plan.min_runs and elapsed >= plan.batch_budget_s):
            break
        if n >= RUNS_FLOOR and elapsed >= 3 * plan.batch_budget_s:
            break  # a batch so slow that min_runs would take minutes: its few runs must do
    return BatchTiming(timings, warmup)


def time_briefly(run: Callable[[], object], clock: Clock = time.perf_counter) -> BatchTiming:
    """One warm-up run and RUNS_FLOOR timed ones: a batch size past those worth refining."""
    run()
    return BatchTiming([_timed(run, clock) for _ in range(RUNS_FLOOR)], warmup_runs=1)


def batch_sizes_to_time(
    measure_batch: Callable[[int, bool], BatchTiming], plan: TimingPlan
) -> dict[int, BatchTiming]:
    """Time batch 1, 2, 4, ... up to ``plan.max_batch`` (the largest a request can carry) until
    stable, and stop doubling once a doubling raises throughput by less than 5 % or the median
    passes the ceiling. Past the first stop, the rest are timed briefly (``measure_batch(batch,
    True)``): the larger powers of two while their median stays under the ceiling, then the
    largest a request can carry, so that a query of any batch size has a measured latency at
    the next size up, close to its own."""
    cap = max(1, plan.max_batch)
    measured: dict[int, BatchTiming] = {}
    batch, previous_qps, brief = 1, 0.0, False
    while batch <= cap:
        timing = measure_batch(batch, brief)
        measured[batch] = timing
        if timing.p50_ms > plan.ceiling_ms:
            break
        qps = batch * 1000 / max(timing.p50_ms, 1e-6)
        if previous_qps and qps < previous_qps * WORTH_IT_GAIN:
            brief = True  # no longer worth refining: a larger batch only queues more rows
        previous_qps = qps
        batch *= 2
    if cap not in measured:
        measured[cap] = measure_batch(cap, True)
    return measured


def measure_latency(artifact: Path, valset: Path, threads: int, plan: TimingPlan) -> Measurement:
    """The latency table of ``artifact`` at ``threads`` intra-op threads, timed on real examples."""
    baseline_kb = resident_kb()
    started = time.perf_counter()
    session = make_session(artifact, threads)
    load_latency_ms = (time.perf_counter() - started) * 1000
    specs = session_specs(session)
    names = [spec.name for spec in specs]
    examples, _ = read_examples(valset, specs)
    peak_kb = resident_kb()

    def measure_batch(batch: int, brief: bool) -> BatchTiming:
        nonlocal peak_kb
        feeds = to_feeds(rows(examples, batch), names)

        def run() -> object:
            return session.run(None, feeds)

        timing = time_briefly(run) if brief else time_batch(run, plan)
        peak_kb = max(peak_kb, resident_kb())
        return timing

    measured = batch_sizes_to_time(measure_batch, plan)
    p50 = {b: round(t.p50_ms, 4) for b, t in sorted(measured.items())}
    p99 = {b: round(t.p99_ms, 4) for b, t in sorted(measured.items())}
    throughput = {b: round(b * 1000 / max(p50[b], 1e-6), 1) for b in p50}
    return Measurement(
        load_latency_ms=round(load_latency_ms, 3),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        throughput_qps=throughput,
        saturation_qps=max(throughput.values()),
        max_useful_batch=max_useful_batch(throughput),
        peak_memory_mb=round(max(0, peak_kb - baseline_kb) / 1024, 2),
        size_bytes=artifact.stat().st_size,
        runs_per_batch={b: len(t.timings_ms) for b, t in sorted(measured.items())},
        profile_runs=sum(len(t.timings_ms) for t in measured.values()),
        p50_ci_pct=round(measured[1].ci_pct, 3),
        ci_pct_per_batch={b: round(t.ci_pct, 3) for b, t in sorted(measured.items())},
        hardware=hardware_description(threads),
    )


def measure_accuracy(
    artifact: Path,
    valset: Path,
    threads: int,
    metric: str = "top1",
    accuracy_from: int = 0,
    batch_sizes: tuple[int, ...] = (1,),
    reference: Path | None = None,
) -> AccuracyMeasurement:
    """Accuracy on the examples from ``accuracy_from`` on (those before it calibrated static
    INT8), at each of ``batch_sizes``; the lowest is recorded. ``reference``: the registered
    model's top-1 answers on the same examples (``reference_top1``), for ``agreement``."""
    if metric not in ACCURACY_METRICS:
        raise ValueError(f"unknown accuracy metric {metric!r}: use one of {ACCURACY_METRICS}")
    session = make_session(artifact, threads)
    specs = session_specs(session)
    names = [spec.name for spec in specs]
    examples, labels = read_examples(valset, specs)
    held_out, scored_labels = examples[accuracy_from:], labels[accuracy_from:]
    count = len(scored_labels)
    if count == 0:
        raise ValueError(f"no validation examples past the first {accuracy_from} to measure accuracy on")
    answers = np.load(reference, allow_pickle=False) if reference is not None else None
    if answers is not None and len(answers) != count:
        raise ValueError(f"the reference answers hold {len(answers)} examples; {count} are scored")
    correct: dict[int, int] = {}
    agreeing: dict[int, int] = {}
    for batch in sorted(set(batch_sizes)):
        correct[batch] = agreeing[batch] = 0
        for start in range(0, count, batch):
            logits = session.run(None, to_feeds(held_out[start : start + batch], names))[0]
            correct[batch] += top_k_correct(logits, scored_labels[start : start + batch], metric)
            if answers is not None:
                agreeing[batch] += int((np.argmax(logits, axis=1) == answers[start : start + batch]).sum())
    worst = min(correct.values())
    measured_agreement = answers is not None
    agreement_by_batch = {b: round(a / count, 6) for b, a in agreeing.items()} if measured_agreement else {}
    low, high = wilson_interval(worst, count)
    return AccuracyMeasurement(
        accuracy=round(worst / count, 6),
        accuracy_low=round(low, 6),
        accuracy_high=round(high, 6),
        accuracy_metric=metric,
        accuracy_examples=count,
        accuracy_by_batch={b: round(c / count, 6) for b, c in correct.items()},
        agreement=round(min(agreeing.values()) / count, 6) if measured_agreement else None,
        agreement_by_batch=agreement_by_batch,
    )


def reference_top1(source: Path, valset: Path, accuracy_from: int, threads: int) -> np.ndarray:
    """The registered model's own top-1 answers on the scored examples, computed once per
    registration: every variant's ``agreement`` is measured against them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # As anyone would run the registered file: onnxruntime's default (full) graph optimisation.
    session = ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
    specs = session_specs(session)
    names = [spec.name for spec in specs]
    examples, _ = read_examples(valset, specs)
    held_out = examples[accuracy_from:]
    answers = [
        np.argmax(session.run(None, to_feeds(held_out[start : start + REFERENCE_BATCH], names))[0], axis=1)
        for start in range(0, len(held_out), REFERENCE_BATCH)
    ]
    return np.concatenate(answers).astype(np.int64) if answers else np.zeros(0, dtype=np.int64)
