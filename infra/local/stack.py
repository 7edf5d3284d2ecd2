"""The embedded stack on one machine: gateway, a local pool of real worker processes and the
local Lambda tier, all on 127.0.0.1.

    python -m infra.local.stack --port 8080 --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import uvicorn

from infra.local.lambda_container import local_lambda_tier
from infra.local.redis_server import EmbeddedRedis, EmbeddedRedisError, find_redis_server
from infra.local.store_epoch import check_store_epoch
from modelless.api import create_app
from modelless.api.services import Services, build_services
from modelless.catalog import CPU_POOL
from modelless.client import Client
from modelless.config import get_settings
from modelless.dispatch.attempts import DEADLINE_GRACE_S, MAX_INVOKE_TIMEOUT_S
from modelless.exceptions import StoreEmptiedError, StoreUnavailableError
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.observability.metrics import logger
from modelless.observability.prometheus import record_scaling
from modelless.offline.events import S3JobStarter, SqsEventPoller, s3_records
from modelless.offline.launchers import ThreadLauncher
from modelless.pipelines.autopilot import PipelineAutopilot
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalPoolProvider, LocalWorkerPool
from modelless.pools.warm import InvokingWarmPool
from modelless.scaling.controller import Scaler, ScalerConfig, record_plan
from modelless.tuning import POLICIES

STATE_FILE = "stack.json"
NO_REDIS_WARNING = """\
modelless: WARNING: no redis-server binary was found (Debian: apt-get install redis-server), so
modelless: this stack keeps its metadata IN MEMORY ONLY: every app, API key and model registered
modelless: is LOST when it stops. Install redis-server, or give --metadata redis://host:port/db."""


def resolve_metadata_url(choice: str, state_dir: Path) -> tuple[str, EmbeddedRedis | None]:
    """The store's URL, and the Redis this stack runs for it. ``auto``: the stack's own
    redis-server, its append-only file in ``state_dir``/redis (docs/PERSISTENCE.md); the
    in-memory store, with a loud warning, only where no redis-server binary is found. Anything
    else (``memory://``, ``redis://…``): that store, as given."""
    if choice != "auto":
        return choice, None
    binary = find_redis_server()
    if binary is None:
        print(NO_REDIS_WARNING, file=sys.stderr, flush=True)
        logger.warning("no redis-server binary: the embedded stack's metadata is kept in memory only")
        return "memory://", None
    server = EmbeddedRedis.start(state_dir, binary)
    return server.url, server


def open_checked_store(url: str, server: EmbeddedRedis | None, state_dir: Path) -> tuple[MetadataStore, str]:
    """The store at ``url`` and the epoch marker it holds, once sure it still holds what this
    state directory registered in it (``check_store_epoch``: StoreEmptiedError otherwise). The
    in-memory store keeps nothing to check: its epoch is ""."""
    store = open_metadata_store(url)
    if store.kind == "memory":
        return store, ""
    name = f"embedded Redis in {server.data_dir}" if server is not None else _without_credentials(url)
    try:
        return store, check_store_epoch(store, name, state_dir)
    except BaseException:
        store.close()
        raise


@contextlib.contextmanager
def refusing_to_start() -> Iterator[None]:
    """A refusal to start (a store that lost what was registered in it, a Redis that cannot be
    started) ends the process with its message and exit code 1, not with a traceback."""
    try:
        yield
    except (StoreEmptiedError, EmbeddedRedisError) as error:
        raise SystemExit(f"modelless: cannot start: {error}") from None


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


@dataclass
class LocalStack:
    services: Services
    pool: LocalWorkerPool
    lambda_tier: LocalLambdaTier
    url: str
    provider: LocalPoolProvider | None = None
    scaler: Scaler | None = None
    offline_events: SqsEventPoller | None = None
    metadata_server: EmbeddedRedis | None = None  # the stack's own Redis (``--metadata auto``)
    warm_pool: InvokingWarmPool | None = None  # the scaler's Lambda warm pool
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
                    now = time.time()
                    report = scaler.tick(now)
                    record_plan(self.services.store, report, now)  # the dashboard shows it
                    record_scaling(report)  # GET /metrics (modelless.observability.prometheus)
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

    def leave_selection(self, worker_id: str) -> None:
        """A worker died, hung or stopped answering: no query may be routed to it from now on.
        Its report leaves the store (the scaler, the offline throttle and other gateways stop
        counting it) and this gateway's dispatcher holds it out (a report it sends meanwhile
        must not bring it back; the pool's watch renews the hold while it stays silent)."""
        self.services.dispatcher.live_view.hold_out(worker_id)
        # With the store unreachable its report goes stale by itself (WORKER_STALE_AFTER_S).
        with contextlib.suppress(StoreUnavailableError):
            self.services.store.remove_worker(worker_id)

    def close(self) -> None:
        self._stop.set()
        if self.offline_events is not None:
            self.offline_events.close()
        if self._scaling is not None:
            self._scaling.join(timeout=30)  # a tick in progress finishes before its workers go
        if self.provider is not None:
            self.provider.close()
        self.pool.close(stopping=self.leave_selection)  # no report of a stopped worker stays
        if self.warm_pool is not None:
            self.warm_pool.close()
        self.lambda_tier.close()
        self.services.close()
        if self.metadata_server is not None:  # last: everything above may still write to it
            self.metadata_server.stop()


class GracefulServer(uvicorn.Server):
    """uvicorn's server, with SIGINT and SIGTERM meaning "drain and return" and nothing more.

    uvicorn (0.29+) raises a signal it caught again once it has shut down, so that the process
    dies of it: that killed the embedded stack before it could stop its worker and Lambda
    processes, which then served on as orphans. Here ``run`` returns, the caller stops the stack
    (``LocalStack.close``) and the process exits 0. In-flight queries finish first: uvicorn stops
    accepting, then waits for them, at most a query's longest deadline."""

    def __init__(self, services: Services, host: str, port: int, log_level: str = "warning") -> None:
        super().__init__(
            uvicorn.Config(
                create_app(services),
                host=host,
                port=port,
                log_level=log_level,
                timeout_graceful_shutdown=int(MAX_INVOKE_TIMEOUT_S + DEADLINE_GRACE_S),
            )
        )

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; a gateway in a thread is stopped by its owner
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def serve(stack: LocalStack, server: GracefulServer) -> None:
    """Serve until SIGINT/SIGTERM (or ``server.should_exit``), then stop every part of the stack."""
    try:
        server.run()
    finally:
        stack.close()
        print("modelless: stopped", flush=True)


class ThreadedGateway:
    """The stack's gateway served by uvicorn from a thread of this process, as the benches run it
    (``scripts/run`` serves from the main thread instead). Stopping it stops the stack too."""

    def __init__(self, stack: LocalStack, port: int, log_level: str = "warning") -> None:
        self.stack = stack
        self.server = GracefulServer(stack.services, "127.0.0.1", port, log_level)
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
    tune: str = "region",
) -> LocalStack:
    """``tune``: the policy each worker tunes its instances' parallelism with (``--tune``,
    docs/TUNING.md), ``off`` to run each as profiled."""
    state_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    metadata_url, metadata_server = resolve_metadata_url(metadata, state_dir)
    try:
        store, epoch = open_checked_store(metadata_url, metadata_server, state_dir)
    except BaseException:
        if metadata_server is not None:
            metadata_server.stop()
        raise
    # The environment's settings (MODELLESS_*), with this stack's store (and the epoch it must
    # keep holding), repository and cache; its admin key the environment's, else a new one.
    configured = get_settings()
    settings = configured.with_overrides(
        metadata_url=metadata_url,
        metadata_epoch=epoch,
        repository_url=str(state_dir / "repo"),
        cache_dir=state_dir / "cache",
        admin_key=configured.admin_key or "adm_" + secrets.token_urlsafe(24),
    )
    lambda_tier = local_lambda_tier(
        settings.repository_url, state_dir / "logs", state_dir / "cache", concurrency=lambda_concurrency
    )
    services = build_services(
        settings, store, lambda_tier=lambda_tier, extra_workers=lambda: [lambda_tier.state()]
    )
    # Workers write their state straight into Redis; with the in-memory store, to the gateway.
    report_url = url if store.kind == "memory" else metadata_url
    pool = LocalWorkerPool(
        CPU_POOL,
        settings.repository_url,
        report_url,
        settings.admin_key,
        state_dir / "logs",
        state_dir / "cache",
        worker_args=("--tune", tune),
    )
    (state_dir / STATE_FILE).write_text(
        json.dumps({"url": url, "admin_key": settings.admin_key, "metadata_url": metadata_url}, indent=2)
    )
    os.chmod(state_dir / STATE_FILE, 0o600)
    provider = LocalPoolProvider({CPU_POOL.name: pool}, forget=services.store.remove_worker)
    # Containers kept warm for the bursts a cold start would miss, within the tier's concurrency.
    warm_pool = InvokingWarmPool(lambda_tier, services.store, capacity=lambda_tier.concurrency)
    scaler = Scaler(
        services.store,
        provider,
        services.pools,
        ScalerConfig(window_s=10, min_workers={CPU_POOL.name: 1}, max_workers={CPU_POOL.name: max_workers}),
        # The pipelines' planner and tuner: their stages' demand floors (InferLine in the loop).
        demand_floors=PipelineAutopilot(services.pipelines).floors,
        warm_pool=warm_pool,
    )
    stack = LocalStack(
        services,
        pool,
        lambda_tier,
        url,
        provider,
        scaler,
        metadata_server=metadata_server,
        warm_pool=warm_pool,
    )
    pool.scale_to(workers)
    pool.supervise(on_unhealthy=stack.leave_selection)
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
    parser.add_argument(
        "--tune",
        choices=("off", *POLICIES),
        default="region",
        help="how workers tune their instances' parallelism under live traffic (docs/TUNING.md)",
    )
    args = parser.parse_args(argv)

    # EMF metrics go to stdout in Lambda (CloudWatch reads them); here they would drown the output.
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    with refusing_to_start():
        stack = start_stack(
            args.state_dir,
            args.host,
            args.port,
            args.workers,
            args.lambda_concurrency,
            args.metadata,
            args.max_workers,
            args.tune,
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
    serve(stack, GracefulServer(stack.services, args.host, args.port))


if __name__ == "__main__":
    main()
