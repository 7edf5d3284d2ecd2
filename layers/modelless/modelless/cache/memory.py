"""The prediction cache in this process's memory: an ordered dict in use order, bounded by bytes.

For the embedded stack with the in-memory metadata store, whose offline jobs run in threads of
the gateway's process: one instance, handed to the dispatcher and the offline runners, is shared.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import ClassVar

from modelless.cache.base import CacheStats, entry_size


class InMemoryPredictionCache:
    kind: ClassVar[str] = "memory"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        self._used = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._lock = threading.Lock()  # queries and offline runners use it from several threads

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        found: list[bytes | None] = []
        with self._lock:
            for key in keys:
                value = self._entries.get(key)
                if value is not None:
                    self._entries.move_to_end(key)
                found.append(value)
        return found

    def put(self, entries: Mapping[str, bytes]) -> None:
        with self._lock:
            for key, value in entries.items():
                old = self._entries.pop(key, None)
                if old is not None:
                    self._used -= entry_size(key, old)
                self._entries[key] = value
                self._used += entry_size(key, value)
            while self._used > self.max_bytes and self._entries:
                key, value = self._entries.popitem(last=False)
                self._used -= entry_size(key, value)
                self._evictions += 1

    def record(self, hits: int, misses: int) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.kind,
                self._hits,
                self._misses,
                self._evictions,
                len(self._entries),
                self._used,
                self.max_bytes,
            )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._used = self._hits = self._misses = self._evictions = 0

    def close(self) -> None:
        pass
