"""Offline work never hurts online queries (docs/ARCHITECTURE.md §6, INFaaS §6.3.2), on real processes: a real
worker process, an offline job run by the embedded stack's child-process runner (its settings
are the deployment's defaults: the throttle pauses above 40 % online utilisation or 2x the
profiled online latency), Redis, and moto's S3.

1. **baseline**: paced online queries, alone, for their latency;
2. **busy**: a saturating online load is added; the job, submitted now, pauses with the
   throttle's reason and writes nothing;
3. **co-located**: the saturating load stops, the paced load goes on; the job resumes and
   completes beside it, every result exactly once, its runs in the worker's background lane;
4. **baseline again**: the paced load alone once more, after the job.

Online queries go straight to the worker's online lane, as the gateway sends them once selection
has chosen it: the test measures what offline work does to online queries, not what selection
does with an instance the busy phase overloaded (with no Lambda tier here, it would refuse them
until the instance recovers).

The online p99 over the whole co-located period (from the moment the worker is left to the paced
load until the job completes) must stay within its budget, which is set from the baseline:

    budget = baseline p99 + 2 x (profiled p99 + 1 ms) + the profiled time of one offline run

which is what the design promises. A client sees the transport and the machine's noise (both in
the baseline p99) plus the worker's queue and inference time; beside offline work, the throttle
keeps the latter under 2x (profiled p99 + 1 ms), its pause threshold (throttle.py; the worker's
report is the same measure), except for one offline run: the worker never preempts a run already
started, and the throttle acts on what the worker has reported, so an online query arriving then
waits for it (the runner sizes its runs by their profiled time). The baseline p99 is the higher
of the two baselines, before and after the job: what the machine's own noise (other processes on
a shared 2-core machine) does to online queries during the test, without offline work. Every term
is measured here and now, so the test means the same on a fast and on a slow, busy machine; it
asserts a bound the design promises, never a speed.
"""

from __future__ import annotations

import http.client
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import onnxruntime as ort

from modelless.config import Settings
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.child_processes import ChildProcessRunner
from modelless.offline.jobs import RESULT_SUFFIX, JobSpec
from modelless.offline.runner import RunOutcome, RunReport
from modelless.offline.throttle import ThrottleConfig
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import Invocation
from modelless.serving.monitoring import INTERFERED_SLACK_MS
from modelless.serving.wire import FRAMES_MEDIA_TYPE, encode_frames
from modelless.types import JobStatus, VariantProfile
from tests.functional.offline_fixtures import Buckets, offline_service, redis_url
from tests.functional.workers_kit import (
    APP,
    Setup,
    make_variant,
    publish_linear_model,
    sample_inputs,
    start_worker,
)
from tests.models import wide_model
from tests.waiting import scaled, wait_for

# The throttle's latency threshold: the child runner's, from the deployment's default settings.
PAUSE_LATENCY_RATIO = Settings().offline_pause_latency_ratio
ONLINE_QPS = 40.0
BASELINE_S = 5.0
# Enough inputs that the job runs for several seconds beside the paced load at ONLINE_QPS, on a
# fast machine too: the co-located p99 needs MIN_COLOCATED_QUERIES queries to mean anything
# (600 inputs ran in 4.7 s in CI once: 187 queries; this many leave room above the 5 s needed).
JOB_INPUTS = 1000
MIN_COLOCATED_QUERIES = 200  # fewer, and a p99 is no more than the slowest one or two
# How long the job may take beside the paced load: its runs (10-30 s on the 2-core VM) plus
# the throttle's pauses. The job's own work pushes the paced load's p99 near the pause threshold,
# so it pauses and resumes many times, and a pause soon after a resume doubles the next one's
# minimum, up to ``max_pause_s`` (throttle.py): here one such job ran 11.5 s of 115.6 s, and in
# CI one took over 90 s. Room for the runs and several pauses at the longest.
COMPLETE_WITHIN_S = 90.0 + 5 * ThrottleConfig().max_pause_s
WIDE_KEY = f"apps/{APP}/linear/variants/wide.onnx"
# What the throttle says when it pauses (throttle.next_state), at the deployment's defaults.
THROTTLE_REASON = re.compile(
    r"online utilisation \d+% > 40%|online p99 at [\d.]+x its profile > 2x|is (overloaded|interfered)"
)


def measured_profile() -> VariantProfile:
    """A variant of the wide model profiled here and now, as the registrar would (median per
    batch size). Its p99 is generous (3x the median + 5 ms): on a shared 2-core machine a tight
    one has the worker judge its instance Interfered for other processes' noise alone, and
    selection (with no Lambda tier here) then has nowhere to send an online query."""
    session = ort.InferenceSession(wide_model(), providers=["CPUExecutionProvider"])
    p50: dict[int, float] = {}
    for batch in (1, 2, 4, 8, 16, 32):
        inputs = np.repeat(sample_inputs(1), batch, axis=0)
        session.run(None, {"input": inputs})
        times = []
        for _ in range(7):
            started = time.perf_counter()
            session.run(None, {"input": inputs})
            times.append((time.perf_counter() - started) * 1000)
        p50[batch] = statistics.median(times)
    base = make_variant(artifact_key=WIDE_KEY, suffix="-wide")
    return VariantProfile(
        **{
            **base.__dict__,
            "size_bytes": len(wide_model()),
            "load_latency_ms": 50.0,
            "latency_p50_ms": p50,
            "latency_p99_ms": {b: 3 * ms + 5.0 for b, ms in p50.items()},
        }
    )


@dataclass
class PacedLoad:
    """Online queries to the worker at a steady rate, from two threads; every query's finish
    time and latency kept, and every failure."""

    address: str
    variant: VariantProfile
    invoker: HttpWorkerInvoker
    qps: float
    samples: list[tuple[float, float]] = field(default_factory=list)  # (finished at, ms)
    failures: list[tuple[float, str]] = field(default_factory=list)  # (failed at, why)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(2):
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _loop(self, index: int) -> None:
        invocation = Invocation(self.variant, sample_inputs(1), f"paced-{index}")
        next_at = time.monotonic() + index / (2 * self.qps)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.invoker.invoke(self.address, invocation, 30.0)
                self.samples.append((time.time(), (time.perf_counter() - started) * 1000))
            except Exception as error:
                self.failures.append((time.time(), f"{type(error).__name__}: {error}"))
            next_at += 2 / self.qps  # two threads share the rate
            self.stop.wait(max(0.0, next_at - time.monotonic()))
            if time.monotonic() - next_at > 1.0:
                next_at = time.monotonic()  # fell behind (a stall): no burst to catch up

    def between(self, start: float, end: float) -> list[float]:
        return [ms for at, ms in list(self.samples) if start <= at <= end]

    def failed_between(self, start: float, end: float) -> list[str]:
        return [why for at, why in list(self.failures) if start <= at <= end]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(scaled(10))


# Enough callers that the instance never idles between batches, with a margin over the
# throttle's 40 % on a busy 2-core machine (four left it hovering near the threshold).
SATURATING_CALLERS = 8


@dataclass
class SaturatingLoad:
    """Online queries sent straight to the worker, back to back from eight threads: its instance
    always has some queued, so it is busy all the time (its worker's online utilisation as high
    as one instance of its two slots takes it: 50 %)."""

    address: str
    variant: VariantProfile
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for _ in range(SATURATING_CALLERS):
            thread = threading.Thread(target=self._loop, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _loop(self) -> None:
        # The frames encoded once and the replies not decoded: on a 2-core machine every
        # microsecond these callers spend between queries is a gap in the instance's busy time,
        # and the load is here to keep it busy (the paced load measures through the invoker).
        body = encode_frames(Invocation(self.variant, sample_inputs(1), "saturating-load").to_message())
        parts = urlsplit(self.address)
        connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30.0)
        headers = {"Content-Type": FRAMES_MEDIA_TYPE, "Accept": FRAMES_MEDIA_TYPE}
        try:
            while not self.stop.is_set():
                connection.request("POST", "/invoke", body, headers)
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status
                self.sent += 1
        finally:
            connection.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(scaled(30))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(values: list[float]) -> str:
    return (
        f"{len(values)} queries, p50 {statistics.median(values):.1f} ms, "
        f"p99 {percentile(values, 0.99):.1f} ms, max {max(values):.1f} ms"
    )


def test_an_offline_job_yields_to_online_load_and_completes_with_online_p99_within_budget(
    setup: Setup,
    pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
) -> None:
    LocalModelRepository(Path(setup.repository_url)).put(WIDE_KEY, wide_model())
    variant = measured_profile()
    publish_linear_model(redis_store, variant)
    redis_store.create_app(APP, "not-a-real-key-hash")
    redis_store.set_offline_buckets(APP, [buckets.data])
    worker = start_worker(pool, redis_store)
    keys = buckets.upload_inputs("in/", JOB_INPUTS)
    invoker = HttpWorkerInvoker()
    paced = PacedLoad(worker.address, variant, invoker, ONLINE_QPS)
    saturating = SaturatingLoad(worker.address, variant)
    service = offline_service(redis_store)
    run_job = ChildProcessRunner(redis_url(redis_store))  # the deployment's default settings
    reports: list[RunReport] = []
    runner: threading.Thread | None = None
    try:
        # The worker loads the variant at its first query (a cold start, not measured).
        invoker.invoke(worker.address, Invocation(variant, sample_inputs(1), "load"), 120.0)
        paced.start()
        time.sleep(2.0)  # warm-up: connections, caches, the worker's first reports
        baseline_from = time.time()
        time.sleep(BASELINE_S)
        baseline_before = paced.between(baseline_from, time.time())

        # Busy: the worker's online utilisation (or its instance's state) passes the throttle's
        # threshold; the job submitted now waits, says why, and writes nothing.
        saturating.start()
        wait_for(
            redis_store.list_workers,
            30.0,  # a report window or more
            "the saturating load to show in the worker's report",
            interval_s=0.1,
            until=lambda workers: any(
                w.online_utilisation > 0.40 or any(i.state.value != "active" for i in w.instances)
                for w in workers
            ),
        )
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        runner = threading.Thread(target=lambda: reports.append(run_job(job.job_id)), daemon=True)
        runner.start()

        def paused() -> bool:
            current = redis_store.get_job(job.job_id)
            return current is not None and current.paused

        wait_for(paused, 20.0, "the job to pause beside the saturating load", interval_s=0.1)
        time.sleep(1.0)
        waiting = redis_store.get_job(job.job_id)
        assert waiting is not None and waiting.paused, (waiting, redis_store.list_workers())
        assert THROTTLE_REASON.search(waiting.pause_reason), waiting.pause_reason
        assert redis_store.job_progress(job.job_id)[0] == 0 and buckets.versions("out/") == {}

        # Co-located: the paced load alone again (every saturating query has returned); the job
        # resumes and completes beside it.
        saturating.close()
        calm_from = time.time()

        def job_now() -> tuple[bool, str]:
            """Whether the run has reported, and where the job stands (what a timeout shows)."""
            current = redis_store.get_job(job.job_id)
            done, errors = redis_store.job_progress(job.job_id)
            standing = "running"
            if current is not None and current.paused:
                standing = f"paused ({current.pause_reason})"
            return bool(reports), f"{done} done, {errors} errors of {JOB_INPUTS}, {standing}"

        wait_for(
            job_now,
            COMPLETE_WITHIN_S,
            "the job to complete beside the paced load",
            interval_s=0.5,
            until=lambda state: state[0],
        )
        finished = redis_store.get_job(job.job_id)
        assert finished is not None and finished.finished_at is not None
        colocated = paced.between(calm_from, finished.finished_at)

        # The paced load alone again: the machine's noise, after.
        after_from = time.time()
        time.sleep(BASELINE_S)
        baseline_after = paced.between(after_from, time.time())
    finally:
        paced.close()
        saturating.close()
        run_job.close()
        if runner is not None:
            runner.join(scaled(30))
        service.close()
        invoker.close()

    [report] = reports
    assert report.outcome is RunOutcome.COMPLETED, report
    assert finished.status is JobStatus.COMPLETED and (finished.done, finished.errors) == (JOB_INPUTS, 0)
    versions = buckets.versions("out/")
    assert len([k for k in versions if k.endswith(RESULT_SUFFIX)]) == len(keys)
    assert set(versions.values()) == {1}, "a result was written twice"
    stats = httpx.get(f"{worker.address}/stats", timeout=5).json()["batching"][variant.variant_id]
    assert stats["background_rows"] >= JOB_INPUTS  # offline runs went through the background lane
    assert paced.failures == [], paced.failures[:3]  # no online query failed

    # The co-located p99 against the budget set from the baseline (see the module's docstring).
    run_ms = variant.latency_ms(finished.batch)
    baseline_p99 = max(percentile(baseline_before, 0.99), percentile(baseline_after, 0.99))
    throttled_ms = PAUSE_LATENCY_RATIO * (variant.latency_ms(1) + INTERFERED_SLACK_MS)
    budget_ms = baseline_p99 + throttled_ms + run_ms
    print(
        f"\nonline alone, before:  {describe(baseline_before)}\n"
        f"beside the job:        {describe(colocated)}\n"
        f"online alone, after:   {describe(baseline_after)}\n"
        f"budget: {baseline_p99:.1f} + {throttled_ms:.1f} + one offline run {run_ms:.1f} "
        f"= {budget_ms:.1f} ms; job: {JOB_INPUTS} inputs, {finished.active_s:.1f} s running of "
        f"{finished.finished_at - (finished.started_at or 0):.1f} s, {finished.runs} run(s), "
        f"batch {finished.batch}; {saturating.sent} saturating queries"
    )
    assert len(colocated) >= MIN_COLOCATED_QUERIES, "too few online queries beside the job to judge"
    assert percentile(colocated, 0.99) <= budget_ms, "online p99 beside the offline job exceeded its budget"
