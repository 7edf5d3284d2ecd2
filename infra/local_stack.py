"""The embedded stack on one machine: gateway, a local pool of real worker processes and the
local Lambda tier, all on 127.0.0.1.

    python -m infra.local_stack --port 8080 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import redis
import uvicorn

from modelless.api import create_app
from modelless.api.services import Services, build_services
from modelless.config import Settings
from modelless.pools.catalog import CPU_POOL
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalWorkerPool

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
STATE_FILE = "stack.json"


def resolve_metadata_url(choice: str) -> str:
    """``auto``: a local Redis when one answers, else the in-memory store."""
    if choice != "auto":
        return choice
    try:
        redis.Redis.from_url(DEFAULT_REDIS, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        return "memory://"
    return DEFAULT_REDIS


@dataclass
class LocalStack:
    services: Services
    pool: LocalWorkerPool
    lambda_tier: LocalLambdaTier
    url: str

    def close(self) -> None:
        self.pool.close()
        self.lambda_tier.close()
        self.services.close()


def start_stack(
    state_dir: Path, host: str, port: int, workers: int, lambda_concurrency: int, metadata: str
) -> LocalStack:
    state_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    metadata_url = resolve_metadata_url(metadata)
    settings = Settings(
        metadata_url=metadata_url,
        repository_url=str(state_dir / "repo"),
        cache_dir=state_dir / "cache",
        admin_key=os.environ.get("MODELLESS_ADMIN_KEY") or "adm_" + secrets.token_urlsafe(24),
    )
    lambda_tier = LocalLambdaTier(
        settings.repository_url, state_dir / "logs", state_dir / "cache", concurrency=lambda_concurrency
    )
    services = build_services(settings, lambda_tier=lambda_tier, extra_workers=lambda: [lambda_tier.state()])
    # Workers write their state straight into Redis; with the in-memory store, to the gateway.
    report_url = metadata_url if metadata_url.startswith("redis") else url
    pool = LocalWorkerPool(
        CPU_POOL,
        settings.repository_url,
        report_url,
        settings.admin_key,
        state_dir / "logs",
        state_dir / "cache",
    )
    (state_dir / STATE_FILE).write_text(
        json.dumps({"url": url, "admin_key": settings.admin_key, "metadata_url": metadata_url}, indent=2)
    )
    os.chmod(state_dir / STATE_FILE, 0o600)
    stack = LocalStack(services, pool, lambda_tier, url)
    pool.scale_to(workers)
    return stack


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=2, help="worker processes in the cpu pool")
    parser.add_argument("--lambda-concurrency", type=int, default=4)
    parser.add_argument("--metadata", default="auto", help="auto | memory:// | redis://host:port/db")
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    args = parser.parse_args(argv)

    # EMF metrics go to stdout in Lambda (CloudWatch reads them); here they would drown the output.
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    stack = start_stack(
        args.state_dir, args.host, args.port, args.workers, args.lambda_concurrency, args.metadata
    )
    print(
        f"modelless: serving on {stack.url} (metadata: {stack.services.settings.metadata_url}, "
        f"{args.workers} cpu workers, Lambda tier up to {args.lambda_concurrency} containers)",
        flush=True,
    )
    try:
        # uvicorn turns SIGINT/SIGTERM into a graceful return, so the pools are always stopped.
        uvicorn.run(create_app(stack.services), host=args.host, port=args.port, log_level="warning")
    finally:
        stack.close()
        print("modelless: stopped", flush=True)


if __name__ == "__main__":
    main()
