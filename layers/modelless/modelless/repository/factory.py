"""Which model repository backend a deployment gets: the factory, apart from the interface it
returns (``modelless.repository.base``), so that the interface never imports its backends (they
import it). Backends are imported only when chosen: a process never loads a client it does not
use.
"""

from __future__ import annotations

from pathlib import Path

from modelless.repository.base import ModelRepository


def open_repository(url: str) -> ModelRepository:
    """``file:///path`` or a plain path, ``s3://bucket/prefix`` (endpoint from
    AWS_ENDPOINT_URL_S3), or ``memory://`` (one process's dictionary: tests)."""
    if url.startswith("s3://"):
        from modelless.repository.s3 import S3ModelRepository

        bucket, _, prefix = url[len("s3://") :].partition("/")
        return S3ModelRepository(bucket, prefix)
    if url == "memory://":
        from modelless.repository.memory import InMemoryModelRepository

        return InMemoryModelRepository()
    from modelless.repository.local import LocalModelRepository

    return LocalModelRepository(Path(url.removeprefix("file://")))
