"""Helpers for end-to-end tests: real stack processes on 127.0.0.1, driven over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.local.ports import free_port
from modelless.client import Client
from tests.waiting import scaled, wait_for_process


@dataclass
class RunningStack:
    url: str
    state_dir: Path
    process: subprocess.Popen[str]
    admin_key: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "MODELLESS_STATE_DIR": str(self.state_dir), "MODELLESS_URL": self.url}

    def stop(self, timeout_s: float = 20.0) -> int:
        """Ctrl-C, as a user stops it; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                return self.process.wait(scaled(timeout_s))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return int(self.process.returncode)


def start_stack(state_dir: Path, metadata: str, workers: int = 2) -> RunningStack:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infra.local.stack",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--metadata",
            metadata,
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    client = Client(url)
    wait_for_process(process, client.health, 60.0, f"the stack to answer on {url}")
    import json

    admin_key = json.loads((state_dir / "stack.json").read_text())["admin_key"]
    return RunningStack(url, state_dir, process, admin_key)


@pytest.fixture
def memory_stack(tmp_path: Path) -> Iterator[RunningStack]:
    stack = start_stack(tmp_path / "state", "memory://")
    try:
        yield stack
    finally:
        stack.stop()
