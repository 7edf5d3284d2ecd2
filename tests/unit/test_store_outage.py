"""A metadata store outage, in process: every error keeps the API's JSON shape (a 503
``store_unavailable`` with ``Retry-After`` for the store, a 500 ``internal_error`` for anything
unexpected); the gateway answers the apps it knows from its last good reads of their keys,
profiles and workers, up to an age limit; ``/health`` is liveness and ``/health/ready`` reports
the store; a worker's failing reports are logged once, not every second.

The store here is the in-memory one with a switch that makes every call fail as the Redis store
does when Redis is unreachable (``StoreUnavailableError``); tests/faults/test_store_outage.py
stops a real Redis under a real gateway and worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

import modelless.auth as auth_module
import modelless.outages as outages_module
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.auth import ApiKeys, hash_key
from modelless.dispatch.live_view import LiveView
from modelless.dispatch.profiles import ProfileCache
from modelless.exceptions import StoreEmptiedError, StoreUnavailableError, UnauthorizedError
from modelless.metadata.base import MetadataStore
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.outages import RepeatedFailures
from modelless.repository.local import LocalModelRepository
from tests.unit.dispatch_kit import (
    APP,
    FakeClock,
    fake_clock,
    live_worker,
    make_instance,
    make_variant,
    seed,
    targets,
)
from tests.unit.test_api import (
    ADMIN,
    Api,
    InProcessLambda,
    error_of,
    images,
    make_settings,
    query,
    seed_digits,
)

STORE_CALLS = frozenset(name for name in dir(MetadataStore) if not name.startswith("_") and name != "kind")


class OutageStore(InMemoryMetadataStore):
    """The in-memory store, with ``down``: while set, every store call fails as the Redis store's
    do when Redis is unreachable (or, with ``raising``, with that exception instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.raising: Exception | None = None
        self.calls_while_down: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in STORE_CALLS and object.__getattribute__(self, "down"):
            self.calls_while_down.append(name)
            error = object.__getattribute__(self, "raising") or StoreUnavailableError(
                "the metadata store (redis at test) does not answer (timed out); try again shortly"
            )

            def unavailable(*args: Any, **kwargs: Any) -> Any:
                raise error

            return unavailable
        return attribute


@pytest.fixture
def outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Api, OutageStore]]:
    store = OutageStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    services = build_services(make_settings(tmp_path), store=store, lambda_tier=lambda_tier)
    # Errors are answered, never raised into the test: what a client sees is what is checked.
    client = TestClient(create_app(services), raise_server_exceptions=False)
    try:
        yield Api(client, services, store, repository, lambda_tier), store
    finally:
        store.down = False
        client.close()
        services.close()


def assert_store_unavailable(response: Any) -> dict[str, Any]:
    error = error_of(response, 503)
    assert error["code"] == "store_unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    return error


# --- every error keeps the API's shape --------------------------------------------------------


def test_store_outage_on_an_unknown_key_is_a_json_503_never_a_401(outage: tuple[Api, OutageStore]) -> None:
    api, store = outage
    api.create_app("digits")
    store.down = True

    unknown = {"X-Api-Key": "mlk_never_seen"}
    response = query(api, unknown, appID="digits", inputs=images().tolist(), accuracy=0.5)

    error = assert_store_unavailable(response)
    assert "does not answer" in error["message"]
    assert response.headers["X-Correlation-Id"]
    assert_store_unavailable(api.client.get("/v1/models", headers={"X-Api-Key": "mlk_never_seen"}))
    assert_store_unavailable(api.client.post("/v1/apps", json={"appID": "other"}, headers=ADMIN))


@pytest.mark.parametrize(
    "raised", [redis.ConnectionError("Connection refused"), redis.TimeoutError("Timeout reading from socket")]
)
def test_a_raw_redis_error_anywhere_is_a_json_503(outage: tuple[Api, OutageStore], raised: Exception) -> None:
    """A redis-py error that escaped the store's own translation still means the store is down."""
    api, store = outage
    key = api.create_app("digits")
    store.down, store.raising = True, raised

    response = api.client.get("/v1/models", headers=key)

    error = assert_store_unavailable(response)
    assert type(raised).__name__ not in error["message"] and str(raised) in error["message"]


def test_an_unexpected_exception_is_a_json_500_logged_with_its_traceback(
    outage: tuple[Api, OutageStore], caplog: pytest.LogCaptureFixture
) -> None:
    api, store = outage
    key = api.create_app("digits")
    store.down, store.raising = True, RuntimeError("a bug deep down")

    with caplog.at_level(logging.ERROR):
        response = api.client.get("/v1/models", headers=key)

    error = error_of(response, 500)
    assert error["code"] == "internal_error"
    assert "RuntimeError" in error["message"]
    correlation_id = response.headers["X-Correlation-Id"]
    assert correlation_id in error["message"]  # what to look up in the logs
    assert "a bug deep down" not in error["message"]  # internals stay in the log
    logged = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    assert logged and logged[0].exc_info is not None and "a bug deep down" in str(logged[0].exc_info[1])


# --- the gateway serves the apps it knows --------------------------------------------------------


def test_known_app_is_answered_during_an_outage_from_its_last_good_reads(
    outage: tuple[Api, OutageStore],
) -> None:
    api, store = outage
    key = api.create_app("digits")
    seed_digits(api, "digits")
    answered = query(api, key, appID="digits", inputs=images().tolist(), accuracy=0.9)
    assert answered.status_code == 200, answered.text

    store.down = True
    for _ in range(3):
        during = query(api, key, appID="digits", inputs=images(2).tolist(), accuracy=0.9)
        assert during.status_code == 200, during.text
        assert during.json()["model"] == answered.json()["model"]
    assert "app_for_key" in store.calls_while_down  # the store was asked, and did not answer
    # A target this gateway never cut a list for: from the app's profiles read before.
    other_target = query(api, key, appID="digits", inputs=images().tolist(), accuracy=0.5, latency=50)
    assert other_target.status_code == 200, other_target.text

    store.down = False
    assert query(api, key, appID="digits", inputs=images().tolist(), accuracy=0.9).status_code == 200


def test_api_keys_are_remembered_for_the_age_limit_only(monkeypatch: pytest.MonkeyPatch) -> None:
    store = OutageStore()
    store.create_app("digits", hash_key("mlk_known"))
    clock = FakeClock()
    monkeypatch.setattr(auth_module, "time", clock)
    keys = ApiKeys(store, max_age_s=300)
    assert keys.authorize("mlk_known", "digits") == "digits"

    store.down = True
    clock.now += 299
    assert keys.app_for_key("mlk_known") == "digits"
    with pytest.raises(StoreUnavailableError):
        keys.app_for_key("mlk_unknown")  # cannot be told: never a 401
    clock.now += 2  # 301 s after the last good read
    with pytest.raises(StoreUnavailableError):
        keys.app_for_key("mlk_known")

    store.down = False
    assert keys.app_for_key("mlk_known") == "digits"  # read again: remembered from now on


def test_api_keys_remembered_are_bounded_least_recently_used_first() -> None:
    store = OutageStore()
    for index in range(3):
        store.create_app(f"app-{index}", hash_key(f"mlk_{index}"))
    keys = ApiKeys(store, max_age_s=300, max_entries=2)
    for index in (0, 1, 0, 2):  # 1 is now the least recently used
        keys.app_for_key(f"mlk_{index}")

    store.down = True
    assert keys.app_for_key("mlk_0") == "app-0" and keys.app_for_key("mlk_2") == "app-2"
    with pytest.raises(StoreUnavailableError):
        keys.app_for_key("mlk_1")


def test_an_unknown_key_in_an_emptied_store_says_the_store_was_emptied() -> None:
    store = OutageStore()
    store.set_epoch("epoch-1")
    emptied = OutageStore()  # the same store, come back empty: no apps, no marker
    with pytest.raises(StoreEmptiedError, match="lost every app and key"):
        ApiKeys(emptied, 300, expected_epoch="epoch-1").app_for_key("mlk_any")
    with pytest.raises(UnauthorizedError, match="unknown API key"):  # the marker is there
        ApiKeys(store, 300, expected_epoch="epoch-1").app_for_key("mlk_any")


def test_profiles_and_input_contracts_answer_from_their_last_read_up_to_the_age_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = fake_clock(monkeypatch)
    store = OutageStore()
    seed(store, [make_variant("v")])
    cache = ProfileCache(store, ttl_s=60, stale_max_age_s=300)
    version = store.profiles_version(APP)
    assert [v.variant_id for v in cache.candidates(targets(accuracy=0.5), version)] == ["v"]
    contract = cache.input_contract(APP, None)

    store.down = True
    clock.now += 200  # past the TTL: the cache asks the store, which does not answer
    assert [v.variant_id for v in cache.candidates(targets(accuracy=0.6), version)] == ["v"]
    assert cache.input_contract(APP, None) is contract
    assert {"list_variants", "list_models"} <= set(store.calls_while_down)
    with pytest.raises(StoreUnavailableError):
        cache.input_contract(APP, "never-read")
    clock.now += 101  # 301 s after the reads
    with pytest.raises(StoreUnavailableError):
        cache.candidates(targets(accuracy=0.7), version)
    with pytest.raises(StoreUnavailableError):
        cache.input_contract(APP, None)


def test_live_view_decides_on_its_last_snapshot_up_to_the_age_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fake_clock(monkeypatch)
    store = OutageStore()
    seed(store, [make_variant("v")])
    store.put_worker_state(live_worker("w1", make_instance("v")))
    view = LiveView(store, ttl_s=0.2, stale_max_age_s=300)
    version, _, _ = view.view(APP)

    store.down = True
    clock.now += 10
    stale_version, stale_workers, fresh = view.view(APP, refresh=True)
    assert (stale_version, [w.worker_id for w in stale_workers]) == (version, ["w1"])
    assert fresh  # nothing fresher to be had: a decision must not ask again (and again)
    clock.now += 291
    with pytest.raises(StoreUnavailableError):
        view.view(APP)
    with pytest.raises(StoreUnavailableError):
        LiveView(store, stale_max_age_s=300).view(APP)  # never read: nothing to stand in


# --- health: liveness and readiness ------------------------------------------------------------


def test_health_is_liveness_and_ready_reports_the_store(outage: tuple[Api, OutageStore]) -> None:
    api, store = outage
    ready = api.client.get("/health/ready")
    assert ready.status_code == 200
    report = ready.json()
    assert report["status"] == "ready"
    assert report["store"]["kind"] == "memory" and report["store"]["reachable"] is True
    assert report["store"]["latencyMs"] >= 0

    store.down = True
    for path in ("/health", "/health/live"):
        assert api.client.get(path).json() == {"status": "ok"}
    error = assert_store_unavailable(api.client.get("/health/ready"))
    assert error["details"]["store"] == {"kind": "memory", "reachable": False}


def test_ready_is_503_store_emptied_once_the_store_lost_its_marker(tmp_path: Path) -> None:
    store = InMemoryMetadataStore()
    store.set_epoch("epoch-1")
    services = build_services(make_settings(tmp_path, metadata_epoch="epoch-1"), store=store)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    try:
        assert client.get("/health/ready").status_code == 200
        store._epoch = None  # what an emptied Redis looks like: the marker is gone with the rest
        response = client.get("/health/ready")
        error = error_of(response, 503)
        assert error["code"] == "store_emptied" and "epoch-1" in error["message"]
        assert error["details"]["store"]["reachable"] is True
        assert int(response.headers["Retry-After"]) >= 1
        unknown = client.get("/v1/models", headers={"X-Api-Key": "mlk_lost"})
        assert error_of(unknown, 503)["code"] == "store_emptied"  # not "unknown API key"
    finally:
        client.close()
        services.close()


# --- a worker's reports through an outage ------------------------------------------------------


def test_failing_reports_are_logged_once_then_rarely_and_their_end_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def warning(self, message: str, extra: dict[str, Any]) -> None:
            lines.append((message, extra))

    clock = FakeClock()
    monkeypatch.setattr(outages_module, "time", clock)
    failures = RepeatedFailures(
        Recorder(),  # type: ignore[arg-type]
        "state report failed; retrying every period",
        "state reports resumed",
        log_every_s=60,
    )
    failures.succeeded()
    for _ in range(60):  # a report a second for a minute
        failures.failed(StoreUnavailableError("the metadata store does not answer"))
        clock.now += 1
    assert [m for m, _ in lines] == ["state report failed; retrying every period"]
    failures.failed(StoreUnavailableError("the metadata store does not answer"))  # 60 s after the first
    assert len(lines) == 2 and lines[1][1]["failed_in_a_row"] == 61
    failures.succeeded()
    failures.succeeded()
    assert lines[2] == ("state reports resumed", {"failed_before": 61})
    assert len(lines) == 3


def test_a_client_that_drops_its_upload_is_a_log_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 33: a dropped upload (register_model reads its form itself) logged an unhandled
    ClientDisconnect traceback. Nobody is left to answer; nothing was accepted."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from modelless.api.app import UnexpectedErrorMiddleware

    async def reads_a_dropped_body(scope: Any, receive: Any, send: Any) -> None:
        raise ClientDisconnect()

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    middleware = UnexpectedErrorMiddleware(reads_a_dropped_body)
    with caplog.at_level(logging.INFO):
        asyncio.run(middleware({"type": "http", "path": "/v1/register_model"}, receive, send))

    assert sent == []  # no 500 to a caller who is gone
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_the_offline_supervisor_logs_a_store_outage_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 33: while Redis was down, the resume loop logged a raw traceback every round."""
    import threading

    from modelless.offline.launchers import ThreadLauncher

    rounds = 0
    resumed = threading.Event()

    def resumable() -> list[str]:
        nonlocal rounds
        rounds += 1
        if rounds <= 5:
            raise StoreUnavailableError("the metadata store does not answer (Connection refused)")
        resumed.set()
        return []

    launcher = ThreadLauncher(run=lambda job_id: None, resumable=resumable, resume_every_s=0.01)  # type: ignore[arg-type, return-value]
    with caplog.at_level(logging.INFO):
        launcher.start_supervisor()
        assert resumed.wait(30)
        launcher.close()

    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("could not look for offline jobs to resume; retrying") == 1
    assert messages.count("looking for offline jobs to resume again") == 1
    assert not [r for r in caplog.records if r.exc_info]
