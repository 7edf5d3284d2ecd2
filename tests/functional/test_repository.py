"""The model repository contract: a local directory, and S3 through moto's real HTTP endpoint
(built with an explicit client, and through ``open_repository`` with the endpoint from the
environment, as the deployed code does)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest

from modelless.exceptions import BadRequestError, NotFoundError
from modelless.repository import ModelRepository, open_repository
from modelless.repository.base import fetch_to_cache
from modelless.repository.local import LocalModelRepository
from modelless.repository.s3 import S3ModelRepository

S3_BACKENDS = ("s3-client", "s3-url", "s3-url-no-prefix")
# The S3 ones run against LocalStack too (scripts/test-localstack).
BACKENDS = [
    "local",
    "memory",
    *(pytest.param(name, marks=pytest.mark.localstack) for name in S3_BACKENDS),
]


@pytest.fixture(params=BACKENDS)
def repository(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ModelRepository]:
    if request.param == "local":
        yield open_repository(str(tmp_path / "repo"))
        return
    if request.param == "memory":
        yield open_repository("memory://")
        return
    bucket: str = request.getfixturevalue("s3_bucket")
    endpoint: str = request.getfixturevalue("aws_endpoint")
    if request.param == "s3-client":
        yield S3ModelRepository(bucket, "models/v1", client=boto3.client("s3", endpoint_url=endpoint))
    elif request.param == "s3-url":
        # No client given: the endpoint comes from AWS_ENDPOINT_URL (set by the aws_endpoint fixture).
        yield open_repository(f"s3://{bucket}/models/v1")
    else:
        yield open_repository(f"s3://{bucket}")


def fill(repository: ModelRepository) -> dict[str, bytes]:
    objects = {
        "apps/a/resnet/source.onnx": b"\x00\x01model-bytes\xff" * 100,
        "apps/a/resnet/valset.npz": b"valset",
        "apps/a/resnet/variants/fp32-basic.onnx": b"fp32",
        "apps/a/resnet/variants/int8-all.onnx": b"int8",
        "apps/a/vgg/source.onnx": b"vgg",
        "apps/b/resnet/source.onnx": b"other app",
    }
    for key, data in objects.items():
        repository.put(key, data)
    return objects


def test_put_then_get_returns_the_same_bytes(repository: ModelRepository) -> None:
    objects = fill(repository)

    for key, data in objects.items():
        assert repository.get(key) == data

    repository.put("apps/a/vgg/source.onnx", b"replaced")
    assert repository.get("apps/a/vgg/source.onnx") == b"replaced"
    repository.put("empty.bin", b"")
    assert repository.get("empty.bin") == b""


def test_put_file_then_get_file_streams_the_same_bytes(repository: ModelRepository, tmp_path: Path) -> None:
    # Larger than boto3's multipart threshold (8 MB): S3 takes it in parts.
    data = bytes(range(256)) * (40 * 1024 * 4)  # 40 MiB
    source = tmp_path / "source.onnx"
    source.write_bytes(data)

    repository.put_file("apps/a/big/source.onnx", source)
    repository.get_file("apps/a/big/source.onnx", tmp_path / "back.onnx")

    assert (tmp_path / "back.onnx").read_bytes() == data
    assert repository.get("apps/a/big/source.onnx") == data
    assert repository.list_keys("apps/a/big/") == ["apps/a/big/source.onnx"]


def test_get_file_of_a_missing_key_raises_not_found(repository: ModelRepository, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        repository.get_file("apps/a/missing.onnx", tmp_path / "missing.onnx")


def test_exists(repository: ModelRepository) -> None:
    fill(repository)

    assert repository.exists("apps/a/resnet/source.onnx")
    assert not repository.exists("apps/a/resnet/missing.onnx")
    assert not repository.exists("apps/zzz/source.onnx")


def test_missing_key_raises_not_found(repository: ModelRepository) -> None:
    fill(repository)

    with pytest.raises(NotFoundError) as raised:
        repository.get("apps/a/resnet/missing.onnx")
    assert raised.value.status_code == 404
    with pytest.raises(NotFoundError):
        repository.get("nothing/here")


def test_list_keys_under_a_prefix(repository: ModelRepository) -> None:
    objects = fill(repository)

    assert repository.list_keys("apps/a/resnet/") == sorted(
        k for k in objects if k.startswith("apps/a/resnet/")
    )
    assert repository.list_keys("apps/a/resnet/variants/") == [
        "apps/a/resnet/variants/fp32-basic.onnx",
        "apps/a/resnet/variants/int8-all.onnx",
    ]
    assert repository.list_keys("apps/") == sorted(objects)
    assert repository.list_keys("apps/a/resnet/source.onnx") == ["apps/a/resnet/source.onnx"]
    assert repository.list_keys("apps/none/") == []


def test_delete_prefix_removes_only_what_is_under_it(repository: ModelRepository) -> None:
    objects = fill(repository)

    deleted = repository.delete_prefix("apps/a/resnet/")

    assert deleted == 4
    assert repository.list_keys("apps/a/resnet/") == []
    assert not repository.exists("apps/a/resnet/variants/int8-all.onnx")
    assert repository.list_keys("apps/") == ["apps/a/vgg/source.onnx", "apps/b/resnet/source.onnx"]
    assert repository.get("apps/b/resnet/source.onnx") == objects["apps/b/resnet/source.onnx"]
    assert repository.delete_prefix("apps/a/resnet/") == 0
    assert repository.delete_prefix("apps/never/") == 0


def test_delete_prefix_of_one_object(repository: ModelRepository) -> None:
    fill(repository)

    assert repository.delete_prefix("apps/a/vgg/source.onnx") == 1
    assert not repository.exists("apps/a/vgg/source.onnx")
    assert repository.exists("apps/a/resnet/source.onnx")


@pytest.mark.localstack
def test_s3_delete_prefix_handles_more_than_one_batch(s3_bucket: str, aws_endpoint: str) -> None:
    # S3's DeleteObjects takes at most 1000 keys per call.
    repository = S3ModelRepository(s3_bucket, "models", client=boto3.client("s3", endpoint_url=aws_endpoint))
    keys = [f"bulk/{index:04d}" for index in range(1003)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda key: repository.put(key, b"x"), keys))
    repository.put("keep/me", b"y")

    assert repository.delete_prefix("bulk/") == 1003
    assert repository.list_keys("bulk/") == []
    assert repository.list_keys("") == ["keep/me"]


# --- S3 specifics -----------------------------------------------------------------------------


@pytest.mark.localstack
def test_s3_objects_live_under_the_repository_prefix(s3_bucket: str, aws_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=aws_endpoint)
    first = S3ModelRepository(s3_bucket, "/models/v1/", client=client)
    second = S3ModelRepository(s3_bucket, "models/v2", client=client)
    first.put("apps/a/m/source.onnx", b"one")
    second.put("apps/a/m/source.onnx", b"two")

    raw = sorted(item["Key"] for item in client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert raw == ["models/v1/apps/a/m/source.onnx", "models/v2/apps/a/m/source.onnx"]
    assert first.get("apps/a/m/source.onnx") == b"one"
    assert second.list_keys("") == ["apps/a/m/source.onnx"]

    assert first.delete_prefix("apps/") == 1
    assert second.get("apps/a/m/source.onnx") == b"two"


@pytest.mark.localstack
def test_s3_missing_bucket_is_not_reported_as_a_missing_object(aws_endpoint: str) -> None:
    repository = S3ModelRepository(
        "no-such-bucket-modelless", client=boto3.client("s3", endpoint_url=aws_endpoint)
    )

    with pytest.raises(Exception) as raised:
        repository.get("anything")
    assert not isinstance(raised.value, NotFoundError)


# --- local specifics --------------------------------------------------------------------------

ESCAPING_KEYS = ["../outside.onnx", "apps/../../outside.onnx", "/tmp/outside.onnx", "a/../../../etc/passwd"]


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_local_repository_refuses_keys_escaping_its_root(tmp_path: Path, key: str) -> None:
    repository = LocalModelRepository(tmp_path / "nested" / "repo")

    with pytest.raises(BadRequestError):
        repository.put(key, b"evil")
    with pytest.raises(BadRequestError):
        repository.get(key)
    with pytest.raises(BadRequestError):
        repository.exists(key)
    with pytest.raises(BadRequestError):
        repository.delete_prefix(key)
    with pytest.raises(BadRequestError):
        repository.list_keys(key)
    assert not (tmp_path / "nested" / "outside.onnx").exists()
    assert not (tmp_path / "outside.onnx").exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []


def test_local_repository_refuses_the_sibling_directory_trick(tmp_path: Path) -> None:
    # "repo-evil" starts with "repo" as a string but is outside the root.
    repository = LocalModelRepository(tmp_path / "repo")

    with pytest.raises(BadRequestError):
        repository.put("../repo-evil/x.onnx", b"evil")
    assert not (tmp_path / "repo-evil").exists()


def test_local_repository_keys_inside_the_root_with_dots_are_fine(tmp_path: Path) -> None:
    repository = LocalModelRepository(tmp_path / "repo")

    repository.put("apps/a/../a/m/source.onnx", b"ok")

    assert repository.get("apps/a/m/source.onnx") == b"ok"
    assert repository.list_keys("apps/") == ["apps/a/m/source.onnx"]


def test_local_put_leaves_no_partial_files(tmp_path: Path) -> None:
    repository = LocalModelRepository(tmp_path / "repo")

    repository.put("apps/a/m/source.onnx", b"first")
    repository.put("apps/a/m/source.onnx", b"second")

    files = [p for p in (tmp_path / "repo").rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["source.onnx"]
    assert files[0].read_bytes() == b"second"


def test_open_repository_understands_file_urls(tmp_path: Path) -> None:
    by_url = open_repository(f"file://{tmp_path / 'repo'}")
    by_path = open_repository(str(tmp_path / "repo"))

    by_url.put("k/v.onnx", b"data")

    assert isinstance(by_url, LocalModelRepository)
    assert by_path.get("k/v.onnx") == b"data"
    assert (tmp_path / "repo" / "k" / "v.onnx").read_bytes() == b"data"


# --- fetch_to_cache ---------------------------------------------------------------------------


class CountingRepository:
    """Wraps a repository and counts the downloads ``fetch_to_cache`` makes."""

    def __init__(self, inner: ModelRepository) -> None:
        self.inner = inner
        self.gets: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return self.inner.get(key)

    def put_file(self, key: str, path: Path) -> None:
        self.inner.put_file(key, path)

    def get_file(self, key: str, path: Path) -> None:
        self.gets.append(key)
        self.inner.get_file(key, path)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(prefix)

    def list_keys(self, prefix: str) -> list[str]:
        return self.inner.list_keys(prefix)


def test_fetch_to_cache_copies_once(repository: ModelRepository, tmp_path: Path) -> None:
    fill(repository)
    counting = CountingRepository(repository)
    cache = tmp_path / "cache"

    first = fetch_to_cache(counting, "apps/a/resnet/variants/fp32-basic.onnx", cache)
    second = fetch_to_cache(counting, "apps/a/resnet/variants/fp32-basic.onnx", cache)

    assert first == second
    assert first.parent == cache
    assert first.read_bytes() == b"fp32"
    assert counting.gets == ["apps/a/resnet/variants/fp32-basic.onnx"]
    assert [p.name for p in cache.iterdir()] == [first.name]  # no partial file left behind


def test_fetch_to_cache_keeps_same_named_keys_apart(repository: ModelRepository, tmp_path: Path) -> None:
    fill(repository)
    cache = tmp_path / "cache"

    resnet = fetch_to_cache(repository, "apps/a/resnet/source.onnx", cache)
    vgg = fetch_to_cache(repository, "apps/a/vgg/source.onnx", cache)

    assert resnet != vgg
    assert resnet.name.endswith("source.onnx") and vgg.name.endswith("source.onnx")
    assert resnet.read_bytes() == repository.get("apps/a/resnet/source.onnx")
    assert vgg.read_bytes() == b"vgg"


def test_fetch_to_cache_of_a_missing_key_raises_and_caches_nothing(
    repository: ModelRepository, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"

    with pytest.raises(NotFoundError):
        fetch_to_cache(repository, "apps/a/missing.onnx", cache)
    assert not cache.exists() or list(cache.iterdir()) == []
