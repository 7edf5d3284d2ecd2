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

    # In AWS: the cpu_worker function the dispatcher invokes for the Lambda tier, one name, or one
    # per memory size ("1769=name-a,3538=name-b"; see modelless.pools.invokers.lambda_functions).
    lambda_function: str = field(default_factory=lambda: _env("LAMBDA_FUNCTION", ""))
    # In AWS: the registrar function the gateway hands registrations to (asynchronous invoke).
    # Empty: variants are generated and profiled in a background thread of this process.
    registrar_function: str = field(default_factory=lambda: _env("REGISTRAR_FUNCTION", ""))

    # --- offline jobs (DESIGN §6) ---------------------------------------------------------------
    # In AWS: the offline function the gateway hands jobs to (asynchronous invoke). Empty: jobs
    # run in a background thread of this process (the embedded stack).
    offline_function: str = field(default_factory=lambda: _env("OFFLINE_FUNCTION", ""))
    # Buckets every app's offline jobs may use when the admin set none for the app (comma list).
    offline_buckets: tuple[str, ...] = field(
        default_factory=lambda: tuple(b.strip() for b in _env("OFFLINE_BUCKETS", "").split(",") if b.strip())
    )
    # Objects created under these prefixes become inputs of the watch's one standing job (JSON list
    # of {"prefix": "s3://b/p/", "appID", "outputPath", and "accuracy" or "modelName"};
    # docs/OFFLINE.md); manifests (*.job.json) always start a job of their own.
    offline_watches: str = field(default_factory=lambda: _env("OFFLINE_WATCHES", "[]"))
    # INFaaS pauses offline work when its worker's utilisation passes 40 % (§6.3.2).
    offline_pause_utilisation: float = field(
        default_factory=lambda: float(_env("OFFLINE_PAUSE_UTILISATION", "0.40"))
    )
    offline_resume_utilisation: float = field(
        default_factory=lambda: float(_env("OFFLINE_RESUME_UTILISATION", "0.30"))
    )
    # ...or when online p99 on the worker passes this many times its profile (queueing included).
    offline_pause_latency_ratio: float = field(
        default_factory=lambda: float(_env("OFFLINE_PAUSE_LATENCY_RATIO", "2.0"))
    )
    offline_resume_latency_ratio: float = field(
        default_factory=lambda: float(_env("OFFLINE_RESUME_LATENCY_RATIO", "1.5"))
    )
    # Rows per offline inference run, at most; fewer where the variant's profiled latency for the
    # run would pass offline_run_ms (an online query may wait behind one run).
    offline_max_batch: int = field(default_factory=lambda: int(_env("OFFLINE_MAX_BATCH", "32")))
    offline_run_ms: float = field(default_factory=lambda: float(_env("OFFLINE_RUN_MS", "10.0")))
    offline_lease_s: float = field(default_factory=lambda: float(_env("OFFLINE_LEASE_S", "30.0")))
    offline_max_input_bytes: int = field(
        default_factory=lambda: int(_env("OFFLINE_MAX_INPUT_BYTES", str(16 * MiB)))
    )
    offline_max_inputs: int = field(default_factory=lambda: int(_env("OFFLINE_MAX_INPUTS", "100000")))
    # The embedded stack polls this SQS queue (fed by S3 event notifications) for events that
    # start jobs; in AWS the offline function is the queue's (or the bucket's) target instead.
    offline_queue_url: str = field(default_factory=lambda: _env("OFFLINE_QUEUE_URL", ""))
    # Where the embedded stack runs a job: "thread" (a background thread of the gateway process),
    # "process" (a child process per job, followed from such a thread: its CPU and GIL apart from
    # online queries; Redis only), or "auto": process with Redis, thread with the in-memory store.
    offline_runner: str = field(default_factory=lambda: _env("OFFLINE_RUNNER", "auto"))
    # Jobs run at once in the embedded stack's background threads.
    offline_concurrency: int = field(default_factory=lambda: int(_env("OFFLINE_CONCURRENCY", "1")))
