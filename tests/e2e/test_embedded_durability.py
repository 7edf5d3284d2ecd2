"""The embedded default keeps what was registered: ``--metadata auto`` stops and starts again with
its apps and keys (its own Redis, an append-only file in the state directory), stops its Redis
with it, and refuses to start on a store that lost them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.local.ports import free_port
from modelless.client import Client
from tests.conftest import redis_server_binary
from tests.e2e.conftest import start_stack


def is_redis_server(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_auto_keeps_apps_across_restarts_and_refuses_an_emptied_store(tmp_path: Path) -> None:
    redis_server_binary()
    state_dir = tmp_path / "state"
    first = start_stack(state_dir, "auto", workers=1)
    try:
        assert json.loads((state_dir / "stack.json").read_text())["metadata_url"].startswith("unix://")
        key = Client(first.url, admin_key=first.admin_key).create_app("kept")
        redis_pid = int((state_dir / "redis" / "redis.pid").read_text())
    finally:
        assert first.stop() == 0
    assert not is_redis_server(redis_pid), "the stack left its Redis running"

    second = start_stack(state_dir, "auto", workers=1)
    try:
        assert Client(second.url, api_key=key).models() == []  # the app and its key are still there
    finally:
        assert second.stop() == 0

    # The store's data lost (its append-only files deleted): the next start refuses, loudly.
    for aof in (state_dir / "redis" / "appendonlydir").iterdir():
        aof.unlink()
    options = {
        "--port": str(free_port()),
        "--workers": "1",
        "--metadata": "auto",
        "--state-dir": str(state_dir),
    }
    refused = subprocess.run(
        [sys.executable, "-m", "infra.local.stack", *(part for pair in options.items() for part in pair)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("modelless: cannot start:") and "came back empty" in refused.stderr
    assert f"embedded Redis in {(state_dir / 'redis').resolve()}" in refused.stderr
    pid_file = state_dir / "redis" / "redis.pid"
    assert not pid_file.exists()  # its Redis was stopped on the way out
