"""The gateway function's cold start, measured: a fresh Python process imports
``functions/gateway/app.py`` and serves its first request (the HTTP API v2 health event), as a new
Lambda container does, then serves more requests; it counts every service, store, boto3 client and
app it creates along the way, to show they are made once per container, never per request.

Settings are the deployed gateway's (template.yaml): the Lambda tier's and the registrar's
functions and the S3 model repository, so boto3 and its clients are part of the measured import;
only the metadata store is in memory (no Redis connection is opened at import either way) and the
admin key is in the environment (in AWS it is one Secrets Manager call, ~tens of ms in-region).
Nothing here opens a network connection.

    python -m bench.cold_start [--repeat 5]

Each line is one fresh process: ``import_ms`` (the module's import: FastAPI app, services,
clients), ``first_request_ms`` (the first invocation through Mangum), their sum ``cold_ms``, and
``process_ms`` (spawn to exit, interpreter start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Runs in the fresh process. Counters wrap the constructors before the function module is imported.
PROBE = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")  # Powertools says a health check published no metric
started = time.perf_counter()
from collections import Counter
created = Counter()

def counting(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        created[label] += 1
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)

import botocore.session
import modelless.api
import modelless.api.services
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.invokers import AwsLambdaInvoker, HttpWorkerInvoker
from modelless.dispatch import Dispatcher
counting(botocore.session.Session, "create_client", "boto3 clients")
counting(modelless.api.services, "build_services", "build_services")
counting(modelless.api, "create_app", "create_app")
counting(InMemoryMetadataStore, "__init__", "metadata stores")
counting(HttpWorkerInvoker, "__init__", "worker invokers")
counting(AwsLambdaInvoker, "__init__", "Lambda tier invokers")
counting(Dispatcher, "__init__", "dispatchers")

import functions.gateway.app as gateway
imported = time.perf_counter()
at_import = dict(created)

events = json.loads(sys.argv[1])
class Context:
    function_name = "modelless-Gateway"
    function_version = "$LATEST"
    memory_limit_in_mb = 1769
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:modelless-Gateway"
    aws_request_id = "req-cold-start"
    log_group_name = "/aws/lambda/modelless-Gateway"
    log_stream_name = "cold-start"
    def get_remaining_time_in_millis(self):
        return 30_000

first = gateway.handler(events[0], Context())
served = time.perf_counter()
after_first = dict(created)
statuses = [first["statusCode"]]
for event in events[1:]:
    statuses.append(gateway.handler(event, Context())["statusCode"])
print(json.dumps({
    # From before the first import: the counters' imports are modules the gateway imports anyway.
    "import_ms": (imported - started) * 1000,
    "first_request_ms": (served - imported) * 1000,
    "cold_ms": (served - started) * 1000,
    "created_at_import": at_import,
    "created_after_first_request": after_first,
    "created_after_all_requests": dict(created),
    "statuses": statuses,
    "lifespan": gateway.gateway.asgi_handler.lifespan,
}))
"""

ADMIN_KEY = "admin-key-sample-0123456789abcdef"  # the key in events/http_api_create_app.json


def probe_events(warm_requests: int) -> list[dict[str, Any]]:
    """The first request (health), then app creation, then health again ``warm_requests`` times."""
    events = ROOT / "events"
    health = json.loads((events / "http_api_health.json").read_text())
    create = json.loads((events / "http_api_create_app.json").read_text())
    return [health, create, *([health] * warm_requests)]


def probe_environment() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "layers" / "modelless"), str(ROOT)]),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_METRICS_NAMESPACE": "Modelless",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        # The deployed gateway's settings, but for the store (in memory: the same code paths above it).
        "MODELLESS_METADATA_URL": "memory://",
        "MODELLESS_REPOSITORY_URL": "s3://modelless-cold-start/repository",
        "MODELLESS_LAMBDA_FUNCTION": "1769=modelless-CpuWorker1769:live,3538=modelless-CpuWorker3538:live",
        "MODELLESS_REGISTRAR_FUNCTION": "modelless-Registrar",
        "MODELLESS_OFFLINE_FUNCTION": "modelless-offline",
        "MODELLESS_ADMIN_KEY": ADMIN_KEY,
    }


def measure_once(warm_requests: int = 10, python: str = sys.executable) -> dict[str, Any]:
    """One fresh process: its measurements and what it created (see PROBE)."""
    started = time.perf_counter()
    completed = subprocess.run(
        [python, "-c", PROBE, json.dumps(probe_events(warm_requests))],
        cwd=ROOT,
        env=probe_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    process_ms = (time.perf_counter() - started) * 1000
    if completed.returncode != 0:
        raise RuntimeError(f"the cold-start probe failed:\n{completed.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    result["process_ms"] = process_ms
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes to measure")
    args = parser.parse_args(argv)
    print(f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")  # fmt: skip
    runs = [measure_once() for _ in range(args.repeat)]
    for run in runs:
        print(
            f"import {run['import_ms']:7.0f} ms   first request {run['first_request_ms']:6.1f} ms   "
            f"cold {run['cold_ms']:7.0f} ms   process {run['process_ms']:7.0f} ms"
        )
    colds = [run["cold_ms"] for run in runs]
    print(
        f"cold start (import + first request): median {statistics.median(colds):.0f} ms, "
        f"min {min(colds):.0f}, max {max(colds):.0f} over {len(colds)} processes"
    )
    print(f"created once per container: {runs[-1]['created_after_all_requests']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
