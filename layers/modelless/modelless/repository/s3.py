"""Model repository in S3, through boto3 (``modelless.aws_clients``); the endpoint URL comes from
the standard AWS settings (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``) or ``MODELLESS_AWS``, so
the same code talks to AWS or an emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from modelless import aws_clients
from modelless.exceptions import NotFoundError


class S3ModelRepository:
    def __init__(self, bucket: str, prefix: str = "", client: Any | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._s3 = client or aws_clients.client("s3")

    def _key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def put(self, key: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        try:
            response = self._s3.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                raise NotFoundError(f"no object {key!r} in the model repository", key=key) from error
            raise
        body: bytes = response["Body"].read()
        return body

    def put_file(self, key: str, path: Path) -> None:
        # boto3's managed transfer: multipart above its threshold, read from disk in parts.
        self._s3.upload_file(str(path), self.bucket, self._key(key))

    def get_file(self, key: str, path: Path) -> None:
        try:
            self._s3.download_file(self.bucket, self._key(key), str(path))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404", "NotFound"}:
                raise NotFoundError(f"no object {key!r} in the model repository", key=key) from error
            raise

    def exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404", "NotFound"}:
                return False
            raise
        return True

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(item["Key"][len(self.prefix) :] for item in page.get("Contents", []))
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list_keys(prefix)
        for start in range(0, len(keys), 1000):
            batch: list[Any] = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        return len(keys)


MISSING_CODES = {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}
DENIED_CODES = {"403", "AccessDenied", "Forbidden", "AllAccessDisabled"}


def download_object(
    bucket: str,
    key: str,
    target: Path,
    limit: int,
    setting: str,
    field: str,
    client: Any | None = None,
) -> int:
    """Copy ``s3://bucket/key`` (a registration's model or validation set) to ``target``, streamed
    by boto3's managed transfer; its size is checked first (HEAD), so that an object over ``limit``
    is refused before a byte of it is read. Returns its size.

    The client is ``aws_clients``' default, so its endpoint comes from the standard settings
    (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), as for the model repository and the offline
    jobs' objects. A missing bucket or object is a 400 naming ``field``; a refused read a 403 that
    says what to grant."""
    from modelless.exceptions import ForbiddenError, InvalidInputError
    from modelless.validation import too_large

    s3 = client or aws_clients.client("s3")
    uri = f"s3://{bucket}/{key}"
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in DENIED_CODES:
            raise ForbiddenError(
                f"{field} {uri}: this deployment may not read it (S3 answered 403): grant the "
                "gateway's role s3:GetObject on the object, or upload it where the deployment may read",
                field=field,
            ) from error
        if code in MISSING_CODES:
            if not _bucket_exists(s3, bucket):
                missing = f"{field} {uri}: bucket {bucket!r} does not exist"
                raise InvalidInputError(missing, field=field) from error
            raise InvalidInputError(f"{field} {uri}: no such object", field=field) from error
        raise
    size = int(head.get("ContentLength", 0))
    if size > limit:
        raise too_large(f"{field} {uri}", limit, setting, size)
    s3.download_file(bucket, key, str(target))
    downloaded = target.stat().st_size
    if downloaded > limit:  # replaced by a larger object between the HEAD and the download
        target.unlink()
        raise too_large(f"{field} {uri}", limit, setting, downloaded)
    return downloaded


def _bucket_exists(s3: Any, bucket: str) -> bool:
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as error:
        # Any other answer (403) means it exists, though this deployment may not use it.
        return str(error.response.get("Error", {}).get("Code", "")) not in MISSING_CODES
    return True
