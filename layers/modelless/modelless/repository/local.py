"""Model repository in a local directory (the embedded default)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from modelless.exceptions import BadRequestError, NotFoundError
from modelless.repository.base import COPY_CHUNK_BYTES


class LocalModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise BadRequestError(f"repository key {key!r} escapes the repository")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        partial.replace(path)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise NotFoundError(f"no object {key!r} in the model repository", key=key)
        return path.read_bytes()

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            _copy(path, partial)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)  # readers never see half a file

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise NotFoundError(f"no object {key!r} in the model repository", key=key)
        _copy(source, path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete_prefix(self, prefix: str) -> int:
        path = self._path(prefix)
        if path.is_dir():
            count = sum(1 for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
            return count
        if path.is_file():
            path.unlink()
            return 1
        return 0

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        return sorted(str(p.relative_to(self.root)) for p in files)


def _copy(source: Path, target: Path) -> None:
    """A chunked copy (``shutil.copyfile`` may use sendfile: in the kernel, also never whole)."""
    with source.open("rb") as reading, target.open("wb") as writing:
        shutil.copyfileobj(reading, writing, COPY_CHUNK_BYTES)
