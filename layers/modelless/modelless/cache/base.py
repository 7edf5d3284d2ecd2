"""The prediction cache's interface (a bounded byte store with LRU eviction) and its keys.

Clipper §4.2: a function cache for ``Predict(model, x) -> y``. Here an entry is one input row's
outputs, keyed by (app, model, model generation, digest of the row). The backends (``memory``:
this process; ``redis``: shared by every gateway and offline runner) only store bytes under keys,
bounded by a byte budget with least-recently-used eviction; what a query may take from them is
decided above them (``modelless.cache.predictions``).

The generation is the model's registration id: registering a model again (after it was deleted,
or after a failed registration removed it) gives it a new one, so its old entries are never found
again and age out of the LRU; a deleted model has no generation at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:
    pass

# A digest of 16 bytes (of SHA-256, which CPUs with SHA extensions hash at over 1 GB/s: about
# twice BLAKE2b's speed here on a 224x224x3 float32 row): collisions are out of reach for any
# cache this size.
DIGEST_BYTES = 16


@dataclass(frozen=True)
class CacheStats:
    """What the cache holds and how it did, over its whole life (shared: over every process)."""

    backend: str
    hits: int  # lookups (queries, offline inputs) answered whole from the cache
    misses: int  # lookups that had to run inference
    evictions: int  # entries dropped to stay within max_bytes
    entries: int
    bytes_used: int  # keys and values, as the byte budget counts them
    max_bytes: int

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class PredictionCache(Protocol):
    """Bytes under keys, at most ``max_bytes`` of keys and values together; the least recently
    used entries are evicted first. Every method may raise when the backend is unreachable: the
    caller (``CachedPredictions``) treats that as a miss."""

    kind: ClassVar[str]
    max_bytes: int

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), marking the found ones as just used."""

    def put(self, entries: Mapping[str, bytes]) -> None:
        """Store ``entries`` as the most recently used, then evict the least recently used
        until the cache is within its budget."""

    def record(self, hits: int, misses: int) -> None:
        """Count lookups answered from the cache and lookups that were not."""

    def stats(self) -> CacheStats: ...

    def clear(self) -> None:
        """Drop every entry and reset the counters."""

    def close(self) -> None: ...


def entry_size(key: str, value: bytes) -> int:
    """What one entry counts against the budget: its key and its value."""
    return len(key.encode()) + len(value)


def row_digests(inputs: np.ndarray) -> list[str]:
    """One digest per row of a batch, over the row's bytes, its dtype (field names included, for
    a model with several inputs) and its shape: equal values of another dtype or shape are
    another input."""
    batch = np.ascontiguousarray(inputs)
    if len(batch) == 0:
        return []
    header = f"{batch.dtype.descr!r}|{tuple(batch.shape[1:])!r}|".encode()
    digests = []
    for row in batch.reshape(len(batch), -1).view(np.uint8):  # each row's bytes, not copied
        digest = hashlib.sha256(header)
        digest.update(row.data)
        digests.append(digest.hexdigest()[: 2 * DIGEST_BYTES])
    return digests


def entry_key(app_id: str, model_name: str, generation: str, digest: str) -> str:
    """The cache key of one row for one model (names are checked: letters, digits, ``_.-``)."""
    return f"{app_id}/{model_name}/{generation}/{digest}"
