"""The offline job runner killed mid-job, on real parts: Redis, the emulated S3 (a versioned
bucket: a second write of a result would show as a second version), a real worker process, and
the runner as the embedded stack runs it: a child process launched and watched from a thread of
the gateway (``ThreadLauncher`` over ``ChildProcessRunner``).

SIGKILL to the runner child: its parent sees the death at once, frees the dead child's lease,
records the death on the job and starts a new child, which resumes where the dead one stopped.
Asserted: the job is taken up again long before the lease would have expired, completes by
itself, every result exists exactly once, and its status shows the restart. The measured times
are printed (run with ``-s``) for the issue's note.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.child_processes import ChildProcessRunner
from modelless.offline.jobs import RESULT_SUFFIX, JobSpec, output_key, summary_key
from modelless.offline.launchers import ThreadLauncher
from modelless.pools.local import LocalWorkerPool
from modelless.types import JobStatus, OfflineJob, VariantProfile
from tests.functional.offline_fixtures import Buckets, offline_service, redis_url
from tests.functional.workers_kit import APP
from tests.waiting import wait_for

# Long on purpose: a job taken up again sooner than this was freed by the runner's parent, not by
# its lease's expiry.
LEASE_S = 60.0
# Three groups of 32 inputs (runner.RunnerConfig.group_inputs), one row per run: the kill lands
# while the child works on the second group, with results written whose inputs are not yet
# marked done.
INPUTS = 96


def test_a_killed_runner_child_is_restarted_at_once_and_its_job_completes_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    served: VariantProfile,
) -> None:
    keys = buckets.upload_inputs("in/", INPUTS)
    # The child takes its settings from the environment it inherits.
    monkeypatch.setenv("MODELLESS_OFFLINE_LEASE_S", str(LEASE_S))
    monkeypatch.setenv("MODELLESS_OFFLINE_MAX_BATCH", "1")
    service = offline_service(redis_store, offline_lease_s=LEASE_S, offline_max_batch=1)
    runner = ChildProcessRunner(redis_url(redis_store), store=redis_store)
    service.launcher = ThreadLauncher(runner, service.resumable)
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        wait_for(lambda: redis_store.job_progress(job.job_id)[0] > 0, 60.0, "the runner's first results")
        pid = runner.pid_of(job.job_id)
        assert pid is not None
        done_at_kill = redis_store.job_progress(job.job_id)[0]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert done_at_kill < INPUTS, "the job finished before its runner could be killed"

        def record() -> OfflineJob:
            current = redis_store.get_job(job.job_id)
            assert current is not None
            return current

        # Taken up again: a second run of the job, by a new child.
        resumed = wait_for(record, 30.0, "a new runner to take the job up", until=lambda j: j.runs >= 2)
        resumed_s = time.monotonic() - killed_at
        view = service.view(job.job_id, APP)  # what GET /v1/jobs/{id} and `job status` show
        wait_for(
            lambda: redis_store.job_progress(job.job_id)[0] > done_at_kill,
            60.0,
            "the new runner's first results",
        )
        progressed_s = time.monotonic() - killed_at
        finished = wait_for(
            record, 120.0, "the job to complete", until=lambda j: j.status is not JobStatus.RUNNING
        )
        completed_s = time.monotonic() - killed_at
    finally:
        service.close()

    print(
        "\nFAULT offline-runner-killed: "
        + json.dumps(
            {
                "inputs": INPUTS,
                "done_at_kill": done_at_kill,
                "kill_to_resumed_s": round(resumed_s, 2),
                "kill_to_progress_s": round(progressed_s, 2),
                "kill_to_completed_s": round(completed_s, 2),
            }
        )
    )
    assert resumed_s < LEASE_S, "the job waited for its dead runner's lease to expire"
    assert resumed.restarts == 1 and "signal 9 (SIGKILL)" in resumed.runner_failure, resumed
    assert view.job.restarts == 1 and view.job.runner_failure.endswith("; resumed") and not view.stalled
    assert finished.status is JobStatus.COMPLETED, finished.message
    assert (finished.done, finished.total, finished.errors, finished.runs) == (INPUTS, INPUTS, 0, 2)
    # The runner marks the job completed, then lets its lease go (in its run's last step): a
    # reader can come between the two.
    wait_for(
        lambda: redis_store.job_lease_holder(job.job_id) is None,
        10.0,
        "the finished runner to release its lease",
    )
    # Exactly once: every result, one version each, and the summary; nothing else.
    versions = buckets.versions("out/")
    results = {k: n for k, n in versions.items() if k.endswith(RESULT_SUFFIX)}
    assert set(results) == {output_key("in/", "out/", k) for k in keys}
    assert set(results.values()) == {1}, {k: n for k, n in results.items() if n > 1}
    assert versions[summary_key("out/", job.job_id)] == 1 and len(versions) == INPUTS + 1


def test_an_offline_job_whose_worker_is_killed_goes_on_on_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    served: VariantProfile,
    pool: LocalWorkerPool,
) -> None:
    """The pool's only worker dies mid-job: the pool starts another by itself and the job, with
    nobody restarting anything, completes on it, every result written once."""
    keys = buckets.upload_inputs("in/", INPUTS)
    monkeypatch.setenv("MODELLESS_OFFLINE_MAX_BATCH", "1")
    pool.supervise(on_unhealthy=redis_store.remove_worker)
    [victim] = pool.workers().items()
    service = offline_service(redis_store, offline_max_batch=1)
    runner = ChildProcessRunner(redis_url(redis_store), store=redis_store)
    service.launcher = ThreadLauncher(runner, service.resumable)
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        wait_for(lambda: redis_store.job_progress(job.job_id)[0] > 0, 60.0, "the job's first results")
        done_at_kill = redis_store.job_progress(job.job_id)[0]
        victim[1].process.kill()
        killed_at = time.monotonic()
        assert done_at_kill < INPUTS, "the job finished before its worker could be killed"
        wait_for(lambda: pool.replacements or None, 10.0, "the pool to replace its worker")
        finished = wait_for(
            lambda: redis_store.get_job(job.job_id),
            120.0,
            "the job to complete",
            until=lambda j: j is not None and j.status is not JobStatus.RUNNING,
        )
        completed_s = time.monotonic() - killed_at
    finally:
        service.close()
    measured = {"inputs": INPUTS, "done_at_kill": done_at_kill, "kill_to_completed_s": round(completed_s, 2)}
    print(f"\nFAULT offline-worker-killed: {json.dumps(measured)}")
    assert finished is not None and finished.status is JobStatus.COMPLETED, finished
    assert (finished.done, finished.errors) == (INPUTS, 0)
    assert pool.replacements[0].worker_id == victim[0]
    assert set(pool.workers()) - {victim[0]}, "no worker serves the pool any more"
    versions = buckets.versions("out/")
    results = {k: n for k, n in versions.items() if k.endswith(RESULT_SUFFIX)}
    assert set(results) == {output_key("in/", "out/", k) for k in keys}
    assert set(results.values()) == {1}
