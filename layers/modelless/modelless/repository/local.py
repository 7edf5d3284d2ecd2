"""Model repository in a local directory (the embedded default)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from modelless.exceptions import BadRequestError, NotFoundError


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
