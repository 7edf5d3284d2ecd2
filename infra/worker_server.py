"""A pool worker: a real OS process that loads variants on demand, serves invocations over HTTP
and reports its live state to the metadata store every second.

    python -m infra.worker_server --worker-id cpu-0 --pool cpu --slots 2 \
        --repository .modelless/repo --report-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger

from infra.json_http import announce_ready, make_server
from modelless.monitoring import WorkerMonitor
from modelless.pools.reporting import make_state_sink
from modelless.repository import open_repository
from modelless.runtime import VariantRuntime
from modelless.types import VariantProfile

logger = Logger(service="modelless-worker")

REPORT_PERIOD_S = 1.0


class Worker:
    def __init__(self, worker_id: str, pool: str, slots: int, repository_url: str, cache_dir: Path) -> None:
        self.monitor = WorkerMonitor(worker_id, pool, address="", slots=slots)
        self.runtime = VariantRuntime(open_repository(repository_url), cache_dir)

    def invoke(self, payload: dict[str, Any]) -> dict[str, Any]:
        variant = VariantProfile.from_json(payload["variant"])
        self.monitor.started(variant.variant_id)
        try:
            result = self.runtime.handle_invocation(payload)
        except Exception:
            self.monitor.abandoned(variant.variant_id)
            raise
        # Only a variant that really loaded counts as an instance (a failed load must not
        # appear Active to selection, nor take a slot).
        self.monitor.loaded(variant)
        self.monitor.finished(
            variant.variant_id, time.time(), result["batch"], result["queue_ms"], result["inference_ms"]
        )
        return result

    def stats(self, _: dict[str, Any]) -> dict[str, Any]:
        state = self.monitor.snapshot(time.time())
        return {"worker_id": state.worker_id, "state": state.to_json(), "loaded": self.runtime.loaded_ids}

    def unload(self, body: dict[str, Any]) -> dict[str, Any]:
        variant_id = str(body["variant_id"])
        self.monitor.unloaded(variant_id)
        return {"unloaded": self.runtime.unload(variant_id)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--pool", default="cpu")
    parser.add_argument("--slots", type=int, default=2, help="variant instances this worker can hold")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--cache-dir", default="/tmp/modelless-cache")
    parser.add_argument("--report-url", required=True, help="redis://… or the gateway's http://… URL")
    parser.add_argument("--report-token", default="")
    args = parser.parse_args(argv)

    worker = Worker(args.worker_id, args.pool, args.slots, args.repository, Path(args.cache_dir))
    server = make_server(
        args.host,
        args.port,
        {
            ("POST", "/invoke"): worker.invoke,
            ("GET", "/stats"): worker.stats,
            ("POST", "/unload"): worker.unload,
            ("GET", "/health"): lambda _: {"ok": True},
        },
    )
    worker.monitor.address = f"http://{args.host}:{server.server_address[1]}"
    sink = make_state_sink(args.report_url, args.report_token)
    stop = threading.Event()

    def report_loop() -> None:
        # The first report goes out at once; the gateway it goes to may not be up yet, so a
        # failed report is logged and retried on the next period, never fatal.
        while True:
            try:
                sink(worker.monitor.snapshot(time.time()))
            except Exception as error:
                logger.warning("state report failed; retrying next period", extra={"error": str(error)})
            if stop.wait(REPORT_PERIOD_S):
                return

    threading.Thread(target=report_loop, name="monitor", daemon=True).start()
    announce_ready(server)
    logger.info("worker ready", extra={"worker_id": args.worker_id, "address": worker.monitor.address})
    try:
        server.serve_forever()
    finally:
        stop.set()


if __name__ == "__main__":
    main()
