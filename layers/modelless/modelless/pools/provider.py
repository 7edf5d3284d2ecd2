"""The pool provider interface: how the scaler's plan becomes running workers.

Two backends: ``local`` (real worker processes on this machine) and ``aws`` (an EC2 Auto Scaling
group per pool, driven through its desired capacity, with the plan's variants in its tags so that
new workers know what to load).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class PoolProvider(Protocol):
    def size(self, pool: str) -> int:
        """Workers the pool has (or is bringing up) now."""

    def scale(self, pool: str, workers: int) -> int:
        """Ask for ``workers`` workers, clamped to the pool's bounds; returns what was asked."""

    def assign(self, pool: str, variants: Mapping[str, int]) -> None:
        """Record which variants (and how many instances of each) the pool should hold."""
