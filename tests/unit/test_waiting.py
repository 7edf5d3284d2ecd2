"""The tests' waiting helper (tests/waiting.py): timeouts scaled by the machine's load or the
environment, conditions polled until they hold, failures that say what was awaited and seen."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import waiting
from tests.waiting import SCALE_VARIABLE, scaled, time_scale, wait_for, wait_for_process


@pytest.fixture
def loaded_machine(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A 2-core machine whose 1-minute load average the test sets (``load[0] = ...``)."""
    load = [0.0]
    monkeypatch.delenv(SCALE_VARIABLE, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load[0], 0.0, 0.0))
    monkeypatch.setattr(waiting, "_cores", lambda: 2)
    return load


def test_an_idle_machine_waits_the_plain_timeout(loaded_machine: list[float]) -> None:
    loaded_machine[0] = 0.5
    assert time_scale() == 1.0
    assert scaled(3.0) == 3.0


def test_a_busy_machine_waits_in_proportion_to_its_load_per_core(loaded_machine: list[float]) -> None:
    loaded_machine[0] = 10.0  # load 10 on 2 cores: the machine the tests failed on
    assert time_scale() == 5.0
    assert scaled(15.0) == 75.0


def test_the_load_derived_scale_is_capped(loaded_machine: list[float]) -> None:
    loaded_machine[0] = 400.0
    assert time_scale() == waiting.MAX_LOAD_SCALE


def test_the_environment_sets_the_scale_whatever_the_load(
    loaded_machine: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded_machine[0] = 10.0
    monkeypatch.setenv(SCALE_VARIABLE, "2.5")
    assert scaled(4.0) == 10.0
    monkeypatch.setenv(SCALE_VARIABLE, "20")  # above the load cap: an explicit choice is kept
    assert time_scale() == 20.0


@pytest.mark.parametrize("value", ["0.5", "0", "-1", "nan", "fast"])
def test_a_scale_that_would_shorten_waits_or_is_no_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(SCALE_VARIABLE, value)
    with pytest.raises(ValueError, match=SCALE_VARIABLE):
        time_scale()


def test_wait_for_returns_the_first_value_that_holds_as_soon_as_it_holds() -> None:
    values = iter([None, False, 0, 7])
    assert wait_for(lambda: next(values), 5.0, "a value", interval_s=0.001) == 0  # 0 is a value

    states = iter(["loading", "loading", "active", "overloaded"])
    started = time.monotonic()
    assert (
        wait_for(lambda: next(states), 5.0, "active", interval_s=0.001, until=lambda s: s == "active")
        == "active"
    )
    assert time.monotonic() - started < 1.0


def test_a_wait_that_times_out_says_what_it_awaited_and_what_it_last_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SCALE_VARIABLE, "2")
    seen = iter(range(1000))
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for(
            lambda: next(seen), 0.05, "the count to reach 1000", interval_s=0.005, until=lambda n: n >= 1000
        )
    waited = time.monotonic() - started
    assert 0.1 <= waited < 2.0  # the timeout, scaled by 2
    message = str(failed.value)
    assert "the count to reach 1000" in message
    assert "scaled to 0.1 s" in message
    last = int(message.rsplit("last observed: ", 1)[1])
    assert 0 < last < 1000


def test_waiting_on_a_process_fails_at_once_when_it_exits_and_shows_its_output() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", "print('port already in use'); raise SystemExit(3)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for_process(process, lambda: False, 60.0, "the server to answer")
    assert time.monotonic() - started < 30.0  # not the whole (scaled) minute
    assert "exited with 3 while waiting for the server to answer" in str(failed.value)
    assert "port already in use" in str(failed.value)


def test_a_process_that_never_gets_ready_is_killed_when_the_wait_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SCALE_VARIABLE, "1")
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    with pytest.raises(AssertionError, match="the server to answer"):
        wait_for_process(process, lambda: None, 0.3, "the server to answer")
    assert process.poll() is not None
