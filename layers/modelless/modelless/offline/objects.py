"""The object store offline jobs read inputs from and write results to: S3 through boto3 (AWS,
or an emulator through ``AWS_ENDPOINT_URL``), and an in-memory one for unit tests.

Results are written with ``put_once``: a conditional write (``If-None-Match: *``) that never
makes a second copy of an object. A rerun of the same job finds its own earlier write and
leaves it; a different job's old result at that key is replaced (the newer job supersedes it).

S3's 403 (the service's IAM role may not read or write a bucket) becomes ``S3AccessDeniedError``,
a 403 that says what to grant, never a 500.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from modelless.exceptions import NotFoundError, S3AccessDeniedError

OWNER_METADATA = "modelless-job"  # x-amz-meta-modelless-job: the job that wrote the object


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str = ""


class WriteOutcome(StrEnum):
    WRITTEN = "written"  # the object did not exist: written now
    ALREADY_WRITTEN = "already-written"  # this job had written it (a rerun): left as it was
    REPLACED = "replaced"  # another job's object was there: replaced by this job's


ACCESS_DENIED_CODES = {"403", "AccessDenied", "Forbidden", "AllAccessDisabled", "AccountProblem"}


class ObjectStore(Protocol):
    def bucket_exists(self, bucket: str) -> bool:
        """Whether the bucket exists; raises ``S3AccessDeniedError`` when the service may not use it."""

    def list_objects(self, bucket: str, prefix: str, limit: int) -> list[ObjectInfo]:
        """Objects under ``prefix`` in key order, at most ``limit`` (one more tells the caller
        that there were more)."""

    def get(self, bucket: str, key: str) -> bytes:
        """Raise NotFoundError when the object is missing."""

    def put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        """Write ``body`` unless ``owner`` already wrote this key; never leave two copies."""

    def put(self, bucket: str, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        """Write ``body`` whatever is there (a watch's summary, rewritten as its job catches up)."""


class S3ObjectStore:
    def __init__(self, client: Any | None = None) -> None:
        if client is None:
            from modelless import aws_clients

            client = aws_clients.client("s3")
        self._s3 = client

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self._s3.head_bucket(Bucket=bucket)
        except Exception as error:
            code = _code(error)
            if code in {"404", "NoSuchBucket", "NotFound"}:
                return False
            if code in ACCESS_DENIED_CODES:
                raise S3AccessDeniedError(bucket, "read") from error
            raise
        return True

    def list_objects(self, bucket: str, prefix: str, limit: int) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        paginator = self._s3.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"], int(item.get("Size", 0)), str(item.get("ETag", ""))))
                    if len(found) >= limit:
                        return found
        except Exception as error:
            if _code(error) in ACCESS_DENIED_CODES:
                raise S3AccessDeniedError(bucket, "list") from error
            raise
        return found

    def get(self, bucket: str, key: str) -> bytes:
        try:
            response = self._s3.get_object(Bucket=bucket, Key=key)
        except Exception as error:
            code = _code(error)
            if code in {"NoSuchKey", "404", "NoSuchBucket"}:
                raise NotFoundError(f"no object s3://{bucket}/{key}", key=key) from error
            if code in ACCESS_DENIED_CODES:
                raise S3AccessDeniedError(bucket, "read", key) from error
            raise
        body: bytes = response["Body"].read()
        return body

    def put(self, bucket: str, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        try:
            self._s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        except Exception as error:
            if _code(error) in ACCESS_DENIED_CODES:
                raise S3AccessDeniedError(bucket, "write", key) from error
            raise

    def put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        try:
            return self._put_once(bucket, key, body, owner, content_type)
        except Exception as error:
            if _code(error) in ACCESS_DENIED_CODES:
                raise S3AccessDeniedError(bucket, "write", key) from error
            raise

    def _put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        for attempt in range(5):
            try:
                self._s3.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=body,
                    ContentType=content_type,
                    Metadata={OWNER_METADATA: owner},
                    IfNoneMatch="*",
                )
                return WriteOutcome.WRITTEN
            except Exception as error:
                code = _code(error)
                if code == "ConditionalRequestConflict":
                    # A concurrent conditional write to the key is in flight (S3 answers 409): the
                    # other writer finishes first, then the object is there to be judged.
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if code not in {"PreconditionFailed", "412"}:
                    raise
            head = self._s3.head_object(Bucket=bucket, Key=key)
            if head.get("Metadata", {}).get(OWNER_METADATA) == owner:
                return WriteOutcome.ALREADY_WRITTEN
            self._s3.put_object(
                Bucket=bucket, Key=key, Body=body, ContentType=content_type, Metadata={OWNER_METADATA: owner}
            )
            return WriteOutcome.REPLACED
        raise RuntimeError(f"s3://{bucket}/{key}: conditional writes kept conflicting")


def _code(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


@dataclass
class StoredObject:
    body: bytes
    owner: str = ""
    content_type: str = "application/octet-stream"
    writes: int = 1  # how many times the key was written (exactly-once tests count them)


@dataclass
class InMemoryObjectStore:
    """Buckets in a dict, with the same conditional-write semantics as S3's."""

    buckets: dict[str, dict[str, StoredObject]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def create_bucket(self, bucket: str) -> None:
        self.buckets.setdefault(bucket, {})

    def put(self, bucket: str, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        """An upload (a user's input or manifest; a watch's summary, counted as a new write)."""
        with self._lock:
            objects = self._bucket(bucket)
            existing = objects.get(key)
            writes = existing.writes + 1 if existing is not None else 1
            objects[key] = StoredObject(body, "", content_type, writes)

    def bucket_exists(self, bucket: str) -> bool:
        return bucket in self.buckets

    def list_objects(self, bucket: str, prefix: str, limit: int) -> list[ObjectInfo]:
        objects = self._bucket(bucket)
        keys = sorted(k for k in list(objects) if k.startswith(prefix))[:limit]
        return [ObjectInfo(k, len(objects[k].body)) for k in keys]

    def get(self, bucket: str, key: str) -> bytes:
        found = self._bucket(bucket).get(key)
        if found is None:
            raise NotFoundError(f"no object s3://{bucket}/{key}", key=key)
        return found.body

    def put_once(self, bucket: str, key: str, body: bytes, owner: str, content_type: str) -> WriteOutcome:
        with self._lock:
            objects = self._bucket(bucket)
            existing = objects.get(key)
            if existing is None:
                objects[key] = StoredObject(body, owner, content_type)
                return WriteOutcome.WRITTEN
            if existing.owner == owner:
                return WriteOutcome.ALREADY_WRITTEN
            objects[key] = StoredObject(body, owner, content_type, existing.writes + 1)
            return WriteOutcome.REPLACED

    def _bucket(self, bucket: str) -> dict[str, StoredObject]:
        if bucket not in self.buckets:
            raise NotFoundError(f"no bucket {bucket!r}", bucket=bucket)
        return self.buckets[bucket]
