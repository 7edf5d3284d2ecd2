"""One container of the local Lambda tier: imports ``functions/cpu_worker/app.py`` exactly as the
Lambda runtime would and serves invocations on the runtime emulator's path.

    python -m infra.local.lambda_container --repository .modelless/repo
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from modelless.pools.lambda_local import INVOKE_PATH, LocalLambdaTier
from modelless.worker.http import announce_ready, make_server

FUNCTION_DIR = Path(__file__).resolve().parents[2] / "functions" / "cpu_worker"


@dataclass
class LocalContext:
    """The attributes of the Lambda context object that Powertools reads."""

    function_name: str = "cpu_worker"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = field(
        default_factory=lambda: int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1769"))
    )
    invoked_function_arn: str = "arn:aws:lambda:local:000000000000:function:cpu_worker"
    aws_request_id: str = ""
    log_group_name: str = "/aws/lambda/cpu_worker"
    log_stream_name: str = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def local_lambda_tier(repository_url: str, log_dir: Path, cache_dir: Path, **options: Any) -> LocalLambdaTier:
    """The embedded stack's Lambda tier: containers that run this module (``options``: the
    tier's memory size, concurrency and idle timeout)."""
    return LocalLambdaTier(__name__, repository_url, log_dir, cache_dir, **options)


def load_function(app_file: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cpu_worker_app", app_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--cache-dir", default="/tmp/modelless-cache")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ["MODELLESS_REPOSITORY_URL"] = args.repository
    os.environ["MODELLESS_CACHE_DIR"] = args.cache_dir
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Modelless")

    function = load_function(FUNCTION_DIR / "app.py")

    def invoke(event: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = function.handler(event, LocalContext(aws_request_id=str(uuid.uuid4())))
        return result

    server = make_server("127.0.0.1", args.port, {("POST", INVOKE_PATH): invoke})
    announce_ready(server)
    server.serve_forever()


if __name__ == "__main__":
    main()
