"""Fixtures of the offline-job functional tests: versioned buckets in the emulated S3 (so that a
second write of a result would show as a second version), an S3 → SQS notification, the linear
model published with one live worker, and an OfflineService on the test's Redis namespace."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import boto3
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.config import Settings
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.service import OfflineService
from modelless.pools.local import LocalWorkerPool
from modelless.types import VariantProfile
from tests.functional.workers_kit import APP, make_variant, publish_linear_model, sample_inputs, start_worker
from tests.offline_kit import npy
from tests.waiting import scaled


class NoLaunch:
    """A launcher that launches nothing: the test runs the job itself, when it wants to."""

    def __init__(self) -> None:
        self.launched: list[str] = []

    def launch(self, job_id: str) -> None:
        self.launched.append(job_id)

    def close(self) -> None:
        pass


@dataclass
class Buckets:
    s3: Any
    data: str  # inputs, manifests and results

    def upload_inputs(self, prefix: str, count: int) -> list[str]:
        keys = []
        for index, row in enumerate(sample_inputs(count)):
            key = f"{prefix}item-{index:04d}.npy"
            self.s3.put_object(Bucket=self.data, Key=key, Body=npy(row))
            keys.append(key)
        return keys

    def versions(self, prefix: str) -> dict[str, int]:
        """Key -> how many versions of it exist (exactly-once: 1 each)."""
        counts: dict[str, int] = {}
        paginator = self.s3.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.data, Prefix=prefix):
            for version in page.get("Versions", []):
                counts[version["Key"]] = counts.get(version["Key"], 0) + 1
        return counts

    def read_json(self, key: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.s3.get_object(Bucket=self.data, Key=key)["Body"].read())
        return data


def _empty_and_delete(s3: Any, bucket: str) -> None:
    # Listed whole before deleting: deleting while paging moves the pages' markers, and past
    # one page (1,000 versions) some would be skipped.
    paginator = s3.get_paginator("list_object_versions")
    items = [
        item
        for page in paginator.paginate(Bucket=bucket)
        for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
    ]
    for item in items:
        s3.delete_object(Bucket=bucket, Key=item["Key"], VersionId=item["VersionId"])
    s3.delete_bucket(Bucket=bucket)


@pytest.fixture
def buckets(aws_endpoint: str) -> Iterator[Buckets]:
    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    name = f"offline-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    try:
        yield Buckets(s3, name)
    finally:
        _empty_and_delete(s3, name)


@pytest.fixture
def event_queue(aws_endpoint: str, buckets: Buckets) -> Iterator[str]:
    """An SQS queue the data bucket notifies of every manifest created in it, and of every
    object created under its watched prefix ``drop/`` (S3's own notifications, as configured in
    AWS: results land outside both, so they never come back as events)."""
    sqs = boto3.client("sqs", endpoint_url=aws_endpoint)
    url = sqs.create_queue(QueueName=f"offline-events-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    buckets.s3.put_bucket_notification_configuration(
        Bucket=buckets.data,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "suffix", "Value": ".job.json"}]}},
                },
                {
                    "QueueArn": arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "drop/"}]}},
                },
            ]
        },
    )
    try:
        yield url
    finally:
        sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def served(pool: LocalWorkerPool, redis_store: RedisMetadataStore, buckets: Buckets) -> VariantProfile:
    """The linear model published (one cpu variant), one live worker, the app allowed the bucket."""
    variant = make_variant()
    publish_linear_model(redis_store, variant)
    redis_store.create_app(APP, "not-a-real-key-hash")
    redis_store.set_offline_buckets(APP, [buckets.data])
    start_worker(pool, redis_store)
    return variant


def offline_service(store: RedisMetadataStore, **settings: Any) -> OfflineService:
    service = OfflineService.from_settings(
        Settings().with_overrides(**settings), store, DEFAULT_POOLS, live_workers=store.list_workers
    )
    service.launcher = NoLaunch()
    return service


def redis_url(store: RedisMetadataStore) -> str:
    import os

    return f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={store.keys.prefix}"


def receive_all(queue_url: str, expect: int, timeout_s: float = 10.0) -> list[dict[str, object]]:
    """The S3 event messages on the queue (S3's test message, sent when the notification was
    configured, left out), as raw SQS messages."""
    sqs = boto3.client("sqs")
    messages: list[dict[str, object]] = []
    deadline = time.monotonic() + scaled(timeout_s)
    while len(messages) < expect and time.monotonic() < deadline:
        reply = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in reply.get("Messages", []):
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            if "Records" in json.loads(message["Body"]):
                messages.append(message)
    return messages


def as_lambda_event(message: dict[str, object]) -> dict[str, object]:
    """An SQS message as Lambda's SQS event source delivers it."""
    return {
        "Records": [
            {
                "eventSource": "aws:sqs",
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "attributes": {},
                "messageAttributes": {},
                "md5OfBody": message["MD5OfBody"],
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:offline-events",
                "awsRegion": "us-east-1",
            }
        ]
    }


class LambdaContext:
    function_name = "offline"
    function_version = "$LATEST"
    memory_limit_in_mb = 1769
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:offline"
    aws_request_id = "req-offline"
    log_group_name = "/aws/lambda/offline"
    log_stream_name = "stream"

    def get_remaining_time_in_millis(self) -> int:
        return 120_000


@contextmanager
def offline_function(
    monkeypatch: pytest.MonkeyPatch, store: RedisMetadataStore, **env: str
) -> Iterator[ModuleType]:
    """functions/offline/app.py as Lambda loads it (its settings from the environment), on this
    test's Redis namespace; closed afterwards."""
    monkeypatch.setenv("MODELLESS_METADATA_URL", redis_url(store))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("functions.offline.app", None)
    import functions.offline.app as offline

    try:
        yield offline
    finally:
        offline.offline.close()
        sys.modules.pop("functions.offline.app", None)
