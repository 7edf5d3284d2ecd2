"""Waiting for a registration: ``Client.wait_for_registration`` waits as long as it makes
progress (on a fake clock), and ``modelless register`` draws its progress on stderr and ends with
one line and an exit code, never a traceback (a fake client)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelless.cli as cli
from modelless.cli import (
    RegistrationDisplay,
    format_duration,
    progress_bar,
    registration_outcome,
    variant_states,
)
from modelless.client import Client, ModellessClientError, RegistrationWaitTimeout
from tests.unit.test_api import (
    Api,
    api,  # noqa: F401 (the fixture: the API over in-memory services)
)

REG = "reg-1"


def reply(status: str = "profiling", done: int = 0, total: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "registrationId": REG,
        "modelName": "resnet",
        "status": status,
        "done": done,
        "total": total,
        "message": extra.pop("message", "profiling variants"),
        "variantIds": extra.pop("variantIds", []),
        "pruned": extra.pop("pruned", 0),
        "variants": extra.pop("variants", {}),
        "createdAt": extra.pop("createdAt", 1000.0),
        "firstServableAt": extra.pop("firstServableAt", None),
        "finishedAt": extra.pop("finishedAt", None),
        "etaSeconds": extra.pop("etaSeconds", None),
        **extra,
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def scripted_client(
    replies: list[dict[str, Any]], clock: FakeClock, poll_s: float
) -> tuple[Client, list[float]]:
    """A Client whose registration() answers ``replies`` one per call (the last one forever)."""
    client = Client("http://modelless.invalid")
    asked_at: list[float] = []
    feed: Iterator[dict[str, Any]] = iter(replies)
    last: dict[str, Any] = {}

    def registration(registration_id: str) -> dict[str, Any]:
        nonlocal last
        assert registration_id == REG
        asked_at.append(clock.now)
        last = next(feed, last)
        return last

    client.registration = registration  # type: ignore[method-assign]
    return client, asked_at


# --- Client.wait_for_registration -----------------------------------------------------------------


def test_waiting_goes_on_while_the_registration_makes_progress() -> None:
    clock = FakeClock()
    # 20 polls of 10 s each, every one a step further: 200 s in all, beyond a 30 s stall timeout.
    replies = [reply(done=i, total=20) for i in range(20)] + [reply("ready", done=20, total=20)]
    client, asked = scripted_client(replies, clock, poll_s=10)
    seen: list[int] = []

    final = client.wait_for_registration(
        REG,
        timeout_s=30,
        poll_s=10,
        on_progress=lambda r: seen.append(r["done"]),
        clock=clock,
        sleep=clock.sleep,
    )

    assert final["status"] == "ready"
    assert seen == list(range(21))
    assert asked[-1] == 200.0


def test_the_stall_timeout_restarts_on_any_change_of_status_done_or_a_variant() -> None:
    clock = FakeClock()
    profiling = reply(done=1, variants={"fp32_all": "profiling"})
    # 25 s of the same reply (no timeout at 30 s)... then a variant's state moves: the clock restarts.
    replies = [profiling] * 6 + [reply(done=1, variants={"fp32_all": "ready"})] * 7 + [reply("ready", done=4)]
    client, _ = scripted_client(replies, clock, poll_s=5)

    final = client.wait_for_registration(REG, timeout_s=30, poll_s=5, clock=clock, sleep=clock.sleep)

    assert final["status"] == "ready" and clock.now == 65.0  # 30 s unchanged twice, never more


def test_a_stalled_registration_times_out_with_its_last_reply() -> None:
    clock = FakeClock()
    stuck = reply(done=2, message="profiling int8_all")
    client, _ = scripted_client([reply(done=1), stuck], clock, poll_s=5)

    with pytest.raises(RegistrationWaitTimeout, match="no progress for 30 s") as stalled:
        client.wait_for_registration(REG, timeout_s=30, poll_s=5, clock=clock, sleep=clock.sleep)

    assert stalled.value.last == stuck
    assert isinstance(stalled.value, TimeoutError)
    assert 30 < clock.now <= 40  # gave up at the first poll past 30 s without change


def test_the_overall_cap_stops_waiting_even_with_progress() -> None:
    clock = FakeClock()
    client, _ = scripted_client([reply(done=i, total=1000) for i in range(1000)], clock, poll_s=1)

    with pytest.raises(RegistrationWaitTimeout, match="not finished after 50 s"):
        client.wait_for_registration(
            REG, timeout_s=30, max_wait_s=50, poll_s=1, clock=clock, sleep=clock.sleep
        )
    assert 50 < clock.now <= 52


def test_without_a_stall_timeout_only_the_cap_or_the_end_stops_it() -> None:
    clock = FakeClock()
    client, _ = scripted_client([reply(done=1)] * 100 + [reply("failed", message="boom")], clock, poll_s=60)
    final = client.wait_for_registration(REG, timeout_s=None, poll_s=60, clock=clock, sleep=clock.sleep)
    assert final["status"] == "failed" and clock.now == 6000.0


# --- the progress bar and the states line ---------------------------------------------------------


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 4.4, 59.6, 60, 125, 3599, 3600, 3725)] == [
        "0s",
        "4s",
        "1m00s",
        "1m00s",
        "2m05s",
        "59m59s",
        "1h00m",
        "1h02m",
    ]


def test_the_bar_shows_first_servable_time_and_eta() -> None:
    status = reply(done=5, total=20, firstServableAt=1014.2, etaSeconds=125.0, message="profiled int8_all")
    assert progress_bar(status, width=8) == (
        "[##......] 5/20 profiling, first servable after 14s, ETA 2m05s: profiled int8_all"
    )
    done = reply("ready", done=20, total=20, firstServableAt=1014.2, etaSeconds=0.0, message="20 kept")
    assert progress_bar(done, width=4) == "[####] 20/20 ready, first servable after 14s: 20 kept"


def test_variant_states_are_grouped_and_queued_ones_counted() -> None:
    states = {
        "fp32_all": "ready",
        "int8_all": "ready",
        "int8_basic": "profiling",
        "fp16_basic": "failed",
        "fp32_basic": "pruned",
        "int8-static_all": "queued",
        "int8-static_basic": "queued",
    }
    assert variant_states(reply(variants=states)) == (
        "ready: fp32_all int8_all | profiling: int8_basic | failed: fp16_basic | pruned: fp32_basic"
        " | queued: 2"
    )
    assert variant_states({"status": "queued"}) == ""


def test_the_display_redraws_in_place_on_a_terminal() -> None:
    stream = io.StringIO()
    display = RegistrationDisplay(stream, live=True, columns=200)
    display.draw(reply(done=1, variants={"fp32_all": "profiling"}))
    display.draw(reply(done=2, variants={"fp32_all": "ready"}, etaSeconds=65.0))
    display.close()

    text = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())  # colours aside
    # Each redraw goes back up over the two lines drawn (bar, variants' states), clearing them.
    frames = text.split("\r\x1b[2K\x1b[1A\x1b[2K")
    assert len(frames) >= 2
    assert "1/4 profiling: profiling variants" in frames[0] and "profiling: fp32_all" in frames[0]
    last = frames[-1]
    assert "2/4 profiling, ETA 1m05s: profiling variants" in last and "ready: fp32_all" in last
    assert "fp32_all" not in last.replace("ready: fp32_all", "")  # the old state is gone
    assert text.rstrip("\x1b[?25h").endswith("\n")  # what follows starts on its own line


def test_the_display_writes_changed_lines_and_a_periodic_line_elsewhere() -> None:
    stream = io.StringIO()
    clock = FakeClock()
    display = RegistrationDisplay(stream, live=False, every_s=30, clock=clock)
    for seconds, done in [(0, 1), (5, 1), (10, 2), (20, 2), (45, 2)]:
        clock.now = seconds
        display.draw(reply(done=done))
    lines = stream.getvalue().splitlines()
    assert "\x1b" not in stream.getvalue()
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "2/4"]  # changes, then 35 s later


# --- `modelless register`: endings and exit codes ---------------------------------------------------


class FakeClient:
    """What the register command uses of a Client."""

    def __init__(
        self,
        replies: list[dict[str, Any]],
        wait_error: BaseException | None = None,
        register_error: BaseException | None = None,
    ) -> None:
        self.replies = replies
        self.wait_error = wait_error
        self.register_error = register_error

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def register_model(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.register_error is not None:
            raise self.register_error
        return reply("queued")

    def wait_for_registration(self, registration_id: str, **kwargs: Any) -> dict[str, Any]:
        for status in self.replies:
            kwargs["on_progress"](status)
        if self.wait_error is not None:
            raise self.wait_error
        return self.replies[-1]


def run_register(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, client: FakeClient, *extra: str) -> int:
    """`modelless register ...` with ``client``; returns the exit code."""
    monkeypatch.setattr(cli, "_client", lambda args: client)
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    (tmp_path / "v.npz").write_bytes(b"npz")
    argv = ["register", "--app", "a", "--name", "resnet", "--model", str(tmp_path / "m.onnx")]
    argv += ["--valset", str(tmp_path / "v.npz"), *extra]
    code = 0
    try:
        cli.main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code


FINISHED = reply(
    "ready",
    done=4,
    variantIds=["a", "b", "c"],
    pruned=5,
    firstServableAt=1012.0,
    finishedAt=1130.0,
    variants={"fp32_all": "ready"},
)


def test_a_ready_registration_ends_with_one_line_and_exit_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_register(monkeypatch, tmp_path, FakeClient([reply(done=1), FINISHED]))
    out, err = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[-1] == (
        "resnet ready: 3 variants servable (5 pruned as dominated); "
        "first servable after 12s, all profiled after 2m10s"
    )
    assert "1/4 profiling" in err and "Traceback" not in out + err


def test_a_failed_registration_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = reply("failed", message="RuntimeError: variant build step failed: bad graph")
    code = run_register(monkeypatch, tmp_path, FakeClient([failed]))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        err.splitlines()[-1]
        == "registration of resnet failed: RuntimeError: variant build step failed: bad graph"
    )


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            RegistrationWaitTimeout("registration reg-1 made no progress for 900 s", reply()),
            "made no progress",
        ),
        (httpx.ReadTimeout("timed out"), "lost the server (ReadTimeout: timed out)"),
        (ModellessClientError(503, "unavailable", "store down"), "the server answered 503 unavailable"),
        (KeyboardInterrupt(), "stopped waiting"),
    ],
)
def test_giving_up_waiting_exits_2_and_says_how_to_check(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    said: str,
) -> None:
    code = run_register(monkeypatch, tmp_path, FakeClient([reply(done=1)], wait_error=error))
    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 2
    assert said in last
    assert "modelless status reg-1 --app a" in last
    assert "Traceback" not in last


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            ModellessClientError(400, "invalid_model", "not ONNX", {"field": "model"}),
            "registration refused: 400",
        ),
        (httpx.ConnectError("connection refused"), "could not reach the server (ConnectError"),
    ],
)
def test_a_refused_or_unsent_registration_exits_1_or_3_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    said: str,
) -> None:
    code = run_register(monkeypatch, tmp_path, FakeClient([], register_error=error))
    err = capsys.readouterr().err
    # Refused (4xx): 1; the server unreachable: 3, as for every command (modelless.cli.ExitCode).
    assert code == (3 if isinstance(error, httpx.ConnectError) else 1)
    assert said in err.splitlines()[-1] and "Traceback" not in err


def test_the_outcome_line_of_a_registration_without_timings() -> None:
    assert registration_outcome(reply("ready", variantIds=["x"], pruned=0), "m") == (
        "m ready: 1 variants servable (0 pruned as dominated)"
    )


def test_register_takes_wait_limits() -> None:
    args = cli.parse_args(
        [
            "register",
            "--app",
            "a",
            "--name",
            "n",
            "--model",
            "m",
            "--valset",
            "v",
            "--stall-timeout",
            "60",
            "--max-wait",
            "3600",
        ]
    )
    assert (args.stall_timeout, args.max_wait) == (60.0, 3600.0)
    defaults = cli.parse_args(["register", "--app", "a", "--name", "n", "--model", "m", "--valset", "v"])
    assert (defaults.stall_timeout, defaults.max_wait) == (900.0, None)


# --- the API reply carries the progress -------------------------------------------------------------


def test_the_registration_reply_carries_states_reasons_eta_and_times(request: pytest.FixtureRequest) -> None:
    served: Api = request.getfixturevalue("api")
    from modelless.types import ModelRecord, Registration, RegistrationStatus

    headers = served.create_app("app-r")
    registration = Registration(
        "reg-r",
        "app-r",
        "resnet",
        status=RegistrationStatus.PROFILING,
        created_at=1000.0,
        done=3,
        total=20,
        variants={"fp32_all": "ready", "int8_all": "profiling", "int8_basic": "queued"},
        prune_reasons={"app-r/resnet/fp32_basic/cpu-1t": "dominated by fp32_all/cpu-1t: ..."},
        eta_s=95.5,
        first_servable_at=1012.5,
    )
    model = ModelRecord(
        "app-r", "resnet", "input", [3], "float32", 10, "reg-r", "apps/app-r/resnet/source.onnx"
    )
    served.store.add_model(model, registration)

    body = served.client.get("/v1/registrations/reg-r", headers=headers).json()

    assert body["variants"] == registration.variants
    assert body["pruneReasons"] == registration.prune_reasons
    assert (body["etaSeconds"], body["firstServableAt"], body["createdAt"]) == (95.5, 1012.5, 1000.0)
    assert body["finishedAt"] is None and (body["done"], body["total"]) == (3, 20)
    assert "first servable after 12s, ETA 1m36s" in progress_bar(body)
