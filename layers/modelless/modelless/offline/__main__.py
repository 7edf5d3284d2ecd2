"""Run offline jobs from the command line, with the deployment's settings (``MODELLESS_*``):

    python -m modelless.offline run JOB_ID [--for-seconds 600] [--owner ID] [--report-file PATH]
    python -m modelless.offline resume            # every unfinished job nobody holds

What the offline function does in AWS, as a process: an operator's tool, how the embedded stack
runs a job apart from its gateway (``ChildProcessRunner``), and how the tests kill a runner
mid-job to show that the next one resumes where it stopped.

Each run's outcome is printed as one JSON line; with ``--report-file`` it is also written to that
file, a channel of its own (stdout carries the runner's JSON logs too).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from modelless.cache import open_cached_predictions
from modelless.catalog import DEFAULT_POOLS
from modelless.config import get_settings
from modelless.metadata import open_metadata_store
from modelless.offline.service import OfflineService


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m modelless.offline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one job until it finishes (or the time is up)")
    run.add_argument("job_id")
    run.add_argument("--for-seconds", type=float, help="stop cleanly before this many seconds pass")
    run.add_argument(
        "--owner",
        help="hold the job's lease under this id (a parent that watches the run frees it if the run dies)",
    )
    resume = commands.add_parser("resume", help="run every unfinished job whose lease nobody holds")
    for command in (run, resume):
        command.add_argument(
            "--report-file", type=Path, help="also write each run's outcome here (JSON lines)"
        )
    args = parser.parse_args(argv)

    settings = get_settings()
    store = open_metadata_store(settings.metadata_url)
    # The prediction cache online queries use (with Redis: the gateway's own, shared).
    predictions = open_cached_predictions(settings)
    service = OfflineService.from_settings(settings, store, DEFAULT_POOLS, predictions=predictions)
    try:
        job_ids = [args.job_id] if args.command == "run" else service.resumable()
        deadline = time.time() + args.for_seconds if getattr(args, "for_seconds", None) else None
        lines: list[str] = []
        for job_id in job_ids:
            report = service.run(job_id, deadline, owner=getattr(args, "owner", None))
            lines.append(
                json.dumps({"jobId": job_id, "outcome": report.outcome.value, "processed": report.processed})
            )
            print(lines[-1], flush=True)
        if args.report_file is not None:
            # Written whole, then renamed: a reader never sees half a report.
            staging = args.report_file.with_name(f".{args.report_file.name}.{os.getpid()}")
            staging.write_text("".join(f"{line}\n" for line in lines))
            staging.replace(args.report_file)
    finally:
        service.close()
        if predictions is not None:
            predictions.close()
        store.close()


if __name__ == "__main__":
    main()
