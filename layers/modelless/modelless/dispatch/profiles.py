"""The profile cache: an app's static profiles, parsed once per profiles version, the per-target
candidate lists selection decides on, and the input contracts queries are checked against.

Profiles change only when a model is registered or re-profiled, which bumps the app's profiles
version (read with the live state, ``live_view``): a list is used for as long as the version it
was cut from is current, with a TTL as a safety net.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from modelless.exceptions import NotFoundError
from modelless.metadata.base import MetadataStore
from modelless.selection import Candidates
from modelless.types import ModelRecord, QueryTargets

# Per-target candidate lists kept at most (targets carry arbitrary accuracies; each list holds
# references only): beyond it they start again from empty, the parsed profiles stay.
MAX_CACHED_TARGETS = 1024


@dataclass
class _CacheEntry:
    version: int
    expires_at: float
    variants: Candidates


class ProfileCache:
    def __init__(self, store: MetadataStore, ttl_s: float = 60.0) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._by_target: dict[tuple[str, str | None, float], _CacheEntry] = {}
        self._by_app: dict[str, _CacheEntry] = {}  # app -> all its profiles, parsed once
        self._contracts: dict[tuple[str, str | None], tuple[float, ModelRecord]] = {}

    def candidates(self, targets: QueryTargets, version: int) -> Candidates:
        """Static profiles meeting the accuracy target, cached until the app's profiles version
        changes (or the TTL passes, as a safety net), with the per-batch tables selection looks
        up (built on first use, kept with the list)."""
        key = (targets.app_id, targets.model_name, targets.min_accuracy)
        now = time.monotonic()
        entry = self._by_target.get(key)
        if entry is None or entry.version != version or entry.expires_at < now:
            # Every target's list holds references into one parsed copy of the app's profiles
            # (parsing per target would multiply the objects the garbage collector walks), and
            # its tables are cut from the app's, already in order.
            app_profiles = self._app_profiles(targets.app_id, version, now)
            entry = _CacheEntry(
                version,
                now + self._ttl_s,
                app_profiles.subset(targets.min_accuracy, targets.model_name),
            )
            if len(self._by_target) >= MAX_CACHED_TARGETS:
                self._by_target.clear()
            self._by_target[key] = entry
        return entry.variants

    def _app_profiles(self, app_id: str, version: int, now: float) -> Candidates:
        entry = self._by_app.get(app_id)
        if entry is None or entry.version != version or entry.expires_at < now:
            entry = _CacheEntry(version, now + self._ttl_s, Candidates(self._store.list_variants(app_id)))
            self._by_app[app_id] = entry
        return entry.variants

    def input_contract(self, app_id: str, model_name: str | None) -> ModelRecord:
        """The input shape the query must have: the named model's, or the app's (an app's models
        share one input shape, which registration enforces). Cached like the profiles."""
        key = (app_id, model_name)
        now = time.monotonic()
        cached = self._contracts.get(key)
        if cached is not None and cached[0] >= now:
            return cached[1]
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
        self._contracts[key] = (now + self._ttl_s, model)
        return model

    def clear(self) -> None:
        """Forget every cached read."""
        self._by_target.clear()
        self._by_app.clear()
        self._contracts.clear()
