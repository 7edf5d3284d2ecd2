"""The CLI's text: progress lines, reports and plain tables, as pure functions of the API's
replies (the same lines on a terminal, in a file or in a test)."""

from __future__ import annotations

from typing import Any


def format_duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``1h02m``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def registration_state(status: dict[str, Any]) -> str:
    """``profiling, first servable after 14s, ETA 2m05s`` (the servable and ETA parts where the
    registration reports them)."""
    state = str(status["status"])
    first, created = status.get("firstServableAt"), status.get("createdAt")
    if first is not None and created:
        state += f", first servable after {format_duration(float(first) - float(created))}"
    eta = status.get("etaSeconds")
    if eta is not None and status["status"] not in {"ready", "failed"}:
        state += f", ETA {format_duration(float(eta))}"
    return state


def progress_bar(status: dict[str, Any], width: int = 30) -> str:
    """``[######......] 4/20 profiling, first servable after 14s, ETA 2m05s: <message>`` (the
    servable and ETA parts where the registration reports them)."""
    total = max(1, int(status.get("total") or 0))
    done = int(status.get("done") or 0)
    filled = int(width * done / total) if status.get("total") else 0
    bar = f"[{'#' * filled}{'.' * (width - filled)}]"
    return f"{bar} {done}/{status.get('total') or '?'} {registration_state(status)}: {status['message']}"


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


def registration_lines(registrations: list[dict[str, Any]]) -> list[str]:
    return [f"{r['modelName']:<24} {progress_bar(r)}" for r in registrations]


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Columns padded to their widest cell: the table as it goes to a file or a pipe (and into
    the reports of bench/ and infra/), stable for scripts that read it."""
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
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total or '?'} {percent} {job_state(job)}"


def job_state(job: dict[str, Any]) -> str:
    """``running, 35.2 inputs/s, 3 failed`` (and why it is paused, or that its runner has gone
    silent): a job's progress line after its bar."""
    state = (
        f"{job['status']}, {float(job.get('throughput') or 0.0):.1f} inputs/s, "
        f"{int(job.get('errors') or 0)} failed"
    )
    if job.get("health") == "stalled":
        state += f" STALLED: no heartbeat from its runner for {float(job.get('heartbeatAgeS') or 0.0):.1f} s"
    elif job.get("paused"):
        state += f" (paused: {job.get('pauseReason')})"
    return state


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


def instance_summary(instance: dict[str, Any]) -> str:
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


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
