"""The profile cache: an app's static profiles, parsed once per profiles version, the per-target
candidate lists selection decides on, and the input contracts queries are checked against.

Profiles change only when a model is registered or re-profiled, which bumps the app's profiles
version (read with the live state, ``live_view``): a list is used for as long as the version it
was cut from is current, with a TTL as a safety net.

While the store is unreachable, an app's profiles and input contracts are answered from their
last good read, for at most ``stale_max_age_s`` after it (``Settings.stale_cache_max_age_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from modelless.config import STALE_CACHE_MAX_AGE_S
from modelless.exceptions import NotFoundError, StoreUnavailableError
from modelless.metadata.base import ModelStore
from modelless.selection import Candidates
from modelless.types import ModelRecord, QueryTargets

# Per-target candidate lists kept at most (targets carry arbitrary accuracies; each list holds
# references only): beyond it they start again from empty, the parsed profiles stay.
MAX_CACHED_TARGETS = 1024
# Apps (and models, for input contracts) whose reads are kept at most: beyond it, the least
# recently read go.
MAX_CACHED_APPS = 1024

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class _CacheEntry:
    version: int
    read_at: float  # monotonic: when the store was read
    variants: Candidates


class ProfileCache:
    def __init__(
        self, store: ModelStore, ttl_s: float = 60.0, stale_max_age_s: float = STALE_CACHE_MAX_AGE_S
    ) -> None:
        """``stale_max_age_s``: how long after a read it may answer for the store while the store
        is unreachable."""
        self._store = store
        self._ttl_s = ttl_s
        self._stale_max_age_s = stale_max_age_s
        self._by_target: dict[tuple[str, str | None, float], _CacheEntry] = {}
        self._by_app: dict[str, _CacheEntry] = {}  # app -> all its profiles, parsed once
        self._contracts: dict[tuple[str, str | None], tuple[float, ModelRecord]] = {}  # (read at, model)
        # app -> (profiles version, read at, its models by name)
        self._models: dict[str, tuple[int, float, Mapping[str, ModelRecord]]] = {}
        self._lock = threading.Lock()  # over evictions (queries read from several threads)

    def candidates(self, targets: QueryTargets, version: int) -> Candidates:
        """Static profiles meeting the accuracy target, cached until the app's profiles version
        changes (or the TTL passes, as a safety net), with the per-batch tables selection looks
        up (built on first use, kept with the list)."""
        key = (targets.app_id, targets.model_name, targets.min_accuracy)
        now = time.monotonic()
        entry = self._by_target.get(key)
        if entry is None or entry.version != version or entry.read_at + self._ttl_s < now:
            # Every target's list holds references into one parsed copy of the app's profiles
            # (parsing per target would multiply the objects the garbage collector walks), and
            # its tables are cut from the app's, already in order.
            app_profiles = self._app_profiles(targets.app_id, version, now)
            entry = _CacheEntry(version, now, app_profiles.subset(targets.min_accuracy, targets.model_name))
            if len(self._by_target) >= MAX_CACHED_TARGETS:
                self._by_target.clear()
            self._by_target[key] = entry
        return entry.variants

    def _app_profiles(self, app_id: str, version: int, now: float) -> Candidates:
        entry = self._by_app.get(app_id)
        if entry is None or entry.version != version or entry.read_at + self._ttl_s < now:
            try:
                profiles = self._store.list_variants(app_id)
            except StoreUnavailableError:
                if entry is None or now - entry.read_at > self._stale_max_age_s:
                    raise
                return entry.variants  # the last good read, while the store is down
            entry = _CacheEntry(version, now, Candidates(profiles))
            self._remember(self._by_app, app_id, entry)
        return entry.variants

    def models(self, app_id: str, version: int) -> Mapping[str, ModelRecord]:
        """The app's models by name, read once per profiles version (deleting a model bumps the
        version, and so does publishing a registration's variants): what the prediction cache
        keys a model's entries by (its registration id) is never older than the profiles."""
        now = time.monotonic()
        cached = self._models.get(app_id)
        if cached is None or cached[0] != version or cached[1] + self._ttl_s < now:
            try:
                records = {m.model_name: m for m in self._store.list_models(app_id)}
            except StoreUnavailableError:
                if cached is None or now - cached[1] > self._stale_max_age_s:
                    raise
                return cached[2]
            cached = (version, now, records)
            self._remember(self._models, app_id, cached)
        return cached[2]

    def input_contract(self, app_id: str, model_name: str | None) -> ModelRecord:
        """The input shape the query must have: the named model's, or the app's (an app's models
        share one input shape, which registration enforces). Cached like the profiles."""
        key = (app_id, model_name)
        now = time.monotonic()
        cached = self._contracts.get(key)
        if cached is not None and cached[0] + self._ttl_s >= now:
            return cached[1]
        try:
            model = self._read_contract(app_id, model_name)
        except StoreUnavailableError:
            if cached is None or now - cached[0] > self._stale_max_age_s:
                raise
            return cached[1]  # the last good read, while the store is down
        self._remember(self._contracts, key, (now, model))
        return model

    def _read_contract(self, app_id: str, model_name: str | None) -> ModelRecord:
        if model_name is not None:
            model = self._store.get_model(app_id, model_name)
            if model is None:
                raise NotFoundError(
                    f"model {model_name!r} is not registered in app {app_id!r}", model=model_name
                )
        else:
            models = self._store.list_models(app_id)
            if not models:
                raise NotFoundError(f"app {app_id!r} has no registered models", app=app_id)
            model = models[0]
        return model

    def clear(self) -> None:
        """Forget every cached read."""
        self._by_target.clear()
        self._by_app.clear()
        self._contracts.clear()
        self._models.clear()

    def _remember(self, cache: dict[K, V], key: K, value: V) -> None:
        """Store ``value`` as the most recent entry; the least recent go beyond MAX_CACHED_APPS."""
        with self._lock:
            cache.pop(key, None)
            cache[key] = value
            while len(cache) > MAX_CACHED_APPS:
                del cache[next(iter(cache))]
