"""Offline jobs as callers see them, in-process: every refusal up front, S3 events into jobs
(manifests, watched prefixes, duplicates, Powertools idempotency), the HTTP API, the client's
CLI, and the offline Lambda handler with real event shapes."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modelless.api import create_app
from modelless.api.services import Services, build_services
from modelless.catalog import DEFAULT_POOLS
from modelless.cli import job_progress_line, job_report, parse_args
from modelless.config import Settings
from modelless.exceptions import InvalidJobError, ModellessError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.offline.events import (
    InProcessCache,
    S3JobStarter,
    cache_layer,
    idempotent_start,
    parse_manifest,
    s3_records,
)
from modelless.offline.jobs import JobSpec, job_id_for_object
from modelless.offline.launchers import ThreadLauncher
from modelless.offline.objects import InMemoryObjectStore
from modelless.offline.runner import RunOutcome
from modelless.offline.service import OfflineService
from modelless.types import JobStatus, OfflineJob
from tests.offline_kit import APP, BUCKET, MODEL, FakeCompute, publish, upload_npy_inputs, variant
from tests.waiting import wait_for

OTHER = "other-bucket"
IN, OUT = f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out/"
WATCHES = json.dumps(
    [
        {
            "prefix": f"s3://{BUCKET}/drop/",
            "appID": APP,
            "outputPath": f"s3://{BUCKET}/drop-out/",
            "accuracy": 0.5,
        }
    ]
)


class RecordingLauncher:
    def __init__(self) -> None:
        self.launched: list[str] = []

    def launch(self, job_id: str) -> None:
        self.launched.append(job_id)

    def close(self) -> None:
        pass


@pytest.fixture
def objects() -> InMemoryObjectStore:
    objects = InMemoryObjectStore()
    objects.create_bucket(BUCKET)
    objects.create_bucket(OTHER)
    upload_npy_inputs(objects, "in/", 3)
    return objects


@pytest.fixture
def store() -> InMemoryMetadataStore:
    store = InMemoryMetadataStore()
    store.create_app(APP, "hash")
    publish(store, [variant()])
    store.set_offline_buckets(APP, [BUCKET])
    return store


@pytest.fixture
def launcher() -> RecordingLauncher:
    return RecordingLauncher()


@pytest.fixture
def service(
    store: InMemoryMetadataStore, objects: InMemoryObjectStore, launcher: RecordingLauncher
) -> OfflineService:
    settings = Settings(offline_watches=WATCHES)
    service = OfflineService.from_settings(settings, store, DEFAULT_POOLS, objects_factory=lambda: objects)
    service.launcher = launcher
    return service


def spec(**changes: Any) -> JobSpec:
    return dataclasses.replace(JobSpec(APP, IN, OUT, 0.5), **changes)


# --- submission and refusals ----------------------------------------------------------------------


def test_submit_creates_the_job_and_launches_it(service: OfflineService, launcher: RecordingLauncher) -> None:
    job = service.submit(spec())
    assert job.status is JobStatus.QUEUED and launcher.launched == [job.job_id]
    view = service.view(job.job_id, APP)
    assert (view.done, view.errors, view.throughput) == (0, 0, 0.0)
    with pytest.raises(ModellessError, match="no job"):
        service.view(job.job_id, "another-app")


REFUSALS = [
    (spec(input_path=f"s3://{OTHER}/in/"), 403, "may not use bucket 'other-bucket'"),
    (spec(output_path=f"s3://{OTHER}/out/"), 403, "may not use bucket 'other-bucket'"),
    (spec(output_path=f"s3://{BUCKET}/in/results/"), 400, "lies inside inputPath"),
    (spec(output_path=IN), 400, "lies inside inputPath"),
    (
        spec(input_path=f"s3://{BUCKET}/in", output_path=f"s3://{BUCKET}/in-out/"),
        400,
        "lies inside inputPath",
    ),
    (spec(output_path=f"s3://{BUCKET}/drop/x/"), 400, "overlaps the watched prefix"),
    (spec(output_path=f"s3://{BUCKET}/"), 400, "overlaps the watched prefix"),
    (spec(input_path="in/"), 400, "must be an s3://bucket/prefix URL"),
    (spec(input_path=f"s3://{BUCKET}/nothing-here/"), 400, "no objects under it"),
    (spec(app_id="ghost"), 404, "no app 'ghost'"),
    (spec(model_name="ghost", min_accuracy=0.0), 404, "model 'ghost' is not registered"),
    (
        spec(min_accuracy=0.99),
        422,
        "offline jobs run on provisioned workers: no variant meets accuracy>=0.99",
    ),
    (spec(min_accuracy=1.5), 400, "accuracy must lie in [0, 1]"),
]


@pytest.mark.parametrize(("job", "status", "message"), REFUSALS)
def test_refused_up_front_with_a_clear_message(
    service: OfflineService, store: InMemoryMetadataStore, job: JobSpec, status: int, message: str
) -> None:
    with pytest.raises(ModellessError) as refused:
        service.submit(job)
    assert refused.value.status_code == status
    assert message in refused.value.message
    assert store.list_jobs(APP) == []  # nothing written


def test_a_missing_bucket_is_refused(
    service: OfflineService, store: InMemoryMetadataStore, objects: InMemoryObjectStore
) -> None:
    store.set_offline_buckets(APP, [BUCKET, "gone-bucket"])
    with pytest.raises(ModellessError) as refused:
        service.submit(spec(output_path="s3://gone-bucket/out/"))
    assert refused.value.status_code == 404
    assert refused.value.message == "outputPath s3://gone-bucket/out/: bucket 'gone-bucket' does not exist"


def test_only_lambda_variants_cannot_serve_offline_jobs(
    service: OfflineService, store: InMemoryMetadataStore
) -> None:
    store._variants[APP] = {v.variant_id: v for v in [variant(pool="lambda-cpu")]}
    with pytest.raises(ModellessError) as refused:
        service.submit(spec())
    assert refused.value.status_code == 422 and "provisioned workers" in refused.value.message


def test_an_app_without_buckets_of_its_own_gets_the_deployments(
    service: OfflineService, store: InMemoryMetadataStore
) -> None:
    store._offline_buckets.clear()
    with pytest.raises(ModellessError, match=r"allowed: none"):
        service.submit(spec())
    service.settings = service.settings.with_overrides(offline_buckets=(BUCKET,))
    assert service.submit(spec()).job_id


def test_resumable_jobs_are_unfinished_and_unheld(
    service: OfflineService, store: InMemoryMetadataStore
) -> None:
    held, free = service.submit(spec()), service.submit(spec())
    assert store.acquire_job_lease(held.job_id, "someone", 30)
    assert service.resumable() == [free.job_id]


def test_the_thread_launcher_runs_jobs_and_its_supervisor_resumes_them(
    service: OfflineService, store: InMemoryMetadataStore
) -> None:
    compute = FakeCompute(variant())
    service.compute = lambda: compute  # type: ignore[method-assign]
    stranded = service.submit(spec())  # launched into the recording launcher: never ran
    launcher = ThreadLauncher(service.run, service.resumable, resume_every_s=0.05)
    service.launcher = launcher
    try:
        launcher.start_supervisor()
        fresh = service.submit(spec())
        wait_for(
            lambda: [store.get_job(j) for j in (stranded.job_id, fresh.job_id)],
            4.0,
            "the stranded and the fresh job to complete",
            interval_s=0.02,
            until=lambda jobs: all(j is not None and j.status is JobStatus.COMPLETED for j in jobs),
        )
    finally:
        launcher.close()


def test_a_job_whose_runner_died_unwatched_resumes_within_its_lease_and_one_supervisor_look(
    store: InMemoryMetadataStore, objects: InMemoryObjectStore
) -> None:
    """The supervisor of a deployment's defaults (``offline_resume_every_s``) looks every second:
    a job freed by its dead runner's lease waits at most that long more."""
    settings = Settings()
    service = OfflineService.from_settings(settings, store, DEFAULT_POOLS, objects_factory=lambda: objects)
    compute = FakeCompute(variant())
    service.compute = lambda: compute  # type: ignore[method-assign]
    launcher = service.launcher
    assert isinstance(launcher, ThreadLauncher)
    service.launcher = RecordingLauncher()  # submitted, never launched: its runner "died"
    job = service.submit(spec())
    lease_s = 0.3
    assert store.acquire_job_lease(job.job_id, "dead-runner", lease_s)
    started = time.monotonic()
    try:
        launcher.start_supervisor()  # looks at once (the lease is held), then every second
        wait_for(
            lambda: store.get_job(job.job_id),
            10.0,
            "the job to be taken up again",
            until=lambda j: j is not None and j.runs == 1,
        )
        taken_up_s = time.monotonic() - started
    finally:
        launcher.close()
    assert taken_up_s <= lease_s + settings.offline_resume_every_s + 1.0, taken_up_s


# --- S3 events ---------------------------------------------------------------------------------------


def s3_record(
    key: str, etag: str = "etag-1", bucket: str = BUCKET, event: str = "ObjectCreated:Put"
) -> dict[str, Any]:
    from urllib.parse import quote_plus

    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-11-22T00:00:00.000Z",
        "eventName": event,
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "offline",
            "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
            "object": {"key": quote_plus(key), "size": 10, "eTag": etag},
        },
    }


def manifest(**fields: Any) -> bytes:
    return json.dumps(
        {"appID": APP, "inputPath": "in/", "outputPath": "out/", "accuracy": 0.5, **fields}
    ).encode()


def test_manifests_name_paths_in_their_own_bucket_or_anywhere() -> None:
    job = parse_manifest(manifest(outputPath=f"s3://{OTHER}/o/"), BUCKET)
    assert job == JobSpec(APP, IN, f"s3://{OTHER}/o/", 0.5, None)
    assert parse_manifest(manifest(accuracy=None, modelName=MODEL), BUCKET).model_name == MODEL
    assert parse_manifest(manifest(accuracy=None, pipeline="cascade"), BUCKET).pipeline == "cascade"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "must be a JSON object"),
        (json.dumps({"appID": APP, "inputPath": "in/"}).encode(), "lacks ['outputPath']"),
        (manifest(accuracy=None), "needs an accuracy target, a modelName or a pipeline"),
        (manifest(extra=1), "unknown fields ['extra']"),
        (manifest(accuracy="high"), "accuracy must be a number"),
        (manifest(accuracy=10**400), "accuracy must be a number in"),  # float() of it overflows
        (manifest(accuracy=1.5), "accuracy must be a number in"),
        (manifest(accuracy=True), "accuracy must be a number"),
        (manifest(accuracy=float("nan")), "accuracy must be a number in"),
    ],
)
def test_bad_manifests_say_why(body: bytes, message: str) -> None:
    with pytest.raises(InvalidJobError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_manifest(body, BUCKET)


def test_a_manifest_event_starts_one_job_and_a_duplicate_finds_it(
    service: OfflineService,
    objects: InMemoryObjectStore,
    store: InMemoryMetadataStore,
    launcher: RecordingLauncher,
) -> None:
    objects.put(BUCKET, "jobs/nightly run.job.json", manifest())
    starter = S3JobStarter(service)
    record = s3_record("jobs/nightly run.job.json")

    first = starter.start(record)
    second = starter.start(record)

    expected = job_id_for_object(BUCKET, "jobs/nightly run.job.json", "etag-1")
    assert first == {"status": "started", "job_id": expected, "message": "queued"}
    assert second["status"] == "exists" and second["job_id"] == expected
    [job] = store.list_jobs(APP)
    assert job.source == f"s3://{BUCKET}/jobs/nightly run.job.json"
    assert launcher.launched == [expected, expected]  # relaunching an unfinished job is harmless


def test_a_refused_manifest_is_recorded_as_a_failed_job_of_its_app(
    service: OfflineService, objects: InMemoryObjectStore, store: InMemoryMetadataStore
) -> None:
    objects.put(BUCKET, "bad.job.json", manifest(outputPath="in/res/"))
    result = S3JobStarter(service).start(s3_record("bad.job.json"))
    assert result["status"] == "refused" and "lies inside inputPath" in result["message"]
    [job] = store.list_jobs(APP)
    assert job.status is JobStatus.FAILED and job.message.startswith("refused: outputPath")


@pytest.mark.parametrize(
    ("body", "recorded", "message"),
    [
        (manifest(extra=1), True, "manifest has unknown fields ['extra']"),
        (manifest(accuracy="high"), True, "manifest accuracy must be a number"),
        (manifest(accuracy=None), True, "needs an accuracy target, a modelName or a pipeline"),
        (manifest(inputPath=7), True, "manifest inputPath must be a string"),
        (manifest(pipeline=["a"]), True, "manifest pipeline must be a string"),
        (b"{not json", False, "manifest is not JSON"),
        (manifest(appID="ghost", extra=1), False, "unknown fields"),  # no such app: nowhere to show it
    ],
)
def test_a_manifest_that_cannot_be_read_is_a_failed_job_that_says_why(
    service: OfflineService,
    objects: InMemoryObjectStore,
    store: InMemoryMetadataStore,
    body: bytes,
    recorded: bool,
    message: str,
) -> None:
    objects.put(BUCKET, "bad.job.json", body)
    result = S3JobStarter(service).start(s3_record("bad.job.json"))
    assert result["status"] == "refused" and message in result["message"]
    jobs = service.views(APP)
    assert len(jobs) == int(recorded)
    if recorded:
        [view] = jobs
        assert view.job.job_id == result["job_id"] and view.job.status is JobStatus.FAILED
        assert view.job.message == f"refused: {result['message']}"
        assert view.job.source == f"s3://{BUCKET}/bad.job.json"


def watch_job_id_of(service: OfflineService) -> str:
    [watch] = service.watches
    return watch.job_id


def test_a_watch_has_one_standing_job_whose_inputs_grow_with_each_object(
    service: OfflineService,
    objects: InMemoryObjectStore,
    store: InMemoryMetadataStore,
    launcher: RecordingLauncher,
) -> None:
    service.compute = lambda: FakeCompute(variant())  # type: ignore[method-assign]
    row = objects.get(BUCKET, "in/item-0000.npy")
    starter = S3JobStarter(service)
    watch_id = watch_job_id_of(service)

    objects.put(BUCKET, "drop/x.npy", row)
    first = starter.start(s3_record("drop/x.npy"))
    assert first == {"status": "started", "job_id": watch_id, "message": "queued"}
    assert starter.start(s3_record("drop/x.npy"))["status"] == "exists"  # a duplicate delivery
    objects.put(BUCKET, "drop/a/b/x.npy", row)  # same name, another folder: no collision
    assert starter.start(s3_record("drop/a/b/x.npy"))["status"] == "started"
    [job] = store.list_jobs(APP)
    assert job.job_id == watch_id and job.source == f"watch:s3://{BUCKET}/drop/"
    assert (job.input_path, job.output_path) == (f"s3://{BUCKET}/drop/", f"s3://{BUCKET}/drop-out/")
    view = service.view(watch_id, APP)
    assert (view.done, view.total) == (0, 2) and set(launcher.launched) == {watch_id}

    assert service.run(watch_id).outcome is RunOutcome.COMPLETED
    results = ["drop-out/x.npy.result.json", "drop-out/a/b/x.npy.result.json"]
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in results)
    summary_key = f"drop-out/_jobs/{watch_id}.summary.json"
    assert json.loads(objects.get(BUCKET, summary_key))["total"] == 2

    # The next object queues the caught-up job again; its done/total grows.
    objects.put(BUCKET, "drop/y.npy", row)
    assert starter.start(s3_record("drop/y.npy"))["status"] == "started"
    queued = service.view(watch_id, APP)
    assert queued.job.status is JobStatus.QUEUED and (queued.done, queued.total) == (2, 3)
    assert service.run(watch_id).outcome is RunOutcome.COMPLETED
    done = service.view(watch_id, APP)
    assert done.job.status is JobStatus.COMPLETED and (done.done, done.total, done.job.runs) == (3, 3, 2)
    assert "watching" in done.job.message
    # Every result exactly once; the summary is the watch's living report, rewritten.
    assert all(objects.buckets[BUCKET][k].writes == 1 for k in [*results, "drop-out/y.npy.result.json"])
    assert json.loads(objects.get(BUCKET, summary_key))["total"] == 3
    assert len(store.list_jobs(APP)) == 1

    # Not a watched input: ignored (a manifest under the watch is a manifest).
    assert starter.start(s3_record("elsewhere/y.npy"))["status"] == "ignored"
    assert starter.start(s3_record("drop/folder/"))["status"] == "ignored"
    assert starter.start(s3_record("drop/x.npy", event="ObjectRemoved:Delete"))["status"] == "ignored"
    objects.put(BUCKET, "drop/run.job.json", manifest())
    assert starter.start(s3_record("drop/run.job.json"))["job_id"] != watch_id


def test_a_refused_watch_is_a_failed_job_until_an_admin_fixes_it(
    service: OfflineService, objects: InMemoryObjectStore, store: InMemoryMetadataStore
) -> None:
    store.set_offline_buckets(APP, [OTHER])  # the watched bucket is not the app's
    objects.put(BUCKET, "drop/x.npy", objects.get(BUCKET, "in/item-0000.npy"))
    starter = S3JobStarter(service)

    refused = starter.start(s3_record("drop/x.npy"))

    assert refused["status"] == "refused" and "may not use bucket" in refused["message"]
    failed = service.view(watch_job_id_of(service), APP)
    assert failed.job.status is JobStatus.FAILED and failed.job.message.startswith("refused: inputPath")
    assert failed.total == 0  # nothing of a refused watch is kept

    store.set_offline_buckets(APP, [BUCKET])
    objects.put(BUCKET, "drop/y.npy", objects.get(BUCKET, "in/item-0000.npy"))
    assert starter.start(s3_record("drop/y.npy"))["status"] == "started"
    fixed = service.view(watch_job_id_of(service), APP)
    assert fixed.job.status is JobStatus.QUEUED and fixed.total == 1
    assert fixed.job.created_at == failed.job.created_at


def test_s3_records_straight_or_through_sqs() -> None:
    record = s3_record("a.job.json")
    assert s3_records({"Records": [record]}) == [record]
    sqs = {
        "Records": [
            {"eventSource": "aws:sqs", "messageId": "1", "body": json.dumps({"Records": [record]})},
            {"eventSource": "aws:sqs", "messageId": "2", "body": json.dumps({"Event": "s3:TestEvent"})},
        ]
    }
    assert s3_records(sqs) == [record]
    assert s3_records({"source": "aws.events"}) == []


@pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time left")  # no Lambda context here
def test_powertools_idempotency_makes_a_duplicate_event_a_no_op(
    service: OfflineService, objects: InMemoryObjectStore
) -> None:
    objects.put(BUCKET, "a.job.json", manifest())
    calls: list[str] = []

    class Counting(S3JobStarter):
        def start(self, record: dict[str, Any]) -> dict[str, Any]:
            calls.append(record["s3"]["object"]["key"])
            return super().start(record)

    start, _ = idempotent_start(Counting(service), cache_layer(InProcessCache()), "test:idempotency")
    first = start(record=s3_record("a.job.json"))
    again = start(record=s3_record("a.job.json"))
    reuploaded = start(record=s3_record("a.job.json", etag="etag-2"))

    assert first == again and len(calls) == 2  # the duplicate never reached the starter
    assert reuploaded["job_id"] != first["job_id"]


# --- the HTTP API and the CLI -------------------------------------------------------------------------


@pytest.fixture
def api(
    tmp_path: Any, store: InMemoryMetadataStore, objects: InMemoryObjectStore, launcher: RecordingLauncher
) -> Iterator[tuple[TestClient, Services, dict[str, str]]]:
    settings = Settings(metadata_url="memory://", repository_url=str(tmp_path / "repo"), admin_key="adm")
    services = build_services(settings, store=store)
    assert services.offline is not None
    services.offline.objects_factory = lambda: objects
    services.offline.launcher = launcher
    services.offline.compute = lambda: FakeCompute(variant())  # type: ignore[method-assign]
    with TestClient(create_app(services)) as client:
        created = client.post(
            "/v1/apps", json={"appID": "api-app", "offlineBuckets": [BUCKET]}, headers={"X-Api-Key": "adm"}
        )
        assert created.status_code == 201, created.text
        # The job's app is the fixture's: give it a key by re-pointing the created key's hash.
        key = created.json()["apiKey"]
        from modelless.auth import hash_key

        store._keys[hash_key(key)] = APP
        yield client, services, {"X-Api-Key": key}
    services.close()


def test_offline_query_over_http_then_job_status(api: tuple[TestClient, Services, dict[str, str]]) -> None:
    client, services, headers = api
    reply = client.post(
        "/v1/offline_query",
        json={"appID": APP, "inputPath": IN, "outputPath": OUT, "accuracy": 0.5},
        headers=headers,
    )
    assert reply.status_code == 202, reply.text
    job = reply.json()
    assert job["status"] == "queued" and job["statusUrl"].endswith(f"/v1/jobs/{job['jobId']}")
    assert services.offline is not None
    assert services.offline.run(job["jobId"]).outcome is RunOutcome.COMPLETED

    status = client.get(f"/v1/jobs/{job['jobId']}", headers=headers).json()
    assert (status["status"], status["done"], status["total"], status["errors"]) == ("completed", 3, 3, 0)
    assert status["variant"] == variant().variant_id and status["summaryPath"].startswith(OUT)
    assert status["throughput"] >= 0 and status["runs"] == 1
    listed = client.get("/v1/jobs", headers=headers).json()["jobs"]
    assert [j["jobId"] for j in listed] == [job["jobId"]]


def test_a_pipeline_job_over_http_pins_a_variant_per_stage_and_says_which_stage_answered(
    api: tuple[TestClient, Services, dict[str, str]], objects: InMemoryObjectStore
) -> None:
    client, services, headers = api
    pipeline = {
        "appID": APP,
        "name": "twice",
        "stages": [{"name": "first", "model": MODEL}, {"name": "second", "model": MODEL}],
        "edges": [{"source": "first", "target": "second"}],
        "latencySlo": 500.0,
    }
    assert client.post("/v1/pipelines", json=pipeline, headers=headers).status_code == 201
    reply = client.post(
        "/v1/offline_query",
        json={"appID": APP, "inputPath": IN, "outputPath": OUT, "pipeline": "twice"},
        headers=headers,
    )
    assert reply.status_code == 202, reply.text
    assert services.offline is not None
    assert services.offline.run(reply.json()["jobId"]).outcome is RunOutcome.COMPLETED

    status = client.get(f"/v1/jobs/{reply.json()['jobId']}", headers=headers).json()
    assert status["status"] == "completed" and status["pipeline"] == "twice"
    assert status["stageVariants"] == {"first": variant().variant_id, "second": variant().variant_id}
    results = [i.key for i in objects.list_objects(BUCKET, "out/", 100) if i.key.endswith(".result.json")]
    assert results
    for key in results:
        result = json.loads(objects.get(BUCKET, key))
        assert result["pipeline"] == "twice" and set(result["answeredBy"]) == {"second"}
    branches = client.get("/v1/pipelines/twice", params={"appID": APP}, headers=headers).json()
    assert branches["branchProbabilities"] == {"first->second": 1.0}


def test_a_job_whose_runner_went_silent_shows_stalled_and_when_it_resumes(
    api: tuple[TestClient, Services, dict[str, str]], store: InMemoryMetadataStore
) -> None:
    client, services, headers = api
    assert services.offline is not None
    job = services.offline.submit(spec())
    now = time.time()
    job.status, job.heartbeat_at, job.message = JobStatus.RUNNING, now - 0.5, "40 of 50 inputs to go"
    store.put_job(job)

    live = client.get(f"/v1/jobs/{job.job_id}", headers=headers).json()
    assert (live["health"], live["message"]) == ("ok", "40 of 50 inputs to go")
    assert 0.4 <= live["heartbeatAgeS"] < 5 and live["restarts"] == 0 and live["lastRunnerFailure"] is None

    # Its runner died holding the lease: 12 s without a heartbeat, the lease 3 s from expiring.
    job.heartbeat_at = now - 12.0
    store.put_job(job)
    assert store.acquire_job_lease(job.job_id, "dead-runner", 3.0)
    stalled = client.get(f"/v1/jobs/{job.job_id}", headers=headers).json()
    assert (stalled["status"], stalled["health"]) == ("running", "stalled")
    assert 12.0 <= stalled["heartbeatAgeS"] < 20
    assert re.search(
        r"^no heartbeat from its runner for 1\d\.\d s .*: it resumes by itself when its lease expires at "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in [0-3]\.\d s\) "
        r"\(its runner's last word: 40 of 50 inputs to go\)$",
        stalled["message"],
    ), stalled["message"]
    line = job_progress_line(stalled)
    assert "STALLED: no heartbeat from its runner for 1" in line

    # The lease gone, nobody holds it: the supervisor's next look resumes it.
    store.release_job_lease(job.job_id, "dead-runner")
    free = client.get(f"/v1/jobs/{job.job_id}", headers=headers).json()
    assert free["health"] == "stalled" and "nobody holds it: it resumes within 1 s" in free["message"]
    # A finished job has no heartbeat to speak of.
    job.status = JobStatus.COMPLETED
    store.put_job(job)
    done = client.get(f"/v1/jobs/{job.job_id}", headers=headers).json()
    assert (done["health"], done["heartbeatAgeS"]) == ("ok", None)


def test_offline_query_errors_over_http(api: tuple[TestClient, Services, dict[str, str]]) -> None:
    client, _, headers = api
    body = {"appID": APP, "inputPath": IN, "outputPath": f"{IN}out/", "accuracy": 0.5}
    inside = client.post("/v1/offline_query", json=body, headers=headers)
    assert inside.status_code == 400 and inside.json()["error"]["code"] == "invalid_job"
    assert "lies inside inputPath" in inside.json()["error"]["message"]
    no_target = client.post("/v1/offline_query", json={**body, "accuracy": None}, headers=headers)
    assert no_target.status_code == 400 and "an accuracy target, a modelName or a pipeline" in no_target.text
    outside = {**body, "outputPath": f"s3://{BUCKET}/results/", "accuracy": None}
    no_pipeline = client.post("/v1/offline_query", json={**outside, "pipeline": "nope"}, headers=headers)
    assert no_pipeline.status_code == 404 and "no pipeline named 'nope'" in no_pipeline.text
    both = client.post(
        "/v1/offline_query", json={**outside, "pipeline": "nope", "modelName": MODEL}, headers=headers
    )
    assert both.status_code == 400 and "not both" in both.text
    wrong_app = client.post("/v1/offline_query", json={**body, "appID": "api-app"}, headers=headers)
    assert wrong_app.status_code == 403
    assert client.get("/v1/jobs/job-nope", headers=headers).status_code == 404
    assert client.post("/v1/offline_query", json=body).status_code == 401


@pytest.mark.parametrize(
    ("accuracy", "message"),
    [
        (True, r"body\.accuracy: Input should be a valid number"),
        ("0.9", r"body\.accuracy: Input should be a valid number"),
        (1e308, r"body\.accuracy: Input should be less than or equal to 1"),
        (10**400, r"body\.accuracy: Input should be a (valid|finite) number"),
    ],
    ids=["boolean", "numeric-string", "huge", "huge-integer"],
)
def test_an_offline_target_of_the_wrong_type_or_size_is_400_and_starts_nothing(
    api: tuple[TestClient, Services, dict[str, str]],
    store: InMemoryMetadataStore,
    launcher: RecordingLauncher,
    accuracy: Any,
    message: str,
) -> None:
    client, _, headers = api
    body = json.dumps({"appID": APP, "inputPath": IN, "outputPath": OUT, "accuracy": accuracy})

    refused = client.post(
        "/v1/offline_query", content=body, headers={**headers, "Content-Type": "application/json"}
    )

    assert refused.status_code == 400, refused.text
    assert re.search(message, refused.json()["error"]["message"]), refused.text
    assert store.list_jobs(APP) == [] and launcher.launched == []


def test_a_retried_offline_query_with_its_idempotency_key_starts_one_job(
    api: tuple[TestClient, Services, dict[str, str]],
    store: InMemoryMetadataStore,
    launcher: RecordingLauncher,
) -> None:
    client, _, headers = api
    body = {"appID": APP, "inputPath": IN, "outputPath": OUT, "accuracy": 0.5}
    keyed = {**headers, "Idempotency-Key": "job-key-1"}

    first = client.post("/v1/offline_query", json=body, headers=keyed)
    again = client.post("/v1/offline_query", json=body, headers=keyed)

    assert first.status_code == again.status_code == 202, again.text
    assert again.json() == first.json()  # the first reply: the same job, the same status
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert [job.job_id for job in store.list_jobs(APP)] == [first.json()["jobId"]]
    assert launcher.launched == [first.json()["jobId"]]

    # The same key with another request: 409 naming the clash, and nothing started.
    other = client.post("/v1/offline_query", json={**body, "accuracy": 0.6}, headers=keyed)
    assert other.status_code == 409, other.text
    error = other.json()["error"]
    assert error["code"] == "idempotency_conflict" and error["details"]["reason"] == "different_request"
    assert "Idempotency-Key 'job-key-1' was used" in error["message"]
    assert len(store.list_jobs(APP)) == 1 and len(launcher.launched) == 1

    # Without a key, or with a new one, a request is a new job.
    assert client.post("/v1/offline_query", json=body, headers=headers).status_code == 202
    renewed = client.post("/v1/offline_query", json=body, headers={**headers, "Idempotency-Key": "k2"})
    assert renewed.status_code == 202
    assert len(store.list_jobs(APP)) == 3


def test_a_refused_offline_query_gives_its_idempotency_key_back(
    api: tuple[TestClient, Services, dict[str, str]], store: InMemoryMetadataStore
) -> None:
    client, _, headers = api
    keyed = {**headers, "Idempotency-Key": "job-key-2"}
    inside = {"appID": APP, "inputPath": IN, "outputPath": f"{IN}out/", "accuracy": 0.5}

    assert client.post("/v1/offline_query", json=inside, headers=keyed).status_code == 400
    fixed = client.post("/v1/offline_query", json={**inside, "outputPath": OUT}, headers=keyed)

    assert fixed.status_code == 202, fixed.text  # the refusal created nothing: the key is free
    assert len(store.list_jobs(APP)) == 1


def test_a_malformed_idempotency_key_is_400(api: tuple[TestClient, Services, dict[str, str]]) -> None:
    client, _, headers = api
    body = {"appID": APP, "inputPath": IN, "outputPath": OUT, "accuracy": 0.5}
    refused = client.post("/v1/offline_query", json=body, headers={**headers, "Idempotency-Key": "x" * 256})
    assert refused.status_code == 400 and "Idempotency-Key must be 1 to 255" in refused.text


def test_a_refused_manifests_job_shows_over_http_whatever_its_paths(
    api: tuple[TestClient, Services, dict[str, str]], objects: InMemoryObjectStore
) -> None:
    client, services, headers = api
    assert services.offline is not None
    objects.put(BUCKET, "odd.job.json", manifest(inputPath=7, outputPath="s3://Not A Bucket/"))
    refused = S3JobStarter(services.offline).start(s3_record("odd.job.json"))
    reply = client.get(f"/v1/jobs/{refused['job_id']}", headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "failed" and "inputPath must be a string" in reply.json()["message"]
    assert [j["jobId"] for j in client.get("/v1/jobs", headers=headers).json()["jobs"]] == [refused["job_id"]]


def test_a_bucket_the_service_may_not_read_is_a_403_that_says_what_to_grant(
    api: tuple[TestClient, Services, dict[str, str]], store: InMemoryMetadataStore
) -> None:
    """S3 answers a HEAD on a bucket the credentials may not read with a bare 403 (the same for
    a bucket that does not exist, when ListBucket is not granted): a refusal, never a 500."""
    import boto3
    from botocore.stub import Stubber

    from modelless.offline.objects import S3ObjectStore

    client, services, headers = api
    assert services.offline is not None
    s3 = boto3.client("s3", region_name="us-east-1")
    services.offline.objects_factory = lambda: S3ObjectStore(s3)
    services.offline._objects = None
    store.set_offline_buckets(APP, [BUCKET, "locked"])
    with Stubber(s3) as stub:
        stub.add_response("head_bucket", {}, {"Bucket": BUCKET})
        stub.add_client_error("head_bucket", "403", "Forbidden", 403, expected_params={"Bucket": "locked"})
        reply = client.post(
            "/v1/offline_query",
            json={"appID": APP, "inputPath": IN, "outputPath": "s3://locked/out/", "accuracy": 0.5},
            headers=headers,
        )
        stub.assert_no_pending_responses()
    assert reply.status_code == 403, reply.text
    error = reply.json()["error"]
    assert error["code"] == "s3_access_denied"
    assert error["message"].startswith(
        "outputPath s3://locked/out/: the service may not read bucket 'locked'"
    )
    assert "s3:ListBucket" in error["message"] and "allow-buckets" in error["message"]
    assert store.list_jobs(APP) == []


def test_admin_sets_an_apps_buckets(
    api: tuple[TestClient, Services, dict[str, str]], store: InMemoryMetadataStore
) -> None:
    client, _, headers = api
    assert (
        client.put(f"/v1/apps/{APP}/offline-buckets", json={"buckets": [OTHER]}, headers=headers).status_code
        == 401
    )
    reply = client.put(
        f"/v1/apps/{APP}/offline-buckets", json={"buckets": [OTHER, BUCKET]}, headers={"X-Api-Key": "adm"}
    )
    assert reply.status_code == 200 and reply.json()["buckets"] == sorted([OTHER, BUCKET])
    assert store.offline_buckets(APP) == sorted([OTHER, BUCKET])
    bad = client.put(
        f"/v1/apps/{APP}/offline-buckets", json={"buckets": ["Not A Bucket"]}, headers={"X-Api-Key": "adm"}
    )
    assert bad.status_code == 400


def test_cli_parses_offline_commands() -> None:
    args = parse_args(
        ["offline-query", "--app", APP, "--input", IN, "--output", OUT, "--accuracy", "0.9", "--wait"]
    )
    assert (args.input, args.output, args.accuracy, args.wait) == (IN, OUT, 0.9, True)
    args = parse_args(["job", "status", "job-1", "--app", APP, "--wait"])
    assert (args.job_id, args.wait, args.job_command) == ("job-1", True, "status")
    args = parse_args(["allow-buckets", APP, "b1", "b2"])
    assert args.buckets == ["b1", "b2"]


def job_reply(**changes: Any) -> dict[str, Any]:
    return {
        "jobId": "job-1",
        "status": "running",
        "done": 120,
        "total": 500,
        "errors": 3,
        "succeeded": 117,
        "throughput": 35.24,
        "elapsedSeconds": 3.4,
        "activeSeconds": 3.0,
        "paused": False,
        "pauseReason": "",
        "variant": "app/m/fp32/cpu-1t",
        "inputPath": IN,
        "outputPath": OUT,
        "summaryPath": None,
        "message": "working",
        "runs": 1,
        "errorSamples": [{"input": f"{IN}bad.npy", "error": "not a readable .npy file"}],
        **changes,
    }


def test_job_progress_line_and_report() -> None:
    line = job_progress_line(job_reply())
    assert line == "[#######.......................] 120/500 24% running, 35.2 inputs/s, 3 failed"
    paused = job_progress_line(job_reply(paused=True, pauseReason="w-1: online utilisation 55% > 40%"))
    assert paused.endswith("(paused: w-1: online utilisation 55% > 40%)")
    assert job_progress_line(job_reply(total=0, done=0, status="completed")).startswith("[" + "#" * 30)
    restarted = job_report(
        job_reply(restarts=1, lastRunnerFailure="runner exited with signal 9 at …; resumed")
    )
    assert "  restarts: 1 (last: runner exited with signal 9 at …; resumed)" in restarted.splitlines()
    assert "restarts" not in job_report(job_reply())
    report = job_report(job_reply(status="completed", summaryPath=f"{OUT}_jobs/job-1.summary.json"))
    assert "summary:  s3://" in report and f"failed:   {IN}bad.npy: not a readable .npy file" in report


def test_cli_job_status_waits_with_a_progress_bar_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelless import cli

    replies = iter(
        [
            job_reply(done=100),
            job_reply(done=400),
            job_reply(done=500, status="completed", errors=0, errorSamples=[]),
        ]
    )

    class FakeClient:
        def __enter__(self) -> FakeClient:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def wait_for_job(self, job_id: str, on_progress: Any, poll_s: float) -> dict[str, Any]:
            for reply in replies:
                on_progress(reply)
            return reply

    monkeypatch.setattr(cli, "_client", lambda args: FakeClient())
    cli.main(["job", "status", "job-1", "--app", APP, "--wait", "--interval", "0"])
    out, err = capsys.readouterr()
    assert "100/500" in err and "400/500" in err and "500/500 100% completed" in err
    assert out.startswith("job job-1: completed")


# --- the offline Lambda handler ------------------------------------------------------------------------


class FakeContext:
    function_name = "offline"
    function_version = "$LATEST"
    memory_limit_in_mb = 1769
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:offline"
    aws_request_id = "req-1"
    log_group_name = "/aws/lambda/offline"
    log_stream_name = "stream"

    def get_remaining_time_in_millis(self) -> int:
        return 120_000


def test_the_offline_handler_runs_an_s3_started_job_once(
    monkeypatch: pytest.MonkeyPatch, objects: InMemoryObjectStore, tmp_path: Any
) -> None:
    import importlib
    import sys

    monkeypatch.setenv("MODELLESS_METADATA_URL", "memory://")
    sys.modules.pop("functions.offline.app", None)
    offline = importlib.import_module("functions.offline.app")
    store = offline.offline.service.store
    store.create_app(APP, "hash")
    publish(store, [variant()])
    store.set_offline_buckets(APP, [BUCKET])
    offline.offline.service._objects = objects
    launcher = RecordingLauncher()
    offline.offline.service.launcher = launcher
    compute = FakeCompute(variant())
    monkeypatch.setattr(offline.offline.service, "compute", lambda: compute)
    objects.put(BUCKET, "run.job.json", manifest())
    event = {
        "Records": [
            {
                "eventSource": "aws:sqs",
                "messageId": "m-1",
                "body": json.dumps({"Records": [s3_record("run.job.json")]}),
            }
        ]
    }

    first = offline.handler(event, FakeContext())
    duplicate = offline.handler(event, FakeContext())

    assert [r["outcome"] for r in first["runs"]] == ["completed"]
    assert first["events"][0]["status"] == "started"
    # The duplicate got the first delivery's result from the idempotency store; its run is a no-op.
    assert duplicate["events"] == first["events"] and duplicate["runs"][0]["processed"] == 0
    assert sum(compute.runs) == 3 and launcher.launched == []
    continued = offline.handler({"jobId": first["runs"][0]["jobId"]}, FakeContext())
    assert continued["runs"][0]["outcome"] == "completed"
    assert offline.handler({"source": "aws.events", "id": "e-1"}, FakeContext()) == {"runs": []}


@pytest.mark.parametrize(
    ("mode", "url", "expected"),
    [
        ("auto", "redis://127.0.0.1:6379/0", True),
        ("auto", "memory://", False),
        ("thread", "redis://127.0.0.1:6379/0", False),
        ("process", "redis://127.0.0.1:6379/0", True),
    ],
)
def test_where_the_embedded_stack_runs_jobs(mode: str, url: str, expected: bool) -> None:
    from modelless.offline.child_processes import runs_in_child_processes

    assert runs_in_child_processes(Settings(metadata_url=url, offline_runner=mode)) is expected


CHILD = """
import json, sys
args = sys.argv[1:]
job_id, report_file = args[1], args[args.index("--report-file") + 1]
# Its log lines look like reports (a JSON log with the job's id and an outcome) and come last.
print(json.dumps({"jobId": job_id, "outcome": "failed", "processed": 0}))
with open(report_file, "w") as out:
    out.write(json.dumps({"jobId": job_id, "outcome": "completed", "processed": 7}) + "\\n")
print(json.dumps({"level": "INFO", "jobId": job_id, "outcome": "lost-lease", "processed": 1}))
"""


def test_a_child_runner_reports_through_its_own_channel_not_its_log_stream(
    tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    from modelless.offline.child_processes import ChildProcessRunner

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    runner = ChildProcessRunner(
        "redis://127.0.0.1:6379/0", command=[sys.executable, str(script)], store=InMemoryMetadataStore()
    )

    report = runner("job-1")

    assert (report.outcome, report.processed) == (RunOutcome.COMPLETED, 7)
    assert '"outcome": "lost-lease"' in capfd.readouterr().out  # its logs went on to ours
    script.write_text("import sys; print('crashed before reporting'); sys.exit(0)")
    with pytest.raises(RuntimeError, match="wrote no report"):
        runner("job-1")


# A runner child that follows a plan, one step per child started: "kill" (SIGKILL itself), "exit3",
# "hang" (until killed) or "complete" (reports 7 inputs done). Each child appends its lease owner
# id (given by its parent) to owners.log.
PLANNED_CHILD = """
import json, os, signal, sys, time
from pathlib import Path
args = sys.argv[1:]
job_id, owner = args[1], args[args.index("--owner") + 1]
report_file = args[args.index("--report-file") + 1]
here = Path(__file__).parent
with open(here / "owners.log", "a") as log:
    log.write(owner + "\\n")
plan = (here / "plan.txt").read_text().split()
step = plan[min(len((here / "owners.log").read_text().split()), len(plan)) - 1]
if step == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if step == "exit3":
    sys.exit(3)
if step == "hang":
    time.sleep(120)
with open(report_file, "w") as out:
    out.write(json.dumps({"jobId": job_id, "outcome": "completed", "processed": 7}) + "\\n")
"""


class WatchedStore(InMemoryMetadataStore):
    """Records the leases released; ``held_by_child`` makes the lease look held by the latest
    child for its first ``held_by_child`` looks (a child holds it in the real store); ``progress``
    makes every child started look as if it finished one input."""

    def __init__(self, owners: Any, held_by_child: int = 0, progress: bool = False) -> None:
        super().__init__()
        self.owners_log, self.held_by_child, self.progress = owners, held_by_child, progress
        self.released: list[str] = []

    def owners(self) -> list[str]:
        return self.owners_log.read_text().split() if self.owners_log.exists() else []

    def release_job_lease(self, job_id: str, owner: str) -> None:
        self.released.append(owner)
        super().release_job_lease(job_id, owner)

    def job_lease_holder(self, job_id: str) -> str | None:
        if self.held_by_child > 0 and self.owners():
            self.held_by_child -= 1
            return self.owners()[-1]
        return super().job_lease_holder(job_id)

    def job_progress(self, job_id: str) -> tuple[int, int]:
        return (len(self.owners()), 0) if self.progress else super().job_progress(job_id)


def planned_runner(
    tmp_path: Any, plan: str, store: WatchedStore, **policy: float
) -> tuple[Any, WatchedStore]:
    from modelless.offline.child_processes import ChildProcessRunner, RestartPolicy

    (tmp_path / "plan.txt").write_text(plan)
    script = tmp_path / "child.py"
    script.write_text(PLANNED_CHILD)
    store.create_job(OfflineJob("job-1", APP, IN, OUT, status=JobStatus.RUNNING))
    restarts = RestartPolicy(**{"first_delay_s": 0.05, "max_delay_s": 0.1, **policy})  # type: ignore[arg-type]
    runner = ChildProcessRunner(
        "redis://127.0.0.1:6379/0", command=[sys.executable, str(script)], store=store, restarts=restarts
    )
    return runner, store


def test_a_child_runner_that_dies_is_freed_recorded_and_started_again_at_once(tmp_path: Any) -> None:
    runner, store = planned_runner(tmp_path, "kill complete", WatchedStore(tmp_path / "owners.log"))

    started = time.monotonic()
    report = runner("job-1")

    assert (report.outcome, report.processed) == (RunOutcome.COMPLETED, 7)
    assert time.monotonic() - started < 10.0  # a restart, not a lease's expiry (10 s)
    dead, second = store.owners()
    assert dead != second and dead in store.released  # the dead child's lease, freed at once
    job = store.get_job("job-1")
    assert job is not None and job.restarts == 1
    assert re.fullmatch(
        r"runner exited with signal 9 \(SIGKILL\) at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; resumed",
        job.runner_failure,
    ), job.runner_failure
    assert store.job_lease_holder("job-1") is None  # the launcher's own note-taking lease, gone too


def test_a_job_whose_runner_keeps_dying_without_progress_is_failed_saying_why(tmp_path: Any) -> None:
    watched = WatchedStore(tmp_path / "owners.log")
    runner, store = planned_runner(tmp_path, "exit3", watched, max_in_a_row=3, give_up_after_s=0.0)

    report = runner("job-1")

    assert report.outcome is RunOutcome.FAILED
    assert len(store.owners()) == 3  # started twice again, then given up on
    job = store.get_job("job-1")
    assert job is not None and job.status is JobStatus.FAILED and job.restarts == 2
    assert "died 3 times in a row without finishing an input" in job.message
    assert "runner exited with code 3" in job.message and store.unfinished_jobs() == []


def test_deaths_between_which_inputs_were_finished_do_not_add_up(tmp_path: Any) -> None:
    watched = WatchedStore(tmp_path / "owners.log", progress=True)
    plan = "exit3 exit3 exit3 exit3 complete"
    runner, store = planned_runner(tmp_path, plan, watched, max_in_a_row=2, give_up_after_s=0.0)

    assert runner("job-1").outcome is RunOutcome.COMPLETED

    job = store.get_job("job-1")
    assert job is not None and job.restarts == 4 and job.status is JobStatus.RUNNING


def test_deaths_in_a_row_fail_the_job_only_once_they_have_lasted_a_while(tmp_path: Any) -> None:
    """A runner that exits on an error it cannot handle (S3 down for some seconds) is not a job
    that kills its runner every time: the streak must also last ``give_up_after_s``."""
    watched = WatchedStore(tmp_path / "owners.log")
    plan = "exit3 exit3 exit3 complete"
    runner, store = planned_runner(tmp_path, plan, watched, max_in_a_row=2, give_up_after_s=60.0)

    assert runner("job-1").outcome is RunOutcome.COMPLETED

    job = store.get_job("job-1")
    assert job is not None and job.restarts == 3 and job.status is JobStatus.RUNNING


def test_a_child_runner_that_hangs_after_losing_its_lease_is_killed_and_replaced(tmp_path: Any) -> None:
    # The child is seen holding its lease twice, then no more (its keepalive stopped): hung.
    watched = WatchedStore(tmp_path / "owners.log", held_by_child=2)
    runner, store = planned_runner(tmp_path, "hang complete", watched, watch_every_s=0.05, hung_grace_s=0.3)

    report = runner("job-1")

    assert report.outcome is RunOutcome.COMPLETED and len(store.owners()) == 2
    job = store.get_job("job-1")
    assert job is not None and job.restarts == 1 and "runner hung" in job.runner_failure


def test_closing_a_child_runner_stops_its_child_without_starting_another(tmp_path: Any) -> None:
    runner, store = planned_runner(tmp_path, "hang", WatchedStore(tmp_path / "owners.log"))
    reports: list[Any] = []
    thread = threading.Thread(target=lambda: reports.append(runner("job-1")))
    thread.start()
    wait_for(lambda: (runner.pid_of("job-1") and store.owners()) or None, 10.0, "the child to start its run")

    runner.close()
    thread.join(timeout=30)

    assert [r.outcome for r in reports] == [RunOutcome.YIELDED] and len(store.owners()) == 1
    assert store.owners()[0] in store.released  # the next start resumes the job at once
    job = store.get_job("job-1")
    assert job is not None and job.restarts == 0


def test_child_processes_need_a_shared_store() -> None:
    from modelless.offline.child_processes import ChildProcessRunner

    with pytest.raises(ValueError, match="shared metadata store"):
        ChildProcessRunner("memory://")
    with pytest.raises(ValueError, match="auto, process or thread"):
        OfflineService.from_settings(Settings(offline_runner="fork"), InMemoryMetadataStore(), DEFAULT_POOLS)
