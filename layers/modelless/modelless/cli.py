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
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from modelless.client import Client, ModellessClientError, RegistrationWaitTimeout
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


def format_duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``1h02m``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_bar(status: dict[str, Any], width: int = 30) -> str:
    """``[######......] 4/20 profiling, first servable after 14s, ETA 2m05s: <message>`` (the
    servable and ETA parts where the registration reports them)."""
    total = max(1, int(status.get("total") or 0))
    done = int(status.get("done") or 0)
    filled = int(width * done / total) if status.get("total") else 0
    bar = f"[{'#' * filled}{'.' * (width - filled)}]"
    state = str(status["status"])
    first, created = status.get("firstServableAt"), status.get("createdAt")
    if first is not None and created:
        state += f", first servable after {format_duration(float(first) - float(created))}"
    eta = status.get("etaSeconds")
    if eta is not None and status["status"] not in {"ready", "failed"}:
        state += f", ETA {format_duration(float(eta))}"
    return f"{bar} {done}/{status.get('total') or '?'} {state}: {status['message']}"


VARIANT_STATES = ("ready", "profiling", "failed", "pruned", "queued")


def variant_states(status: dict[str, Any]) -> str:
    """Each recipe's state, grouped: ``ready: fp32_all int8_all | profiling: int8_basic |
    queued: 6`` (queued ones counted, not named); empty when the reply has none."""
    by_state: dict[str, list[str]] = {}
    for recipe, state in sorted((status.get("variants") or {}).items()):
        by_state.setdefault(str(state), []).append(recipe)
    parts = []
    for state in [*VARIANT_STATES, *sorted(set(by_state) - set(VARIANT_STATES))]:
        recipes = by_state.get(state)
        if recipes:
            parts.append(f"{state}: {len(recipes)}" if state == "queued" else f"{state}: {' '.join(recipes)}")
    return " | ".join(parts)


class RegistrationDisplay:
    """A registration's progress on a stream (stderr): on a terminal, the bar and the variants'
    states redrawn in place; elsewhere (a file, a pipe, CI logs) a line whenever they change, and
    at least every ``every_s`` seconds while nothing does."""

    def __init__(
        self,
        stream: Any,
        live: bool,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        columns: int | None = None,
    ) -> None:
        self._stream = stream
        self._live = live
        self._every_s = every_s
        self._clock = clock
        self._columns = columns or shutil.get_terminal_size((120, 24)).columns
        self._drawn = 0  # lines on screen (live)
        self._shown: list[str] = []
        self._shown_at = -math.inf

    def draw(self, status: dict[str, Any]) -> None:
        lines = [progress_bar(status)]
        states = variant_states(status)
        if states:
            lines.append("  " + states)
        if self._live:
            # Back to the first line drawn, then each line cleared and rewritten, cut to the width.
            up = "\x1b[1A" * (self._drawn - 1) if self._drawn > 1 else ""
            text = "\n".join("\x1b[2K" + line[: self._columns - 1] for line in lines)
            self._stream.write(("\r" + up if self._drawn else "") + text)
            self._stream.flush()
            self._drawn = len(lines)
            return
        now = self._clock()
        if lines != self._shown or now - self._shown_at >= self._every_s:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
            self._shown, self._shown_at = lines, now

    def close(self) -> None:
        """End the live block with a newline, so that what follows starts on its own line."""
        if self._live and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0


def registration_outcome(final: dict[str, Any], name: str) -> str:
    """The one line a finished registration ends with."""
    if final["status"] == "failed":
        return f"registration of {name} failed: {final['message']}"
    created, first, finished = final.get("createdAt"), final.get("firstServableAt"), final.get("finishedAt")
    timing = ""
    if created and first is not None and finished is not None:
        timing = (
            f"; first servable after {format_duration(float(first) - float(created))}, "
            f"all profiled after {format_duration(float(finished) - float(created))}"
        )
    return (
        f"{name} ready: {len(final['variantIds'])} variants servable "
        f"({final['pruned']} pruned as dominated){timing}"
    )


# Exit codes of `modelless register`.
EXIT_READY, EXIT_FAILED, EXIT_GAVE_UP = 0, 1, 2


def _end(code: int, message: str) -> None:
    print(message, file=sys.stderr if code else sys.stdout, flush=True)
    if code:
        raise SystemExit(code)


def follow_registration(
    client: Client,
    registration_id: str,
    name: str,
    app: str,
    stall_timeout_s: float | None = 900.0,
    max_wait_s: float | None = None,
) -> None:
    """Wait for a registration with a progress display on stderr; end with one line and the
    exit code: 0 ready, 1 failed, 2 gave up waiting (the registration goes on server-side)."""
    display = RegistrationDisplay(sys.stderr, sys.stderr.isatty())
    check = f"check on it with: modelless status {registration_id} --app {app}"
    try:
        final = client.wait_for_registration(
            registration_id,
            timeout_s=stall_timeout_s,
            on_progress=display.draw,
            max_wait_s=max_wait_s,
        )
    except RegistrationWaitTimeout as error:
        display.close()
        _end(EXIT_GAVE_UP, f"gave up waiting: {error}; the registration goes on server-side ({check})")
        return
    except KeyboardInterrupt:
        display.close()
        _end(EXIT_GAVE_UP, f"stopped waiting; the registration goes on server-side ({check})")
        return
    except ModellessClientError as error:
        display.close()
        _end(EXIT_GAVE_UP, f"gave up waiting: the server answered {error}; {check}")
        return
    except httpx.HTTPError as error:
        display.close()
        _end(EXIT_GAVE_UP, f"gave up waiting: lost the server ({type(error).__name__}: {error}); {check}")
        return
    display.close()
    outcome = registration_outcome(final, name)
    _end(EXIT_FAILED if final["status"] == "failed" else EXIT_READY, outcome)


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
    """``[#####.....] 120/500 24% running, 35.2 inputs/s, 3 failed`` (and why it is paused, or
    that its runner has gone silent)."""
    total = int(job.get("total") or 0)
    done = int(job.get("done") or 0)
    filled = int(width * done / total) if total else (width if job["status"] == "completed" else 0)
    percent = f"{100 * done / total:.0f}%" if total else "-"
    line = (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total or '?'} {percent} {job['status']}, "
        f"{float(job.get('throughput') or 0.0):.1f} inputs/s, {int(job.get('errors') or 0)} failed"
    )
    if job.get("health") == "stalled":
        line += f" STALLED: no heartbeat from its runner for {float(job.get('heartbeatAgeS') or 0.0):.1f} s"
    elif job.get("paused"):
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
    if job.get("lastRunnerFailure"):
        lines.append(f"  restarts: {job.get('restarts', 0)} (last: {job['lastRunnerFailure']})")
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
    """A query's inputs from a file, as ``Client.online_query`` sends them: ``.npy`` the array;
    ``.npz`` its ``inputs`` array (a validation set's), else its arrays by name (one per input of
    a model with several); ``.json`` the value (nested lists, or an object of them by input name);
    ``.png``/``.jpg``/``.jpeg`` the file's bytes (the server decodes them with the model's
    preprocessing recipe)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return json.loads(path.read_text())
    if suffix in {".png", ".jpg", ".jpeg"}:
        return path.read_bytes()
    if suffix not in {".npy", ".npz"}:
        raise SystemExit(f"error: --inputs {path}: use a .npy, .npz, .json, .png or .jpg file")
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded as archive:
            if "inputs" in archive.files:
                return archive["inputs"]
            return {name: archive[name] for name in archive.files}
    return loaded


def _cmd_create_app(args: argparse.Namespace) -> None:
    with _client(args) as client:
        key = client.create_app(args.app_id)
    save_app_key(args.app_id, key)
    print(f"app {args.app_id} created; API key (saved to {_state_dir() / 'credentials.json'}):\n{key}")


def _cmd_register(args: argparse.Namespace) -> None:
    """Register, then follow the registration to its end (``follow_registration``). A refusal
    or an unreachable server ends with one line and exit code 1, never a traceback."""
    try:
        _register(args)
    except ModellessClientError as error:
        details = "".join(f"; {key}: {value}" for key, value in error.details.items())
        _end(EXIT_FAILED, f"registration refused: {error}{details}")
    except httpx.HTTPError as error:
        _end(
            EXIT_FAILED,
            f"registration not sent: could not reach the server ({type(error).__name__}: {error})",
        )
    except OSError as error:  # a model or validation file that cannot be read
        _end(EXIT_FAILED, f"registration not sent: {error}")


def _register(args: argparse.Namespace) -> None:
    with _client(args) as client:
        reply = client.register_model(
            args.name,
            _file_or_uri(args.model, "--model"),
            _file_or_uri(args.valset, "--valset"),
            args.app,
            args.metric,
            preprocessing=_recipe(args.preprocessing),
            model_data=_file_or_uri(args.model_data, "--model-data") if args.model_data else None,
        )
        print(f"registration {reply['registrationId']} accepted")
        if args.no_wait:
            return
        follow_registration(
            client, reply["registrationId"], args.name, args.app, args.stall_timeout, args.max_wait
        )


def _cmd_status(args: argparse.Namespace) -> None:
    with _client(args) as client:
        print(progress_bar(client.registration(args.registration_id)))


def _cmd_query(args: argparse.Namespace) -> None:
    inputs = load_inputs(Path(args.inputs))
    with _client(args) as client:
        reply = client.online_query(
            inputs,
            args.app,
            latency=args.latency,
            accuracy=args.accuracy,
            model_name=args.model,
            encoding=args.encoding,
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
    ensemble = reply.get("ensemble")
    if ensemble:
        missing = (
            f"; missing (late or failed): {', '.join(ensemble['missing'])}" if ensemble["missing"] else ""
        )
        print(f"ensemble:    {', '.join(ensemble['members'])}{missing}; confidence {ensemble['confidence']}")
    print(
        f"query id:    {reply['queryId']} (policy {reply.get('policy', 'infaas')}; for `modelless feedback`)"
    )
    print("timings ms:  " + ", ".join(f"{k.removesuffix('_ms')}={v}" for k, v in reply["timingsMs"].items()))
    client_timings = reply.get("clientTimingsMs", {})
    print("client ms:   " + ", ".join(f"{k}={v}" for k, v in client_timings.items()))


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


def _cmd_feedback(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.stats:
            stats = client.feedback_stats(args.app)
            rows = [
                {
                    "model": m["model"],
                    "feedbacks": m["feedbacks"],
                    "accuracy": _share(m["accuracy"]),
                    "recent": f"{_share(m['recentAccuracy'])} of {m['recentFeedbacks']}",
                    "exp3 weight": f"{m['exp3Weight']:.3f}",
                    "exp4 weight": f"{m['exp4Weight']:.3f}",
                }
                for m in stats["models"]
            ]
            columns = ["model", "feedbacks", "accuracy", "recent", "exp3 weight", "exp4 weight"]
            print(f"app {args.app}: selection {stats['policy']}")
            print(format_table(rows, columns) if rows else "no feedback yet")
            return
        if args.query_id is None or (args.label is None) == (args.reward is None):
            raise SystemExit("error: give a query id and either --label (one, or one per row) or --reward")
        label = args.label[0] if args.label is not None and len(args.label) == 1 else args.label
        reply = client.feedback(args.query_id, args.app, label=label, reward=args.reward)
    rewards = ", ".join(f"{model}={reward:g}" for model, reward in reply["rewards"].items())
    again = " (given before: nothing changed)" if reply["duplicate"] else ""
    print(f"query {reply['queryId']} ({reply['policy']}): {rewards or 'no model rewarded'}{again}")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _cmd_pipelines(args: argparse.Namespace) -> None:
    """``modelless pipelines register|list|show|delete|plan|query`` (docs/PIPELINES.md)."""
    with _client(args) as client:
        if args.action == "register":
            reply = client.register_pipeline(json.loads(Path(args.spec).read_text()), args.app)
            print(f"pipeline {reply['pipeline']['name']} registered: {' -> '.join(reply['order'])}")
        elif args.action == "list":
            rows = [
                {
                    "pipeline": p["pipeline"]["name"],
                    "stages": " -> ".join(p["order"]),
                    "slo ms": p["pipeline"]["latencySlo"],
                    "accuracy": p["pipeline"]["accuracy"],
                }
                for p in client.pipelines(args.app)
            ]
            print(
                format_table(rows, ["pipeline", "stages", "slo ms", "accuracy"]) if rows else "no pipelines"
            )
        elif args.action == "show":
            print(json.dumps(client.pipeline(args.name, args.app), indent=2))
        elif args.action == "delete":
            client.delete_pipeline(args.name, args.app)
            print(f"pipeline {args.name} deleted")
        elif args.action == "plan":
            plan = client.pipeline_plan(args.name, args.app, args.qps, args.lambda_allowed)
            if args.json:
                print(json.dumps(plan, indent=2))
                return
            print("\n".join(plan["explanation"]))
            if not plan["feasible"]:
                print("NOT FEASIBLE: some load cannot be served within the SLO (see above)")
        elif args.action == "query":
            reply = client.query_pipeline(args.name, load_inputs(Path(args.inputs)), args.app)
            if args.json:
                print(json.dumps(reply, indent=2))
                return
            met = "met" if reply["metSlo"] else "MISSED"
            print(f"predictions: {reply['predictions']} (answered by {reply['answeredBy']})")
            print(f"end to end:  {reply['totalMs']} ms, SLO {reply['sloMs']} ms {met}")
            rows = [
                {
                    "stage": st["stage"],
                    "model": st["model"],
                    "ran": "yes" if st["ran"] else f"no: {st['skippedBecause']}",
                    "variant": st["variant"] or "-",
                    "tier": st["tier"] or "-",
                    "budget ms": st["budgetMs"] if st["budgetMs"] is not None else "-",
                    "total ms": st["timingsMs"]["total_ms"] if st["timingsMs"] else "-",
                }
                for st in reply["stages"]
            ]
            print(format_table(rows, ["stage", "model", "ran", "variant", "tier", "budget ms", "total ms"]))


def _cmd_selection(args: argparse.Namespace) -> None:
    with _client(args) as client:
        policy = client.set_selection(args.app, args.policy) if args.policy else client.selection(args.app)
    print(f"app {args.app}: selection {policy}")


def _cmd_allow_buckets(args: argparse.Namespace) -> None:
    with _client(args) as client:
        buckets = client.set_offline_buckets(args.app_id, args.buckets)
    print(f"app {args.app_id}: offline jobs may use {', '.join(buckets) or 'no bucket'}")


def _instance_summary(instance: dict[str, Any]) -> str:
    """``variant[state qps]``, with the parallelism its worker tuned it to (intra x inter threads,
    runs at once) and its measured run time over the profile's, once reported (docs/TUNING.md)."""
    summary = f"{instance['variant_id']}[{instance['state']} {instance['qps']:.1f}qps"
    if instance.get("intra_threads", 0) > 0:
        summary += (
            f" tuned {instance['intra_threads']}x{instance.get('inter_threads', 1)}"
            f"x{instance.get('concurrency', 1)}"
        )
        if instance.get("latency_scale", 0.0) > 0:
            summary += f" {instance['latency_scale']:.2f}x profile"
    return summary + "]"


def _cmd_workers(args: argparse.Namespace) -> None:
    with _client(args) as client:
        # An app's key sees its own instances; without --app, the admin key sees every worker.
        for worker in client.workers(admin=args.app is None):
            loaded = ", ".join(_instance_summary(i) for i in worker["instances"])
            print(
                f"{worker['worker_id']:12} {worker['pool']:10} util={worker['utilisation']:.2f} "
                f"free={worker['free_slots']} {loaded}"
            )


def _cmd_cache(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.clear:
            client.clear_cache()
        stats = client.cache_stats()
    if not stats["enabled"]:
        print("prediction cache: off (MODELLESS_PREDICTION_CACHE_ENABLED)")
        return
    print(
        f"prediction cache ({stats['backend']}): {stats['hits']} hits, {stats['misses']} misses "
        f"(hit rate {stats['hitRate']:.1%}); {stats['entries']} entries, "
        f"{stats['bytesUsed'] / 2**20:.2f} of {stats['maxBytes'] / 2**20:.2f} MiB; "
        f"{stats['evictions']} evictions"
    )


def _file_or_uri(value: str, option: str) -> Path | str:
    """A registration file: an s3:// URI the server reads itself, or a local file streamed to it."""
    if value.startswith("s3://"):
        return value
    path = Path(value)
    if not path.is_file():
        raise SystemExit(f"error: {option} {value}: no such file")
    return path


def _recipe(value: str | None) -> dict[str, Any] | None:
    """The preprocessing recipe in a JSON file (docs/REGISTRATION.md), None when not given."""
    if value is None:
        return None
    try:
        recipe = json.loads(Path(value).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: --preprocessing {value}: {error}") from None
    if not isinstance(recipe, dict):
        raise SystemExit(f"error: --preprocessing {value}: must hold a JSON object")
    return recipe


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
    register.add_argument(
        "--model",
        required=True,
        help="ONNX file, a zip/tar holding it with its external data, or s3://bucket/key",
    )
    register.add_argument(
        "--valset",
        required=True,
        help=".npz with 'labels' and the inputs ('inputs', or one array per input name), or s3://bucket/key",
    )
    register.add_argument(
        "--model-data", help="the model's external data file (x.onnx.data), or s3://bucket/key"
    )
    register.add_argument(
        "--preprocessing", help="JSON file: the recipe that turns image bytes into the model's input"
    )
    register.add_argument("--metric", default="top1", choices=["top1", "top5"], help="accuracy metric")
    register.add_argument("--no-wait", action="store_true", help="return once accepted")
    register.add_argument(
        "--stall-timeout",
        type=float,
        default=900.0,
        help="give up waiting after this many seconds without progress (exit code 2)",
    )
    register.add_argument("--max-wait", type=float, help="give up waiting after this many seconds in all")
    register.set_defaults(run=_cmd_register)

    status = commands.add_parser("status", help="a registration's progress")
    status.add_argument("registration_id")
    status.add_argument("--app", required=True)
    status.set_defaults(run=_cmd_status)

    query = commands.add_parser("query", help="online query: the system picks the variant")
    query.add_argument("--app", required=True)
    query.add_argument(
        "--inputs",
        required=True,
        help=".npy array, .npz ('inputs', or one array per input name), .json, or a .png/.jpg image",
    )
    query.add_argument(
        "--encoding",
        choices=["npy", "json"],
        default="npy",
        help="send arrays binary (.npy/.npz, the default) or as JSON",
    )
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

    feedback = commands.add_parser(
        "feedback",
        help="the true label (or a reward) of an answered query; --stats: each model's live accuracy",
    )
    feedback.add_argument("--app", required=True)
    feedback.add_argument("query_id", nargs="?", help="the queryId of the query's reply")
    feedback.add_argument("--label", type=int, nargs="+", help="the true class (one, or one per row)")
    feedback.add_argument("--reward", type=float, help="how good the reply was, 0..1 (instead of a label)")
    feedback.add_argument("--stats", action="store_true", help="per model: feedbacks, accuracy, weights")
    feedback.set_defaults(run=_cmd_feedback)

    selection = commands.add_parser(
        "selection", help="the app's selection policy (infaas, exp3, exp4): show it, or set it with --policy"
    )
    selection.add_argument("--app", required=True)
    selection.add_argument("--policy", choices=["infaas", "exp3", "exp4"])
    selection.set_defaults(run=_cmd_selection)

    pipelines = commands.add_parser("pipelines", help="pipelines of models under one end-to-end latency SLO")
    actions = pipelines.add_subparsers(dest="action", required=True)
    register_pipeline = actions.add_parser("register", help="register a pipeline from its JSON spec")
    register_pipeline.add_argument("spec", help="a .json file: name, stages, edges, latencySlo, accuracy")
    actions.add_parser("list", help="the app's pipelines")
    for action, text in (
        ("show", "a pipeline, its order and measured branch probabilities"),
        ("delete", "delete a pipeline"),
    ):
        actions.add_parser(action, help=text).add_argument("name")
    plan_pipeline = actions.add_parser(
        "plan", help="the planner's per-stage variant, batch and instances for an arrival rate, explained"
    )
    plan_pipeline.add_argument("name")
    plan_pipeline.add_argument("--qps", type=float, required=True, help="the arrival rate to plan for")
    plan_pipeline.add_argument(
        "--lambda-allowed", action="store_true", help="let the plan use the Lambda tier"
    )
    plan_pipeline.add_argument("--json", action="store_true", help="print the whole plan")
    query_pipeline = actions.add_parser("query", help="one online query through a pipeline")
    query_pipeline.add_argument("name")
    query_pipeline.add_argument(
        "--inputs", required=True, help=".npy, .npz or .json file (the entry stage's inputs)"
    )
    query_pipeline.add_argument("--json", action="store_true", help="print the whole reply")
    for subcommand in actions.choices.values():
        subcommand.add_argument("--app", required=True)
    pipelines.set_defaults(run=_cmd_pipelines)

    jobs = commands.add_parser("jobs", help="the app's offline jobs")
    jobs.add_argument("--app", required=True)
    jobs.set_defaults(run=_cmd_jobs)

    allow = commands.add_parser("allow-buckets", help="admin: the S3 buckets an app's offline jobs may use")
    allow.add_argument("app_id")
    allow.add_argument("buckets", nargs="*", help="bucket names (none: no bucket)")
    allow.set_defaults(run=_cmd_allow_buckets)

    workers = commands.add_parser(
        "workers", help="live worker state: an app's own instances (--app), or every worker (admin key)"
    )
    workers.add_argument("--app", help="the app whose instances to show (its key); default: all (admin key)")
    workers.set_defaults(run=_cmd_workers)

    cache = commands.add_parser("cache", help="admin: the prediction cache's hit rate, size and evictions")
    cache.add_argument("--clear", action="store_true", help="empty it (and reset its counters) first")
    cache.set_defaults(run=_cmd_cache)
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
