"""The metadata store goes away under load: a real Redis (a redis-server of the test's own, on a
free port, so that stopping it touches no other test's Redis) under the embedded stack's real
gateway (uvicorn in a thread) and a real worker process that reports into it.

Redis is stopped (SIGSTOP: it accepts connections and answers nothing, the hard case) for 5 s
under bounded load, then killed and started again (its append-only file brings the data back).
Asserted: every query of the known app is answered throughout, from the gateway's last good
reads; an unknown key is a JSON 503 ``store_unavailable`` with ``Retry-After`` and the
connection stays open; every reply is JSON; ``/health`` stays 200 while ``/health/ready`` says
503; afterwards the worker's reports resume and writes (a new app) work again. The counts are
printed (run with ``-s``) for the issue's note: "queries answered during a 5 s store outage".
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import uvicorn

from infra.local.ports import free_port
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.config import Settings
from modelless.exceptions import StoreUnavailableError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.serving.invocation import npy_bytes
from tests.conftest import redis_server_binary
from tests.faults.stack_kit import BUDGET_MS, QueryLoad, Reply, served_stack, summary
from tests.functional.workers_kit import APP, sample_inputs
from tests.waiting import scaled, wait_for

OUTAGE_S = 5.0  # the figure: queries answered during a 5 s store outage
KILLED_S = 2.0  # how long Redis stays dead before it is started again


def report(name: str, **numbers: object) -> None:
    print(f"\nFAULT {name}: {json.dumps(numbers)}")


class RedisProcess:
    """A redis-server of this test's own on a free 127.0.0.1 port, with an append-only file
    fsynced on every write (a SIGKILL loses nothing), that the test stops, kills and restarts."""

    def __init__(self, directory: Path) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # A port just freed by a killed server (or taken by someone else since): redis-server
        # exits at once; the wait below says so.
        self.process = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            wait_for(lambda: self._answers(client), 20, f"redis-server on port {self.port} to answer")
        finally:
            client.close()

    def _answers(self, client: redis.Redis) -> bool:  # type: ignore[type-arg]
        assert self.process is not None and self.process.poll() is None, (
            self.directory / "redis.log"
        ).read_text()
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted into the backlog, nothing is answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis")
    try:
        yield server
    finally:
        server.close()


@dataclass
class Prober:
    """From one thread, over ONE keep-alive HTTP connection: a query with a key the gateway has
    never seen, ``/health`` and ``/health/ready``, in turn, until stopped. Keeps every answer
    and whether the connection was ever dropped or replaced."""

    url: str
    answers: list[tuple[str, int, dict[str, Any] | None, str | None]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Prober:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        body = npy_bytes(np.ascontiguousarray(sample_inputs(1)))
        query = f"/v1/online_query?appID={APP}&latency={BUDGET_MS}&accuracy=0.5"
        requests = [
            (
                "unknown-key",
                "POST",
                query,
                body,
                {"X-Api-Key": "mlk_never_issued", "Content-Type": "application/x-npy"},
            ),
            ("live", "GET", "/health", None, {}),
            ("ready", "GET", "/health/ready", None, {}),
        ]
        try:
            connection.connect()
            while not self._stop.is_set():
                for name, method, path, content, headers in requests:
                    sock = connection.sock
                    try:
                        connection.request(method, path, body=content, headers=headers)
                        response = connection.getresponse()
                        raw = response.read()
                    except (http.client.HTTPException, OSError) as error:
                        self.dropped.append(f"{name}: {type(error).__name__}: {error}")
                        connection.close()
                        continue
                    if connection.sock is not sock or response.getheader("Connection", "") == "close":
                        self.dropped.append(f"{name}: the server closed the connection")
                    try:
                        parsed = json.loads(raw)
                    except ValueError:
                        parsed = None
                    self.answers.append((name, response.status, parsed, response.getheader("Retry-After")))
                self._stop.wait(0.2)
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)
        assert not self._thread.is_alive(), "the prober hung"


def ready(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/health/ready", timeout=30).json()
    return body


def answered_by_the_worker(load: QueryLoad, count: int) -> bool:
    return sum(1 for r in load.since(0) if r.status == 200 and r.tier == "worker") >= count


def reported_since(store: RedisMetadataStore, moment: float) -> bool:
    """A worker's report newer than ``moment`` (wall clock) is in the store."""
    try:
        return any(w.pool == "cpu" and w.reported_at > moment for w in store.list_workers())
    except StoreUnavailableError:
        return False


def check_outage_replies(replies: list[Reply], what: str) -> dict[str, object]:
    assert replies, f"no query was sent during the {what}"
    assert all(r.json_body and r.status != 0 for r in replies), [r for r in replies if not r.json_body]
    unanswered = [r for r in replies if r.status != 200]
    assert not unanswered, f"known-app queries refused during the {what}: {unanswered[:5]}"
    return summary(replies)


def test_known_apps_are_served_through_a_store_outage_and_everything_resumes(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    with served_stack(
        tmp_path / "state", workers=1, lambda_concurrency=1, metadata=redis_server.url
    ) as served:
        store = served.store
        assert isinstance(store, RedisMetadataStore)
        admin = served.gateway.admin()
        load = QueryLoad(served.url, served.api_key, callers=2, pause_s=0.05).start()
        prober: Prober | None = None
        try:
            wait_for(lambda: answered_by_the_worker(load, 10), 60, "10 queries answered by the pool worker")

            # --- Redis stopped (SIGSTOP) for 5 s -----------------------------------------------
            prober = Prober(served.url)
            redis_server.pause()
            paused_at, paused_wall = time.monotonic(), time.time()
            prober.start()
            threading.Event().wait(OUTAGE_S)  # the outage itself: what the load runs through
            redis_server.resume()
            resumed_at, resumed_wall = time.monotonic(), time.time()
            prober.stop()
            paused = [r for r in load.since(paused_at) if r.sent_at < resumed_at]
            paused_summary = check_outage_replies(paused, "5 s store outage")
            assert not prober.dropped, prober.dropped
            probes = prober.answers
            unknown = [(s, b, retry) for name, s, b, retry in probes if name == "unknown-key"]
            assert unknown and all(
                s == 503 and b and b["error"]["code"] == "store_unavailable" and retry
                for s, b, retry in unknown
            ), unknown
            assert all(s == 200 for name, s, _, _ in probes if name == "live")
            ready_codes = {
                b["error"]["code"] if b and s == 503 else s for name, s, b, _ in probes if name == "ready"
            }
            assert ready_codes == {"store_unavailable"}, ready_codes

            # --- back: the worker reports again, writes work, the new app is known -----------
            wait_for(lambda: reported_since(store, resumed_wall), 10, "the worker's report after the outage")
            assert ready(served.url)["store"]["reachable"] is True
            new_key = admin.create_app("after-the-outage")
            assert new_key.startswith("mlk_")

            # --- Redis killed, then started again (a crash; its append-only file keeps the data)
            redis_server.kill()
            killed_at = time.monotonic()
            threading.Event().wait(KILLED_S)
            redis_server.start()
            restarted_at, restarted_wall = time.monotonic(), time.time()
            killed = [r for r in load.since(killed_at) if r.sent_at < restarted_at]
            killed_summary = check_outage_replies(killed, "store crash")
            wait_for(
                lambda: reported_since(store, restarted_wall), 10, "the worker's report after the restart"
            )
            wait_for(
                lambda: ready(served.url).get("status") == "ready" or None, 5, "/health/ready to say ready"
            )
            assert admin.create_app("after-the-restart").startswith("mlk_")

            settled_at = time.monotonic()
            wait_for(lambda: len(load.since(settled_at)) >= 10 or None, 30, "10 queries after the restart")
        finally:
            if prober is not None and prober._thread is not None and prober._thread.is_alive():
                prober.stop()
            replies = load.stop()
    after = [r for r in replies if r.sent_at >= settled_at]
    assert after and all(r.status == 200 for r in after), [r for r in after if r.status != 200][:5]
    assert all(r.json_body and r.status != 0 for r in replies), [r for r in replies if not r.json_body][:5]
    numbers = {
        "outage_s": round(resumed_at - paused_at, 2),
        "answered_during_outage": sum(1 for r in paused if r.status == 200),
        "sent_during_outage": len(paused),
        "worst_reply_during_outage_s": paused_summary["worst_s"],
        "tiers_during_outage": paused_summary["tiers"],
        "unknown_key_503s_during_outage": len(unknown),
        "crash_s": round(restarted_at - killed_at, 2),
        "answered_during_crash": sum(1 for r in killed if r.status == 200),
        "worst_reply_during_crash_s": killed_summary["worst_s"],
        "queries_in_all": len(replies),
    }
    report("store outage", **numbers)
    assert paused_wall < resumed_wall


def test_the_store_translates_an_outage_and_fails_fast_while_it_lasts(redis_server: RedisProcess) -> None:
    """At the store's boundary: a stopped Redis costs one call the socket timeout, then calls fail
    at once (no socket timeout per call) until Redis answers again, found by the probe alone."""
    store = RedisMetadataStore.from_url(f"{redis_server.url}?prefix=outage-test:")
    timeout_s = Settings().metadata_timeout_s
    try:
        store.create_app("app", "hash")
        # Calls in a thread, so that one that hangs (no socket timeout) fails the test, not hangs it.
        call = ThreadPoolExecutor(1)
        redis_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="does not answer"):
                call.submit(store.app_for_key, "hash").result(timeout=scaled(10))
            first_s = time.monotonic() - started
            started = time.monotonic()
            for _ in range(20):
                with pytest.raises(StoreUnavailableError):
                    store.selection_state("app")
            next_s = (time.monotonic() - started) / 20
        finally:
            redis_server.resume()
            call.shutdown()
        assert first_s < timeout_s + scaled(1.0), first_s  # not redis-py's default of four tries
        assert next_s < 0.05, next_s
        wait_for(lambda: _answers(store), 10, "the store to answer again")
        assert store.app_for_key("hash") == "app"
    finally:
        store.flush_namespace()
        store.close()


def _answers(store: RedisMetadataStore) -> bool:
    try:
        store.ping()
    except StoreUnavailableError:
        return False
    return True


def test_a_store_nobody_listens_on_fails_at_once_as_unavailable() -> None:
    store = RedisMetadataStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=r"redis at 127\.0\.0\.1:\d+"):
            store.list_workers()
        assert time.monotonic() - started < scaled(1.0)
    finally:
        store.close()


class BrokenStore(InMemoryMetadataStore):
    def app_for_key(self, key_hash: str) -> str | None:
        raise RuntimeError("a bug deep down")


def test_an_unexpected_error_over_real_http_is_json_and_keeps_the_connection(tmp_path: Path) -> None:
    """Over uvicorn, not only TestClient: Starlette's own last-resort handler would send plain
    text, or the JSON and then have uvicorn close the connection."""
    settings = Settings(metadata_url="memory://", repository_url=str(tmp_path / "repo"), admin_key="adm")
    services = build_services(settings, store=BrokenStore())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(services), host="127.0.0.1", port=port, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, "uvicorn to start")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        answers = []
        for path, headers in (("/v1/models", {"X-Api-Key": "mlk_any"}), ("/health", {})) * 2:
            connection.request("GET", path, headers=headers)
            sock = connection.sock
            response = connection.getresponse()
            answers.append((response.status, json.loads(response.read()), response.getheader("Connection")))
            assert connection.sock is sock, "the server closed the connection"
        connection.close()
        assert [status for status, _, _ in answers] == [500, 200, 500, 200]
        failed = answers[0][1]["error"]
        assert failed["code"] == "internal_error" and "RuntimeError" in failed["message"]
        assert all(connection_header != "close" for _, _, connection_header in answers)
    finally:
        server.should_exit = True
        thread.join(20)
        services.close()
