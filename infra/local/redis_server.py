"""The embedded stack's own Redis (``--metadata auto``): a redis-server child process that keeps
its data in the state directory with an append-only file, so that apps, keys and models outlive
the stack (docs/PERSISTENCE.md).

It listens on a unix socket in its data directory, readable by this user only (nothing else on
the machine reaches it by accident, and there is no port to collide on), or, where the socket's
path would be too long for the OS, on a free 127.0.0.1 port.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from infra.local.ports import free_port

REDIS_DIR = "redis"  # under the state directory
# A unix socket's path fits in sun_path: 108 bytes on Linux, its terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107
# Where redis-server is looked for besides the PATH (Debian's package puts it in /usr/bin).
KNOWN_BINARIES = ("/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server")
# The longest a start may take before it is given up: the wait ends the moment the server answers
# (after loading its append-only file, which for a large store takes seconds), so this only
# bounds a server that never does.
START_TIMEOUT_S = 60.0
# On SIGTERM redis-server writes what its append-only file still lacks and exits.
STOP_TIMEOUT_S = 30.0


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be started: the message says why and what to do."""


def find_redis_server() -> str | None:
    """The redis-server binary, or None when this machine has none."""
    found = shutil.which("redis-server")
    if found:
        return found
    return next((path for path in KNOWN_BINARIES if os.access(path, os.X_OK)), None)


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen[bytes]
    url: str
    data_dir: Path

    @classmethod
    def start(cls, state_dir: Path, binary: str) -> EmbeddedRedis:
        """Start redis-server on ``state_dir``/redis (its append-only file, log and socket) and
        return once it answers."""
        data_dir = (state_dir / REDIS_DIR).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        data_dir.chmod(0o700)
        _refuse_a_second_server(data_dir)
        socket_path = data_dir / "redis.sock"
        if len(os.fsencode(socket_path)) <= MAX_SOCKET_PATH_BYTES:
            listen = ["--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700"]
            url = f"unix://{socket_path}?db=0"
        else:
            port = free_port()
            listen = ["--port", str(port)]
            url = f"redis://127.0.0.1:{port}/0"
        command = [
            binary,
            "--bind", "127.0.0.1",
            *listen,
            "--dir", str(data_dir),
            # Every write is in the append-only file, fsynced, before Redis answers it: a crash of
            # the machine or of a process loses nothing acknowledged. "everysec" lost writes to
            # a SIGKILL: while a background fsync runs, Redis holds new writes back (up to 2 s)
            # but still answers them. An fsync cost about 0.13 ms a write on the 2-core VM, and
            # queries seldom write: load counts go once a second (only an app whose selection
            # learns from feedback stores each query).
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",  # no RDB snapshots besides: the append-only file is the copy
            "--pidfile", str(data_dir / "redis.pid"),
            "--logfile", str(data_dir / "redis.log"),
            "--daemonize", "no",
        ]  # fmt: skip
        # What it prints before its log file is open (a bad option, a busy port) goes here.
        with (data_dir / "redis-server.out").open("ab") as output:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
            )
        server = cls(process, url, data_dir)
        try:
            server._wait_until_it_answers()
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        """SIGTERM (the server completes its append-only file and exits), then SIGKILL if it
        has not exited within STOP_TIMEOUT_S."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _wait_until_it_answers(self) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1.0, socket_timeout=1.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if self.process.poll() is not None:
                    raise EmbeddedRedisError(
                        f"redis-server exited (code {self.process.returncode}) as it started on "
                        f"{self.data_dir}:\n{self._log_tail()}"
                    )
                try:
                    client.ping()  # answers once its append-only file is loaded
                    return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(
                        f"redis-server on {self.data_dir} did not answer within {START_TIMEOUT_S:g} s:\n"
                        f"{self._log_tail()}"
                    )
                time.sleep(0.05)  # a poll interval: the condition is the ping above
        finally:
            client.close()

    def _log_tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("redis-server.out", "redis.log"):
            path = self.data_dir / name
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text.strip() or "(it wrote nothing)"


def _refuse_a_second_server(data_dir: Path) -> None:
    """Two servers on one append-only file would corrupt it: refuse while the pid in the data
    directory's pid file is still a redis-server (an earlier stack on this state directory that
    is running, or that died and left its Redis behind)."""
    pid_file = data_dir / "redis.pid"
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return  # no pid file, or its process is gone (a stale file: the new server rewrites it)
    if b"redis-server" in command:
        raise EmbeddedRedisError(
            f"a redis-server (pid {pid}) is already serving {data_dir}: another stack uses this "
            f"state directory, or an earlier one did not stop it. Stop that stack (or `kill {pid}`), "
            f"or give this one its own --state-dir"
        )

