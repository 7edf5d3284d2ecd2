"""The offline function (functions/offline/app.py) on real parts: Redis, moto's S3 with its event
notifications, real worker processes. Every shape of event it takes:

- an S3 ObjectCreated event straight from S3 (the body S3 would hand Lambda), not wrapped in SQS;
- the same event delivered twice *at once*: Powertools' idempotency (Redis) turns the second
  away while the first is still being handled, and the job runs once;
- objects under a watched prefix: one standing job, its done/total growing, every result once;
- the schedule: every stranded job (never launched, or whose runner died) resumed and completed,
  a job another runner holds left alone;

and PNG/JPEG images decoded and resized to the model's input, end to end through a job.
"""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
from PIL import Image

from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.jobs import RESULT_SUFFIX, JobSpec, output_key, summary_key
from modelless.offline.runner import RunOutcome
from modelless.types import JobStatus, VariantProfile
from tests.functional.offline_fixtures import (
    Buckets,
    LambdaContext,
    as_lambda_event,
    offline_function,
    offline_service,
    receive_all,
)
from tests.functional.workers_kit import APP, expected_logits, sample_inputs
from tests.offline_kit import npy
from tests.waiting import scaled

pytestmark = [
    pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time left"),
    pytest.mark.localstack,  # S3 and its S3 → SQS notifications: LocalStack emulates both
]


def upload_manifest(buckets: Buckets, key: str = "jobs/nightly.job.json", prefix: str = "in/") -> None:
    manifest = {"appID": APP, "inputPath": prefix, "outputPath": "out/", "accuracy": 0.5}
    buckets.s3.put_object(Bucket=buckets.data, Key=key, Body=json.dumps(manifest).encode())


def results(buckets: Buckets, prefix: str = "out/") -> dict[str, int]:
    return {k: n for k, n in buckets.versions(prefix).items() if k.endswith(RESULT_SUFFIX)}


def test_a_direct_s3_event_runs_the_job(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    event_queue: str,
    served: VariantProfile,
) -> None:
    keys = buckets.upload_inputs("in/", 6)
    upload_manifest(buckets)
    [message] = receive_all(event_queue, expect=1)
    # What S3 hands Lambda when it invokes the function itself: the notification's own body.
    direct: dict[str, Any] = json.loads(str(message["Body"]))
    assert direct["Records"][0]["eventSource"] == "aws:s3"

    with offline_function(monkeypatch, redis_store) as offline:
        reply = offline.handler(direct, LambdaContext())

    [started] = reply["events"]
    assert started["status"] == "started"
    assert reply["runs"] == [{"jobId": started["job_id"], "outcome": "completed", "processed": 6}]
    assert results(buckets) == {output_key("in/", "out/", k): 1 for k in keys}


def test_a_duplicate_delivered_while_the_first_is_handled_is_turned_away(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    event_queue: str,
    served: VariantProfile,
) -> None:
    keys = buckets.upload_inputs("in/", 6)
    upload_manifest(buckets)
    [message] = receive_all(event_queue, expect=1)
    event = as_lambda_event(message)

    with offline_function(monkeypatch, redis_store) as offline:
        entered, release = threading.Event(), threading.Event()
        start = offline.offline.starter.start

        def held_start(record: dict[str, Any]) -> dict[str, Any]:
            entered.set()  # inside the idempotent section: its record says "in progress"
            assert release.wait(scaled(30))
            result: dict[str, Any] = start(record)
            return result

        monkeypatch.setattr(offline.offline.starter, "start", held_start)
        replies: list[dict[str, Any]] = []
        first = threading.Thread(target=lambda: replies.append(offline.handler(event, LambdaContext())))
        first.start()
        try:
            assert entered.wait(scaled(30))
            duplicate = offline.handler(event, LambdaContext())
        finally:
            release.set()
            first.join(scaled(60))

    # The duplicate did nothing at all: no job touched, nothing run.
    assert duplicate == {"events": [], "runs": []}
    [reply] = replies
    [started] = reply["events"]
    assert started["status"] == "started" and reply["runs"][0]["outcome"] == "completed"
    assert len(redis_store.list_jobs(APP)) == 1
    assert results(buckets) == {output_key("in/", "out/", k): 1 for k in keys}


def test_a_watched_prefix_feeds_one_standing_job(
    monkeypatch: pytest.MonkeyPatch,
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    event_queue: str,
    served: VariantProfile,
) -> None:
    watches = [
        {
            "prefix": f"s3://{buckets.data}/drop/",
            "appID": APP,
            "outputPath": f"s3://{buckets.data}/drop-out/",
            "accuracy": 0.5,
        }
    ]
    rows = sample_inputs(3)
    with offline_function(monkeypatch, redis_store, MODELLESS_OFFLINE_WATCHES=json.dumps(watches)) as offline:
        [watch] = offline.offline.service.watches
        for index in range(2):
            buckets.s3.put_object(Bucket=buckets.data, Key=f"drop/x-{index}.npy", Body=npy(rows[index]))
        first = receive_all(event_queue, expect=2)
        replies = [offline.handler(as_lambda_event(m), LambdaContext()) for m in first]
        view = offline.offline.service.view(watch.job_id, APP)
        assert view.job.status is JobStatus.COMPLETED and (view.done, view.total) == (2, 2)

        # A later object: the caught-up job takes it; a duplicate delivery of it adds nothing.
        buckets.s3.put_object(Bucket=buckets.data, Key="drop/late/x-2.npy", Body=npy(rows[2]))
        [late] = receive_all(event_queue, expect=1)
        replies += [offline.handler(as_lambda_event(late), LambdaContext()) for _ in range(2)]
        view = offline.offline.service.view(watch.job_id, APP)

    assert {e["job_id"] for r in replies for e in r["events"]} == {watch.job_id}
    assert view.job.status is JobStatus.COMPLETED and (view.done, view.total, view.errors) == (3, 3, 0)
    assert [j.job_id for j in redis_store.list_jobs(APP)] == [watch.job_id]
    written = results(buckets, "drop-out/")
    assert written == {
        "drop-out/x-0.npy.result.json": 1,
        "drop-out/x-1.npy.result.json": 1,
        "drop-out/late/x-2.npy.result.json": 1,
    }
    late_result = buckets.read_json("drop-out/late/x-2.npy.result.json")
    np.testing.assert_allclose(late_result["outputs"], expected_logits(rows[2:3]), rtol=1e-4, atol=1e-4)
    summary = buckets.read_json(summary_key("drop-out/", watch.job_id))
    assert (summary["total"], summary["succeeded"]) == (3, 3)
    # Nothing the job wrote came back as an event (results land outside the watched prefix).
    assert receive_all(event_queue, expect=1, timeout_s=2.0) == []


def test_the_schedule_resumes_stranded_jobs_and_leaves_held_ones_alone(
    monkeypatch: pytest.MonkeyPatch, redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile
) -> None:
    buckets.upload_inputs("a/", 5)
    buckets.upload_inputs("b/", 5)
    buckets.upload_inputs("c/", 5)
    data = f"s3://{buckets.data}"
    service = offline_service(redis_store)
    never_launched = service.submit(JobSpec(APP, f"{data}/a/", f"{data}/out-a/", 0.5))
    # A runner that died mid-job: two results written and marked, its lease left to expire.
    crashed = service.submit(JobSpec(APP, f"{data}/b/", f"{data}/out-b/", 0.5))
    dead = service.runner()
    dead.owner = "dead-runner"
    keys_b = [f"b/item-{i:04d}.npy" for i in range(5)]
    redis_store.fix_job_items(crashed.job_id, keys_b)
    redis_store.mark_items(crashed.job_id, {k: (output_key("b/", "out-b/", k), "") for k in keys_b[:2]})
    assert redis_store.acquire_job_lease(crashed.job_id, "dead-runner", 0.5)
    held = service.submit(JobSpec(APP, f"{data}/c/", f"{data}/out-c/", 0.5))
    assert redis_store.acquire_job_lease(held.job_id, "live-runner", 120.0)
    service.close()

    time.sleep(0.8)  # the dead runner's lease expires
    with offline_function(monkeypatch, redis_store) as offline:
        reply = offline.handler({"source": "aws.events", "id": "schedule-1"}, LambdaContext())

    runs = {r["jobId"]: r for r in reply["runs"]}
    assert set(runs) == {never_launched.job_id, crashed.job_id}  # the held one is not touched
    assert (
        runs[never_launched.job_id]["outcome"] == "completed"
        and runs[never_launched.job_id]["processed"] == 5
    )
    assert runs[crashed.job_id]["outcome"] == "completed" and runs[crashed.job_id]["processed"] == 3
    for job_id in (never_launched.job_id, crashed.job_id):
        job = redis_store.get_job(job_id)
        assert job is not None and job.status is JobStatus.COMPLETED and job.done == 5
    # The crashed job's first two results were its dead runner's to write (none here): the
    # resumed run redid only the three not marked done.
    assert len(results(buckets, "out-b/")) == 3 and set(results(buckets, "out-a/").values()) == {1}
    still_held = redis_store.get_job(held.job_id)
    assert still_held is not None and still_held.status is JobStatus.QUEUED
    assert results(buckets, "out-c/") == {}
    assert dead.run(crashed.job_id).outcome is RunOutcome.COMPLETED  # finished: nothing to do


def image(pixels: np.ndarray, fmt: str, mode: str) -> bytes:
    picture = Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8), mode="L").convert(mode)
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def test_png_and_jpeg_inputs_end_to_end(
    redis_store: RedisMetadataStore, buckets: Buckets, served: VariantProfile
) -> None:
    """Images of other sizes and channels than the model's 1x8x8 input: converted to grey,
    resized (area averaging when shrinking) and scaled to [0, 1], then run on the worker."""
    digits = sample_inputs(3)[:, 0]
    uploads = {
        "in/exact.png": image(digits[0], "PNG", "L"),  # 8x8 grey: taken as it is
        "in/big-rgb.png": image(np.kron(digits[1], np.ones((4, 4))), "PNG", "RGB"),  # 32x32 colour
        "in/photo.jpg": image(np.kron(digits[2], np.ones((3, 3))), "JPEG", "RGB"),  # 24x24 JPEG
        "in/broken.png": b"\x89PNG\r\n\x1a\n not really",
    }
    for key, body in uploads.items():
        buckets.s3.put_object(Bucket=buckets.data, Key=key, Body=body)
    service = offline_service(redis_store)
    try:
        job = service.submit(JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5))
        assert service.run(job.job_id).outcome is RunOutcome.COMPLETED
    finally:
        service.close()

    def expected(key: str) -> np.ndarray:
        """What the model should have seen, computed here with Pillow alone."""
        picture = Image.open(io.BytesIO(uploads[key])).convert("L")
        if picture.size != (8, 8):
            picture = picture.resize((8, 8), Image.Resampling.BOX)
        return (np.asarray(picture, dtype=np.float32) / 255.0).reshape(1, 1, 8, 8)

    for key in ("in/exact.png", "in/big-rgb.png", "in/photo.jpg"):
        result = buckets.read_json(output_key("in/", "out/", key))
        np.testing.assert_allclose(result["outputs"], expected_logits(expected(key)), rtol=1e-4, atol=1e-4)
    # The exact PNG is the digit itself; the enlarged one averages back to it.
    exact = buckets.read_json(output_key("in/", "out/", "in/exact.png"))
    np.testing.assert_allclose(exact["outputs"], expected_logits(sample_inputs(1)), atol=0.02)
    summary = buckets.read_json(summary_key("out/", job.job_id))
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (4, 3, 1)
    assert summary["errors"][0]["input"].endswith("in/broken.png")
    assert "not a decodable image" in summary["errors"][0]["error"]
    assert set(results(buckets).values()) == {1} and len(results(buckets)) == 3
