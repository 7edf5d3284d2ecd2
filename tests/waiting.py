"""Waiting in tests: on a condition, never a fixed sleep, with a timeout scaled for a busy machine.

A test that waits for a state change (a worker's report, an instance turning Overloaded, a lease
expiring, a process starting or ending) polls a condition and returns the moment it holds; its
timeout is only the point at which the test gives up. That point is scaled by ``time_scale()``:
on a loaded machine the same transition takes longer (processes wait for a core), and a timeout
met only by an idle box makes the test fail for the machine's sake, not the code's. Only waiting
scales: what a test asserts (a promised bound, a measured latency) never goes through here.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")
V = TypeVar("V")

SCALE_VARIABLE = "MODELLESS_TEST_TIME_SCALE"
# The load-derived scale stops here. The 1-minute load average lags (a burst that has just begun
# does not show yet) and, in a container, counts the host's processes too: past this the figure
# says more about the host than about how late our processes run, and a test that really fails
# must still fail within minutes, not hang the suite. A machine known to be slower than this
# sets MODELLESS_TEST_TIME_SCALE explicitly.
MAX_LOAD_SCALE = 6.0


def _cores() -> int:
    """The cores this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def time_scale() -> float:
    """How much longer than on an idle machine a wait may take, read when the wait starts.

    ``MODELLESS_TEST_TIME_SCALE`` when set (at least 1: waits end as soon as their condition
    holds, so a shorter timeout saves nothing and only makes tests flaky); else the machine's
    load per core (the 1-minute load average over the usable cores), at least 1 and at most
    ``MAX_LOAD_SCALE``. Load 10 on 2 cores waits 5 times as long as an idle machine."""
    configured = os.environ.get(SCALE_VARIABLE, "").strip()
    if configured:
        try:
            scale = float(configured)
        except ValueError:
            raise ValueError(f"{SCALE_VARIABLE} must be a number, not {configured!r}") from None
        if not scale >= 1.0:  # also refuses NaN
            raise ValueError(f"{SCALE_VARIABLE} must be at least 1 (it lengthens waits), not {configured!r}")
        return scale
    per_core = os.getloadavg()[0] / _cores()
    return min(MAX_LOAD_SCALE, max(1.0, per_core))


def scaled(seconds: float) -> float:
    """``seconds`` of waiting on an idle machine, as long as this machine needs now."""
    return seconds * time_scale()


@overload
def wait_for(
    probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = ..., until: None = None
) -> T: ...


@overload
def wait_for(
    probe: Callable[[], V],
    timeout_s: float,
    what: str,
    interval_s: float = ...,
    *,
    until: Callable[[V], bool],
) -> V: ...


def wait_for(
    probe: Callable[[], object],
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    until: Callable[[Any], bool] | None = None,
) -> object:
    """Poll ``probe`` every ``interval_s`` until it returns something other than None or False
    (with ``until``: until ``until(value)`` holds), and return that value; fail after
    ``scaled(timeout_s)`` saying what was awaited and what the probe last returned (``until``
    lets a probe return the state itself, so that a failure shows the state it was stuck in).
    ``timeout_s`` is the wait an idle machine needs, with its margin."""
    limit_s = scaled(timeout_s)
    started = time.monotonic()
    while True:
        value = probe()
        if until(value) if until is not None else (value is not None and value is not False):
            return value
        waited = time.monotonic() - started
        if waited >= limit_s:
            raise AssertionError(
                f"timed out after {waited:.1f} s waiting for {what} "
                f"(timeout {timeout_s:g} s scaled to {limit_s:.1f} s for this machine's load); "
                f"last observed: {value!r}"
            )
        time.sleep(interval_s)


def wait_for_process(
    process: subprocess.Popen[str], probe: Callable[[], T | None], timeout_s: float, what: str
) -> T:
    """``wait_for`` on a process being started (a server coming up): fails at once if the process
    exits meanwhile; on any failure the process is killed and its output (when piped) goes into
    the message."""

    def running_probe() -> T | None:
        if process.poll() is not None:
            raise AssertionError(f"the process exited with {process.returncode} while waiting for {what}")
        return probe()

    try:
        return wait_for(running_probe, timeout_s, what, interval_s=0.2)
    except AssertionError as error:
        if process.poll() is None:
            process.kill()
        process.wait()
        output = process.stdout.read() if process.stdout else ""
        raise AssertionError(f"{error}; its output:\n{output}") from None
