"""Starting and stopping the local stack's real OS processes (pool workers, Lambda containers)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from modelless.exceptions import ServiceUnavailableError
from modelless.worker.http import PARENT_PID_ENV

READY_TIMEOUT_S = 60.0


@dataclass
class ChildProcess:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    started_ms: float  # spawn until the process said READY: its measured start-up time

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """Ask the process to stop (SIGTERM): a worker finishes what is in flight first."""
        if self.process.poll() is None:
            self.process.terminate()

    def wait_stopped(self, timeout_s: float = 5.0) -> None:
        """Wait for a terminated process to exit; kill it past ``timeout_s``."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.terminate()
        self.wait_stopped(timeout_s)


def spawn(
    name: str, module: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None
) -> ChildProcess:
    """Run ``python -m module args`` and wait for its ``READY <port>`` line."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_dir / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            # PARENT_PID_ENV: the child stops once this process is gone (``exit_with_parent``).
            env={**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid()), **(env or {})},
        )
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode().strip()
        if line.startswith("READY "):
            port = int(line.split()[1])
            ready_ms = (time.perf_counter() - started) * 1000
            # Keep draining stdout (EMF metrics, prints) into the log so the pipe never fills up.
            threading.Thread(target=_drain, args=(process, log_dir / f"{name}.log"), daemon=True).start()
            return ChildProcess(name, process, port, ready_ms)
        if not line and process.poll() is not None:
            break
    process.kill()
    raise ServiceUnavailableError(f"{name} did not start; see {log_dir / (name + '.log')}")


def _drain(process: subprocess.Popen[bytes], log_path: Path) -> None:
    assert process.stdout is not None
    # OSError/ValueError: the pipe closed while the process was being stopped.
    with open(log_path, "ab") as log, contextlib.suppress(OSError, ValueError):
        shutil.copyfileobj(process.stdout, log)
