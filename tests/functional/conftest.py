"""Fixtures shared by the functional tests: emulated AWS resources, real worker pools and the
local Lambda tier."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalWorkerPool
from modelless.pools.processes import ChildProcess
from modelless.repository.local import LocalModelRepository
from tests.functional.offline_fixtures import buckets, event_queue, served  # noqa: F401 (offline jobs)
from tests.functional.workers_kit import ARTIFACT_KEY, Setup, make_tier, report_url_of, worker_pool
from tests.models import linear_model


@pytest.fixture
def autoscaling_group(aws_endpoint: str) -> Iterator[tuple[Any, str]]:
    ec2 = boto3.client("ec2", endpoint_url=aws_endpoint)
    autoscaling = boto3.client("autoscaling", endpoint_url=aws_endpoint)
    suffix = uuid.uuid4().hex[:8]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"modelless-cpu-{suffix}",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "c5.large"},
    )["LaunchTemplate"]
    name = f"modelless-cpu-{suffix}"
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
        MinSize=1,
        MaxSize=4,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )
    try:
        yield autoscaling, name
    finally:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    repository = LocalModelRepository(tmp_path / "repo")
    repository.put(ARTIFACT_KEY, linear_model())
    return Setup(str(tmp_path / "repo"), tmp_path)


@pytest.fixture
def pool(setup: Setup, redis_store: RedisMetadataStore) -> Iterator[LocalWorkerPool]:
    # The workers report into the same Redis namespace as the test's store.
    with worker_pool(setup.repository_url, report_url_of(redis_store), setup.tmp) as workers:
        yield workers


@pytest.fixture
def invoker() -> Iterator[HttpWorkerInvoker]:
    client = HttpWorkerInvoker()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def tier(setup: Setup) -> Iterator[LocalLambdaTier]:
    lambda_tier = make_tier(setup, concurrency=2)
    try:
        yield lambda_tier
    finally:
        processes = [c.child.process for c in lambda_tier._containers]
        lambda_tier.close()
        assert all(p.poll() is not None for p in processes), "a Lambda container outlived its tier"


@pytest.fixture
def single_tier(setup: Setup) -> Iterator[LocalLambdaTier]:
    lambda_tier = make_tier(setup, concurrency=1)
    try:
        yield lambda_tier
    finally:
        lambda_tier.close()


@pytest.fixture
def spawned() -> Iterator[list[ChildProcess]]:
    """Worker processes a test starts itself (``spawn``): each stopped after the test, and none
    may outlive it."""
    children: list[ChildProcess] = []
    try:
        yield children
    finally:
        for child in children:
            child.stop()
        assert all(not child.alive() for child in children), "a worker process outlived its test"
