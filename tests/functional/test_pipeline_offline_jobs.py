"""A pipeline as the target of an offline S3 batch job, on real parts: moto's S3, Redis, and a
real worker process running the real digits models. Every input row takes its own path through
the DAG (a cascade sends only the rows the cheap model is unsure of to the expensive one); each
result holds each row's answering stage and that stage's real outputs; the stage variants are
pinned on the job; the branch counts the planner weighs load by include the job's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modelless.exceptions import InvalidJobError, NotFoundError
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.jobs import JobSpec, output_key
from modelless.offline.runner import RunOutcome
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from modelless.types import JobStatus
from tests.functional.offline_fixtures import Buckets, offline_service
from tests.functional.test_pipelines import CASCADE, THRESHOLD, confidence_of
from tests.functional.workers_kit import Setup, publish_model, start_worker
from tests.models import digits, hidden_model, linear_model
from tests.offline_kit import npy

pytestmark = [pytest.mark.usefixtures("buckets"), pytest.mark.localstack]

APP = "pipeline-batch"


def logits(model: bytes, inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"input": inputs})[0].astype(np.float64)
    return result


@pytest.fixture
def published(setup: Setup, pool: LocalWorkerPool, redis_store: RedisMetadataStore, buckets: Buckets) -> None:
    repository = LocalModelRepository(Path(setup.repository_url))
    publish_model(redis_store, repository, APP, "linear", linear_model(), accuracy=0.86, p99_ms=5.0)
    publish_model(redis_store, repository, APP, "hidden", hidden_model(), accuracy=0.93, p99_ms=8.0)
    redis_store.create_app(APP, "not-a-real-key-hash")
    redis_store.set_offline_buckets(APP, [buckets.data])
    start_worker(pool, redis_store)


@pytest.mark.usefixtures("published")
def test_a_cascade_job_routes_each_row_and_writes_each_rows_answering_stage(
    redis_store: RedisMetadataStore, buckets: Buckets
) -> None:
    service = offline_service(redis_store)
    service.pipeline_store().create(APP, CASCADE)
    inputs = np.ascontiguousarray(digits()[0][-60:])
    # Six objects of 1-3 rows: routing is per row, within an object too.
    sizes = [1, 2, 3, 1, 3, 2]
    keys, start = [], 0
    for index, size in enumerate(sizes):
        key = f"in/batch-{index}.npy"
        buckets.s3.put_object(Bucket=buckets.data, Key=key, Body=npy(inputs[start : start + size]))
        keys.append((key, start, size))
        start += size
    used = inputs[:start]
    cheap, expensive = logits(linear_model(), used), logits(hidden_model(), used)
    unsure = confidence_of(linear_model(), used) < THRESHOLD
    assert 0 < unsure.sum() < len(used), "the sample must take both paths"

    job = service.submit(
        JobSpec(APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", pipeline="cascade"),
        launch=False,
    )
    report = service.run(job.job_id)

    assert report.outcome is RunOutcome.COMPLETED, report.message
    finished = redis_store.get_job(job.job_id)
    assert finished is not None and finished.status is JobStatus.COMPLETED
    assert finished.pipeline == "cascade"
    assert set(finished.stage_variants) == {"cheap", "expensive"}
    for key, first, size in keys:
        result = buckets.read_json(output_key("in/", "out/", key))
        assert result["pipeline"] == "cascade"
        want_stage = ["expensive" if unsure[first + i] else "cheap" for i in range(size)]
        assert result["answeredBy"] == want_stage
        for i, stage in enumerate(want_stage):
            want = (expensive if stage == "expensive" else cheap)[first + i]
            np.testing.assert_allclose(result["outputs"][i], want, rtol=1e-4, atol=1e-4)
            assert result["predictions"][i] == int(np.argmax(want))
        assert result["stages"]["expensive"]["model"] == "hidden"
    summary = buckets.read_json(finished.summary_key.split("/", 3)[3] if finished.summary_key else "")
    assert summary["pipeline"] == "cascade" and summary["succeeded"] == len(sizes)
    assert summary["stages"]["cheap"]["variant"] == finished.stage_variants["cheap"]
    counts = service.pipeline_store().branches(APP, "cascade")["cheap->expensive"]
    assert (counts.seen, counts.taken) == (len(used), int(unsure.sum()))


@pytest.mark.usefixtures("published")
def test_pipeline_jobs_are_refused_up_front_with_the_reason(
    redis_store: RedisMetadataStore, buckets: Buckets
) -> None:
    service = offline_service(redis_store)
    service.pipeline_store().create(APP, CASCADE)
    buckets.s3.put_object(Bucket=buckets.data, Key="in/one.npy", Body=npy(digits()[0][:1]))
    where = (f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/")

    with pytest.raises(NotFoundError, match="no pipeline named 'nope'"):
        service.submit(JobSpec(APP, *where, pipeline="nope"), launch=False)
    with pytest.raises(InvalidJobError, match="not both"):
        service.submit(JobSpec(APP, *where, model_name="linear", pipeline="cascade"), launch=False)
    # A floor the expensive stage's model cannot meet names the stage.
    with pytest.raises(Exception, match="stage 'cheap'"):
        service.submit(JobSpec(APP, *where, min_accuracy=0.9, pipeline="cascade"), launch=False)
    assert redis_store.list_jobs(APP) == []
