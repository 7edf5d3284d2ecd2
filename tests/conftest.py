"""Shared fixtures. Real services come from scripts/test through the environment:

- ``MODELLESS_TEST_REDIS_URL``: a real Redis (tests use their own database and a unique key
  prefix per test, and delete what they wrote);
- ``MODELLESS_TEST_AWS_ENDPOINT``: moto's server, an emulated AWS HTTP endpoint; or a LocalStack,
  with ``MODELLESS_TEST_AWS_BACKEND=localstack`` (scripts/test-localstack). Against LocalStack only
  the tests marked ``localstack`` run (those of the services it emulates without Docker); against
  moto every test runs but those marked ``localstack(moto=False)`` (what moto cannot do, such as
  firing a scheduled EventBridge rule). Both are deselections, listed in pytest's summary.

Without them, tests that need them skip, unless ``MODELLESS_REQUIRE_SERVICES=1`` (set by
scripts/test and so CI), where a missing service is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from aws_lambda_powertools import Metrics

from infra.local.redis_server import find_redis_server
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.repository.local import LocalModelRepository

# boto3 needs credentials and a region even against an emulator; never real ones in tests.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_name] = _value
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
# The prediction cache answers a repeated query without running it: a test of serving that sends
# one input twice would test the cache instead. Off, unless a test turns it on (the tests of the
# cache itself: tests/*/test_prediction_cache.py); child processes inherit it.
os.environ.setdefault("MODELLESS_PREDICTION_CACHE_ENABLED", "false")


AWS_BACKENDS = ("moto", "localstack")


def aws_backend() -> str:
    """The AWS emulator ``MODELLESS_TEST_AWS_ENDPOINT`` is: moto's server unless
    ``MODELLESS_TEST_AWS_BACKEND`` says ``localstack``."""
    backend = os.environ.get("MODELLESS_TEST_AWS_BACKEND", "moto")
    if backend not in AWS_BACKENDS:
        raise pytest.UsageError(f"MODELLESS_TEST_AWS_BACKEND must be one of {AWS_BACKENDS}, got {backend!r}")
    return backend


def runs_against(item: pytest.Item, backend: str) -> bool:
    marker = item.get_closest_marker("localstack")
    if backend == "localstack":
        return marker is not None
    return marker is None or bool(marker.kwargs.get("moto", True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backend = aws_backend()
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        (kept if runs_against(item, backend) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(autouse=True)
def fresh_metric_set() -> Iterator[None]:
    """Powertools keeps one metric set per process, and with metrics disabled (as here) a flush
    never clears it: a test that reads the EMF a handler prints would see earlier tests' values."""
    Metrics().clear_metrics()
    yield
    Metrics().clear_metrics()


def missing_service(required: str, skipped: str) -> NoReturn:
    """A service a test needs is not here: a failure where scripts/test runs (it provides every
    one), else a skip."""
    if os.environ.get("MODELLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(required)
    pytest.skip(skipped)


def service_url(variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        missing_service(
            f"{variable} is not set: scripts/test starts this service",
            f"{variable} not set (run through scripts/test)",
        )
    return value


def redis_server_binary() -> str:
    """The redis-server binary, for tests that start (and stop, kill, restart) servers of their
    own."""
    binary = find_redis_server()
    if binary is None:
        message = "redis-server is not installed (scripts/lib.sh ensure_redis_server_binary)"
        missing_service(message, message)
    return binary


@pytest.fixture
def redis_store() -> Iterator[RedisMetadataStore]:
    base = service_url("MODELLESS_TEST_REDIS_URL")
    store = RedisMetadataStore.from_url(f"{base}?prefix=test-{uuid.uuid4().hex[:12]}:")
    try:
        yield store
    finally:
        store.flush_namespace()
        store.close()


@pytest.fixture
def memory_store() -> InMemoryMetadataStore:
    return InMemoryMetadataStore()


@pytest.fixture(params=["memory", "redis"])
def any_store(request: pytest.FixtureRequest) -> Iterator[object]:
    """Both metadata store backends, for contract tests."""
    if request.param == "memory":
        yield InMemoryMetadataStore()
    else:
        yield request.getfixturevalue("redis_store")


@pytest.fixture
def aws_endpoint(monkeypatch: pytest.MonkeyPatch) -> str:
    endpoint = service_url("MODELLESS_TEST_AWS_ENDPOINT")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    if aws_backend() == "localstack":
        # The code under test makes its clients as a deployment pointed at a LocalStack does
        # (modelless.aws_clients: localstack-client's session); child processes inherit it.
        monkeypatch.setenv("MODELLESS_AWS", "localstack")
    return endpoint


@pytest.fixture
def s3_bucket(aws_endpoint: str) -> Iterator[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    bucket = f"test-models-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    try:
        yield bucket
    finally:
        objects = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        for item in objects:
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)


@pytest.fixture
def local_repository(tmp_path: Path) -> LocalModelRepository:
    return LocalModelRepository(tmp_path / "repo")
