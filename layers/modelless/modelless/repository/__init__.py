"""Model repository: where model files and generated variant artifacts live.

``base`` holds the interface; ``local`` (a directory) and ``s3`` (boto3, any endpoint) are the
backends; ``factory.open_repository`` picks one from a URL.
"""

from modelless.repository.base import ModelRepository
from modelless.repository.factory import open_repository

__all__ = ["ModelRepository", "open_repository"]
