"""Benchmarks (``scripts/bench``). Each prints its numbers and the machine it ran on.

    scripts/bench selection [--architectures 3] [--queries 5000]
    scripts/bench zoo
    scripts/bench live [--queries 1000] [--metadata redis://127.0.0.1:6379/14]

``selection``: per-query decision time of the Dispatcher (getVariant + worker choice): cached
static profiles plus one live-state read from the metadata store, for the in-memory store and a
real Redis server.

``zoo``: registers the demo zoo under both demo apps, in-process, and reports for each model the
variants generated, kept and pruned, their latency and accuracy spread, and the registration time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from modelless.cli import format_table
from modelless.dispatcher import Dispatcher
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.selection import InfaasPolicy
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Registration,
    RegistrationStatus,
    VariantProfile,
    WorkerState,
)

RECIPES = ("fp32-basic", "fp32-all", "int8-basic", "int8-all")


def machine() -> str:
    return (
        f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def seed_store(store: MetadataStore, app_id: str, architectures: int, workers: int) -> list[VariantProfile]:
    """Profiles shaped like the demo zoo's (latency grows with accuracy), and live workers."""
    rng = random.Random(7)
    everything: list[VariantProfile] = []
    for index in range(architectures):
        name = f"arch{index}"
        base_latency = 0.02 + 5.0 * index / max(1, architectures - 1)
        accuracy = min(0.999, 0.85 + 0.14 * index / max(1, architectures - 1))
        record = ModelRecord(app_id, name, "input", [1, 8, 8], "float32", 10, f"reg-{index}", "src", True)
        registration = Registration(f"reg-{index}", app_id, name, RegistrationStatus.READY)
        store.add_model(record, registration)
        variants = []
        for recipe in RECIPES:
            for pool in DEFAULT_POOLS.values():
                latency = base_latency * rng.uniform(0.8, 1.2)
                variants.append(
                    VariantProfile(
                        variant_id=f"{app_id}/{name}/{recipe}/{pool.name}",
                        app_id=app_id,
                        model_name=name,
                        pool=pool.name,
                        precision=recipe.split("-")[0],
                        opt_level=recipe.split("-")[1],
                        threads=1,
                        artifact_key=f"apps/{app_id}/{name}/{recipe}.onnx",
                        size_bytes=1000,
                        load_latency_ms=3.0,
                        latency_p50_ms={b: latency * b**0.5 for b in (1, 2, 4, 8)},
                        latency_p99_ms={b: latency * 1.3 * b**0.5 for b in (1, 2, 4, 8)},
                        peak_memory_mb=5.0,
                        accuracy=round(accuracy - (0.003 if recipe.startswith("int8") else 0.0), 4),
                        price_per_second=pool.instance_price_per_second(1),
                        request_price=pool.request_price,
                        hardware="synthetic profile for the selection benchmark",
                        measured_on_target=False,
                    )
                )
        store.publish_variants(record, variants, registration)
        everything += variants
    cpu_variants = [v for v in everything if v.pool == "cpu"]
    for w in range(workers):
        loaded = rng.sample(cpu_variants, k=min(4, len(cpu_variants)))
        store.put_worker_state(
            WorkerState(
                worker_id=f"cpu-{w}",
                pool="cpu",
                address=f"http://127.0.0.1:{9000 + w}",
                utilisation=rng.random(),
                free_slots=rng.randint(0, 2),
                reported_at=time.time() + 3600,  # stays fresh for the whole run
                instances=tuple(
                    InstanceStats(v.variant_id, InstanceState.ACTIVE, 5.0, 0.2, 0.4, 0) for v in loaded
                ),
            )
        )
    return everything


def time_selection(
    store: MetadataStore, app_id: str, variants: list[VariantProfile], queries: int
) -> list[float]:
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), HttpWorkerInvoker(), None, cache_ttl_s=2.0)
    rng = random.Random(11)
    # Targets that some variant meets (a miss is a different, rarer path): each one is a
    # variant's own accuracy with a budget a little above its cold latency.
    targets = [
        QueryTargets(
            app_id,
            latency_ms=round(v.load_latency_ms + v.latency_ms(1) * 1.5, 3),
            min_accuracy=v.accuracy,
        )
        for v in rng.sample(variants, k=min(64, len(variants)))
    ]
    for target in targets:  # warm the profile cache, as a serving gateway's is
        dispatcher.select(target)
    samples = []
    for index in range(queries):
        target = targets[index % len(targets)]
        started = time.perf_counter()
        dispatcher.select(target)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def report(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"{label:<28} n={len(samples):>6}  median={statistics.median(ordered):.4f} ms  "
        f"p99={p99:.4f} ms  max={ordered[-1]:.4f} ms"
    )


def bench_selection(architectures: int, queries: int, workers: int, redis_url: str) -> None:
    print(f"machine: {machine()}")
    print(
        f"selection: {architectures} architectures x {len(RECIPES) * len(DEFAULT_POOLS)} variants, "
        f"{workers} live workers, {queries} decisions"
    )
    memory = open_metadata_store("memory://")
    variants = seed_store(memory, "bench", architectures, workers)
    print(report("in-memory store", time_selection(memory, "bench", variants, queries)))
    store = RedisMetadataStore.from_url(f"{redis_url}?prefix=bench-{os.getpid()}:")
    try:
        variants = seed_store(store, "bench", architectures, workers)
        print(report(f"Redis ({redis_url})", time_selection(store, "bench", variants, queries)))
    finally:
        store.flush_namespace()
        store.close()


def bench_zoo(state_dir: Path) -> None:
    """Register the demo zoo (both demo apps) in-process and report what registration produced."""
    from infra.demo import DEMO_APPS, zoo_summary
    from infra.demo_models import build_zoo
    from modelless.config import Settings
    from modelless.pools.catalog import DEFAULT_POOLS
    from modelless.registration import RegistrationService
    from modelless.repository.local import LocalModelRepository

    print(f"machine: {machine()}")
    zoo_dir = state_dir / "demo"
    manifest = build_zoo(zoo_dir)
    store = open_metadata_store("memory://")
    with tempfile.TemporaryDirectory(prefix="modelless-bench-") as tmp:
        registrar = RegistrationService(store, LocalModelRepository(Path(tmp)), Settings(), DEFAULT_POOLS)
        rows = []
        for app, only in DEMO_APPS.items():
            for model in manifest["models"]:
                if only is not None and model["name"] not in only:
                    continue
                started = time.perf_counter()
                registration = registrar.register(
                    app,
                    model["name"],
                    (zoo_dir / model["file"]).read_bytes(),
                    (zoo_dir / "valset.npz").read_bytes(),
                )
                registrar.wait_idle()
                seconds = time.perf_counter() - started
                final = store.get_registration(registration.registration_id)
                assert final is not None
                if final.status.value != "ready":
                    raise SystemExit(f"{app}/{model['name']}: {final.message}")
                kept = store.list_variants(app, model["name"])
                latencies = [v.latency_p50_ms[1] for v in kept]
                accuracies = [v.accuracy for v in kept]
                rows.append(
                    {
                        "app": app,
                        "model": model["name"],
                        "generated": len(kept) + final.pruned,
                        "kept": len(kept),
                        "pruned": final.pruned,
                        "p50@1 ms": f"{min(latencies):.3f}..{max(latencies):.3f}",
                        "accuracy": f"{min(accuracies):.4f}..{max(accuracies):.4f}",
                        "register s": f"{seconds:.1f}",
                    }
                )
        registrar.close()
    print(format_table(rows, list(rows[0])))
    as_served = {app: [json.loads(v.to_json()) for v in store.list_variants(app)] for app in DEMO_APPS}
    print(zoo_summary(as_served))
    durations = [float(r["register s"]) for r in rows]
    print(
        f"generated {sum(int(r['generated']) for r in rows)} variants; "
        f"one registration took {min(durations):.1f}..{max(durations):.1f} s "
        f"(median {statistics.median(durations):.1f} s)"
    )


def bench_live(state_dir: Path, queries: int, metadata: str) -> None:
    """Queries over HTTP against the embedded stack on 127.0.0.1: the selection time each reply
    reports, and the whole round trip the client sees."""
    import threading

    import numpy as np
    import uvicorn

    from infra.demo_models import build_zoo
    from infra.local_stack import start_stack
    from modelless.api import create_app
    from modelless.client import Client
    from modelless.observability import logger as gateway_logger

    print(f"machine: {machine()}")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # EMF on stdout would drown the report
    gateway_logger.setLevel("WARNING")
    zoo_dir = state_dir / "demo"
    build_zoo(zoo_dir)
    with tempfile.TemporaryDirectory(prefix="modelless-live-") as tmp:
        port = 18080 + os.getpid() % 1000
        stack = start_stack(Path(tmp), "127.0.0.1", port, 2, 2, metadata)
        server = uvicorn.Server(
            uvicorn.Config(create_app(stack.services), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            admin = Client(stack.url, admin_key=stack.services.settings.admin_key)
            while not admin.health():
                time.sleep(0.05)
            client = Client(stack.url, api_key=admin.create_app("live"))
            for name in ("digits-linear", "digits-mlp"):
                reply = client.register_model(name, zoo_dir / f"{name}.onnx", zoo_dir / "valset.npz", "live")
                client.wait_for_registration(reply["registrationId"])
            with np.load(zoo_dir / "testset.npz", allow_pickle=False) as test:
                images = test["inputs"]
            variants = client.variants()
            accuracies = sorted({v["accuracy"] for v in variants})
            targets = [
                {"accuracy": accuracies[0], "latency": 5.0},
                {"accuracy": accuracies[-1], "latency": 5.0},
            ]
            for target in targets:  # load both variants first: the run measures the warm path
                for _ in range(3):
                    try:
                        client.online_query(images[0], "live", **target)
                    except Exception:
                        time.sleep(0.3)
            selection, total, client_side = [], [], []
            for index in range(queries):
                started = time.perf_counter()
                reply = client.online_query(images[index % len(images)], "live", **targets[index % 2])
                client_side.append((time.perf_counter() - started) * 1000)
                selection.append(reply["timingsMs"]["selection_ms"])
                total.append(reply["timingsMs"]["total_ms"])
        finally:
            server.should_exit = True
            thread.join(10)
            stack.close()
    print(f"live: {queries} sequential queries over HTTP, metadata {metadata}, 2 cpu workers")
    print(report("selection (in reply)", selection))
    print(report("gateway total (in reply)", total))
    print(report("client round trip", client_side))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    selection = commands.add_parser("selection", help="per-query selection time")
    selection.add_argument("--architectures", type=int, default=3)
    selection.add_argument("--queries", type=int, default=5000)
    selection.add_argument("--workers", type=int, default=4)
    selection.add_argument(
        "--redis", default=os.environ.get("MODELLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    zoo = commands.add_parser("zoo", help="register the demo zoo and report variants and registration time")
    zoo.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    live = commands.add_parser("live", help="selection and round-trip time of queries over HTTP")
    live.add_argument("--queries", type=int, default=1000)
    live.add_argument("--metadata", default="memory://", help="memory:// or a redis:// URL")
    live.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    args = parser.parse_args(argv)
    if args.command == "live":
        bench_live(args.state_dir, args.queries, args.metadata)
    elif args.command == "selection":
        bench_selection(args.architectures, args.queries, args.workers, args.redis)
    elif args.command == "zoo":
        bench_zoo(args.state_dir)


if __name__ == "__main__":
    main()
