"""``modelless``: the command-line tool over the HTTP API.

    modelless create-app digits
    modelless register --app digits --name digits-cnn --model cnn.onnx --valset val.npz
    modelless query --app digits --latency 5 --accuracy 0.95 --inputs sample.npy
    modelless variants --app digits
    modelless offline-query --app digits --input s3://b/in/ --output s3://b/out/ --accuracy 0.9 --wait
    modelless job status JOB_ID --app digits --wait

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
from modelless.config import get_client_settings

DEFAULT_URL = "http://127.0.0.1:8080"


def _state_dir() -> Path:
    return get_client_settings().state_dir


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
    return get_client_settings().api_key or _read_json(_state_dir() / "credentials.json").get(app_id)


def _client(args: argparse.Namespace) -> Client:
    settings = get_client_settings()
    stack = _read_json(settings.state_dir / "stack.json")
    url = args.url or settings.url or stack.get("url") or DEFAULT_URL
    admin_key = settings.admin_key or stack.get("admin_key")
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


def job_progress_line(job: dict[str, Any], width: int = 30) -> str:
    """``[#####.....] 120/500 24% running, 35.2 inputs/s, 3 failed`` (and why it is paused)."""
    total = int(job.get("total") or 0)
    done = int(job.get("done") or 0)
    filled = int(width * done / total) if total else (width if job["status"] == "completed" else 0)
    percent = f"{100 * done / total:.0f}%" if total else "-"
    line = (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total or '?'} {percent} {job['status']}, "
        f"{float(job.get('throughput') or 0.0):.1f} inputs/s, {int(job.get('errors') or 0)} failed"
    )
    if job.get("paused"):
        line += f" (paused: {job.get('pauseReason')})"
    return line


def job_report(job: dict[str, Any]) -> str:
    """The lines ``job status`` prints once a job has finished (or when asked without --wait)."""
    lines = [
        f"job {job['jobId']}: {job['status']} ({job['message']})",
        f"  inputs:   {job['inputPath']} -> {job['outputPath']}",
        f"  progress: {job['done']}/{job['total']} done, {job['succeeded']} succeeded, "
        f"{job['errors']} failed",
        f"  variant:  {job.get('variant') or '-'}",
        f"  speed:    {float(job.get('throughput') or 0.0):.2f} inputs/s over {job['elapsedSeconds']:.1f} s "
        f"({job['activeSeconds']:.1f} s running, {job['runs']} run(s))",
    ]
    if job.get("summaryPath"):
        lines.append(f"  summary:  {job['summaryPath']}")
    for sample in job.get("errorSamples") or []:
        lines.append(f"  failed:   {sample['input']}: {sample['error']}")
    return "\n".join(lines)


def _follow_job(client: Client, job_id: str, poll_s: float) -> dict[str, Any]:
    """Wait for the job with a progress bar on stderr (redrawn in place on a terminal)."""
    live = sys.stderr.isatty()
    shown = ""

    def draw(job: dict[str, Any]) -> None:
        nonlocal shown
        line = job_progress_line(job)
        if live:
            print("\r" + line[:150].ljust(150), end="", file=sys.stderr, flush=True)
        elif line != shown:
            print(line, file=sys.stderr, flush=True)
        shown = line

    final = client.wait_for_job(job_id, on_progress=draw, poll_s=poll_s)
    if live:
        print(file=sys.stderr)
    return final


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


def _cmd_offline_query(args: argparse.Namespace) -> None:
    if args.accuracy is None and args.model is None:
        raise SystemExit("give --accuracy or --model")
    with _client(args) as client:
        job = client.offline_query(
            args.input, args.output, args.app, accuracy=args.accuracy, model_name=args.model
        )
        print(f"job {job['jobId']} accepted: {job['status']}")
        if args.wait:
            _finish_job(_follow_job(client, job["jobId"], args.interval))


def _finish_job(job: dict[str, Any]) -> None:
    print(job_report(job))
    if job["status"] == "failed":
        raise SystemExit(1)


def _cmd_job_status(args: argparse.Namespace) -> None:
    with _client(args) as client:
        job = _follow_job(client, args.job_id, args.interval) if args.wait else client.job(args.job_id)
    if args.json:
        print(json.dumps(job, indent=2))
        return
    if args.wait:
        _finish_job(job)
        return
    print(job_progress_line(job))
    print(job_report(job))


def _cmd_jobs(args: argparse.Namespace) -> None:
    with _client(args) as client:
        jobs = client.jobs()
    rows = [
        {
            "job": j["jobId"],
            "status": j["status"],
            "done": f"{j['done']}/{j['total']}",
            "failed": j["errors"],
            "inputs/s": f"{j['throughput']:.1f}",
            "input": j["inputPath"],
            "source": j["source"],
        }
        for j in jobs
    ]
    print(
        format_table(rows, ["job", "status", "done", "failed", "inputs/s", "input", "source"])
        if rows
        else "no jobs"
    )


def _cmd_allow_buckets(args: argparse.Namespace) -> None:
    with _client(args) as client:
        buckets = client.set_offline_buckets(args.app_id, args.buckets)
    print(f"app {args.app_id}: offline jobs may use {', '.join(buckets) or 'no bucket'}")


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

    offline = commands.add_parser(
        "offline-query", help="batch job over S3 objects: one result per input under --output"
    )
    offline.add_argument("--app", required=True)
    offline.add_argument("--input", required=True, help="s3://bucket/prefix of the inputs")
    offline.add_argument("--output", required=True, help="s3://bucket/prefix for the results")
    offline.add_argument("--accuracy", type=float, help="minimum accuracy, 0..1")
    offline.add_argument("--model", help="name the model instead of an accuracy")
    offline.add_argument("--wait", action="store_true", help="follow the job to the end (progress on stderr)")
    offline.add_argument("--interval", type=float, default=1.0, help="seconds between progress checks")
    offline.set_defaults(run=_cmd_offline_query)

    job = commands.add_parser("job", help="offline jobs")
    job_commands = job.add_subparsers(dest="job_command", required=True)
    job_status = job_commands.add_parser("status", help="a job's progress: done/total, speed, failures")
    job_status.add_argument("job_id")
    job_status.add_argument("--app", required=True)
    job_status.add_argument(
        "--wait", action="store_true", help="wait for the end, with a progress bar on stderr"
    )
    job_status.add_argument("--interval", type=float, default=1.0, help="seconds between progress checks")
    job_status.add_argument("--json", action="store_true", help="print the whole reply")
    job_status.set_defaults(run=_cmd_job_status)

    jobs = commands.add_parser("jobs", help="the app's offline jobs")
    jobs.add_argument("--app", required=True)
    jobs.set_defaults(run=_cmd_jobs)

    allow = commands.add_parser("allow-buckets", help="admin: the S3 buckets an app's offline jobs may use")
    allow.add_argument("app_id")
    allow.add_argument("buckets", nargs="*", help="bucket names (none: no bucket)")
    allow.set_defaults(run=_cmd_allow_buckets)

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
