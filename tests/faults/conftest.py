"""The fault tests reuse the functional tests' fixtures as they are: a real worker pool, the
emulated S3 buckets and the model they serve."""

from tests.functional.conftest import pool, setup
from tests.functional.offline_fixtures import buckets, served

__all__ = ["buckets", "pool", "served", "setup"]
