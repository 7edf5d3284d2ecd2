"""Settings, read once from the environment (``MODELLESS_*``), with the embedded defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024


def _env(name: str, default: str) -> str:
    return os.environ.get(f"MODELLESS_{name}", default)


@dataclass(frozen=True)
class Settings:
    metadata_url: str = field(default_factory=lambda: _env("METADATA_URL", "memory://"))
    repository_url: str = field(default_factory=lambda: _env("REPOSITORY_URL", ".modelless/repo"))
    cache_dir: Path = field(default_factory=lambda: Path(_env("CACHE_DIR", "/tmp/modelless-cache")))
    admin_key: str = field(default_factory=lambda: _env("ADMIN_KEY", ""))
    max_model_bytes: int = field(default_factory=lambda: int(_env("MAX_MODEL_BYTES", str(64 * MiB))))
    max_valset_bytes: int = field(default_factory=lambda: int(_env("MAX_VALSET_BYTES", str(32 * MiB))))
    max_query_bytes: int = field(default_factory=lambda: int(_env("MAX_QUERY_BYTES", str(4 * MiB))))
    max_batch: int = field(default_factory=lambda: int(_env("MAX_BATCH", "64")))
    # The gateway caches static profiles until their version changes; this TTL is a safety net.
    profile_cache_ttl_s: float = field(default_factory=lambda: float(_env("PROFILE_CACHE_TTL_S", "60.0")))
    profile_runs: int = field(default_factory=lambda: int(_env("PROFILE_RUNS", "40")))

    @property
    def register_body_limit(self) -> int:
        """A registration's body: the model, the validation set, and room for multipart framing."""
        return self.max_model_bytes + self.max_valset_bytes + 64 * 1024

    # In AWS: the name of the cpu_worker function the dispatcher invokes for the Lambda tier.
    lambda_function: str = field(default_factory=lambda: _env("LAMBDA_FUNCTION", ""))
