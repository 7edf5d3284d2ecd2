"""The embedded stack's metadata store (infra/local/stack.py, redis_server.py, store_epoch.py):
``--metadata auto`` runs the stack's own redis-server with an append-only file in the state
directory, so that what was registered outlives the stack and a crash of its Redis; a store that
lost what this state directory registered in it is refused at start, loudly; with no
redis-server to be found the stack says, loudly, that it keeps nothing."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import infra.local.stack as stack_module
from infra.local.redis_server import EmbeddedRedis, EmbeddedRedisError
from infra.local.stack import open_checked_store, resolve_metadata_url
from infra.local.store_epoch import EPOCH_FILE
from modelless.exceptions import StoreEmptiedError
from modelless.metadata.redis import RedisMetadataStore
from tests.conftest import redis_server_binary, service_url


@pytest.fixture
def redis_binary() -> str:
    return redis_server_binary()


@pytest.fixture
def servers() -> Iterator[list[EmbeddedRedis]]:
    """Embedded servers a test started, stopped whatever happens."""
    started: list[EmbeddedRedis] = []
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def start(state_dir: Path, servers: list[EmbeddedRedis]) -> tuple[str, EmbeddedRedis]:
    url, server = resolve_metadata_url("auto", state_dir)
    assert server is not None
    servers.append(server)
    return url, server


def test_auto_runs_its_own_redis_with_an_append_only_file_in_the_state_dir(
    tmp_path: Path, redis_binary: str, servers: list[EmbeddedRedis]
) -> None:
    state_dir = tmp_path / "state"
    url, server = start(state_dir, servers)
    assert url.startswith("unix://") and str(state_dir / "redis" / "redis.sock") in url
    client = redis.Redis.from_url(url, decode_responses=True)
    config = client.config_get("appendonly") | client.config_get("appendfsync") | client.config_get("dir")
    client.close()
    assert config == {
        "appendonly": "yes",
        "appendfsync": "always",
        "dir": str((state_dir / "redis").resolve()),
    }
    store, epoch = open_checked_store(url, server, state_dir)
    try:
        assert store.kind == "redis" and epoch
        store.create_app("kept", "hash-kept")
    finally:
        store.close()

    # A crash of the server (SIGKILL: no chance to write anything more) loses nothing written.
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    url, server = start(state_dir, servers)
    store, again = open_checked_store(url, server, state_dir)
    try:
        assert again == epoch
        assert store.app_for_key("hash-kept") == "kept"
    finally:
        store.close()

    server.stop()  # a clean stop (what LocalStack.close does) ends the process
    assert server.process.returncode == 0


def test_a_second_server_on_the_same_state_dir_is_refused(
    tmp_path: Path, redis_binary: str, servers: list[EmbeddedRedis]
) -> None:
    start(tmp_path / "state", servers)
    with pytest.raises(EmbeddedRedisError, match="already serving"):
        EmbeddedRedis.start(tmp_path / "state", redis_binary)


def test_a_long_state_dir_gets_a_loopback_port_instead_of_a_socket(
    tmp_path: Path, redis_binary: str, servers: list[EmbeddedRedis]
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    url, server = start(deep, servers)
    assert url.startswith("redis://127.0.0.1:")
    store, epoch = open_checked_store(url, server, deep)
    store.close()
    assert epoch


def test_an_emptied_store_is_refused_at_start_naming_what_was_lost(tmp_path: Path) -> None:
    url = f"{service_url('MODELLESS_TEST_REDIS_URL')}?prefix=epoch-{uuid.uuid4().hex[:8]}:"
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "credentials.json").write_text(json.dumps({"digits": "mlk_x", "text": "mlk_y"}))
    store, epoch = open_checked_store(url, None, state_dir)
    assert json.loads((state_dir / EPOCH_FILE).read_text())["epoch"] == epoch
    store.close()
    again, same = open_checked_store(url, None, state_dir)  # a restart on the same store
    assert same == epoch
    assert isinstance(again, RedisMetadataStore)
    again.flush_namespace()  # what a Redis restarted without persistence holds: nothing
    again.close()

    with pytest.raises(StoreEmptiedError) as refused:
        open_checked_store(url, None, state_dir)
    message = refused.value.message
    assert url.split("?")[0] in message and epoch in message
    assert "came back empty" in message and "digits, text" in message
    assert str(state_dir / EPOCH_FILE) in message  # how to start afresh


def test_memory_and_a_given_redis_url_are_used_as_given(tmp_path: Path) -> None:
    assert resolve_metadata_url("memory://", tmp_path) == ("memory://", None)
    assert resolve_metadata_url("redis://10.0.0.1:6380/2", tmp_path) == ("redis://10.0.0.1:6380/2", None)
    store, epoch = open_checked_store("memory://", None, tmp_path)
    assert (store.kind, epoch) == ("memory", "")  # nothing persists, nothing to check
    assert not (tmp_path / EPOCH_FILE).exists()


def test_without_a_redis_server_binary_auto_warns_loudly_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stack_module, "find_redis_server", lambda: None)
    assert resolve_metadata_url("auto", tmp_path) == ("memory://", None)
    warning = capsys.readouterr().err
    assert "WARNING" in warning and "IN MEMORY ONLY" in warning and "LOST" in warning
