"""The embedded stack on one machine: gateway, a local pool of real worker processes and the
local Lambda tier, all on 127.0.0.1.

    python -m infra.local.stack --port 8080 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import uvicorn

from infra.local.lambda_container import local_lambda_tier
from modelless.api import create_app
from modelless.api.services import Services, build_services
from modelless.client import Client
from modelless.config import get_settings
from modelless.observability import logger
from modelless.offline.events import S3JobStarter, SqsEventPoller, s3_records
from modelless.offline.service import ThreadLauncher
from modelless.pools.catalog import CPU_POOL
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalPoolProvider, LocalWorkerPool
from modelless.scaling.controller import Scaler, ScalerConfig

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
    provider: LocalPoolProvider | None = None
    scaler: Scaler | None = None
    offline_events: SqsEventPoller | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _scaling: threading.Thread | None = None

    def start_scaling(self, period_s: float) -> None:
        """The scaling function's schedule, as a loop: one tick every ``period_s``."""
        scaler = self.scaler
        if scaler is None:
            return

        def loop() -> None:
            while not self._stop.wait(period_s):
                try:
                    report = scaler.tick()
                    if report.plan.unmet or report.held or any(report.plan.lambda_qps.values()):
                        logger.info("scaling tick", extra=report.summary())
                except Exception:
                    logger.exception("scaling tick failed; trying again next period")

        self._scaling = threading.Thread(target=loop, name="scaler", daemon=True)
        self._scaling.start()

    def start_offline(self) -> None:
        """Offline jobs run in background threads of this process: resume the unfinished ones
        (a restart) and, when a queue is configured, start jobs from its S3 events."""
        offline = self.services.offline
        if offline is None:
            return
        if isinstance(offline.launcher, ThreadLauncher):
            offline.launcher.start_supervisor()
        queue_url = self.services.settings.offline_queue_url
        if queue_url:
            starter = S3JobStarter(offline)

            def handle(event: dict[str, Any]) -> None:
                for record in s3_records(event):
                    starter.start(record)

            self.offline_events = SqsEventPoller(queue_url, handle)
            self.offline_events.start()

    def close(self) -> None:
        self._stop.set()
        if self.offline_events is not None:
            self.offline_events.close()
        if self._scaling is not None:
            self._scaling.join(timeout=30)  # a tick in progress finishes before its workers go
        if self.provider is not None:
            self.provider.close()
        self.pool.close()
        self.lambda_tier.close()
        self.services.close()


class ThreadedGateway:
    """The stack's gateway served by uvicorn from a thread of this process, as the benches run it
    (``scripts/run`` serves from the main thread instead). Stopping it stops the stack too."""

    def __init__(self, stack: LocalStack, port: int, log_level: str = "warning") -> None:
        self.stack = stack
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(stack.services), host="127.0.0.1", port=port, log_level=log_level)
        )
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)
        self.thread.start()

    def admin(self, ready_s: float = 30) -> Client:
        """An admin client, once the gateway answers."""
        admin = Client(self.stack.url, admin_key=self.stack.services.settings.admin_key)
        deadline = time.monotonic() + ready_s
        while not admin.health():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not answer on {self.stack.url} in {ready_s:.0f} s")
            time.sleep(0.05)
        return admin

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.stack.close()


def start_stack(
    state_dir: Path,
    host: str,
    port: int,
    workers: int,
    lambda_concurrency: int,
    metadata: str,
    max_workers: int = 4,
) -> LocalStack:
    state_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    metadata_url = resolve_metadata_url(metadata)
    # The environment's settings (MODELLESS_*), with this stack's store, repository and cache;
    # its admin key the environment's, else a new one.
    configured = get_settings()
    settings = configured.with_overrides(
        metadata_url=metadata_url,
        repository_url=str(state_dir / "repo"),
        cache_dir=state_dir / "cache",
        admin_key=configured.admin_key or "adm_" + secrets.token_urlsafe(24),
    )
    lambda_tier = local_lambda_tier(
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
    provider = LocalPoolProvider({CPU_POOL.name: pool}, forget=services.store.remove_worker)
    scaler = Scaler(
        services.store,
        provider,
        services.pools,
        ScalerConfig(window_s=10, min_workers={CPU_POOL.name: 1}, max_workers={CPU_POOL.name: max_workers}),
    )
    stack = LocalStack(services, pool, lambda_tier, url, provider, scaler)
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
    parser.add_argument("--max-workers", type=int, default=4, help="the scaler's cap on the cpu pool")
    parser.add_argument(
        "--scale-every", type=float, default=5.0, help="seconds between scaling ticks; 0: off"
    )
    args = parser.parse_args(argv)

    # EMF metrics go to stdout in Lambda (CloudWatch reads them); here they would drown the output.
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    stack = start_stack(
        args.state_dir,
        args.host,
        args.port,
        args.workers,
        args.lambda_concurrency,
        args.metadata,
        args.max_workers,
    )
    if args.scale_every > 0:
        stack.start_scaling(args.scale_every)
    stack.start_offline()
    print(
        f"modelless: serving on {stack.url} (metadata: {stack.services.settings.metadata_url}, "
        f"{args.workers} cpu workers, Lambda tier up to {args.lambda_concurrency} containers, "
        f"scaling every {args.scale_every:g} s)",
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
