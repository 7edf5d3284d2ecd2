"""The README's first command: start the embedded stack, register the demo models, show how
different targets pick different variants, then keep serving until Ctrl-C.

    python -m infra.local.demo --port 8080 [--zoo digits|real]

``--zoo digits`` (the default) registers the small digits zoo (infra/zoo/digits.py, trained in
seconds). ``--zoo real`` builds the real zoo once (infra/zoo/real.py: timm architectures at
3x224x224 in app ``zoo-images``, a BERT-style text model in app ``zoo-text``; docs/ZOO.md), then
registers it and queries it with tensors, an image file and token sequences.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from infra.local.stack import STATE_FILE, GracefulServer, refusing_to_start, serve, start_stack
from modelless.cli import format_table, load_app_key, progress_bar, save_app_key, variant_rows
from modelless.client import Client, ModellessClientError
from modelless.observability.metrics import logger as gateway_logger

ZOOS = ("digits", "real")
# Two apps: one serves the whole zoo; the other, a cheaper subset of it.
DEMO_APPS: dict[str, tuple[str, ...] | None] = {
    "digits": None,
    "digits-lite": ("digits-tiny", "digits-linear", "digits-mlp"),
}


def ensure_app(client: Client, app_id: str) -> tuple[str, str]:
    """Reuse the app (and its saved key) from an earlier run, or create it."""
    key = load_app_key(app_id)
    if key is not None and not opens_an_app(client.url, key):
        key = None  # saved for a store that is not this one (an earlier in-memory run's)
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


def opens_an_app(url: str, key: str) -> bool:
    try:
        with Client(url, api_key=key) as client:
            client.models()
    except ModellessClientError as error:
        if error.status == 401:
            return False
        raise
    return True


def register_zoo(
    client: Client, app_id: str, zoo_dir: Path, manifest: dict[str, Any], only: tuple[str, ...] | None
) -> None:
    ready = {m["model_name"] for m in client.models() if m["ready"]}
    for model in manifest["models"]:
        name = model["name"]
        if only is not None and name not in only:
            continue
        register_one(client, app_id, name, zoo_dir / model["file"], zoo_dir / "valset.npz", ready)


def register_one(
    client: Client,
    app_id: str,
    name: str,
    model_path: Path,
    valset_path: Path,
    ready: set[str],
    preprocessing: dict[str, Any] | None = None,
) -> None:
    """Register one model (unless it is already) and follow its registration to the end."""
    if name in ready:
        print(f"  {name}: already registered")
        return
    reply = client.register_model(name, model_path, valset_path, app_id, preprocessing=preprocessing)
    started = time.monotonic()

    def show(status: dict[str, Any]) -> None:
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
    with_inputs = [(label, targets, images[i]) for i, (label, targets) in enumerate(cases)]
    show_queries(client, app_id, with_inputs, labels)


def show_queries(
    client: Client, app_id: str, cases: list[tuple[str, dict[str, Any], Any]], labels: Any
) -> None:
    """Send each (label, targets, inputs) case and print which variant answered it and why; a
    refused query shows its error, and a variant warming up is given its profiled load time."""
    rows = []
    for index, (label, targets, sample) in enumerate(cases):
        try:
            reply = client.online_query(sample, app_id, **targets)
        except ModellessClientError as error:
            closest = error.details.get("closest") or {}
            warming = error.details.get("warming")
            outcome = (
                f"loading {warming['variant']} for next time"
                if warming
                else f"closest: {closest.get('variant')} (accuracy {closest.get('accuracy')})"
                if closest
                else ""
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


# --- the real zoo (--zoo real) ------------------------------------------------------------------


def build_real_zoo(root: Path) -> list[Any]:
    """The real zoo's models (infra.zoo.real.BuiltModel), built first where the cache lacks them:
    in a child process, so that this serving process never imports torch (its progress goes to
    stderr as it builds)."""
    from infra.zoo import real

    print(
        f"building the real zoo where {root} lacks it (timm architectures at 3x224x224 and a "
        "BERT-style text model; built here, no downloaded weights; docs/ZOO.md)...",
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "infra.zoo.real", "--root", str(root)], check=True)
    return [real.load_built(entry.name, root) for entry in real.ZOO]


def png_of(image: np.ndarray, preprocessing: dict[str, Any]) -> bytes:
    """A zoo image input [3, H, W] (normalised, grey in RGB) back to the 8-bit PNG it came from:
    the form in which a client would send it, decoded by the model's preprocessing recipe."""
    from PIL import Image

    mean, std, scale = preprocessing["mean"][0], preprocessing["std"][0], preprocessing["scale"]
    grey = np.clip(np.rint((image[0] * std + mean) * scale), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(grey).save(buffer, format="PNG")
    return buffer.getvalue()


def real_zoo_queries(client: Client, app_id: str, models: list[Any]) -> None:
    """A few model-less queries on one of the real zoo's apps: tight and loose targets, a named
    model, and (images) a PNG file decoded by the gateway with the model's recipe."""
    from infra.zoo.real import read_split

    variants = client.variants()
    fastest = min(variants, key=lambda v: v["latency_p99_ms"]["1"])
    best = max(variants, key=lambda v: (v["accuracy"], -v["latency_p99_ms"]["1"]))
    budget = round(max(0.1, fastest["latency_p99_ms"]["1"] * 3), 3)
    fast = {"latency": budget, "accuracy": float(fastest["accuracy"])}
    accurate = {"latency": 5000.0, "accuracy": float(best["accuracy"])}
    named = best["model_name"]
    sample_model = next(m for m in models if m.name == named)
    test = read_split(sample_model.testset_path, rows=4)
    labels = test.pop("labels")
    if "inputs" in test:
        samples: list[Any] = [test["inputs"][i : i + 1] for i in range(len(labels))]
    else:
        samples = [{name: array[i : i + 1] for name, array in test.items()} for i in range(len(labels))]
    cases: list[tuple[str, dict[str, Any], Any]] = [
        (f"fast: <= {budget} ms, accuracy >= {fast['accuracy']:.4f}", fast, samples[0]),
        (f"accurate: accuracy >= {accurate['accuracy']:.4f}, <= 5000 ms", accurate, samples[1]),
        (f"named model: {named}", {"model_name": named}, samples[2]),
    ]
    if sample_model.preprocessing is not None:
        image = png_of(samples[3][0], sample_model.preprocessing)
        cases.append((f"a {len(image)}-byte PNG, accuracy >= {fast['accuracy']:.4f}", fast, image))
    else:
        cases.append(("the fast targets again", fast, samples[3]))
    show_queries(client, app_id, cases, labels)


def run_real_zoo_demo(url: str, admin_key: str, root: Path) -> None:
    models = build_real_zoo(root)
    admin = Client(url, admin_key=admin_key)
    clients: dict[str, tuple[str, Client]] = {}
    for app in dict.fromkeys(m.app for m in models):
        app_id, key = ensure_app(admin, app)
        client = Client(url, api_key=key)
        clients[app] = (app_id, client)
        print(f"registering the real zoo's models in app {app_id!r} (variants are generated and profiled):")
        ready = {m["model_name"] for m in client.models() if m["ready"]}
        for model in (m for m in models if m.app == app):
            register_one(
                client, app_id, model.name, model.onnx_path, model.valset_path, ready, model.preprocessing
            )
    for app_id, client in clients.values():
        print(f"\nvariants of app {app_id!r}:")
        rows = variant_rows(client.variants())
        print(format_table(rows, list(rows[0])))
    print("\n" + zoo_summary({app_id: client.variants() for app_id, client in clients.values()}))
    for app, (app_id, client) in clients.items():
        print(f"\nqueries in app {app_id!r} (model-less: only targets are given):")
        real_zoo_queries(client, app_id, [m for m in models if m.app == app])
    first = next(iter(clients.values()))[0]
    print(
        f"\nserving on {url} — try: .venv/bin/modelless variants --app {first}   (Ctrl-C stops)",
        flush=True,
    )
    print(dashboard_hint(url), flush=True)


def dashboard_hint(url: str) -> str:
    """Where the live dashboard is (docs/OPERATIONS.md), and the key it asks for; the key itself
    is not printed (a terminal's scrollback outlives the stack)."""
    return f"dashboard: {url}/dashboard   (its key: admin_key in the state dir's {STATE_FILE}, or an app's)"


def run_demo(
    url: str,
    admin_key: str,
    state_dir: Path,
    done: threading.Event,
    failures: list[str],
    zoo: str = "digits",
) -> None:
    from infra.zoo.digits import build_zoo

    zoo_dir = state_dir / "demo"
    try:
        client = Client(url)
        while not client.health():
            time.sleep(0.1)
        if zoo == "real":
            run_real_zoo_demo(url, admin_key, state_dir / "zoo-real")
            return
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
        print(dashboard_hint(url), flush=True)
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
    parser.add_argument(
        "--zoo",
        choices=ZOOS,
        default="digits",
        help="digits: the small digits zoo (seconds); real: timm architectures at 224x224 and a text "
        "model (built once, minutes; docs/ZOO.md)",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    # The demo prints its own table; the per-query JSON logs stay available at INFO for `serve`.
    gateway_logger.setLevel("WARNING")
    os.environ["MODELLESS_STATE_DIR"] = str(args.state_dir)
    with refusing_to_start():
        stack = start_stack(args.state_dir, args.host, args.port, args.workers, 4, args.metadata)
    stack.start_scaling(period_s=5.0)
    os.environ["MODELLESS_ADMIN_KEY"] = stack.services.settings.admin_key
    print(
        f"modelless: embedded stack on {stack.url} (metadata: {stack.services.settings.metadata_url}, "
        f"{args.workers} cpu workers, local Lambda tier)",
        flush=True,
    )
    server = GracefulServer(stack.services, args.host, args.port)
    done = threading.Event()
    failures: list[str] = []
    threading.Thread(
        target=run_demo,
        args=(stack.url, stack.services.settings.admin_key, args.state_dir, done, failures, args.zoo),
        daemon=True,
    ).start()
    if args.exit_after_demo:

        def stop_when_done() -> None:
            done.wait()
            server.should_exit = True

        threading.Thread(target=stop_when_done, daemon=True).start()
    serve(stack, server)
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
