"""Benchmarks (``scripts/bench``). Each part prints its numbers and the machine it ran on, and
writes its section of the write-up to ``docs/bench/<part>.md`` (raw numbers in ``<part>.json``,
plots beside them); ``scripts/bench all`` runs every part and assembles ``docs/BENCHMARKS.md``.

    scripts/bench all [--only PART ...] [--skip PART ...] [--quick]
    scripts/bench report                     # reassemble docs/BENCHMARKS.md, measuring nothing
    scripts/bench real-zoo|variant-picks     # the real zoo registered; the variant each target picks
    scripts/bench selection [--architectures 100] [--queries 5000] [--rate 1000] [--repeats 3]
    scripts/bench live [--queries 1000] [--metadata memory:// --metadata redis://...]
    scripts/bench zoo
    scripts/bench scaler|serving|offline|costs|soak [their own options: --help]

``selection``: per-query decision time of the Dispatcher (getVariant + worker choice), the whole
path a query takes: cached static profiles and their per-batch index, the live state read from
the metadata store through the dispatcher's short-lived snapshot (one round trip when it is
older than LIVE_STATE_TTL_S), the dispatcher's own recent loads laid over it, the policy. The
workers re-report every second, as real ones do, and decisions arrive at ``--rate`` per second,
so that the snapshot's reads are amortised as in serving; each line says how many reads its
decisions made. Lines for the in-memory store and a real Redis server, then: every decision
reading the live state (what a query pays when the snapshot has expired: the bound at any
rate), and cold decisions (the first after an app's profiles changed; a new gateway's first).

``live``: the same decision measured in the replies of real queries over HTTP to the embedded
stack, with the gateway's total and the client's round trip.

``zoo``: registers the demo zoo under both demo apps, in-process, and reports for each model the
variants generated, kept and pruned, their latency and accuracy spread, and the registration time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.report import (
    DEFAULT_OUT_DIR,
    headlines,
    machine,
    markdown_table,
    percentile,
    span,
    write_fragment,
)
from modelless.catalog import DEFAULT_POOLS
from modelless.cli import format_table
from modelless.config import Settings
from modelless.dispatch import LIVE_STATE_TTL_S, Dispatcher
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.metadata.redis import RedisMetadataStore
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


@contextmanager
def reporting_workers(store: MetadataStore, every_s: float = 1.0) -> Iterator[None]:
    """Re-report every live worker each ``every_s``, as the workers' monitoring loops do: the
    live state the decisions read changes under them (new bytes to read and parse)."""
    stop = threading.Event()

    def report_loop() -> None:
        while not stop.wait(every_s):
            for state in store.list_workers():
                store.put_worker_state(dataclasses.replace(state, reported_at=time.time() + 3600))

    thread = threading.Thread(target=report_loop, name="bench-reports", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclasses.dataclass
class Timed:
    samples: list[float]
    store_reads: int  # live-state reads (store round trips) the timed decisions made


def bench_targets(app_id: str, variants: list[VariantProfile]) -> list[QueryTargets]:
    """Targets that some variant meets (a miss is a different, rarer path): each one is a
    variant's own accuracy with a budget a little above its cold latency."""
    rng = random.Random(11)
    return [
        QueryTargets(
            app_id,
            latency_ms=round(v.load_latency_ms + v.latency_ms(1) * 1.5, 3),
            min_accuracy=v.accuracy,
        )
        for v in rng.sample(variants, k=min(64, len(variants)))
    ]


def new_dispatcher(store: MetadataStore, live_state_ttl_s: float = LIVE_STATE_TTL_S) -> Dispatcher:
    """A dispatcher configured as the gateway's (the settings' profile cache TTL and tolerance)."""
    settings = Settings()
    return Dispatcher(
        store,
        InfaasPolicy(DEFAULT_POOLS, settings.accuracy_tolerance),
        HttpWorkerInvoker(),
        None,
        cache_ttl_s=settings.profile_cache_ttl_s,
        live_state_ttl_s=live_state_ttl_s,
    )


@contextmanager
def counting_reads(store: MetadataStore) -> Iterator[list[int]]:
    """Counts the live-state reads (``selection_state``: one round trip each) made meanwhile."""
    count = [0]
    read_state = store.selection_state

    def counted(app: str) -> tuple[int, list[WorkerState]]:
        count[0] += 1
        return read_state(app)

    setattr(store, "selection_state", counted)  # noqa: B010 (an instance attribute over the method)
    try:
        yield count
    finally:
        delattr(store, "selection_state")  # back to the method


def time_selection(
    store: MetadataStore,
    app_id: str,
    variants: list[VariantProfile],
    queries: int,
    rate: float = 0.0,
    live_state_ttl_s: float = LIVE_STATE_TTL_S,
) -> Timed:
    """``queries`` consecutive decisions through ``Dispatcher.select``, arriving ``rate`` per
    second (0: back to back), each timed whole, live-state reads included where it makes them."""
    dispatcher = new_dispatcher(store, live_state_ttl_s)
    targets = bench_targets(app_id, variants)
    for target in targets:  # warm the profile cache, as a serving gateway's is
        dispatcher.select(target)
    samples = []
    with counting_reads(store) as reads:
        begun = time.perf_counter()
        for index in range(queries):
            if rate > 0:
                wait = begun + index / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            started = time.perf_counter()
            dispatcher.select(targets[index % len(targets)])
            samples.append((time.perf_counter() - started) * 1000)
    return Timed(samples, reads[0])


def time_after_profiles_change(
    store: MetadataStore, app_id: str, variants: list[VariantProfile], queries: int
) -> Timed:
    """Cold decisions: before each, the app's profiles change (a registration republishes one
    model, which bumps the version), and the live-state snapshot has expired. The decision reads
    the live state, sees the new version, reads every profile again and rebuilds the index."""
    dispatcher = new_dispatcher(store)
    targets = bench_targets(app_id, variants)
    for target in targets:
        dispatcher.select(target)
    model = store.get_model(app_id, "arch0")
    assert model is not None
    registration = store.get_registration(model.registration_id)
    assert registration is not None
    republished = store.list_variants(app_id, "arch0")
    samples = []
    with counting_reads(store) as reads:
        for index in range(queries):
            store.publish_variants(model, republished, registration)
            dispatcher.live_view.forget_snapshots()
            started = time.perf_counter()
            dispatcher.select(targets[index % len(targets)])
            samples.append((time.perf_counter() - started) * 1000)
    return Timed(samples, reads[0])


def time_new_gateway(redis_url: str, app_id: str, variants: list[VariantProfile], queries: int) -> Timed:
    """Cold decisions: each the first of a new gateway (new store client and dispatcher): a
    connection, the live state, every profile read and parsed, the index built."""
    targets = bench_targets(app_id, variants)
    samples = []
    for index in range(queries):
        started = time.perf_counter()
        store = RedisMetadataStore.from_url(redis_url)
        new_dispatcher(store).select(targets[index % len(targets)])
        samples.append((time.perf_counter() - started) * 1000)
        store.close()
    return Timed(samples, queries)


def summary(timed: Timed | list[float]) -> dict[str, float]:
    samples = timed.samples if isinstance(timed, Timed) else timed
    figures = {
        "n": float(len(samples)),
        "median_ms": statistics.median(samples),
        "p99_ms": percentile(samples, 99),
        "max_ms": max(samples),
    }
    if isinstance(timed, Timed):
        figures["store_reads"] = float(timed.store_reads)
    return figures


def report(label: str, timed: Timed | list[float]) -> str:
    figures = summary(timed)
    line = (
        f"{label:<46} n={int(figures['n']):>5}  median={figures['median_ms']:.4f} ms  "
        f"p99={figures['p99_ms']:.4f} ms  max={figures['max_ms']:.4f} ms"
    )
    return f"{line}  store reads={int(figures['store_reads'])}" if "store_reads" in figures else line


SELECTION_LINES = {
    "memory": "in-memory store",
    "memory-cold": "in-memory, cold: first decision after a profiles change",
    "redis": "Redis (real server, redis-py + hiredis), live-state snapshot",
    "redis-every": "Redis, live state read by every decision",
    "redis-cold": "Redis, cold: first decision after a profiles change",
    "redis-new-gateway": "Redis, cold: a new gateway's first decision",
}


def selection_once(
    architectures: int, queries: int, workers: int, redis_url: str, rate: float
) -> dict[str, dict[str, float]]:
    """One repeat of every line of the selection bench; prints each as it is measured."""
    cold = max(1, min(50, queries // 100))
    measured: dict[str, dict[str, float]] = {}

    def record(key: str, timed: Timed) -> None:
        measured[key] = summary(timed)
        print(report(SELECTION_LINES[key], timed), flush=True)

    memory = open_metadata_store("memory://")
    variants = seed_store(memory, "bench", architectures, workers)
    with reporting_workers(memory):
        record("memory", time_selection(memory, "bench", variants, queries, rate))
        record("memory-cold", time_after_profiles_change(memory, "bench", variants, cold))
    url = f"{redis_url}?prefix=bench-{os.getpid()}:"
    store = RedisMetadataStore.from_url(url)
    try:
        variants = seed_store(store, "bench", architectures, workers)
        with reporting_workers(store):
            record("redis", time_selection(store, "bench", variants, queries, rate))
            record("redis-every", time_selection(store, "bench", variants, queries, live_state_ttl_s=0.0))
            record("redis-cold", time_after_profiles_change(store, "bench", variants, cold))
            record("redis-new-gateway", time_new_gateway(url, "bench", variants, max(1, cold // 5)))
    finally:
        store.flush_namespace()
        store.close()
    return measured


def bench_selection(
    architectures: int, queries: int, workers: int, redis_url: str, rate: float, repeats: int, out_dir: Path
) -> None:
    print(f"machine: {machine()}")
    arrival = f"{rate:g} decisions/s" if rate > 0 else "back to back"
    variants = architectures * len(RECIPES) * len(DEFAULT_POOLS)
    print(
        f"selection: {architectures} architectures x {len(RECIPES) * len(DEFAULT_POOLS)} variants, "
        f"{workers} live workers reporting every 1 s; {queries} decisions arriving {arrival}; "
        f"live-state snapshot {LIVE_STATE_TTL_S * 1000:g} ms; {repeats} repeat(s)"
    )
    runs = []
    for repeat in range(repeats):
        print(f"-- repeat {repeat + 1}/{repeats}", flush=True)
        runs.append(selection_once(architectures, queries, workers, redis_url, rate))

    def figure(key: str, name: str, digits: int) -> str:
        return span([run[key][name] for run in runs], digits)

    rows = [
        [
            SELECTION_LINES[key],
            figure(key, "median_ms", 3),
            figure(key, "p99_ms", 3) if key != "redis-new-gateway" else "—",
            span([run[key]["store_reads"] for run in runs], 0),
        ]
        for key in SELECTION_LINES
    ]
    median_redis = [run["redis"]["median_ms"] for run in runs]
    p99_redis = [run["redis"]["p99_ms"] for run in runs]
    median_every = [run["redis-every"]["median_ms"] for run in runs]
    p99_every = [run["redis-every"]["p99_ms"] for run in runs]
    met = max(median_redis) < 0.3 and max(p99_redis) < 1.0
    met_every = max(median_every) < 0.3 and max(p99_every) < 1.0
    command = (
        f"scripts/bench selection --architectures {architectures} --queries {queries} "
        f"--workers {workers} --rate {rate:g} --repeats {repeats}"
    )
    markdown = f"""## Per-query selection time (getVariant + worker choice)

Machine: `{machine()}`. Reproduce: `{command}`.

It seeds {architectures} architectures x {len(RECIPES)} recipes x {len(DEFAULT_POOLS)} pools
({variants:,} variants) of profiles and {workers} live workers that re-report every second, then
times `Dispatcher.select()`: the whole decision a query takes (the app's profiles, parsed once and
revalidated by a version counter; the live worker state; the dispatcher's own recent placements
laid over it; the policy), for {queries:,} decisions arriving at {rate:g} per second. Live state
is read from the store at most every {LIVE_STATE_TTL_S * 1000:g} ms per app (a snapshot: workers
report every second; a miss or an unreachable worker forces a fresh read), so the table also shows
a decision that reads Redis every time. Milliseconds, min-max over {repeats} repeat(s):

{markdown_table(["decision", "median ms", "p99 ms", "store reads"], rows)}

Target (issue "Live variant state…"): median under 0.3 ms and p99 under 1 ms with 100
architectures and live state in Redis. With {architectures}: **{"met" if met else "missed"}** with
the snapshot (median {span(median_redis, 3)} ms, p99 {span(p99_redis, 3)} ms) and
**{"met" if met_every else "missed"}** when every decision reads Redis (median
{span(median_every, 3)} ms, p99 {span(p99_every, 3)} ms).
INFaaS reports 2.2-3.5 ms median. A cold decision pays for parsing the app's profiles; a new
gateway pays it once.
"""
    write_fragment(
        out_dir,
        "selection",
        markdown,
        {
            "machine": machine(),
            "command": command,
            "architectures": architectures,
            "variants": variants,
            "runs": runs,
            "headlines": [
                f"Selection (getVariant + worker choice), {architectures} architectures, live state in "
                f"Redis: median {span(median_redis, 3)} ms, p99 {span(p99_redis, 3)} ms "
                f"(reading Redis every decision: {span(median_every, 3)} / {span(p99_every, 3)} ms); "
                "INFaaS: 2.2-3.5 ms median"
            ],
        },
    )


def bench_zoo(state_dir: Path, out_dir: Path) -> None:
    """Register the demo zoo (both demo apps) in-process and report what registration produced."""
    from infra.local.demo import DEMO_APPS, zoo_summary
    from infra.zoo.digits import build_zoo
    from modelless.catalog import DEFAULT_POOLS
    from modelless.config import Settings
    from modelless.registration.ingest import RegistrationSource
    from modelless.registration.service import RegistrationService
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
                source = RegistrationSource(zoo_dir / model["file"], zoo_dir / "valset.npz")
                registration = registrar.register(app, model["name"], source)
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
    generated = sum(int(r["generated"]) for r in rows)
    kept_per_app = {app: sum(int(r["kept"]) for r in rows if r["app"] == app) for app in DEMO_APPS}
    print(
        f"generated {generated} variants; one registration took {min(durations):.1f}..{max(durations):.1f} s "
        f"(median {statistics.median(durations):.1f} s)"
    )
    every = [v for app in DEMO_APPS for v in store.list_variants(app)]
    batch_one = [v.latency_p50_ms[1] for v in every]
    accuracies = [v.accuracy for v in every]
    kept_line = ", ".join(f"{count} in `{app}`" for app, count in kept_per_app.items())
    markdown = f"""## Variant generation and profiling (the demo zoo)

Machine: `{machine()}`. Reproduce: `scripts/bench zoo` (it trains the zoo first when
`.modelless/demo` lacks it: `python -m infra.zoo.digits`, ~25-45 s).

The demo zoo registered under both demo apps, in-process, as `scripts/run` registers it. Per
model: variants generated, kept and pruned (dominated within measurement noise, see
[VARIANTS.md](../VARIANTS.md)), the kept variants' batch-1 median latency and accuracy, and the
registration's wall time (every profile in a fresh process):

{markdown_table(list(rows[0]), [list(r.values()) for r in rows])}

In all: {generated} variants generated, {sum(kept_per_app.values())} kept ({kept_line}); batch-1 median
latency {min(batch_one):.3f}-{max(batch_one):.3f} ms ({max(batch_one) / min(batch_one):.0f}x),
accuracy {min(accuracies):.4f}-{max(accuracies):.4f}. One registration takes
{min(durations):.1f}-{max(durations):.1f} s (median {statistics.median(durations):.1f} s). Kept
counts vary by a few between runs: pruning compares measured medians on a 10 % grid.
"""
    write_fragment(
        out_dir,
        "zoo",
        markdown,
        {
            "machine": machine(),
            "rows": rows,
            "headlines": [
                f"Variants: {generated} generated for the demo zoo, {sum(kept_per_app.values())} kept after "
                f"pruning; batch-1 latency spread {max(batch_one) / min(batch_one):.0f}x, accuracy "
                f"{min(accuracies):.4f}-{max(accuracies):.4f}; one registration {min(durations):.1f}-"
                f"{max(durations):.1f} s"
            ],
        },
    )


def live_once(state_dir: Path, queries: int, metadata: str) -> dict[str, dict[str, float]]:
    """Queries over HTTP against the embedded stack on 127.0.0.1: the selection time each reply
    reports, and the whole round trip the client sees."""

    import numpy as np

    from infra.local.stack import ThreadedGateway, start_stack
    from infra.zoo.digits import build_zoo
    from modelless.client import Client
    from modelless.observability.metrics import logger as gateway_logger

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # EMF on stdout would drown the report
    gateway_logger.setLevel("WARNING")
    zoo_dir = state_dir / "demo"
    build_zoo(zoo_dir)
    with tempfile.TemporaryDirectory(prefix="modelless-live-") as tmp:
        port = 18080 + os.getpid() % 1000
        stack = start_stack(Path(tmp), "127.0.0.1", port, 2, 2, metadata)
        gateway = ThreadedGateway(stack, port)
        try:
            admin = gateway.admin()
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
            if isinstance(stack.services.store, RedisMetadataStore):
                stack.services.store.flush_namespace()  # the next repeat starts from an empty store
            gateway.close()
    print(f"live: {queries} sequential queries over HTTP, metadata {metadata}, 2 cpu workers")
    print(report("selection (in reply)", selection))
    print(report("gateway total (in reply)", total))
    print(report("client round trip", client_side), flush=True)
    return {"selection": summary(selection), "gateway": summary(total), "client": summary(client_side)}


LIVE_HEADER = [
    "metadata store",
    "selection (`timingsMs.selection_ms`)",
    "gateway total (`total_ms`)",
    "client round trip",
]


def bench_live(state_dir: Path, queries: int, stores: list[str], repeats: int, out_dir: Path) -> None:
    print(f"machine: {machine()}")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {store: [] for store in stores}
    for repeat in range(repeats):
        for store in stores:  # in turns, so that other work on the machine weighs on both alike
            print(f"-- repeat {repeat + 1}/{repeats}, metadata {store}", flush=True)
            runs[store].append(live_once(state_dir, queries, store))

    def cell(store: str, stage: str) -> str:
        return (
            f"{span([r[stage]['median_ms'] for r in runs[store]], 3)} / "
            f"{span([r[stage]['p99_ms'] for r in runs[store]], 3)}"
        )

    rows = [
        [f"`{store}`", cell(store, "selection"), cell(store, "gateway"), cell(store, "client")]
        for store in stores
    ]
    stores_option = " ".join(f"--metadata '{store}'" for store in stores)
    command = f"scripts/bench live --queries {queries} --repeats {repeats} {stores_option}"
    markdown = f"""## Selection and round trip, measured in the replies of real queries

Machine: `{machine()}`. Reproduce: `{command}`.

The embedded stack (gateway, 2 worker processes, the local Lambda tier) on 127.0.0.1 with two
demo models registered; {queries:,} sequential queries over HTTP alternating a low- and a
high-accuracy target, after both variants are loaded. Milliseconds, median / p99, min-max over
{repeats} repeat(s):

{markdown_table(LIVE_HEADER, rows)}

Selection here is what the reply reports: the same decision as the selection bench above, plus
the live-state snapshot's refresh when it has expired (one Redis round trip every
{LIVE_STATE_TTL_S * 1000:g} ms at most). The rest of the round trip is the Python HTTP stack
(uvicorn, FastAPI, pydantic), the hop to the worker and the inference itself.
"""
    write_fragment(out_dir, "live", markdown, {"machine": machine(), "command": command, "runs": runs})


# The parts of ``scripts/bench all``, in the order they run, with what each measures. Each writes
# docs/bench/<part>.md and <part>.json (bench/report.py). The real zoo is built and registered
# once, by the first part; the parts after it that serve it read its cache.
PARTS: dict[str, str] = {
    "real-zoo": "the real zoo built and registered: time to first servable variant, variants kept and pruned",
    "variant-picks": "which variant each (latency, accuracy) target picks across the real zoo",
    "serving": "real zoo: overhead over a direct onnxruntime call; AIMD batching against batch 1; Ray Serve",
    "costs": "real zoo: trace-driven cost and SLO against INFaaS's baselines (simulator, validated live)",
    "sim-validation": "real zoo: the simulator against the live embedded stack, replaying the conv trace",
    "tuning": "real zoo: RRL-style parallelism tuning on a real worker against static configurations",
    "selection": "per-query decision time, in-memory and Redis",
    "live": "selection and round trip in the replies of real queries over HTTP (digits models)",
    "zoo": "variants generated, kept and pruned for the demo (digits) zoo; registration time",
    "scaler": "solve time of the variant-mix program; the greedy's optimality gap",
    "offline": "offline job throughput alone and beside online load (a small MLP)",
    "soak": "10 minutes at 80 % of measured capacity: errors by kind, p99, SLO attainment, memory slopes",
    "selection-feedback": "a model goes bad mid-run: Exp3/Exp4 selection from feedback against static INFaaS",
    "cache": "the prediction cache: a hit's p50/p99 latency against a miss's, over HTTP",
    "pipelines": "real zoo: pipelines under one end-to-end SLO, planner + tuner vs InferLine baselines (sim)",
}
# Fragments kept from runs of parts since re-based on the real zoo: the small-model numbers.
ARCHIVED: dict[str, str] = {
    "digits-serving": "serving overhead, Ray Serve and batching on a digits MLP (before the real zoo)",
    "digits-costs": "the cost study on the digits zoo and a derived ResNet-style model (before the real zoo)",
}
ARCHIVED_NOTE = (
    "*Measured by the digits-based version of this part, before the benchmarks were re-based on the real "
    "zoo (at commit d2ea50d); the command quoted below reproduces it only at that commit. Kept as the "
    "small-model figures: every model here answers in well under a millisecond to a few ms.*"
)
# How docs/BENCHMARKS.md groups the fragments: the real zoo first, then the small models, then the
# control plane on synthetic profiles.
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Real architectures (the real zoo)",
        "timm's MobileNets, EfficientNet-B0, ResNets, DenseNet-121 and ViT-Tiny at 3x224x224 and a "
        "BERT-style text model ([ZOO.md](ZOO.md)): the figures that say what serving real models costs.",
        ("real-zoo", "variant-picks", "serving", "costs", "sim-validation", "tuning", "cache", "pipelines"),
    ),
    (
        "Small models (scikit-learn digits)",
        "The demo zoo's 8x8-digit models (0.005-1.5 ms per inference), where the serving path's own "
        "milliseconds dominate: kept for what they isolate, the path itself.",
        ("zoo", "live", "digits-serving", "digits-costs", "offline", "selection-feedback"),
    ),
    (
        "Endurance",
        "The whole embedded stack under minutes of steady load: what breaks or grows only with time.",
        ("soak",),
    ),
    (
        "The control plane (synthetic profiles)",
        "Decision and solve times, independent of the models' sizes.",
        ("selection", "scaler"),
    ),
)
# Runs of a part kept from a second machine (``docs/bench/<name>.md``, beside the part's own): their
# ``<name>.json`` holds the summary lines quoted after the part's headlines, written by hand from the
# fragment, since that run wrote its own JSON elsewhere (the fragment gives its command).
COMPANIONS: dict[str, tuple[str, ...]] = {"scaler": ("scaler-xeon",)}
# Parts with an argument parser of their own, in their own modules.
DELEGATED = {
    "real-zoo": "bench.real_zoo",
    "variant-picks": "bench.variant_picks",
    "scaler": "bench.scaler",
    "serving": "bench.serving",
    "offline": "bench.offline",
    "soak": "bench.soak",
    "costs": "bench.costs",
    "sim-validation": "bench.sim_validation",
    "selection-feedback": "bench.feedback",
    "tuning": "bench.tuning",
    "cache": "bench.cache",
    "pipelines": "bench.pipelines",
}
DOC = Path("docs/BENCHMARKS.md")


# The parts with a ``--quick`` smoke mode (two models of the real zoo, short loads).
QUICK_PARTS = (
    "real-zoo",
    "variant-picks",
    "serving",
    "costs",
    "sim-validation",
    "tuning",
    "offline",
    "soak",
    "selection-feedback",
    "cache",
    "pipelines",
)


def run_all(parts: list[str], out_dir: Path, quick: bool = False) -> None:
    """Every part in turn, each in a process of its own (nothing one leaves behind weighs on the
    next), then docs/BENCHMARKS.md assembled from what they wrote. ``quick``: the parts that have a
    smoke mode run in it (``QUICK_PARTS``)."""
    import subprocess

    print(f"machine: {machine()}", flush=True)
    timings: dict[str, float] = {}
    failed: list[str] = []
    began = time.perf_counter()
    for part in parts:
        print(f"\n=== {part}: {PARTS[part]}", flush=True)
        started = time.perf_counter()
        options = ["--quick"] if quick and part in QUICK_PARTS else []
        code = subprocess.call([sys.executable, "-m", "bench", part, *options])
        timings[part] = round(time.perf_counter() - started, 1)
        print(
            f"=== {part}: {'done' if code == 0 else f'FAILED (exit {code})'} in {timings[part]:.0f} s",
            flush=True,
        )
        if code != 0:
            failed.append(part)
    total = round(time.perf_counter() - began, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "all.json").write_text(
        json.dumps(
            {"machine": machine(), "seconds": timings, "total_seconds": total, "failed": failed}, indent=1
        )
        + "\n"
    )
    assemble(out_dir, DOC)
    print(f"\nall: {total / 60:.1f} min; " + ", ".join(f"{p} {s / 60:.1f} min" for p, s in timings.items()))
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


def relink(markdown: str, fragment_dir: str) -> str:
    """Relative links of a fragment under docs/bench/, made relative to docs/ where it is inlined."""
    import posixpath
    import re

    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("#", "/")):
            return match.group(0)
        return f"{match.group(1)}({posixpath.normpath(posixpath.join(fragment_dir, target))})"

    return re.sub(r"(\]\s*)\(([^)\s]+)\)", fix, markdown)


def demote(markdown: str) -> str:
    """Every heading one level down (a fragment's ``##`` sits under its group's ``##``)."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append(f"#{line}" if not fenced and line.startswith("#") else line)
    return "\n".join(out)


def fragment(out_dir: Path, part: str, fragment_dir: str) -> str:
    """One part's section as docs/BENCHMARKS.md inlines it."""
    path = out_dir / f"{part}.md"
    if not path.exists():
        what = PARTS.get(part) or ARCHIVED.get(part, part)
        return f"### {what}\n\nNot measured yet: run `scripts/bench {part}`."
    text = relink(path.read_text().strip(), fragment_dir)
    if part in ARCHIVED:
        heading, _, rest = text.partition("\n")
        text = f"{heading}\n\n{ARCHIVED_NOTE}\n{rest}"
    return demote(text)


def assemble(out_dir: Path, doc: Path) -> None:
    """docs/BENCHMARKS.md from the parts' fragments: the summary of their headlines, then each,
    in their groups (the real zoo first)."""
    timings_path = out_dir / "all.json"
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    seconds = timings.get("seconds", {})
    rows = [
        [
            f"`scripts/bench {part}`",
            what,
            # A time only beside what that run wrote (a part re-run or renamed since has none).
            f"{seconds[part] / 60:.1f} min"
            if part in seconds and (out_dir / f"{part}.json").exists()
            else "—",
        ]
        for part, what in PARTS.items()
    ]
    fragment_dir = posixpath_relative(out_dir, doc.parent)
    lines, sections = [], []
    for title, intro, parts in GROUPS:
        found = [
            f"- {line}"
            for part in parts
            for name in (part, *COMPANIONS.get(part, ()))
            for line in headlines(out_dir, name)
        ]
        if found:
            lines += [f"**{title}**", "", *found, ""]
        sections.append(
            f"## {title}\n\n{intro}\n\n"
            + "\n\n".join(fragment(out_dir, part, fragment_dir) for part in parts)
        )
    total = timings.get("total_seconds")
    last_run = (
        f"The last `scripts/bench all` took {total / 60:.1f} min on `{timings.get('machine', '')}`."
        if total
        else ""
    )
    header = f"""# Benchmarks

Every figure here comes from a run of the project's own code, by the command beside it, on the
machine that run printed (each section states it, with the date, the repeats and the spread).
Absolute numbers move between runs on a shared machine, so every figure is given as the min-max
over repeats within one run, and comparisons are made as ratios within one run. No test asserts a
timing. No GPU or Inferentia device was used: wherever such a variant appears, its profile is
derived from a measured CPU profile, not measured, and the section says how.

The real zoo's sections come first (real architectures at their native input sizes), then the
small digits models, then the control plane. `scripts/bench all` runs every part below in turn
(the real zoo built and registered once, by its first part) and writes this file from what they
wrote (`docs/bench/<part>.md` and `.json`, plots beside them); each part also runs alone, and
`scripts/bench report` rewrites this file from those fragments without measuring anything.
{last_run}

{markdown_table(["command", "what it measures", "time in the last `all`"], rows)}

## Headlines

{chr(10).join(lines).rstrip() if lines else "No part has run yet."}
"""
    doc.write_text(header.rstrip() + "\n\n" + "\n\n".join(sections) + "\n")
    print(f"wrote {doc}", flush=True)


def posixpath_relative(path: Path, start: Path) -> str:
    return os.path.relpath(path.resolve(), start.resolve()).replace(os.sep, "/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    selection = commands.add_parser("selection", help=PARTS["selection"])
    selection.add_argument("--architectures", type=int, default=100)
    selection.add_argument("--queries", type=int, default=5000)
    selection.add_argument("--workers", type=int, default=4)
    selection.add_argument(
        "--rate", type=float, default=1000.0, help="decisions per second (0: back to back)"
    )
    selection.add_argument(
        "--redis", default=os.environ.get("MODELLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    selection.add_argument("--repeats", type=int, default=3)
    zoo = commands.add_parser("zoo", help=PARTS["zoo"])
    zoo.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    live = commands.add_parser("live", help=PARTS["live"])
    live.add_argument("--queries", type=int, default=1000)
    live.add_argument(
        "--metadata",
        action="append",
        help="memory:// or a redis:// URL; repeat for several (default: memory:// and a local Redis)",
    )
    live.add_argument("--repeats", type=int, default=2)
    live.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    for name, module in DELEGATED.items():
        delegated = commands.add_parser(
            # argparse formats help with %: a literal one is written %%.
            name,
            help=f"{PARTS[name]} ({module.replace('.', '/')}.py; --help there)".replace("%", "%%"),
        )
        delegated.add_argument("options", nargs=argparse.REMAINDER, help="passed on to the part")
    everything = commands.add_parser("all", help="every part in turn, then docs/BENCHMARKS.md")
    everything.add_argument("--only", nargs="+", choices=list(PARTS), help="these parts only")
    everything.add_argument("--skip", nargs="+", choices=list(PARTS), default=[], help="leave these out")
    everything.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke runs of {', '.join(QUICK_PARTS)} (two models, short loads)",
    )
    commands.add_parser("report", help="assemble docs/BENCHMARKS.md from docs/bench/ without measuring")
    for sub in (selection, zoo, live, everything, commands.choices["report"]):
        sub.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    # The prediction cache would answer the repeated inputs of the serving benchmarks without
    # running them: off, except where a part turns it on (bench/cache.py measures it).
    os.environ.setdefault("MODELLESS_PREDICTION_CACHE_ENABLED", "false")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in DELEGATED:  # its own options, parsed by its own module
        import importlib

        importlib.import_module(DELEGATED[argv[0]]).main(argv[1:])
        return
    args = parser.parse_args(argv)
    if args.command == "live":
        stores = args.metadata or ["memory://", "redis://127.0.0.1:6379/14?prefix=benchlive:"]
        bench_live(args.state_dir, args.queries, stores, args.repeats, args.out_dir)
    elif args.command == "selection":
        bench_selection(
            args.architectures, args.queries, args.workers, args.redis, args.rate, args.repeats, args.out_dir
        )
    elif args.command == "zoo":
        bench_zoo(args.state_dir, args.out_dir)
    elif args.command == "all":
        run_all([p for p in (args.only or PARTS) if p not in args.skip], args.out_dir, args.quick)
    elif args.command == "report":
        assemble(args.out_dir, DOC)


if __name__ == "__main__":
    main()
