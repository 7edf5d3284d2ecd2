"""Which pipeline store a deployment gets: the factory, apart from the interface it returns
(``modelless.pipelines.store``), so that the interface never imports its backends (they import
it). Backends are imported only when chosen.
"""

from __future__ import annotations

import threading
import weakref

from modelless.pipelines.store import PipelineStore

_BESIDE_LOCK = threading.Lock()
# The in-memory store beside each in-memory metadata store: the gateway's pipelines service and
# the offline jobs of the same process must see the same pipelines.
_BESIDE: weakref.WeakKeyDictionary[object, PipelineStore] = weakref.WeakKeyDictionary()


def pipeline_store_for(metadata: object) -> PipelineStore:
    """Beside a metadata store: in the same Redis (and namespace) for the Redis store, so that
    every gateway sees the app's pipelines; else in this process's memory, one per metadata store."""
    from modelless.metadata.redis import RedisMetadataStore

    if isinstance(metadata, RedisMetadataStore):
        from modelless.pipelines.redis import RedisPipelineStore

        return RedisPipelineStore(metadata)
    from modelless.pipelines.memory import InMemoryPipelineStore

    with _BESIDE_LOCK:
        store = _BESIDE.get(metadata)
        if store is None:
            store = _BESIDE[metadata] = InMemoryPipelineStore()
        return store
