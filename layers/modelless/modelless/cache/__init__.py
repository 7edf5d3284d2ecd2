"""The prediction cache (Clipper §4.2): per (model, input row), bounded by bytes, LRU.

``base`` holds the backend interface, the keys and the digests; ``memory`` and ``redis`` are the
two backends; ``predictions`` is what queries and offline jobs use (``CachedPredictions``).
``factory.open_prediction_cache`` picks a backend from the settings.
"""

from modelless.cache.base import CacheStats, PredictionCache
from modelless.cache.factory import open_prediction_cache
from modelless.cache.predictions import CachedPredictions, CacheHit, open_cached_predictions

__all__ = [
    "CacheHit",
    "CacheStats",
    "CachedPredictions",
    "PredictionCache",
    "open_cached_predictions",
    "open_prediction_cache",
]
