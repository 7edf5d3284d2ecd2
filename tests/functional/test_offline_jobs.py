"""Offline jobs end to end on real parts: Redis, moto's S3 with its S3 → SQS event notifications,
and real worker processes.

- an uploaded manifest's S3 event, delivered twice through SQS to the offline function, runs one
  job whose every result exists exactly once (one S3 version each, in a versioned bucket);
- a runner process killed mid-job (SIGKILL: no clean-up at all) leaves its lease to expire; the
  next runner resumes where it stopped, and again every result exists exactly once;
- every refusal, against the real S3 endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import numpy as np
import pytest

from modelless.exceptions import ModellessError, S3AccessDeniedError
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.child_processes import ChildProcessRunner
from modelless.offline.jobs import RESULT_SUFFIX, JobSpec, output_key, summary_key
from modelless.offline.objects import S3ObjectStore
from modelless.offline.runner import RunOutcome
from modelless.offline.service import OfflineService
from modelless.types import JobStatus, VariantProfile
from tests.functional.offline_fixtures import (
    Buckets,
    LambdaContext,
    as_lambda_event,
    offline_function,
    offline_service,
    receive_all,
    redis_url,
)
from tests.functional.workers_kit import (
    APP,
    expected_logits,
    make_variant,
    publish_linear_model,
    sample_inputs,
)
from tests.offline_kit import npy
from tests.waiting import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.localstack
def test_a_manifest_event_delivered_twice_writes_every_result_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    event_queue: str,
    served: VariantProfile,
) -> None:
    keys = buckets.upload_inputs("in/", 24)
    buckets.s3.put_object(Bucket=buckets.data, Key="in/readme.txt", Body=b"not an input")
    manifest = {"appID": APP, "inputPath": "in/", "outputPath": "out/", "accuracy": 0.5}
    buckets.s3.put_object(
        Bucket=buckets.data, Key="jobs/nightly.job.json", Body=json.dumps(manifest).encode()
    )
    [message] = receive_all(event_queue, expect=1)

    # The offline function, as Lambda runs it, on this test's Redis namespace.
    with offline_function(monkeypatch, redis_store) as offline:
        first = offline.handler(as_lambda_event(message), LambdaContext())
        duplicate = offline.handler(as_lambda_event(message), LambdaContext())

    [started] = first["events"]
    assert started["status"] == "started"
    assert first["runs"] == [{"jobId": started["job_id"], "outcome": "completed", "processed": 25}]
    # The duplicate: Powertools' idempotency answered from Redis; the run found the job finished.
    assert duplicate["events"] == first["events"]
    assert duplicate["runs"][0]["processed"] == 0
    [job] = redis_store.list_jobs(APP)
    assert job.status is JobStatus.COMPLETED and (job.total, job.done, job.errors) == (25, 25, 1)
    assert job.source == f"s3://{buckets.data}/jobs/nightly.job.json"
    # Exactly once: one version of each result, one of the summary, nothing else written.
    versions = buckets.versions("out/")
    results = {k: n for k, n in versions.items() if k.endswith(RESULT_SUFFIX)}
    assert set(results) == {output_key("in/", "out/", k) for k in keys}
    assert set(results.values()) == {1}
    assert versions[summary_key("out/", job.job_id)] == 1 and len(versions) == 25
    result = buckets.read_json(output_key("in/", "out/", keys[5]))
    np.testing.assert_allclose(
        result["outputs"], expected_logits(sample_inputs(6)[5:6]), rtol=1e-4, atol=1e-4
    )
    summary = buckets.read_json(summary_key("out/", job.job_id))
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (25, 24, 1)
    assert summary["errors"][0]["input"].endswith("in/readme.txt")
    assert redis_store.job_lease_holder(job.job_id) is None


@pytest.mark.localstack
def test_a_runner_killed_mid_job_is_resumed_and_every_result_exists_once(
    redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile
) -> None:
    count = 80
    keys = buckets.upload_inputs("in/", count)
    lease_s = 2.0
    service = offline_service(redis_store, offline_lease_s=lease_s, offline_max_batch=1)
    job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
    env = {
        **os.environ,
        "MODELLESS_METADATA_URL": redis_url(redis_store),
        "MODELLESS_OFFLINE_LEASE_S": str(lease_s),
        "MODELLESS_OFFLINE_MAX_BATCH": "1",  # one input per run: the job lasts long enough to kill
        "PYTHONPATH": f"{ROOT / 'layers' / 'modelless'}:{ROOT}",
    }
    runner = subprocess.Popen(
        [sys.executable, "-m", "modelless.offline", "run", job.job_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: redis_store.job_progress(job.job_id)[0],
            30.0,
            "the runner's first 10 results",
            until=lambda done: done >= 10,
        )
        runner.send_signal(signal.SIGKILL)
        runner.wait(scaled(10))
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(scaled(10))
    done_at_kill = redis_store.job_progress(job.job_id)[0]
    assert 10 <= done_at_kill < count, "the runner finished before it could be killed mid-job"
    # Killed without any clean-up: its lease is still there, and stops a new runner until it expires.
    assert redis_store.job_lease_holder(job.job_id) is not None
    assert service.run(job.job_id).outcome is RunOutcome.BUSY
    assert service.resumable() == []

    wait_for(
        lambda: service.resumable() == [job.job_id] or None, lease_s + 3, "the dead runner's lease to expire"
    )
    report = service.run(job.job_id)

    assert report.outcome is RunOutcome.COMPLETED
    assert report.processed <= count - done_at_kill  # it redid nothing the first had marked done
    finished = redis_store.get_job(job.job_id)
    assert finished is not None and finished.status is JobStatus.COMPLETED
    assert (finished.done, finished.total, finished.runs) == (count, count, 2)
    versions = buckets.versions("out/")
    assert {k for k in versions if k.endswith(RESULT_SUFFIX)} == {output_key("in/", "out/", k) for k in keys}
    assert set(versions.values()) == {1}, "a result was written twice"
    service.close()


@pytest.mark.localstack
def test_refusals_against_the_real_s3_endpoint(
    redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile
) -> None:
    buckets.upload_inputs("in/", 2)
    service = offline_service(redis_store)
    data = f"s3://{buckets.data}"
    redis_store.set_offline_buckets(APP, [buckets.data, "no-such-bucket-anywhere"])
    cases = [
        (JobSpec(APP, f"{data}/in/", "s3://no-such-bucket-anywhere/out/", 0.5), 404, "does not exist"),
        (JobSpec(APP, "s3://no-such-bucket-anywhere/in/", f"{data}/out/", 0.5), 404, "does not exist"),
        (JobSpec(APP, f"{data}/in/", f"{data}/in/out/", 0.5), 400, "lies inside inputPath"),
        (JobSpec(APP, f"{data}/in/", "s3://someone-elses-bucket/out/", 0.5), 403, "may not use bucket"),
        (JobSpec(APP, f"{data}/empty/", f"{data}/out/", 0.5), 400, "no objects under it"),
        (JobSpec(APP, f"{data}/in/", f"{data}/out/", 0.99), 422, "closest is"),
    ]
    for spec, status, message in cases:
        with pytest.raises(ModellessError) as refused:
            service.submit(spec)
        assert (refused.value.status_code, message in refused.value.message) == (status, True), spec
    assert redis_store.list_jobs(APP) == []
    assert buckets.versions("") == {f"in/item-{i:04d}.npy": 1 for i in range(2)}  # nothing written
    service.close()


@pytest.fixture
def restricted_s3() -> Iterator[tuple[Any, str, str]]:
    """A private moto server with IAM enforcement on (the shared one lets everything through),
    two buckets, and an S3 client whose credentials may use only the first: the 403 is S3's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The first actions (the set-up below) run unauthenticated; every later one is checked.
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "5"}
    binary = str(Path(sys.executable).parent / "moto_server")
    server = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url), 20.0, "the private moto server")
        admin = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        admin.create_bucket(Bucket="open-bucket")
        admin.create_bucket(Bucket="locked-bucket")
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1")
        iam.create_user(UserName="offline-service")
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "s3:*",
                    "Resource": ["arn:aws:s3:::open-bucket", "arn:aws:s3:::open-bucket/*"],
                }
            ],
        }
        iam.put_user_policy(UserName="offline-service", PolicyName="open", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="offline-service")["AccessKey"]
        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        )
        client.put_object(Bucket="open-bucket", Key="in/x.npy", Body=npy(sample_inputs(1)[0]))
        yield client, "open-bucket", "locked-bucket"
    finally:
        server.terminate()
        server.wait(scaled(10))


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/moto-api/", timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_a_bucket_the_services_credentials_may_not_read_is_refused_with_a_403(
    redis_store: RedisMetadataStore, restricted_s3: tuple[Any, str, str]
) -> None:
    client, open_bucket, locked_bucket = restricted_s3
    publish_linear_model(redis_store, make_variant())
    redis_store.create_app(APP, "not-a-real-key-hash")
    redis_store.set_offline_buckets(APP, [open_bucket, locked_bucket])  # the app may ask; IAM says no
    service = offline_service(redis_store)
    service.objects_factory = lambda: S3ObjectStore(client)
    try:
        for spec, what in [
            (JobSpec(APP, f"s3://{open_bucket}/in/", f"s3://{locked_bucket}/out/", 0.5), "outputPath"),
            (JobSpec(APP, f"s3://{locked_bucket}/in/", f"s3://{open_bucket}/out/", 0.5), "inputPath"),
        ]:
            with pytest.raises(S3AccessDeniedError) as refused:
                service.submit(spec)
            assert refused.value.status_code == 403
            assert refused.value.message.startswith(f"{what} s3://") and (
                f"may not read bucket {locked_bucket!r}" in refused.value.message
            )
        assert redis_store.list_jobs(APP) == []
        # The same credentials can use the open bucket: a job within it is accepted.
        assert service.submit(JobSpec(APP, f"s3://{open_bucket}/in/", f"s3://{open_bucket}/out/", 0.5))
    finally:
        service.close()


@pytest.mark.localstack
def test_the_embedded_stack_can_run_jobs_in_child_processes(
    redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile
) -> None:
    """``MODELLESS_OFFLINE_RUNNER=process``: each job in a child process (its CPU and GIL apart
    from the gateway's online queries), launched and followed from a gateway thread."""
    keys = buckets.upload_inputs("in/", 6)
    service = offline_service(redis_store, offline_runner="process", metadata_url=redis_url(redis_store))
    service.launcher = OfflineService.from_settings(
        service.settings, redis_store, service.pools, live_workers=redis_store.list_workers
    ).launcher
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))

        def completed() -> bool | None:
            current = redis_store.get_job(job.job_id)
            return (current is not None and current.status is JobStatus.COMPLETED) or None

        wait_for(completed, 30.0, "the child process to complete the job")
        # The child's report comes back through its own channel, whatever its logs say. Not
        # launched by the service: its own child would race this one for the job's lease.
        again = service.submit(
            JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/again/", 0.5), launch=False
        )
        report = ChildProcessRunner(redis_url(redis_store))(again.job_id)
        assert (report.outcome, report.processed) == (RunOutcome.COMPLETED, len(keys))
    finally:
        service.close()
    versions = buckets.versions("out/")
    assert {k for k in versions if k.endswith(RESULT_SUFFIX)} == {output_key("in/", "out/", k) for k in keys}
