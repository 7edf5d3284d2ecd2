"""The offline job runner on in-memory stores and a fake compute: one result per input, exactly
once, across duplicates, crashes at every step, lost leases, pauses and deadlines."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.exceptions import S3AccessDeniedError, ServiceUnavailableError, WorkerUnreachableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.offline.compute import Paused, RunResult, WorkerCompute
from modelless.offline.jobs import RESULT_SUFFIX, output_key, summary_key
from modelless.offline.objects import InMemoryObjectStore, WriteOutcome
from modelless.offline.runner import JobRunner, RunnerConfig, RunOutcome
from modelless.serving.invocation import Invocation, Reply
from modelless.types import (
    Decision,
    InstanceState,
    InstanceStats,
    JobStatus,
    OfflineJob,
    VariantProfile,
    WorkerState,
)
from tests.offline_kit import (
    APP,
    BUCKET,
    FakeClock,
    FakeCompute,
    digit_inputs,
    image_bytes,
    logits,
    npy,
    npz,
    publish,
    read_json,
    upload_npy_inputs,
    variant,
)

IN = "in/"
OUT = "out/"


class Crash(Exception):
    """Stands for the runner's process dying at this point."""


class CrashingObjects(InMemoryObjectStore):
    """Dies right after its ``crash_after``-th result write has landed (before the marker)."""

    crash_after: int | None = None
    written: int = 0

    def put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        outcome = super().put_once(bucket, key, body, owner, content_type)
        self.written += 1
        if self.crash_after is not None and self.written >= self.crash_after:
            self.crash_after = None
            raise Crash()
        return outcome


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> InMemoryMetadataStore:
    store = InMemoryMetadataStore(lease_clock=clock)
    publish(store, [variant()])
    return store


@pytest.fixture
def objects() -> CrashingObjects:
    objects = CrashingObjects()
    objects.create_bucket(BUCKET)
    return objects


def new_job(store: InMemoryMetadataStore, job_id: str = "job-1") -> OfflineJob:
    job = OfflineJob(job_id, APP, f"s3://{BUCKET}/{IN}", f"s3://{BUCKET}/{OUT}", min_accuracy=0.5)
    assert store.create_job(job)
    return job


def runner(
    store: InMemoryMetadataStore,
    objects: InMemoryObjectStore,
    compute: FakeCompute,
    clock: FakeClock,
    owner: str | None = None,
    **config: float,
) -> JobRunner:
    settings = {
        "max_rows": 4,
        "lease_s": 30.0,
        "heartbeat_s": 0.0,
        "keepalive": False,  # a thread on real time beside the fake clock: its own tests below
        "io_threads": 2,
        "group_inputs": 1,
        **config,
    }
    return JobRunner(
        store,
        objects,
        compute,
        RunnerConfig(**settings),  # type: ignore[arg-type]
        variants=store.list_variants,
        models=store.get_model,
        clock=clock,
        sleep=clock.sleep,
        owner=owner,
    )


def result_keys(objects: InMemoryObjectStore) -> list[str]:
    return sorted(k for k in objects.buckets[BUCKET] if k.startswith(OUT) and k.endswith(RESULT_SUFFIX))


@pytest.mark.parametrize("group_inputs", [1, 32])
def test_every_input_gets_one_result_and_the_job_a_summary(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock, group_inputs: int
) -> None:
    keys = upload_npy_inputs(objects, IN, 9)
    rows = digit_inputs(3, start=20)
    objects.put(BUCKET, f"{IN}batch.npz", npz(inputs=rows))
    objects.put(BUCKET, f"{IN}pictures/seven.png", image_bytes(digit_inputs(1, start=7)[0, 0]))
    new_job(store)
    compute = FakeCompute(variant())

    report = runner(store, objects, compute, clock, group_inputs=group_inputs).run("job-1")

    assert report.outcome is RunOutcome.COMPLETED and report.processed == 11
    assert len(result_keys(objects)) == 11
    # Keys follow the inputs' keys below the input prefix; contents are the model's answers.
    first = read_json(objects, output_key(IN, OUT, keys[0]))
    assert first["input"] == f"s3://{BUCKET}/{keys[0]}"
    assert first["variant"] == variant().variant_id and first["job"] == "job-1"
    np.testing.assert_allclose(first["outputs"], logits(digit_inputs(1)), rtol=1e-5, atol=1e-5)
    batch = read_json(objects, f"{OUT}batch.npz{RESULT_SUFFIX}")
    assert batch["predictions"] == np.argmax(logits(rows), axis=1).tolist()
    assert f"{OUT}pictures/seven.png{RESULT_SUFFIX}" in result_keys(objects)
    # Runs are batches of at most max_rows (4) rows.
    assert max(compute.runs) <= 4 and sum(compute.runs) == 9 + 3 + 1
    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.COMPLETED
    assert (job.total, job.done, job.errors, job.runs) == (11, 11, 0, 1)
    assert job.summary_key == f"s3://{BUCKET}/{summary_key(OUT, 'job-1')}"
    summary = read_json(objects, summary_key(OUT, "job-1"))
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (11, 11, 0)
    assert summary["variant"] == variant().variant_id and summary["errors"] == []
    assert store.job_lease_holder("job-1") is None


def test_bad_inputs_are_errors_of_their_own_and_the_job_completes(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 3)
    objects.put(BUCKET, f"{IN}broken.npy", b"\x93NUMPY garbage")
    objects.put(BUCKET, f"{IN}wrong-shape.npy", npy(np.zeros((2, 5), dtype=np.float32)))
    objects.put(BUCKET, f"{IN}notes.txt", b"hello")
    objects.put(BUCKET, f"{IN}broken.png", b"\x89PNG not really")
    new_job(store)

    report = runner(store, objects, FakeCompute(variant()), clock).run("job-1")

    assert report.outcome is RunOutcome.COMPLETED
    summary = read_json(objects, summary_key(OUT, "job-1"))
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (7, 3, 4)
    errors = {e["input"].rsplit("/", 1)[1]: e["error"] for e in summary["errors"]}
    assert set(errors) == {"broken.npy", "wrong-shape.npy", "notes.txt", "broken.png"}
    assert "shape [2, 5]" in errors["wrong-shape.npy"] and "takes [1, 8, 8]" in errors["wrong-shape.npy"]
    assert "unsupported input type '.txt'" in errors["notes.txt"]
    assert "not a decodable image" in errors["broken.png"]
    assert len(result_keys(objects)) == 3  # failed inputs get no result object


class LockedObjects(CrashingObjects):
    """S3 answering 403: on one input, or (``outputs_locked``) on every result write."""

    locked_input: str = f"{IN}item-0001.npy"
    outputs_locked: bool = False

    def get(self, bucket: str, key: str) -> bytes:
        if key == self.locked_input:
            raise S3AccessDeniedError(bucket, "read", key)
        return super().get(bucket, key)

    def put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        if self.outputs_locked:
            raise S3AccessDeniedError(bucket, "write", key)
        return super().put_once(bucket, key, body, owner, content_type)


def test_an_input_the_service_may_not_read_is_an_error_of_its_own(
    store: InMemoryMetadataStore, clock: FakeClock
) -> None:
    objects = LockedObjects()
    objects.create_bucket(BUCKET)
    upload_npy_inputs(objects, IN, 3)
    new_job(store)

    assert runner(store, objects, FakeCompute(variant()), clock).run("job-1").outcome is RunOutcome.COMPLETED

    summary = read_json(objects, summary_key(OUT, "job-1"))
    assert (summary["succeeded"], summary["failed"]) == (2, 1)
    assert "may not read s3://offline-bucket/in/item-0001.npy" in summary["errors"][0]["error"]


def test_outputs_the_service_may_not_write_fail_the_job_with_what_to_grant(
    store: InMemoryMetadataStore, clock: FakeClock
) -> None:
    objects = LockedObjects()
    objects.create_bucket(BUCKET)
    objects.outputs_locked = True
    upload_npy_inputs(objects, IN, 3)
    new_job(store)

    report = runner(store, objects, FakeCompute(variant()), clock).run("job-1")

    assert report.outcome is RunOutcome.FAILED
    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.FAILED and "may not write" in job.message
    assert store.job_lease_holder("job-1") is None


def test_a_batch_the_worker_refuses_is_retried_input_by_input(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 3)
    objects.put(BUCKET, f"{IN}item-0001.npy", npy(np.full((1, 8, 8), 7.0, dtype=np.float32)))
    new_job(store)
    compute = FakeCompute(variant(), refuse_rows_above=2.0)

    runner(store, objects, compute, clock).run("job-1")

    summary = read_json(objects, summary_key(OUT, "job-1"))
    assert (summary["succeeded"], summary["failed"]) == (2, 1)
    assert "item-0001.npy" in summary["errors"][0]["input"]
    assert "refused" in summary["errors"][0]["error"]


def test_a_duplicate_run_of_a_finished_job_does_nothing(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 5)
    new_job(store)
    compute = FakeCompute(variant())
    runner(store, objects, compute, clock).run("job-1")
    runs = len(compute.runs)

    again = runner(store, objects, compute, clock).run("job-1")

    assert again.outcome is RunOutcome.COMPLETED and again.processed == 0
    assert len(compute.runs) == runs
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in result_keys(objects))


@pytest.mark.parametrize("crash_after", [1, 2, 4, 5, 6])
def test_a_crash_at_any_write_resumes_with_every_output_written_exactly_once(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock, crash_after: int
) -> None:
    """Crash right after a result object landed but before its done marker (and, at 6, after
    the summary landed but before the job was marked completed)."""
    upload_npy_inputs(objects, IN, 5)
    new_job(store)
    compute = FakeCompute(variant())
    objects.crash_after = crash_after
    with pytest.raises(Crash):
        runner(store, objects, compute, clock, owner="first").run("job-1")
    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.RUNNING and "interrupted" in job.message

    report = runner(store, objects, compute, clock, owner="second").run("job-1")

    assert report.outcome is RunOutcome.COMPLETED
    assert len(result_keys(objects)) == 5
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in result_keys(objects))
    assert objects.buckets[BUCKET][summary_key(OUT, "job-1")].writes == 1
    job = store.get_job("job-1")
    assert job is not None and (job.done, job.total, job.runs) == (5, 5, 2)
    # The second run redid only what the first had not marked done.
    assert store.done_items("job-1") == {f"{IN}item-{i:04d}.npy" for i in range(5)}


def test_a_crashed_runners_lease_holds_the_job_until_it_expires(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 3)
    new_job(store)
    assert store.acquire_job_lease("job-1", "crashed-runner", 30.0)  # died holding it

    busy = runner(store, objects, FakeCompute(variant()), clock).run("job-1")
    assert busy.outcome is RunOutcome.BUSY and "crashed-runner" in busy.message
    clock.advance(31.0)
    done = runner(store, objects, FakeCompute(variant()), clock).run("job-1")

    assert done.outcome is RunOutcome.COMPLETED and len(result_keys(objects)) == 3


def test_the_input_list_is_fixed_when_the_job_first_runs(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 4)
    new_job(store)
    objects.crash_after = 2
    with pytest.raises(Crash):
        runner(store, objects, FakeCompute(variant()), clock).run("job-1")
    objects.put(BUCKET, f"{IN}late-arrival.npy", npy(digit_inputs(1)[0]))

    runner(store, objects, FakeCompute(variant()), clock).run("job-1")

    summary = read_json(objects, summary_key(OUT, "job-1"))
    assert summary["total"] == 4
    assert f"{OUT}late-arrival.npy{RESULT_SUFFIX}" not in result_keys(objects)


def test_a_runner_that_lost_its_lease_stops(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 8)
    new_job(store)

    class Thief(FakeCompute):
        def acquire(self, variant, rows):  # type: ignore[no-untyped-def]
            if self.acquires == 0:
                # The runner stalls past its lease; another takes the job meanwhile.
                clock.advance(31.0)
                assert store.acquire_job_lease("job-1", "other", 30.0)
            return super().acquire(variant, rows)

    report = runner(store, objects, Thief(variant()), clock, owner="slow").run("job-1")

    assert report.outcome is RunOutcome.LOST_LEASE
    assert store.job_lease_holder("job-1") == "other"  # its release did not drop the other's lease
    assert len(store.done_items("job-1")) < 8


class LeaseThief(FakeCompute):
    """At its first acquire the runner stalls past its lease: meanwhile another runner takes the
    job and completes it. Then (``crash``) the stalled runner's next result write may fail."""

    def __init__(
        self, store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock, crash: bool = False
    ) -> None:
        super().__init__(variant())
        self.store, self.objects, self.clock, self.crash = store, objects, clock, crash

    def acquire(self, wanted: VariantProfile, rows: int) -> Decision | Paused:
        if self.acquires == 0:
            self.clock.advance(31.0)  # past the 30 s lease
            other = runner(self.store, self.objects, FakeCompute(self.chosen), self.clock, owner="other")
            assert other.run("job-1").outcome is RunOutcome.COMPLETED
            if self.crash:
                self.objects.crash_after = self.objects.written + 1
        return super().acquire(wanted, rows)


@pytest.mark.parametrize("crash", [False, True])
def test_a_runner_that_lost_its_lease_never_writes_over_the_new_holders_record(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock, crash: bool
) -> None:
    """Its heartbeat (and, crashing, its "interrupted" note) would write "running" back over the
    "completed" the other runner wrote: every record write is conditional on the lease."""
    upload_npy_inputs(objects, IN, 8)
    new_job(store)
    slow = runner(store, objects, LeaseThief(store, objects, clock, crash), clock, owner="slow")

    if crash:
        with pytest.raises(Crash):
            slow.run("job-1")
    else:
        assert slow.run("job-1").outcome is RunOutcome.LOST_LEASE

    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.COMPLETED, job
    assert (job.done, job.total, job.runs) == (8, 8, 2) and "interrupted" not in job.message
    assert store.unfinished_jobs() == []
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in result_keys(objects))


def test_the_runner_waits_while_paused_and_resumes(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 8)  # two batches: the second waits
    new_job(store)
    seen: list[tuple[bool, str]] = []

    class Watching(FakeCompute):
        def acquire(self, variant, rows):  # type: ignore[no-untyped-def]
            job = store.get_job("job-1")
            assert job is not None
            seen.append((job.paused, job.pause_reason))
            return super().acquire(variant, rows)

    compute = Watching(variant(), verdicts=[None, *[Paused("w-1: online utilisation 55% > 40%")] * 8])
    report = runner(store, objects, compute, clock, poll_s=0.5).run("job-1")

    assert report.outcome is RunOutcome.COMPLETED
    assert report.paused_s == pytest.approx(4.0)  # 8 polls of 0.5 s
    assert (True, "w-1: online utilisation 55% > 40%") in seen
    job = store.get_job("job-1")
    assert job is not None and not job.paused and job.active_s < clock.now - (job.started_at or 0)


def test_worker_failures_are_retried_with_backoff(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 2)
    new_job(store)
    compute = FakeCompute(
        variant(), failures=[WorkerUnreachableError("gone"), ServiceUnavailableError("batch timed out")]
    )
    started = clock.now

    report = runner(store, objects, compute, clock, retry_s=1.0).run("job-1")

    assert report.outcome is RunOutcome.COMPLETED and report.failed == 0
    assert clock.now - started == pytest.approx(3.0)  # 1 s, then 2 s


def test_a_deadline_stops_the_run_cleanly_and_the_next_run_finishes(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 12)
    new_job(store)
    compute = FakeCompute(variant(), verdicts=[None, None, Paused("busy")] + [Paused("busy")] * 100)

    first = runner(store, objects, compute, clock, poll_s=1.0, yield_margin_s=2.0).run(
        "job-1", deadline=clock.now + 10.0
    )
    assert first.outcome is RunOutcome.YIELDED
    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.RUNNING and 0 < len(store.done_items("job-1")) < 12
    assert store.job_lease_holder("job-1") is None  # handed back for the next run

    compute.verdicts.clear()
    second = runner(store, objects, compute, clock).run("job-1", deadline=clock.now + 600)
    assert second.outcome is RunOutcome.COMPLETED
    assert len(result_keys(objects)) == 12
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in result_keys(objects))


def test_the_variant_is_pinned_at_the_first_run(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 4)
    new_job(store)
    objects.crash_after = 1
    with pytest.raises(Crash):
        runner(store, objects, FakeCompute(variant()), clock).run("job-1")
    other = variant(suffix="-other")
    publish_more = [*store.list_variants(APP), other]
    store._variants[APP] = {v.variant_id: v for v in publish_more}

    runner(store, objects, FakeCompute(other), clock).run("job-1")

    results = [read_json(objects, k) for k in result_keys(objects)]
    assert {r["variant"] for r in results} == {variant().variant_id}


def test_a_vanished_variant_fails_the_job_with_the_reason(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    upload_npy_inputs(objects, IN, 2)
    job = new_job(store)
    job.variant_id = "offline-app/linear/gone/cpu-1t"
    store.put_job(job)

    report = runner(store, objects, FakeCompute(variant()), clock).run("job-1")

    assert report.outcome is RunOutcome.FAILED
    failed = store.get_job("job-1")
    assert failed is not None and failed.status is JobStatus.FAILED and "no longer exists" in failed.message


def test_an_empty_input_prefix_completes_with_an_empty_summary(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    new_job(store)
    report = runner(store, objects, FakeCompute(variant()), clock).run("job-1")
    assert report.outcome is RunOutcome.COMPLETED
    assert read_json(objects, summary_key(OUT, "job-1"))["total"] == 0


def test_a_watchs_job_takes_the_inputs_that_arrive_while_it_finishes(
    store: InMemoryMetadataStore, objects: CrashingObjects, clock: FakeClock
) -> None:
    """An object lands under the watched prefix while the runner works on the last ones: the
    runner's "completed" is refused (an input is not done) and it goes on with the new one."""
    keys = upload_npy_inputs(objects, IN, 2)
    job = OfflineJob(
        "watch-1",
        APP,
        f"s3://{BUCKET}/{IN}",
        f"s3://{BUCKET}/{OUT}",
        min_accuracy=0.5,
        source=f"watch:s3://{BUCKET}/{IN}",
    )
    assert store.create_job(job)
    store.add_job_items("watch-1", keys, "queued")

    class ArrivingMeanwhile(FakeCompute):
        def run(self, decision: Decision, inputs: np.ndarray, correlation_id: str) -> RunResult:
            if not self.runs:  # an S3 event, handled while the runner is busy
                objects.put(BUCKET, f"{IN}late.npy", npy(digit_inputs(1)[0]))
                store.add_job_items("watch-1", [f"{IN}late.npy"], "queued")
            return super().run(decision, inputs, correlation_id)

    report = runner(store, objects, ArrivingMeanwhile(variant()), clock, group_inputs=32).run("watch-1")

    assert report.outcome is RunOutcome.COMPLETED and report.processed == 3
    finished = store.get_job("watch-1")
    assert finished is not None and finished.status is JobStatus.COMPLETED
    assert (finished.done, finished.total, finished.runs) == (3, 3, 1)
    assert f"{OUT}late.npy{RESULT_SUFFIX}" in result_keys(objects)
    assert read_json(objects, summary_key(OUT, "watch-1"))["total"] == 3
    assert store.job_items("watch-1")  # a watch's markers stay: they are how it knows its objects


# --- liveness: the keepalive thread, on real time ------------------------------------------------


class SlowWorker(FakeCompute):
    """Its first batch takes ``block_s`` (a worker waiting long for an idle moment); meanwhile
    ``during`` runs, once, ``check_after_s`` into it. Notes how far the job's heartbeat moved."""

    def __init__(self, store: InMemoryMetadataStore, block_s: float, **during: Any) -> None:
        super().__init__(variant())
        self.store, self.block_s = store, block_s
        self.during = during.get("during")
        self.check_after_s = float(during.get("check_after_s", 0.0))
        self.heartbeat_moved_s: float | None = None

    def run(self, decision: Decision, inputs: np.ndarray, correlation_id: str) -> RunResult:
        if self.heartbeat_moved_s is None:
            before = self.heartbeat()
            time.sleep(self.check_after_s)  # the batch's own duration, standing for the worker's
            if self.during is not None:
                self.during()
            time.sleep(self.block_s - self.check_after_s)
            self.heartbeat_moved_s = self.heartbeat() - before
        return super().run(decision, inputs, correlation_id)

    def heartbeat(self) -> float:
        job = self.store.get_job("job-1")
        assert job is not None and job.heartbeat_at is not None
        return job.heartbeat_at


def real_time_runner(
    store: InMemoryMetadataStore, objects: InMemoryObjectStore, compute: FakeCompute, **config: Any
) -> JobRunner:
    settings = {
        "max_rows": 4,
        "lease_s": 0.8,  # renewed every 0.05 s: a busy machine's scheduling delays stay well inside it
        "heartbeat_s": 0.05,
        "io_threads": 2,
        "group_inputs": 1,
        **config,
    }
    return JobRunner(
        store,
        objects,
        compute,
        RunnerConfig(**settings),
        variants=store.list_variants,
        models=store.get_model,
    )


@pytest.mark.parametrize("keepalive", [True, False])
def test_a_batch_longer_than_the_lease_keeps_it_and_the_heartbeat_through_the_keepalive(
    objects: CrashingObjects, keepalive: bool
) -> None:
    store = InMemoryMetadataStore()  # leases on real time
    publish(store, [variant()])
    upload_npy_inputs(objects, IN, 2)
    new_job(store)
    compute = SlowWorker(store, block_s=2.0)

    report = real_time_runner(store, objects, compute, keepalive=keepalive).run("job-1")

    if keepalive:
        assert report.outcome is RunOutcome.COMPLETED
        assert compute.heartbeat_moved_s is not None and compute.heartbeat_moved_s >= 1.5
    else:  # what the keepalive prevents: a 0.8 s lease lost under a 2 s batch
        assert report.outcome is RunOutcome.LOST_LEASE
        assert compute.heartbeat_moved_s == 0.0


def test_a_runner_quiet_past_max_quiet_lets_its_lease_expire(objects: CrashingObjects) -> None:
    """A main thread stuck in a batch for longer than any batch takes is hung: its keepalive
    stops renewing, so that another runner can take the job."""
    store = InMemoryMetadataStore()
    publish(store, [variant()])
    upload_npy_inputs(objects, IN, 2)
    new_job(store)
    taken: list[bool] = []
    compute = SlowWorker(
        store,
        block_s=2.0,
        check_after_s=1.5,  # past max_quiet_s and then the lease
        during=lambda: taken.append(store.acquire_job_lease("job-1", "other", 30.0)),
    )

    report = real_time_runner(store, objects, compute, max_quiet_s=0.3).run("job-1")

    assert taken == [True] and report.outcome is RunOutcome.LOST_LEASE
    assert store.job_lease_holder("job-1") == "other"


# --- where a batch runs after its worker failed ----------------------------------------------------


class DeadWorkers:
    """An invoker whose workers at ``dead`` addresses do not answer."""

    def __init__(self, *dead: str) -> None:
        self.dead = set(dead)
        self.calls: list[str] = []

    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply:
        self.calls.append(address)
        raise WorkerUnreachableError(f"{address} does not answer")

    def close(self) -> None:
        pass


def reporting(clock: FakeClock, *worker_ids: str) -> list[WorkerState]:
    """Workers reporting now, each with the variant loaded and idle."""
    active = InstanceStats(variant().variant_id, InstanceState.ACTIVE, 0.0, 1.0, 2.0, 0)
    return [WorkerState(w, "cpu", f"http://{w}", 0.0, 1, clock.now, (active,)) for w in worker_ids]


def test_a_worker_whose_batch_failed_is_left_out_of_the_next_decisions(
    store: InMemoryMetadataStore, clock: FakeClock
) -> None:
    from modelless.dispatch.live_view import FAILED_WORKER_HOLD_S

    workers = ["w-1", "w-2"]
    compute = WorkerCompute(
        store, DEFAULT_POOLS, lambda: reporting(clock, *workers), DeadWorkers(), clock=clock
    )
    first = compute.acquire(variant(), 1)
    assert isinstance(first, Decision) and first.worker_id in workers
    with pytest.raises(WorkerUnreachableError):
        compute.run(first, digit_inputs(1), "c-1")

    # Its report is still fresh (it died a moment ago): the retry goes to the other worker.
    retry = compute.acquire(variant(), 1)
    assert isinstance(retry, Decision) and retry.worker_id != first.worker_id
    # Alone, it is not tried again until its hold ends: the job waits, saying why.
    workers = [str(first.worker_id)]
    waiting = compute.acquire(variant(), 1)
    assert isinstance(waiting, Paused) and "its last offline run failed" in waiting.reason
    clock.advance(FAILED_WORKER_HOLD_S)
    again = compute.acquire(variant(), 1)
    assert isinstance(again, Decision) and again.worker_id == first.worker_id
