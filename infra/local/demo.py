"""The README's first command: start the embedded stack, register the demo models, show how
different targets pick different variants, then keep serving until Ctrl-C.

    python -m infra.local.demo --port 8080
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from infra.local.stack import start_stack
from modelless.api import create_app
from modelless.cli import format_table, load_app_key, progress_bar, save_app_key, variant_rows
from modelless.client import Client, ModellessClientError
from modelless.observability import logger as gateway_logger

# Two apps: one serves the whole zoo; the other, a cheaper subset of it.
DEMO_APPS: dict[str, tuple[str, ...] | None] = {
    "digits": None,
    "digits-lite": ("digits-tiny", "digits-linear", "digits-mlp"),
}


def ensure_app(client: Client, app_id: str) -> tuple[str, str]:
    """Reuse the app (and its saved key) from an earlier run, or create it."""
    key = load_app_key(app_id)
    if key is None:
        try:
            key = client.create_app(app_id)
        except ModellessClientError as error:
            if error.status != 409:
                raise
            # The app outlived its saved key (e.g. Redis kept it): use a fresh app name.
            app_id = f"{app_id}-{int(time.time())}"
            key = client.create_app(app_id)
        save_app_key(app_id, key)
    return app_id, key


def register_zoo(
    client: Client, app_id: str, zoo_dir: Path, manifest: dict[str, Any], only: tuple[str, ...] | None
) -> None:
    ready = {m["model_name"] for m in client.models() if m["ready"]}
    for model in manifest["models"]:
        name = model["name"]
        if only is not None and name not in only:
            continue
        if name in ready:
            print(f"  {name}: already registered")
            continue
        reply = client.register_model(name, zoo_dir / model["file"], zoo_dir / "valset.npz", app_id)
        started = time.monotonic()

        def show(status: dict[str, Any], name: str = name) -> None:
            print(f"\r  {name}: {progress_bar(status)}"[:110].ljust(110), end="", flush=True)

        final = client.wait_for_registration(reply["registrationId"], on_progress=show)
        print(
            f"\r  {name}: {final['status']}, {len(final['variantIds'])} variants "
            f"({final['pruned']} dominated ones pruned) in {time.monotonic() - started:.1f} s".ljust(110)
        )
        if final["status"] != "ready":
            raise SystemExit(f"registration of {name} failed: {final['message']}")


def demo_queries(client: Client, app_id: str, zoo_dir: Path) -> None:
    variants = client.variants()
    with np.load(zoo_dir / "testset.npz", allow_pickle=False) as test:
        images, labels = test["inputs"], test["labels"]
    fastest = min(variants, key=lambda v: v["latency_p99_ms"]["1"])
    best = max(variants, key=lambda v: (v["accuracy"], -v["latency_p99_ms"]["1"]))
    fast_budget = round(max(0.05, fastest["latency_p99_ms"]["1"] * 3), 3)
    best_accuracy = float(best["accuracy"])
    fast_accuracy = float(fastest["accuracy"])
    impossible_accuracy = min(1.0, best_accuracy + 0.005)
    fast = {"latency": fast_budget, "accuracy": fast_accuracy}
    accurate = {"latency": 200.0, "accuracy": best_accuracy}
    cases: list[tuple[str, dict[str, Any]]] = [
        (f"fast: <= {fast_budget} ms, accuracy >= {fast_accuracy:.4f}", fast),
        (f"accurate: accuracy >= {best_accuracy:.4f}, <= 200 ms", accurate),
        ("the fast targets again", fast),
        ("the accurate targets again", accurate),
        ("named model: digits-mlp", {"model_name": "digits-mlp"}),
        (
            f"impossible: accuracy >= {impossible_accuracy:.4f} within {fast_budget} ms",
            {"latency": fast_budget, "accuracy": impossible_accuracy},
        ),
    ]
    rows = []
    for index, (label, targets) in enumerate(cases):
        sample = images[index]
        try:
            reply = client.online_query(sample, app_id, **targets)
        except ModellessClientError as error:
            closest = error.details.get("closest", {})
            warming = error.details.get("warming")
            outcome = (
                f"loading {warming['variant']} for next time"
                if warming
                else f"closest: {closest.get('variant')} (accuracy {closest.get('accuracy')})"
            )
            rows.append({"query": label, "variant": f"{error.status} {error.code}", "where": outcome})
            print(f"  {label}\n      -> {error.status}: {error.message}")
            if warming:  # give the load the time its profile says it takes, and a margin
                time.sleep(warming["retry_after_ms"] / 1000 + 0.2)
            continue
        rows.append(
            {
                "query": label,
                "variant": reply["variant"],
                "where": f"{reply['tier']} {reply['worker'] or ''}".strip(),
                "state": reply["variantState"] + (" cold" if reply["coldStart"] else ""),
                "total ms": reply["timingsMs"]["total_ms"],
                "select ms": reply["timingsMs"]["selection_ms"],
                "pred/label": f"{reply['predictions'][0]}/{labels[index]}",
            }
        )
        print(f"  {label}\n      -> {reply['variant']}: {reply['reason']}")
    print()
    print(format_table(rows, ["query", "variant", "where", "state", "total ms", "select ms", "pred/label"]))


def zoo_summary(variants_by_app: dict[str, list[dict[str, Any]]]) -> str:
    """Variants per app and the spread of latency and accuracy they offer."""
    lines = []
    everything = [v for variants in variants_by_app.values() for v in variants]
    for app, variants in variants_by_app.items():
        models = sorted({v["model_name"] for v in variants})
        lines.append(f"app {app}: {len(variants)} variants of {len(models)} models")
    latencies = [v["latency_p50_ms"]["1"] for v in everything]
    accuracies = [v["accuracy"] for v in everything]
    fastest, slowest = min(latencies), max(latencies)
    lines.append(
        f"in all: {len(everything)} variants; batch-1 p50 latency {fastest:.3f}..{slowest:.3f} ms "
        f"({slowest / fastest:.0f}x); accuracy {min(accuracies):.4f}..{max(accuracies):.4f}"
    )
    return "\n".join(lines)


def run_demo(url: str, admin_key: str, zoo_dir: Path, done: threading.Event, failures: list[str]) -> None:
    from infra.zoo.digits import build_zoo

    try:
        client = Client(url)
        while not client.health():
            time.sleep(0.1)
        print("building the demo zoo (trained here on scikit-learn's digits)...", flush=True)
        manifest = build_zoo(zoo_dir)
        admin = Client(url, admin_key=admin_key)
        clients: dict[str, Client] = {}
        for wanted, only in DEMO_APPS.items():
            app_id, key = ensure_app(admin, wanted)
            clients[app_id] = Client(url, api_key=key)
            print(f"registering demo models in app {app_id!r} (variants are generated and profiled):")
            register_zoo(clients[app_id], app_id, zoo_dir, manifest, only)
        main_app, client = next(iter(clients.items()))
        print(f"\nvariants of app {main_app!r}:")
        rows = variant_rows(client.variants())
        print(format_table(rows, list(rows[0])))
        print("\n" + zoo_summary({app: c.variants() for app, c in clients.items()}))
        print("\nqueries (model-less: only targets are given):")
        demo_queries(client, main_app, zoo_dir)
        print(
            f"\nserving on {url} — try: .venv/bin/modelless variants --app {main_app}   (Ctrl-C stops)",
            flush=True,
        )
    except Exception as error:  # the demo failing must not leave the server up silently
        failures.append(f"{type(error).__name__}: {error}")
        print(f"demo failed: {failures[-1]}", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    finally:
        done.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--metadata", default="auto")
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    parser.add_argument("--exit-after-demo", action="store_true", help="stop once the demo queries ran")
    args = parser.parse_args(argv)

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    # The demo prints its own table; the per-query JSON logs stay available at INFO for `serve`.
    gateway_logger.setLevel("WARNING")
    os.environ["MODELLESS_STATE_DIR"] = str(args.state_dir)
    stack = start_stack(args.state_dir, args.host, args.port, args.workers, 4, args.metadata)
    stack.start_scaling(period_s=5.0)
    os.environ["MODELLESS_ADMIN_KEY"] = stack.services.settings.admin_key
    print(
        f"modelless: embedded stack on {stack.url} (metadata: {stack.services.settings.metadata_url}, "
        f"{args.workers} cpu workers, local Lambda tier)",
        flush=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(stack.services), host=args.host, port=args.port, log_level="warning")
    )
    done = threading.Event()
    failures: list[str] = []
    threading.Thread(
        target=run_demo,
        args=(stack.url, stack.services.settings.admin_key, args.state_dir / "demo", done, failures),
        daemon=True,
    ).start()
    if args.exit_after_demo:

        def stop_when_done() -> None:
            done.wait()
            server.should_exit = True

        threading.Thread(target=stop_when_done, daemon=True).start()
    try:
        server.run()
    finally:
        stack.close()
        print("modelless: stopped", flush=True)
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
