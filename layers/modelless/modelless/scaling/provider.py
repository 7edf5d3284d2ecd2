"""The interface the scaler drives: a pool provider turns a plan into running workers.

It lives with the scaler that uses it, and the providers (``modelless.pools.local``,
``modelless.pools.aws``) implement it without importing it back: the scaler never imports the
pools' supervisor, only the catalogue of what pools exist (``modelless.catalog``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from modelless.types import VariantProfile


class PoolProvider(Protocol):
    def size(self, pool: str) -> int:
        """Workers the pool has (or is bringing up) now."""

    def scale(self, pool: str, workers: int) -> int:
        """Ask for ``workers`` workers, clamped to the pool's bounds; returns what was asked."""

    def assign(self, pool: str, instances: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        """Make the pool hold ``instances`` (variant id -> instances); ``profiles`` describes those
        variants (what a worker needs to load one)."""

    def heal(self, pool: str) -> list[str]:
        """Have the pool's dead or hung workers replaced (where the provider does not do it on
        its own); returns the ids of the workers replaced since the last call."""
