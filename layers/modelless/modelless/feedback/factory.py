"""Which feedback store backend a deployment gets: the factory, apart from the interface it returns
(``modelless.feedback.store``), so that the interface never imports its backends (they import
it). Backends are imported only when chosen: a process never loads a client it does not use.
"""

from __future__ import annotations

from modelless.feedback.store import FeedbackStore


def feedback_store_for(metadata: object) -> FeedbackStore:
    """The feedback store beside a metadata store: in the same Redis (and namespace) for the
    Redis store, so that every gateway sees one app's feedback; else in this process's memory."""
    from modelless.metadata.redis import RedisMetadataStore

    if isinstance(metadata, RedisMetadataStore):
        from modelless.feedback.redis import RedisFeedbackStore

        return RedisFeedbackStore(metadata)
    from modelless.feedback.memory import InMemoryFeedbackStore

    return InMemoryFeedbackStore()
