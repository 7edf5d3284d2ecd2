"""The embedded stack's lifecycle as an operator sees it, on a real ``python -m infra.local.stack``
process: SIGTERM drains the query in flight, stops every child and exits 0; a stack killed with
no chance to clean up leaves no orphans; no secret is on a child's command line; a worker's
identity carries a boot nonce."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from infra.local.ports import free_port
from modelless.catalog import CPU_POOL
from modelless.client import Client
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.local import LocalWorkerPool
from modelless.repository.local import LocalModelRepository
from tests.functional.workers_kit import APP, ARTIFACT_KEY, make_variant, publish_linear_model, sample_inputs
from tests.models import linear_model
from tests.waiting import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
# docs/OPERATIONS.md: a killed stack's children stop by themselves within this long.
ORPHANS_STOP_S = 1.0


def children_of(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing paren.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry.name))
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class StackProcess:
    def __init__(self, state_dir: Path, metadata_url: str, workers: int) -> None:
        self.port = free_port()
        self.state_dir = state_dir
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "infra.local.stack",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--metadata",
                metadata_url,
                "--state-dir",
                str(state_dir),
                "--scale-every",
                "0",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "MODELLESS_ADMIN_KEY": ""},
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(
            lambda: self.process.poll() is not None or Client(self.url).health() or None, 60, "the stack"
        )
        assert self.process.poll() is None, self.output()

    @property
    def admin_key(self) -> str:
        return str(json.loads((self.state_dir / "stack.json").read_text())["admin_key"])

    def output(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stdout is not None
        return self.process.stdout.read().decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def stack_process(tmp_path: Path, redis_store: RedisMetadataStore) -> Iterator[StackProcess]:
    url = f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={redis_store.keys.prefix}"
    stack = StackProcess(tmp_path / "stack", url, workers=1)
    try:
        yield stack
    finally:
        stack.close()


def test_sigterm_drains_the_query_in_flight_stops_every_child_and_exits_0(
    stack_process: StackProcess, redis_store: RedisMetadataStore
) -> None:
    admin = Client(stack_process.url, admin_key=stack_process.admin_key)
    key = admin.create_app(APP)
    LocalModelRepository(stack_process.state_dir / "repo").put(ARTIFACT_KEY, linear_model())
    # Only a Lambda variant: the query waits for a container's cold start, long enough to be
    # in flight when SIGTERM comes.
    publish_linear_model(redis_store, make_variant(pool="lambda-cpu"))
    pid = stack_process.process.pid
    before = children_of(pid)
    assert before, "the stack started no worker"

    # No secret on a child's command line (every user of the machine can read it): the admin
    # key that workers' reports present travels in their environment.
    for child in before:
        assert stack_process.admin_key.encode() not in Path(f"/proc/{child}/cmdline").read_bytes()

    outcome: list[dict[str, object]] = []
    client = Client(stack_process.url, api_key=key)
    query = threading.Thread(
        target=lambda: outcome.append(client.online_query(sample_inputs(1), APP, accuracy=0.5))
    )
    query.start()
    wait_for(lambda: len(children_of(pid)) > len(before) or None, 30, "a Lambda container starting")
    everyone = children_of(pid) | before
    stack_process.process.send_signal(signal.SIGTERM)

    assert stack_process.process.wait(scaled(60)) == 0, stack_process.output()
    query.join(scaled(30))
    assert outcome, "the query in flight got no answer"
    assert outcome[0]["tier"] == "lambda"
    assert np.asarray(outcome[0]["outputs"]).shape == (1, 10)
    assert not [p for p in everyone if running(p)], "a child outlived the stack"
    assert "modelless: stopped" in stack_process.output()
    # Issue 33: a stopped worker's record stayed in the store after the stack's SIGTERM.
    assert redis_store.list_worker_reports("cpu") == [], "a stopped worker's report outlived it"


def test_a_killed_stack_leaves_no_orphans(stack_process: StackProcess) -> None:
    pid = stack_process.process.pid
    orphans = children_of(pid)
    assert orphans
    stack_process.process.kill()  # no chance to stop anything
    stack_process.process.wait()
    killed = time.monotonic()
    wait_for(
        lambda: not any(running(p) for p in orphans), 15, "the orphaned workers to exit", interval_s=0.01
    )
    stopped_s = time.monotonic() - killed
    numbers = {"children": len(orphans), "all_stopped_s": round(stopped_s, 3)}
    print(f"\nFAULT killed-stack: {json.dumps(numbers)}")
    # Each sees its parent gone at once (a pidfd) and drains in DRAIN_QUIET_S (0.3 s).
    assert stopped_s < scaled(ORPHANS_STOP_S), f"the orphans took {stopped_s:.2f} s to stop"


def test_a_worker_id_carries_a_boot_nonce(tmp_path: Path) -> None:
    """Two pools that count their workers from 0 (a stack and the one started after it) never
    give two processes the same id: a process of the first can never pose as one of the second."""
    ids: list[str] = []
    for run in range(2):
        logs = tmp_path / f"logs-{run}"
        pool = LocalWorkerPool(
            CPU_POOL, str(tmp_path / "repo"), "http://127.0.0.1:9", "", logs, tmp_path / "cache"
        )
        try:
            pool.scale_to(1)
            ids.extend(pool.workers())
        finally:
            pool.close()
    assert len(set(ids)) == 2
    assert all(i.startswith(f"{CPU_POOL.name}-0-") for i in ids)
