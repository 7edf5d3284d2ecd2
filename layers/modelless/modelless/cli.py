"""``modelless``: the command-line tool over the HTTP API.

    modelless create-app digits
    modelless register --app digits --name digits-cnn --model cnn.onnx --valset val.npz
    modelless query --app digits --latency 5 --accuracy 0.95 --inputs sample.npy
    modelless variants --app digits

The server URL comes from --url, $MODELLESS_URL or the embedded stack's .modelless/stack.json;
app keys from --api-key, $MODELLESS_API_KEY or .modelless/credentials.json (written by create-app).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from modelless.client import Client, ModellessClientError

DEFAULT_URL = "http://127.0.0.1:8080"


def _state_dir() -> Path:
    return Path(os.environ.get("MODELLESS_STATE_DIR", ".modelless"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def save_app_key(app_id: str, key: str) -> None:
    path = _state_dir() / "credentials.json"
    keys = _read_json(path)
    keys[app_id] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keys, indent=2))
    os.chmod(path, 0o600)


def load_app_key(app_id: str) -> str | None:
    return os.environ.get("MODELLESS_API_KEY") or _read_json(_state_dir() / "credentials.json").get(app_id)


def _client(args: argparse.Namespace) -> Client:
    stack = _read_json(_state_dir() / "stack.json")
    url = args.url or os.environ.get("MODELLESS_URL") or stack.get("url") or DEFAULT_URL
    admin_key = os.environ.get("MODELLESS_ADMIN_KEY") or stack.get("admin_key")
    api_key = args.api_key or (load_app_key(args.app) if getattr(args, "app", None) else None)
    return Client(url, api_key=api_key, admin_key=admin_key)


def progress_bar(status: dict[str, Any], width: int = 30) -> str:
    total = max(1, int(status.get("total") or 0))
    done = int(status.get("done") or 0)
    filled = int(width * done / total) if status.get("total") else 0
    bar = f"[{'#' * filled}{'.' * (width - filled)}]"
    return f"{bar} {done}/{status.get('total') or '?'} {status['status']}: {status['message']}"


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def variant_rows(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for v in sorted(variants, key=lambda v: (v["model_name"], v["latency_p99_ms"].get("1", 0))):
        p50 = {int(k): val for k, val in v["latency_p50_ms"].items()}
        p99 = {int(k): val for k, val in v["latency_p99_ms"].items()}
        source = v["hardware"]
        if v.get("imported"):
            source += " (imported)"
        elif not v["measured_on_target"]:
            source += " (not target hw)"
        rows.append(
            {
                "variant": v["variant_id"],
                "accuracy": f"{v['accuracy']:.4f}",
                "p50@1 ms": f"{p50[1]:.3f}",
                "p99@1 ms": f"{p99[1]:.3f}",
                f"p50@{max(p50)} ms": f"{p50[max(p50)]:.3f}",
                "sat q/s": f"{v.get('saturation_qps', 0.0):.0f}",
                "best batch": str(v.get("max_useful_batch") or "-"),
                "load ms": f"{v['load_latency_ms']:.1f}",
                "MB": f"{v['size_bytes'] / 1e6:.2f}",
                "peak MB": f"{v['peak_memory_mb']:.1f}",
                # The same p99-based cost that selection ranks variants by.
                "$/1M q": f"{(v['price_per_second'] * p99[1] / 1000 + v['request_price']) * 1e6:.4f}",
                "measured on": source,
            }
        )
    return rows


def registration_lines(registrations: list[dict[str, Any]]) -> list[str]:
    return [f"{r['modelName']:<24} {progress_bar(r)}" for r in registrations]


def load_inputs(path: Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.lib.npyio.NpzFile):
        return loaded["inputs"]
    return loaded


def _cmd_create_app(args: argparse.Namespace) -> None:
    with _client(args) as client:
        key = client.create_app(args.app_id)
    save_app_key(args.app_id, key)
    print(f"app {args.app_id} created; API key (saved to {_state_dir() / 'credentials.json'}):\n{key}")


def _cmd_register(args: argparse.Namespace) -> None:
    with _client(args) as client:
        reply = client.register_model(args.name, Path(args.model), Path(args.valset), args.app, args.metric)
        print(f"registration {reply['registrationId']} accepted")
        if args.no_wait:
            return
        final = client.wait_for_registration(
            reply["registrationId"],
            on_progress=lambda s: print("\r" + progress_bar(s)[:120].ljust(120), end="", flush=True),
        )
        print()
        if final["status"] == "failed":
            raise SystemExit(f"registration failed: {final['message']}")
        print(
            f"{args.name}: {len(final['variantIds'])} variants ready ({final['pruned']} pruned as dominated)"
        )


def _cmd_status(args: argparse.Namespace) -> None:
    with _client(args) as client:
        print(progress_bar(client.registration(args.registration_id)))


def _cmd_query(args: argparse.Namespace) -> None:
    inputs = load_inputs(Path(args.inputs))
    with _client(args) as client:
        reply = client.online_query(
            inputs, args.app, latency=args.latency, accuracy=args.accuracy, model_name=args.model
        )
    if args.json:
        print(json.dumps(reply, indent=2))
        return
    print(f"predictions: {reply['predictions']}")
    print(
        f"variant:     {reply['variant']} ({reply['variantState']}) "
        f"on {reply['tier']} {reply['worker'] or ''}"
    )
    print(f"why:         {reply['reason']}")
    print("timings ms:  " + ", ".join(f"{k[:-3]}={v}" for k, v in reply["timingsMs"].items()))


def _cmd_variants(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.watch:
            _watch(client, args.model, args.interval)
            return
        variants = client.variants(args.model)
    rows = variant_rows(variants)
    print(format_table(rows, list(rows[0]) if rows else ["variant"]))


def _watch(client: Client, model: str | None, interval_s: float) -> None:
    """Redraw registrations and the variants table until every registration has finished."""
    live = sys.stdout.isatty()
    shown = ""
    while True:
        registrations = client.registrations()
        rows = variant_rows(client.variants(model))
        screen = "\n".join(
            [
                *registration_lines(registrations),
                "",
                format_table(rows, list(rows[0]) if rows else ["variant"]),
            ]
        )
        if screen != shown:
            # On a terminal, redraw in place; into a file or pipe, append only what changed.
            print(("\033[H\033[J" if live else "") + screen, flush=True)
            shown = screen
        if all(r["status"] in {"ready", "failed"} for r in registrations):
            return
        time.sleep(interval_s)


def _cmd_registrations(args: argparse.Namespace) -> None:
    with _client(args) as client:
        print("\n".join(registration_lines(client.registrations())) or "no registrations")


def _cmd_import_profiles(args: argparse.Namespace) -> None:
    profiles = json.loads(Path(args.file).read_text())
    if not isinstance(profiles, list):
        raise SystemExit(f"{args.file} must hold a JSON list of profiles")
    with _client(args) as client:
        imported = client.import_profiles(args.model, profiles, args.app)
    print(f"imported {len(imported)} profile(s):\n" + "\n".join(imported))


def _cmd_workers(args: argparse.Namespace) -> None:
    with _client(args) as client:
        for worker in client.workers():
            loaded = ", ".join(
                f"{i['variant_id']}[{i['state']} {i['qps']:.1f}qps]" for i in worker["instances"]
            )
            print(
                f"{worker['worker_id']:12} {worker['pool']:10} util={worker['utilisation']:.2f} "
                f"free={worker['free_slots']} {loaded}"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelless", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", help=f"server URL (default: $MODELLESS_URL, .modelless/stack.json, {DEFAULT_URL})"
    )
    parser.add_argument(
        "--api-key", help="the app's API key (default: $MODELLESS_API_KEY or saved credentials)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    create = commands.add_parser("create-app", help="create an app and get its API key (admin)")
    create.add_argument("app_id")
    create.set_defaults(run=_cmd_create_app)

    register = commands.add_parser("register", help="register a model: variants are generated and profiled")
    register.add_argument("--app", required=True)
    register.add_argument("--name", required=True, help="model name")
    register.add_argument("--model", required=True, help="ONNX file")
    register.add_argument("--valset", required=True, help=".npz with 'inputs' and 'labels'")
    register.add_argument("--metric", default="top1", choices=["top1", "top5"], help="accuracy metric")
    register.add_argument("--no-wait", action="store_true", help="return once accepted")
    register.set_defaults(run=_cmd_register)

    status = commands.add_parser("status", help="a registration's progress")
    status.add_argument("registration_id")
    status.add_argument("--app", required=True)
    status.set_defaults(run=_cmd_status)

    query = commands.add_parser("query", help="online query: the system picks the variant")
    query.add_argument("--app", required=True)
    query.add_argument("--inputs", required=True, help=".npy, .npz ('inputs') or .json array")
    query.add_argument("--latency", type=float, help="latency budget, ms")
    query.add_argument("--accuracy", type=float, help="minimum accuracy, 0..1")
    query.add_argument("--model", help="name the model instead of giving targets")
    query.add_argument("--json", action="store_true", help="print the whole reply")
    query.set_defaults(run=_cmd_query)

    variants = commands.add_parser("variants", help="table of the app's variants and their profiles")
    variants.add_argument("--app", required=True)
    variants.add_argument("--model")
    variants.add_argument("--watch", action="store_true", help="live table until registrations finish")
    variants.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    variants.set_defaults(run=_cmd_variants)

    registrations = commands.add_parser("registrations", help="registration progress of the app's models")
    registrations.add_argument("--app", required=True)
    registrations.set_defaults(run=_cmd_registrations)

    importing = commands.add_parser(
        "import-profiles", help="import profiles measured on hardware this deployment lacks (GPU, Inferentia)"
    )
    importing.add_argument("--app", required=True)
    importing.add_argument("--model", required=True)
    importing.add_argument("file", help="JSON list of profiles (see docs/VARIANTS.md)")
    importing.set_defaults(run=_cmd_import_profiles)

    workers = commands.add_parser("workers", help="live worker state")
    workers.add_argument("--app", required=True)
    workers.set_defaults(run=_cmd_workers)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except ModellessClientError as error:
        print(f"error: {error}", file=sys.stderr)
        for key, value in error.details.items():
            print(f"  {key}: {value}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
