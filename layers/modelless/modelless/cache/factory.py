"""Which prediction cache backend a deployment gets: the factory, apart from the interface it
returns (``modelless.cache.base``), so that the interface never imports its backends (they
import it). Backends are imported only when chosen: a process never loads a client it does not
use.
"""

from __future__ import annotations

from modelless.cache.base import PredictionCache
from modelless.config import Settings


def open_prediction_cache(settings: Settings) -> PredictionCache | None:
    """The backend ``settings`` choose, or None when the cache is off: ``prediction_cache_url``,
    else the metadata store's URL (``memory://`` -> this process; ``redis://`` -> that Redis,
    shared by every gateway and offline runner that uses it)."""
    if not settings.prediction_cache_enabled or settings.prediction_cache_max_bytes <= 0:
        return None
    url = settings.prediction_cache_url or settings.metadata_url
    if url.startswith("memory://"):
        from modelless.cache.memory import InMemoryPredictionCache

        return InMemoryPredictionCache(settings.prediction_cache_max_bytes)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from modelless.cache.redis import RedisPredictionCache

        return RedisPredictionCache.from_url(url, settings.prediction_cache_max_bytes)
    raise ValueError(f"unsupported prediction cache URL {url!r}: use memory:// or redis://")
