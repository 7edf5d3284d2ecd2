"""The model repository interface."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

# Files move between disk and a repository in pieces of this size, never whole in memory.
COPY_CHUNK_BYTES = 1024 * 1024


class ModelRepository(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """Raise NotFoundError when the key is missing."""

    def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` under ``key``, streamed (a model may be a gigabyte)."""

    def get_file(self, key: str, path: Path) -> None:
        """Write ``key`` to ``path``, streamed; raise NotFoundError when the key is missing."""

    def exists(self, key: str) -> bool: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many were deleted."""

    def list_keys(self, prefix: str) -> list[str]: ...


def fetch_to_cache(repository: ModelRepository, key: str, cache_dir: Path) -> Path:
    """Copy ``key`` into ``cache_dir`` once (Lambda's /tmp, a worker's disk) and return its path."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = cache_dir / f"{digest}-{Path(key).name}"
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        try:
            repository.get_file(key, partial)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)  # atomic: concurrent loaders never read half a file
    return target
