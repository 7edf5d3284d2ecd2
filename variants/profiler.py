"""Measure one variant artifact: load latency, latency per batch size, peak memory, accuracy.

Meant to run in a fresh child process per artifact, so that the memory it measures is the
variant's own and nothing else in the parent disturbs the timings. Peak memory is the resident
memory the variant adds over the bare process (imports and data loaded), sampled after the load
and after each batch size.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelless.runtime import make_session

BATCH_SIZES = (1, 2, 4, 8)
WARMUP_RUNS = 3
MAX_SECONDS_PER_BATCH = 2.0


@dataclass(frozen=True)
class Measurement:
    load_latency_ms: float
    latency_p50_ms: dict[int, float]
    latency_p99_ms: dict[int, float]
    peak_memory_mb: float
    accuracy: float
    size_bytes: int
    runs_per_batch: dict[int, int]
    hardware: str


def hardware_description(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {cpu}, {os.cpu_count()} cores, {threads} intra-op thread(s)"


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


def measure(artifact: Path, valset: Path, threads: int, runs: int) -> Measurement:
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
    for batch in BATCH_SIZES:
        sample = np.resize(inputs, (batch, *inputs.shape[1:])).astype(np.float32)
        for _ in range(WARMUP_RUNS):
            session.run(None, {input_name: sample})
        timings: list[float] = []
        deadline = time.perf_counter() + MAX_SECONDS_PER_BATCH
        while len(timings) < runs and (len(timings) < 5 or time.perf_counter() < deadline):
            begin = time.perf_counter()
            session.run(None, {input_name: sample})
            timings.append((time.perf_counter() - begin) * 1000)
        p50[batch] = round(float(np.percentile(timings, 50)), 4)
        p99[batch] = round(float(np.percentile(timings, 99)), 4)
        counts[batch] = len(timings)
        peak_kb = max(peak_kb, resident_kb())

    correct = 0
    largest = max(BATCH_SIZES)
    for start in range(0, len(inputs), largest):
        logits = session.run(None, {input_name: inputs[start : start + largest]})[0]
        correct += int((np.argmax(logits, axis=1) == labels[start : start + largest]).sum())
    return Measurement(
        load_latency_ms=round(load_latency_ms, 3),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        peak_memory_mb=round(max(0, peak_kb - baseline_kb) / 1024, 2),
        accuracy=round(correct / len(labels), 6),
        size_bytes=artifact.stat().st_size,
        runs_per_batch=counts,
        hardware=hardware_description(threads),
    )
