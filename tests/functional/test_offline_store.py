"""The offline-job part of the metadata store contract, on both backends (in memory, and a real
Redis): job records, the fixed input list, done markers set and counted once, leases."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from modelless.metadata.base import JobSave, MetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.types import JobStatus, OfflineJob


def job(job_id: str = "job-1", app_id: str = "app", created_at: float = 1.0) -> OfflineJob:
    return OfflineJob(job_id, app_id, "s3://b/in/", "s3://b/out/", 0.5, created_at=created_at)


def test_a_job_is_created_once_and_listed_newest_first(any_store: MetadataStore) -> None:
    assert any_store.create_job(job("job-1", created_at=1.0))
    assert not any_store.create_job(job("job-1", created_at=5.0))  # a duplicate: nothing written
    assert any_store.create_job(job("job-2", created_at=2.0))
    assert any_store.create_job(job("job-3", "other-app"))
    assert [j.job_id for j in any_store.list_jobs("app")] == ["job-2", "job-1"]
    stored = any_store.get_job("job-1")
    assert stored == job("job-1", created_at=1.0)
    assert any_store.get_job("nope") is None


def test_finished_jobs_leave_the_unfinished_set(any_store: MetadataStore) -> None:
    for job_id in ("job-1", "job-2"):
        any_store.create_job(job(job_id))
    done = job("job-1")
    done.status = JobStatus.COMPLETED
    any_store.put_job(done)
    assert any_store.unfinished_jobs() == ["job-2"]
    stored = any_store.get_job("job-1")
    assert stored is not None and stored.status is JobStatus.COMPLETED


def test_the_first_input_list_recorded_is_the_jobs(any_store: MetadataStore) -> None:
    keys = [f"in/{i:05d}.npy" for i in range(2500)]  # more than one write chunk
    assert any_store.fix_job_items("job-1", keys) == keys
    assert any_store.fix_job_items("job-1", ["in/other.npy"]) == keys
    assert any_store.job_items("job-1") == keys
    assert any_store.job_items("job-2") == []


def test_done_markers_are_set_and_counted_once(any_store: MetadataStore) -> None:
    first = {"in/a": ("out/a.result.json", ""), "in/b": ("", "not a readable .npy file")}
    assert any_store.mark_items("job-1", first) == 2
    # A rerun marks the same inputs (one of them now differently) and one more: only the new counts.
    again = {"in/a": ("out/a.result.json", ""), "in/b": ("out/b.result.json", ""), "in/c": ("out/c", "")}
    assert any_store.mark_items("job-1", again) == 1
    assert any_store.done_items("job-1") == {"in/a", "in/b", "in/c"}
    assert any_store.job_progress("job-1") == (3, 1)
    assert any_store.job_errors("job-1", 10) == {"in/b": "not a readable .npy file"}
    assert any_store.mark_items("job-1", {}) == 0


def test_concurrent_markers_of_one_input_count_once(any_store: MetadataStore) -> None:
    with ThreadPoolExecutor(8) as pool:
        added = list(pool.map(lambda _: any_store.mark_items("job-1", {"in/a": ("out/a", "")}), range(16)))
    assert sum(added) == 1 and any_store.job_progress("job-1") == (1, 0)


def test_a_lease_is_held_by_one_owner_until_released_or_expired(any_store: MetadataStore) -> None:
    assert any_store.job_lease_expires_in_s("job-1") is None
    assert any_store.acquire_job_lease("job-1", "runner-a", 30.0)
    assert 29.0 < (any_store.job_lease_expires_in_s("job-1") or 0.0) <= 30.0
    assert any_store.acquire_job_lease("job-1", "runner-a", 30.0)  # its holder may take it again
    assert not any_store.acquire_job_lease("job-1", "runner-b", 30.0)
    assert any_store.job_lease_holder("job-1") == "runner-a"
    assert not any_store.renew_job_lease("job-1", "runner-b", 30.0)
    assert any_store.renew_job_lease("job-1", "runner-a", 30.0)
    any_store.release_job_lease("job-1", "runner-b")  # not its lease: nothing happens
    assert any_store.job_lease_holder("job-1") == "runner-a"
    any_store.release_job_lease("job-1", "runner-a")
    assert any_store.job_lease_holder("job-1") is None
    assert any_store.acquire_job_lease("job-1", "runner-b", 0.2)
    time.sleep(0.35)
    assert any_store.job_lease_holder("job-1") is None  # expired: its holder crashed
    assert any_store.job_lease_expires_in_s("job-1") is None
    assert not any_store.renew_job_lease("job-1", "runner-b", 30.0)
    assert any_store.acquire_job_lease("job-1", "runner-c", 30.0)


def test_a_runner_writes_the_job_record_only_while_it_holds_the_lease(any_store: MetadataStore) -> None:
    record = job()
    any_store.create_job(record)
    record.status, record.message = JobStatus.RUNNING, "working"
    assert any_store.save_job(record, "runner-a") is JobSave.NOT_HOLDER  # nobody holds it
    assert any_store.acquire_job_lease("job-1", "runner-a", 0.3)
    assert any_store.save_job(record, "runner-b") is JobSave.NOT_HOLDER  # not its lease
    assert any_store.save_job(record, "runner-a") is JobSave.SAVED
    assert any_store.unfinished_jobs() == ["job-1"]
    time.sleep(0.45)  # runner-a's lease expires (it stalled); runner-b takes the job and completes it
    assert any_store.acquire_job_lease("job-1", "runner-b", 30.0)
    done = job()
    done.status, done.message = JobStatus.COMPLETED, "completed by runner-b"
    assert any_store.save_job(done, "runner-b") is JobSave.SAVED
    stale = job()
    stale.status, stale.message = JobStatus.RUNNING, "runner-a's heartbeat"
    assert any_store.save_job(stale, "runner-a") is JobSave.NOT_HOLDER
    stored = any_store.get_job("job-1")
    assert stored is not None and (stored.status, stored.message) == (
        JobStatus.COMPLETED,
        "completed by runner-b",
    )
    assert any_store.unfinished_jobs() == []


def test_a_watchs_job_gains_inputs_once_and_completes_only_when_caught_up(any_store: MetadataStore) -> None:
    record = job()
    any_store.create_job(record)
    assert any_store.add_job_items("job-1", ["drop/a.npy", "drop/b.npy", "drop/a.npy"], "queued") == 2
    assert any_store.add_job_items("job-1", ["drop/b.npy"], "queued") == 0  # a duplicate event
    assert any_store.job_items("job-1") == ["drop/a.npy", "drop/b.npy"]
    assert any_store.job_item_count("job-1") == 2
    assert any_store.acquire_job_lease("job-1", "runner", 30.0)
    any_store.mark_items("job-1", {"drop/a.npy": ("out/a", ""), "drop/b.npy": ("out/b", "")})
    # An object arrives while the runner writes "completed": the write is refused, nothing lost.
    assert any_store.add_job_items("job-1", ["drop/c.npy"], "queued") == 1
    record.status = JobStatus.COMPLETED
    assert any_store.save_job(record, "runner") is JobSave.NEW_INPUTS
    stored = any_store.get_job("job-1")
    assert stored is not None and stored.status is JobStatus.QUEUED
    any_store.mark_items("job-1", {"drop/c.npy": ("out/c", "")})
    assert any_store.save_job(record, "runner") is JobSave.SAVED
    assert any_store.unfinished_jobs() == []
    # The next object queues the completed job again, with the message given.
    assert any_store.add_job_items("job-1", ["drop/d.npy"], "1 new input") == 1
    reopened = any_store.get_job("job-1")
    assert reopened is not None and (reopened.status, reopened.message) == (JobStatus.QUEUED, "1 new input")
    assert reopened.finished_at is None and any_store.unfinished_jobs() == ["job-1"]


def test_offline_buckets_per_app(any_store: MetadataStore) -> None:
    assert any_store.offline_buckets("app") is None
    any_store.set_offline_buckets("app", ["b2", "b1", "b2"])
    assert any_store.offline_buckets("app") == ["b1", "b2"]
    any_store.set_offline_buckets("app", [])
    assert any_store.offline_buckets("app") == []


def test_redis_job_keys_live_under_the_store_prefix_and_finished_progress_expires(
    redis_store: RedisMetadataStore,
) -> None:
    redis_store.create_job(job())
    redis_store.fix_job_items("job-1", ["in/a"])
    redis_store.mark_items("job-1", {"in/a": ("", "bad")})
    redis_store.acquire_job_lease("job-1", "runner", 30.0)
    redis_store.set_offline_buckets("app", ["b"])
    client = redis_store._redis
    keys = [k.decode() for k in client.keys("*") if k.decode().startswith(redis_store.keys.prefix)]
    assert len(keys) >= 7 and not [
        k for k in client.keys("*job-1*") if not k.decode().startswith(redis_store.keys.prefix)
    ]
    redis_store.expire_job_progress("job-1", 60.0)
    for key in (
        redis_store.keys.job_items("job-1"),
        redis_store.keys.job_done("job-1"),
        redis_store.keys.job_errors("job-1"),
    ):
        assert 0 < client.ttl(key) <= 60
    assert client.ttl(redis_store.keys.job("job-1")) == -1  # the record itself stays


@pytest.mark.parametrize("count", [0, 1])
def test_an_empty_or_single_input_list(any_store: MetadataStore, count: int) -> None:
    keys = [f"in/{i}" for i in range(count)]
    assert any_store.fix_job_items("job-1", keys) == keys
