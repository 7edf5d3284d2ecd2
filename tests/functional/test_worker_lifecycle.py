"""The scale-in drain script of a worker instance (infra/aws/worker-lifecycle.sh), run for real:
its instance metadata service is a local HTTP server speaking IMDSv2 (session token, then the
Auto Scaling target lifecycle state), its metadata store the test's Redis, and ``systemctl`` and
``aws`` are stand-ins on PATH that record how they were called, in order."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from modelless.metadata.redis import RedisMetadataStore
from modelless.types import WorkerState
from tests.functional.offline_fixtures import redis_url
from tests.waiting import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "aws" / "worker-lifecycle.sh"
TOKEN = "imds-session-token"
INSTANCE_ID = "i-0123456789abcdef0"
GROUP = "modelless-CpuPool-1A2B3C"


class FakeImds(ThreadingHTTPServer):
    target_state = "InService"
    polls = 0


class ImdsHandler(BaseHTTPRequestHandler):
    server: FakeImds

    def do_PUT(self) -> None:  # the session token (IMDSv2)
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(400, "")
            return
        self._reply(200, TOKEN)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self._reply(401, "")  # IMDSv2 only, as the launch templates require
        elif self.path == "/latest/meta-data/autoscaling/target-lifecycle-state":
            self.server.polls += 1
            self._reply(200, self.server.target_state)
        else:
            self._reply(404, "")

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    server = FakeImds(("127.0.0.1", 0), ImdsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def stand_in(directory: Path, name: str, calls: Path) -> None:
    """A command that appends its name and arguments to ``calls`` and succeeds."""
    path = directory / name
    path.write_text(f'#!/bin/bash\necho "{name} $*" >> "{calls}"\n')
    path.chmod(0o755)


def test_on_scale_in_the_worker_drains_then_the_termination_goes_on(
    imds: FakeImds, redis_store: RedisMetadataStore, tmp_path: Path
) -> None:
    # The settings files the user data and the boot script write on an instance.
    env_file, instance_env_file = tmp_path / "worker.env", tmp_path / "instance.env"
    env_file.write_text(
        f"MODELLESS_POOL=cpu\nMODELLESS_METADATA_URL={redis_url(redis_store)}\n"
        "MODELLESS_LIFECYCLE_HOOK=modelless-drain\nAWS_DEFAULT_REGION=us-east-1\n"
    )
    instance_env_file.write_text(
        f"MODELLESS_WORKER_ID={INSTANCE_ID}\nMODELLESS_ADVERTISE_HOST=10.42.16.7\nMODELLESS_GROUP={GROUP}\n"
    )
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("systemctl", "aws"):
        stand_in(bin_dir, name, calls)
    redis_store.put_worker_state(
        WorkerState(INSTANCE_ID, "cpu", "http://10.42.16.7:8500", 0.0, 2, time.time())
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "MODELLESS_ENV_FILE": str(env_file),
        "MODELLESS_INSTANCE_ENV_FILE": str(instance_env_file),
        "MODELLESS_IMDS_URL": f"http://127.0.0.1:{imds.server_address[1]}",
        "MODELLESS_PYTHON": sys.executable,
        "MODELLESS_LIFECYCLE_POLL_S": "0.1",
    }
    drain = subprocess.Popen(["bash", str(SCRIPT)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        # In service: it keeps polling and touches nothing.
        wait_for(lambda: imds.polls, 10.0, "three polls of the target state", until=lambda polls: polls >= 3)
        assert drain.poll() is None
        assert not calls.exists()
        assert [w.worker_id for w in redis_store.list_workers()] == [INSTANCE_ID]

        imds.target_state = "Terminated"  # the scaler chose this instance to leave
        _, stderr = drain.communicate(timeout=scaled(30))
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()

    assert drain.returncode == 0, stderr
    assert calls.read_text().splitlines() == [
        "systemctl stop modelless-worker.service",
        "aws autoscaling complete-lifecycle-action --lifecycle-hook-name modelless-drain "
        f"--auto-scaling-group-name {GROUP} --instance-id {INSTANCE_ID} --lifecycle-action-result CONTINUE",
    ]
    # Its last report is gone at once: no gateway picks the drained worker.
    assert redis_store.list_workers() == []
