"""Offline jobs: offline-query, job status, jobs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modelless.cli.app import app, session_of
from modelless.cli.core import (
    CommandError,
    ExitCode,
    UsageProblem,
    open_client,
    print_json,
    print_table,
    wants_json,
)
from modelless.cli.models import AppOption, JsonFlag
from modelless.cli.progress import follow_job
from modelless.cli.text import job_progress_line, job_report

IntervalOption = Annotated[float, typer.Option(help="seconds between progress checks")]


def _finish_job(job: dict[str, Any], args: Any) -> None:
    """A finished job's report (or JSON); a failed job ends with exit code 1."""
    if wants_json(args):
        print_json(job)
    else:
        print(job_report(job))
    if job["status"] == "failed":
        raise CommandError(
            ExitCode.REFUSED,
            f"job {job['jobId']} failed: {job.get('message', '')}",
            "job_failed",
            {"jobId": job["jobId"]},
        )


def _cmd_offline_query(args: Any) -> None:
    if args.accuracy is None and args.model is None and args.pipeline is None:
        raise UsageProblem("give --accuracy, --model or --pipeline")
    with open_client(args) as client:
        job = client.offline_query(
            args.input,
            args.output,
            args.app,
            accuracy=args.accuracy,
            model_name=args.model,
            pipeline=args.pipeline,
        )
        if not args.wait:
            if wants_json(args):
                print_json(job)
            else:
                print(f"job {job['jobId']} accepted: {job['status']}")
            return
        if not wants_json(args):
            print(f"job {job['jobId']} accepted: {job['status']}", flush=True)
        final = follow_job(client, job["jobId"], args.app, args.interval)
    _finish_job(final, args)


@app.command("offline-query")
def offline_query(
    context: typer.Context,
    app_id: AppOption,
    input_: Annotated[str, typer.Option("--input", help="s3://bucket/prefix of the inputs")],
    output: Annotated[str, typer.Option("--output", help="s3://bucket/prefix for the results")],
    accuracy: Annotated[float | None, typer.Option(help="minimum accuracy, 0..1")] = None,
    model: Annotated[str | None, typer.Option(help="name the model instead of an accuracy")] = None,
    pipeline: Annotated[
        str | None, typer.Option(help="run each input through the app's pipeline (docs/PIPELINES.md)")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="follow the job to the end (progress on stderr)")
    ] = False,
    interval: IntervalOption = 1.0,
) -> None:
    """Batch job over S3 objects: one result per input under --output. (This command's --output
    is the results' prefix; the output format is the global one: modelless -o json offline-query ...)"""
    session_of(context).run(
        "offline-query",
        _cmd_offline_query,
        app=app_id,
        input=input_,
        output=output,
        accuracy=accuracy,
        model=model,
        pipeline=pipeline,
        wait=wait,
        interval=interval,
    )


def _cmd_job_status(args: Any) -> None:
    with open_client(args) as client:
        job = (
            follow_job(client, args.job_id, args.app, args.interval) if args.wait else client.job(args.job_id)
        )
    if args.wait:
        _finish_job(job, args)
        return
    if wants_json(args):
        print_json(job)
        return
    print(job_progress_line(job))
    print(job_report(job))


job_app = typer.Typer(help="Offline jobs.", no_args_is_help=False)
app.add_typer(job_app, name="job")


@job_app.command("status")
def job_status(
    context: typer.Context,
    job_id: Annotated[str, typer.Argument(help="the job's id (offline-query prints it)")],
    app_id: AppOption,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for the end, with a progress bar on stderr")
    ] = False,
    interval: IntervalOption = 1.0,
    json_: JsonFlag = False,
) -> None:
    """A job's progress: done/total, speed, failures. With --wait, a failed job exits 1."""
    session_of(context).run(
        "job",
        _cmd_job_status,
        job_command="status",
        job_id=job_id,
        app=app_id,
        wait=wait,
        interval=interval,
        json=json_,
    )


def _cmd_jobs(args: Any) -> None:
    with open_client(args) as client:
        jobs = client.jobs()
    if wants_json(args):
        print_json({"jobs": jobs})
        return
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
    print_table(rows, ["job", "status", "done", "failed", "inputs/s", "input", "source"], empty="no jobs")


@app.command("jobs")
def jobs(context: typer.Context, app_id: AppOption) -> None:
    """The app's offline jobs."""
    session_of(context).run("jobs", _cmd_jobs, app=app_id)
