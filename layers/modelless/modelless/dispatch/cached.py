"""Online queries and the prediction cache: the lookup before selection, the write after inference.

A query is answered from the cache when every row of its batch is cached for one model, by a
variant that selection could pick for the query's targets: one of its candidates
(``ProfileCache.candidates``: accurate enough, of the named model if any, and for a named model or
no accuracy target within the tolerance of the model's reference accuracy). A latency target is
always met: a hit costs a lookup. Entries are keyed by the model's registration id (its
generation), read with the profiles: a model deleted, or registered again, is never answered
from what its former registration computed.

The models are tried most accurate first (by their best candidate), so that a target-only query
gets the best cached answer its targets allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelless.cache.predictions import CachedPredictions, CacheHit
from modelless.dispatch.live_view import LiveView
from modelless.dispatch.profiles import ProfileCache
from modelless.exceptions import ModellessError
from modelless.types import QueryTargets, VariantProfile


@dataclass(frozen=True)
class Answered:
    """The query's answer, from the cache."""

    hit: CacheHit
    variant: VariantProfile  # the variant that computed its first row


@dataclass(frozen=True)
class Pending:
    """A miss: what writing its answer needs (the generations as they were before inference, so
    that an answer computed across a re-registration is filed under the old one: never found)."""

    app_id: str
    generations: dict[str, str]
    digests: list[str]


class QueryCache:
    def __init__(self, predictions: CachedPredictions, profiles: ProfileCache, live_view: LiveView) -> None:
        self.predictions = predictions
        self._profiles = profiles
        self._live_view = live_view

    def look_up(self, targets: QueryTargets, inputs: np.ndarray) -> Answered | Pending | None:
        """The cached answer, or what a miss writes later; None when the cache cannot tell (no
        candidates: selection explains why; or the store is unreachable)."""
        try:
            version, _, _ = self._live_view.view(targets.app_id)
            candidates = self._profiles.candidates(targets, version)
            records = self._profiles.models(targets.app_id, version)
        except ModellessError:
            return None  # selection meets the same error, and answers it
        admitted = {v.variant_id: v for v in candidates}
        best: dict[str, float] = {}
        for v in candidates:
            best[v.model_name] = max(best.get(v.model_name, 0.0), v.accuracy)
        generations = {
            model: records[model].registration_id
            for model in sorted(best, key=lambda m: (-best[m], m))
            if model in records
        }
        if not generations:
            return None
        digests = self.predictions.digests(inputs)
        hit = self.predictions.find(targets.app_id, generations, digests, admitted.__contains__)
        if hit is not None:
            self.predictions.count(hits=1)
            return Answered(hit, admitted[hit.variant_ids[0]])
        self.predictions.count(misses=1)
        return Pending(targets.app_id, generations, digests)

    def remember(self, pending: Pending, variant: VariantProfile, outputs: np.ndarray) -> None:
        generation = pending.generations.get(variant.model_name)
        if generation is not None:
            self.predictions.remember(
                pending.app_id, variant.model_name, generation, pending.digests, outputs, variant.variant_id
            )
