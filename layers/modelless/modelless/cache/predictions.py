"""What queries and offline jobs take from the prediction cache, and what they put in it.

``CachedPredictions`` stands between the callers and a backend (``PredictionCache``): it keys
each input row by (app, model, generation, digest), encodes a row's outputs with the variant that
computed them, and decides what a lookup may answer:

- a lookup is answered only when **every** row is cached for **one** model (the models are tried
  in the order the caller gives: its preference);
- each row's entry must come from a variant the caller admits (``admits``): for an online query,
  a variant selection could pick for its targets (accurate enough; for a named model or no
  accuracy target, within the tolerance of the model's reference accuracy: INFaaS's "faithful"
  rule), so that the cache never answers with something selection would have refused.

It never fails its caller: a backend that is down, or anything else that goes wrong, is logged
(once per minute at most) and the lookup is a miss, the write is skipped.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from aws_lambda_powertools import Logger

from modelless.cache.base import (
    CacheStats,
    PredictionCache,
    entry_key,
    entry_size,
    row_digests,
)
from modelless.cache.factory import open_prediction_cache

if TYPE_CHECKING:
    from modelless.config import Settings

logger = Logger(service="prediction-cache", child=True)

# A failing backend is logged at most this often (it is asked on every query).
FAILURE_LOG_PERIOD_S = 60.0


@dataclass(frozen=True)
class CachedRow:
    outputs: np.ndarray  # one row's outputs, e.g. [classes]
    variant_id: str  # the variant that computed them


@dataclass(frozen=True)
class CacheHit:
    model_name: str
    variant_ids: tuple[str, ...]  # per row: the variant that computed it
    outputs: np.ndarray  # [batch, ...]


def encode_row(outputs: np.ndarray, variant_id: str) -> bytes:
    """One JSON header line (the variant, the dtype and shape), then the raw values: no pickle."""
    row = np.ascontiguousarray(outputs)
    header = json.dumps({"variant": variant_id, "dtype": row.dtype.str, "shape": list(row.shape)})
    return header.encode() + b"\n" + row.tobytes()


def decode_row(value: bytes) -> CachedRow:
    header, _, data = value.partition(b"\n")
    meta = json.loads(header)
    outputs = np.frombuffer(data, dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])
    return CachedRow(outputs, str(meta["variant"]))


def choose_hit(
    rows_by_model: Mapping[str, Sequence[CachedRow | None]], admits: Callable[[str], bool]
) -> CacheHit | None:
    """The first model (in the mapping's order) whose every row is cached by an admitted variant."""
    for model_name, rows in rows_by_model.items():
        present = [row for row in rows if row is not None and admits(row.variant_id)]
        if rows and len(present) == len(rows):
            return CacheHit(
                model_name,
                tuple(row.variant_id for row in present),
                np.stack([row.outputs for row in present]),
            )
    return None


class CachedPredictions:
    def __init__(self, backend: PredictionCache, max_entry_bytes: int) -> None:
        self.backend = backend
        self.max_entry_bytes = max_entry_bytes
        self._failure_logged_at = -FAILURE_LOG_PERIOD_S
        self._lock = threading.Lock()

    def digests(self, inputs: np.ndarray) -> list[str]:
        return row_digests(inputs)

    def find(
        self,
        app_id: str,
        generations: Mapping[str, str],
        digests: Sequence[str],
        admits: Callable[[str], bool],
    ) -> CacheHit | None:
        """The answer for the rows ``digests`` from one of the models ``generations`` names
        (model -> its generation, in order of preference), or None. Counts nothing: the caller
        says how the lookup ended (``count``)."""
        return self.find_each(app_id, generations, [digests], admits)[0]

    def find_each(
        self,
        app_id: str,
        generations: Mapping[str, str],
        lookups: Sequence[Sequence[str]],
        admits: Callable[[str], bool],
    ) -> list[CacheHit | None]:
        """``find`` for several lookups (an offline group's inputs), in one backend round trip."""
        if not generations or not lookups:
            return [None] * len(lookups)
        keys = [
            entry_key(app_id, model, generation, digest)
            for digests in lookups
            for model, generation in generations.items()
            for digest in digests
        ]
        try:
            values = iter(self.backend.get(keys))
            answers: list[CacheHit | None] = []
            for digests in lookups:
                rows_by_model = {
                    model: [None if (value := next(values)) is None else decode_row(value) for _ in digests]
                    for model in generations
                }
                answers.append(choose_hit(rows_by_model, admits) if digests else None)
        except Exception as error:
            self._failed("lookup", error)
            return [None] * len(lookups)
        return answers

    def remember(
        self,
        app_id: str,
        model_name: str,
        generation: str,
        digests: Sequence[str],
        outputs: np.ndarray,
        variant_ids: str | Sequence[str],
    ) -> None:
        """Cache each row's outputs under its digest; rows over ``max_entry_bytes`` are left out."""
        if len(outputs) != len(digests):
            return
        variants = [variant_ids] * len(digests) if isinstance(variant_ids, str) else list(variant_ids)
        entries: dict[str, bytes] = {}
        for digest, row, variant_id in zip(digests, outputs, variants, strict=True):
            key = entry_key(app_id, model_name, generation, digest)
            value = encode_row(row, variant_id)
            if entry_size(key, value) <= self.max_entry_bytes:
                entries[key] = value
        if not entries:
            return
        try:
            self.backend.put(entries)
        except Exception as error:
            self._failed("write", error)

    def count(self, hits: int = 0, misses: int = 0) -> None:
        try:
            self.backend.record(hits, misses)
        except Exception as error:
            self._failed("count", error)

    def stats(self) -> CacheStats:
        return self.backend.stats()

    def close(self) -> None:
        self.backend.close()

    def _failed(self, what: str, error: Exception) -> None:
        """A cache that fails never fails a query: say so in the log, at most once a minute."""
        now = time.monotonic()
        with self._lock:
            if now - self._failure_logged_at < FAILURE_LOG_PERIOD_S:
                return
            self._failure_logged_at = now
        logger.warning(
            f"prediction cache {what} failed; answering as a miss",
            extra={"backend": self.backend.kind, "error": f"{type(error).__name__}: {error}"},
        )


def open_cached_predictions(settings: Settings) -> CachedPredictions | None:
    """The cache ``settings`` configure (``open_prediction_cache``), or None when it is off."""
    backend = open_prediction_cache(settings)
    if backend is None:
        return None
    return CachedPredictions(backend, settings.prediction_cache_max_entry_bytes)
