"""Measure one variant artifact at one thread count: load latency, latency per batch size,
saturation throughput, resident memory and accuracy.

Meant to run in a fresh child process per measurement, so that the memory it measures is the
variant's own and nothing else in the parent disturbs the timings. Peak memory is the resident
memory the variant adds over the bare process (imports and data loaded), sampled after the load
and after each batch size.
"""

from __future__ import annotations

import itertools
import os
import platform
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelless.runtime import make_session
from variants.recipes import ACCURACY_METRICS

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
WARMUP_RUNS = 3
MIN_RUNS = 5
SECONDS_PER_BATCH = 0.6  # stop a batch size's runs after this long, past MIN_RUNS
WORTH_IT_GAIN = 1.05  # a larger batch is worth it while it raises throughput by 5 % or more


@dataclass(frozen=True)
class Measurement:
    load_latency_ms: float
    latency_p50_ms: dict[int, float]
    latency_p99_ms: dict[int, float]
    throughput_qps: dict[int, float]  # batch * 1000 / p50: one instance, saturated
    saturation_qps: float
    max_useful_batch: int
    peak_memory_mb: float
    accuracy: float
    accuracy_metric: str
    accuracy_examples: int
    size_bytes: int
    runs_per_batch: dict[int, int]
    hardware: str


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


def measure(
    artifact: Path,
    valset: Path,
    threads: int,
    runs: int,
    metric: str = "top1",
    accuracy_from: int = 0,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
) -> Measurement:
    """``accuracy_from``: validation examples before this index calibrated static INT8, so every
    variant's accuracy is measured on the rest (the same examples for all of them)."""
    if metric not in ACCURACY_METRICS:
        raise ValueError(f"unknown accuracy metric {metric!r}: use one of {ACCURACY_METRICS}")
    baseline_kb = resident_kb()
    with np.load(valset, allow_pickle=False) as data:
        inputs = data["inputs"].astype(np.float32)
        labels = data["labels"].astype(np.int64)

    started = time.perf_counter()
    session = make_session(artifact, threads)
    load_latency_ms = (time.perf_counter() - started) * 1000
    peak_kb = resident_kb()
    input_name = session.get_inputs()[0].name

    p50: dict[int, float] = {}
    p99: dict[int, float] = {}
    counts: dict[int, int] = {}
    for batch in batch_sizes:
        sample = np.resize(inputs, (batch, *inputs.shape[1:])).astype(np.float32)
        for _ in range(WARMUP_RUNS):
            session.run(None, {input_name: sample})
        timings: list[float] = []
        deadline = time.perf_counter() + SECONDS_PER_BATCH
        while len(timings) < runs and (len(timings) < MIN_RUNS or time.perf_counter() < deadline):
            begin = time.perf_counter()
            session.run(None, {input_name: sample})
            timings.append((time.perf_counter() - begin) * 1000)
        p50[batch] = round(float(np.percentile(timings, 50)), 4)
        p99[batch] = round(float(np.percentile(timings, 99)), 4)
        counts[batch] = len(timings)
        peak_kb = max(peak_kb, resident_kb())
    throughput = {batch: round(batch * 1000 / max(p50[batch], 1e-6), 1) for batch in batch_sizes}

    correct = 0
    scored = labels[accuracy_from:]
    chunk = max(batch_sizes)
    for start in range(accuracy_from, len(inputs), chunk):
        logits = session.run(None, {input_name: inputs[start : start + chunk]})[0]
        correct += top_k_correct(logits, labels[start : start + chunk], metric)
    return Measurement(
        load_latency_ms=round(load_latency_ms, 3),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        throughput_qps=throughput,
        saturation_qps=max(throughput.values()),
        max_useful_batch=max_useful_batch(throughput),
        peak_memory_mb=round(max(0, peak_kb - baseline_kb) / 1024, 2),
        accuracy=round(correct / max(1, len(scored)), 6),
        accuracy_metric=metric,
        accuracy_examples=len(scored),
        size_bytes=artifact.stat().st_size,
        runs_per_batch=counts,
        hardware=hardware_description(threads),
    )
