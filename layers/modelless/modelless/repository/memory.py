"""Model repository in a dictionary of this process (unit tests, throwaway stacks)."""

from __future__ import annotations

import threading
from pathlib import Path

from modelless.exceptions import NotFoundError
from modelless.repository.base import COPY_CHUNK_BYTES


class InMemoryModelRepository:
    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        with self._lock:
            found = self._objects.get(key)
        if found is None:
            raise NotFoundError(f"no object {key!r} in the model repository", key=key)
        return found

    def put_file(self, key: str, path: Path) -> None:
        # The object ends up in memory anyway: that is this backend.
        self.put(key, path.read_bytes())

    def get_file(self, key: str, path: Path) -> None:
        data = self.get(key)
        with path.open("wb") as target:
            for start in range(0, len(data), COPY_CHUNK_BYTES):
                target.write(data[start : start + COPY_CHUNK_BYTES])

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._objects

    def delete_prefix(self, prefix: str) -> int:
        with self._lock:
            doomed = [key for key in self._objects if key.startswith(prefix)]
            for key in doomed:
                del self._objects[key]
        return len(doomed)

    def list_keys(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key in self._objects if key.startswith(prefix))
