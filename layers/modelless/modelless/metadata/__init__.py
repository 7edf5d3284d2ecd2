"""Metadata store: apps and keys, models, registrations, variant profiles and live worker state.

``base`` holds the interface; ``memory`` and ``redis`` are the two backends; ``keys`` owns every
Redis key name. ``factory.open_metadata_store`` picks a backend from a URL.
"""

from modelless.metadata.base import MetadataStore
from modelless.metadata.factory import open_metadata_store

__all__ = ["MetadataStore", "open_metadata_store"]
