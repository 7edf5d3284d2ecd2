"""Which metadata store backend a deployment gets: the factory, apart from the interface it returns
(``modelless.metadata.base``), so that the interface never imports its backends (they import
it). Backends are imported only when chosen: a process never loads a client it does not use.
"""

from __future__ import annotations

from modelless.metadata.base import MetadataStore


def open_metadata_store(url: str) -> MetadataStore:
    """``memory://`` or ``redis://host:port/db[?prefix=name:]``."""
    if url.startswith("memory://"):
        from modelless.metadata.memory import InMemoryMetadataStore

        return InMemoryMetadataStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from modelless.metadata.redis import RedisMetadataStore

        return RedisMetadataStore.from_url(url)
    raise ValueError(f"unsupported metadata store URL {url!r}: use memory:// or redis://")


def unreachable_errors() -> tuple[type[Exception], ...]:
    """What a store's client raises when its server cannot be reached, for code that meets such
    an error outside the store's own translation (the API's last-resort handler): asked here, so
    that it need not know which backend runs."""
    from modelless.metadata.redis import UNREACHABLE_ERRORS

    return UNREACHABLE_ERRORS
