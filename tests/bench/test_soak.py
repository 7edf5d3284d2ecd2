"""The soak benchmark (bench/soak.py) at smoke size: the real stack (its own process, real workers,
the local Lambda tier) on 127.0.0.1, the tests' linear digits model registered over the API, a
seconds-long capacity search and soak; and its error accounting, fed requests that must fail."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from bench import loadgen, soak
from bench.soak import NO_REPLY, Session, SoakConfig
from tests.models import linear_model, valset_npz

# Seconds, not minutes: the point is the code path and the report, not the figures.
SMOKE = SoakConfig(
    duration_s=4.0,
    load=0.8,
    latency_ms=200.0,  # generous: a busy test machine must still find a capacity
    workers=1,
    lambda_concurrency=1,
    window_s=2.0,
    sample_every_s=0.5,
    warmup_s=1.0,
    request_timeout_s=10.0,
    ladder=(1, 2),
    ramp=(0.3, 0.5),
    level_s=1.0,
    level_warmup_s=0.2,
    warm_s=1.0,
    # Profiling kept short: registration is not what this measures.
    stack_env={"MODELLESS_PROFILE_RUNS": "20", "MODELLESS_PROFILE_MIN_RUNS": "5"},
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SoakConfig, Session]]:
    root = tmp_path_factory.mktemp("soak")
    (root / "linear.onnx").write_bytes(linear_model())
    (root / "val.npz").write_bytes(valset_npz())
    config = dataclasses.replace(SMOKE, model=root / "linear.onnx", valset=root / "val.npz", state_dir=root)
    with soak.session(config, log=lambda line: None) as session:
        yield config, session


def test_a_smoke_soak_measures_capacity_soaks_and_reports_memory(
    live: tuple[SoakConfig, Session], tmp_path: Path
) -> None:
    config, session = live
    report = soak.soak(config, session, log=lambda line: None)

    modes = [level["mode"] for level in report["capacity_levels"]]
    assert modes[0] == "closed" and "open" in modes  # the peak first, then open-loop rates
    assert report["capacity_qps"] > 0
    assert report["rate_qps"] == pytest.approx(0.8 * report["capacity_qps"], abs=0.1)

    totals = report["totals"]
    windows = report["windows"]
    assert len(windows) >= 2
    assert totals["sent"] == sum(w["sent"] for w in windows) > 0
    assert totals["sent"] == totals["ok"] + totals["errors"]
    assert totals["errors"] == sum(totals["errors_by_kind"].values())
    assert 0.0 <= totals["slo_attainment"] <= 1.0
    assert totals["p50_ms"] <= totals["p99_ms"] <= totals["max_ms"]
    assert sum(totals["tiers"].values()) == totals["ok"]

    memory = report["memory"]
    roles = {p["role"] for p in memory["processes"]}
    assert {"gateway", "worker"} <= roles
    gateway = next(p for p in memory["processes"] if p["role"] == "gateway")
    assert gateway["pid"] == session.stack.pid
    assert gateway["samples"] >= 3 and gateway["slope_mb_per_min"] is not None and gateway["judged"]
    assert 0 < gateway["soak_start_mb"] <= gateway["peak_mb"]
    assert isinstance(memory["flat"], bool)
    assert len(report["memory_samples"]) >= 6  # every 0.5 s over the seconds of warm-up and soak

    written = soak.write_outputs(report, "scripts/bench soak (smoke)", tmp_path)
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert saved["totals"] == totals and saved["headlines"] == [soak.headline(report)]
    text = written.read_text()
    assert text.startswith("## Soak:") and "scripts/bench soak (smoke)" in text
    assert f"**{totals['errors']}**" in text


@pytest.fixture
def dropping_server() -> Iterator[int]:
    """A port on 127.0.0.1 whose server accepts every connection and closes it unanswered."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    listener.settimeout(0.1)
    stop = threading.Event()

    def drop() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listener.accept()
                connection.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_every_failed_request_is_counted_by_kind(
    live: tuple[SoakConfig, Session], dropping_server: int
) -> None:
    config, session = live
    quiet = lambda line: None  # noqa: E731
    answered = soak.run_open_loop(session.loadgen, session.target, 20.0, 1.0, config, quiet)
    # Refused: a key the gateway does not know. Unanswered: a server that drops every connection.
    refused_target = dataclasses.replace(session.target, headers={"X-Api-Key": "not-a-key"})
    refused = soak.run_open_loop(session.loadgen, refused_target, 20.0, 1.0, config, quiet)
    nobody = dataclasses.replace(session.target, url=f"http://127.0.0.1:{dropping_server}/v1/online_query")
    unanswered = soak.run_open_loop(session.loadgen, nobody, 20.0, 1.0, config, quiet)

    ok = sum(w.ok for w in answered)
    refused_count = sum(w.sent for w in refused)
    unanswered_count = sum(w.sent for w in unanswered)
    assert ok > 0 and refused_count > 0 and unanswered_count > 0
    assert all(w.statuses == {"401": w.sent} for w in refused)
    assert all(w.statuses == {"0": w.sent} for w in unanswered)
    # The real target's own failures, if a busy machine made any, are counted too.
    answered_errors = Counter(
        s for w in answered for s, n in w.statuses.items() for _ in range(n) if s[0] != "2"
    )
    memory: dict[str, object] = {}
    report = soak.summarise(config, session.model, 1.0, [], 0.8, [*answered, *refused, *unanswered], memory)

    kinds = report["totals"]["errors_by_kind"]
    assert kinds.pop("HTTP 401") == refused_count + answered_errors.pop("401", 0)
    no_reply = [kind for kind in kinds if kind.startswith(NO_REPLY)]
    assert len(no_reply) == 1 and kinds.pop(no_reply[0]) == unanswered_count + answered_errors.pop("0", 0)
    assert kinds == {f"HTTP {status}": count for status, count in answered_errors.items()}
    assert report["totals"]["errors"] == refused_count + unanswered_count + sum(
        w.sent - w.ok for w in answered
    )
    assert report["totals"]["ok"] == ok


def test_the_soak_sends_nowhere_but_127_0_0_1(live: tuple[SoakConfig, Session]) -> None:
    _, session = live
    elsewhere = dataclasses.replace(session.target, url="http://192.0.2.1:80/v1/online_query")
    with pytest.raises(ValueError, match=r"only to 127\.0\.0\.1"):
        soak.job(elsewhere, "open", 1.0, 1.0, rate=1.0)


def test_the_load_generator_never_reuses_a_connection_the_server_may_have_closed() -> None:
    # The soak's first runs counted a few "no reply" errors per window: requests written on
    # kept-alive connections idle past the gateway's keep-alive timeout, as it closed them.
    class Writer:
        closed = False

        def close(self) -> None:
            self.closed = True

    def connection(idle_s: float) -> loadgen.Connection:
        made = loadgen.Connection(cast(Any, None), cast(Any, Writer()))
        made.used_at = now - idle_s
        return made

    now = 1000.0
    stale, older_fresh, fresh = connection(30.0), connection(1.0), connection(0.1)
    idle = [stale, older_fresh, fresh]  # in order of use, the latest last
    assert loadgen.take_idle(idle, now) is fresh
    assert loadgen.take_idle(idle, now) is older_fresh
    assert loadgen.take_idle(idle, now) is None  # idle past IDLE_REUSE_S: closed, not reused
    assert idle == [] and cast(Any, stale.writer).closed

    too_old = [connection(loadgen.IDLE_REUSE_S + 0.5), connection(loadgen.IDLE_REUSE_S + 0.1)]
    assert loadgen.take_idle(too_old, now) is None and too_old == []
    assert loadgen.take_idle([], now) is None
