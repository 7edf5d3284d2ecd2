"""Progress of long operations on stderr (a registration's profiling, an offline job): a rich
progress bar redrawn in place on a terminal; elsewhere (a file, a pipe, CI logs) a plain line
whenever it changes, so that logs stay readable. stdout keeps only the result."""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskID, TextColumn

from modelless.cli.core import CommandError, ExitCode
from modelless.cli.text import job_progress_line, job_state, progress_bar, registration_state, variant_states
from modelless.client import Client, ModellessClientError, RegistrationWaitTimeout


def _live_progress(stream: Any, columns: int | None, *state_columns: ProgressColumn) -> Progress:
    """A progress display drawn on ``stream`` as a terminal, redrawn on each update only (no
    refresh thread: updates come with each poll of the server)."""
    console = Console(file=stream, force_terminal=True, width=columns, highlight=False)
    return Progress(*state_columns, console=console, auto_refresh=False, transient=False)


class RegistrationDisplay:
    """A registration's progress on a stream (stderr): on a terminal (``live``), a rich bar with
    the done/total count, the state and ETA and the variants' states, redrawn in place; elsewhere
    a line whenever they change, and at least every ``every_s`` seconds while nothing does."""

    def __init__(
        self,
        stream: Any,
        live: bool,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        columns: int | None = None,
    ) -> None:
        self._stream = stream
        self._live = live
        self._every_s = every_s
        self._clock = clock
        self._columns = columns or shutil.get_terminal_size((120, 24)).columns
        self._shown: list[str] = []
        self._shown_at = -math.inf
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def draw(self, status: dict[str, Any]) -> None:
        if self._live:
            self._draw_live(status)
            return
        lines = [progress_bar(status)]
        states = variant_states(status)
        if states:
            lines.append("  " + states)
        now = self._clock()
        if lines != self._shown or now - self._shown_at >= self._every_s:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
            self._shown, self._shown_at = lines, now

    def _draw_live(self, status: dict[str, Any]) -> None:
        state = f"{registration_state(status)}: {status['message']}"
        states = variant_states(status)
        if states:
            state += "\n" + states
        total = int(status.get("total") or 0) or None
        done = int(status.get("done") or 0)
        if self._progress is None:
            self._progress = _live_progress(
                self._stream,
                self._columns,
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[state]}", markup=False),
            )
            self._task = self._progress.add_task("registration", total=total, completed=done, state=state)
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, total=total, completed=done, state=state)
        self._progress.refresh()

    def close(self) -> None:
        """End the live display, so that what follows starts on its own line."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def follow_registration(
    client: Client,
    registration_id: str,
    app: str,
    stall_timeout_s: float | None = 900.0,
    max_wait_s: float | None = None,
) -> dict[str, Any]:
    """Wait for a registration with its progress on stderr; its last reply (ready or failed).
    Giving up (no progress for ``stall_timeout_s``, ``max_wait_s`` in all, Ctrl-C, the server
    lost) raises a ``CommandError`` with exit code 2: the registration goes on server-side."""
    display = RegistrationDisplay(sys.stderr, sys.stderr.isatty())
    check = f"check on it with: modelless status {registration_id} --app {app}"

    def gave_up(message: str) -> CommandError:
        return CommandError(ExitCode.USAGE, message, "wait_gave_up", {"registrationId": registration_id})

    try:
        return client.wait_for_registration(
            registration_id,
            timeout_s=stall_timeout_s,
            on_progress=display.draw,
            max_wait_s=max_wait_s,
        )
    except RegistrationWaitTimeout as error:
        raise gave_up(f"gave up waiting: {error}; the registration goes on server-side ({check})") from None
    except KeyboardInterrupt:
        raise gave_up(f"stopped waiting; the registration goes on server-side ({check})") from None
    except ModellessClientError as error:
        raise gave_up(f"gave up waiting: the server answered {error}; {check}") from None
    except httpx.HTTPError as error:
        raise gave_up(
            f"gave up waiting: lost the server ({type(error).__name__}: {error}); {check}"
        ) from None
    finally:
        display.close()


class JobDisplay:
    """An offline job's progress on a stream (stderr): a rich bar with done/total, percentage,
    speed and failures on a terminal (``live``); elsewhere a line whenever it changes."""

    def __init__(self, stream: Any, live: bool, columns: int | None = None) -> None:
        self._stream = stream
        self._live = live
        self._columns = columns
        self._shown = ""
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def draw(self, job: dict[str, Any]) -> None:
        if not self._live:
            line = job_progress_line(job)
            if line != self._shown:
                print(line, file=self._stream, flush=True)
                self._shown = line
            return
        total = int(job.get("total") or 0) or None
        done = int(job.get("done") or 0)
        if self._progress is None:
            self._progress = _live_progress(
                self._stream,
                self._columns,
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[state]}", markup=False),
            )
            self._task = self._progress.add_task("job", total=total, completed=done, state=job_state(job))
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, total=total, completed=done, state=job_state(job))
        self._progress.refresh()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def follow_job(client: Client, job_id: str, app: str, poll_s: float) -> dict[str, Any]:
    """Wait for an offline job with its progress on stderr; its last reply (completed or
    failed). Giving up (Ctrl-C, the client's wait limit) raises a ``CommandError`` with exit
    code 2: the job goes on server-side."""
    display = JobDisplay(sys.stderr, sys.stderr.isatty())
    check = f"check on it with: modelless job status {job_id} --app {app}"
    try:
        return client.wait_for_job(job_id, on_progress=display.draw, poll_s=poll_s)
    except (KeyboardInterrupt, TimeoutError) as error:
        why = str(error) or "stopped waiting"
        raise CommandError(
            ExitCode.USAGE, f"gave up waiting: {why}; the job goes on server-side ({check})", "wait_gave_up"
        ) from None
    finally:
        display.close()
