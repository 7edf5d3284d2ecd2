"""A query's reply is due at its deadline, whatever happens behind the gateway.

The dispatcher bounds every attempt by the query's clock (``modelless.dispatch.attempts``), but
the clock runs in a thread of the gateway's pool: a query waiting for a thread (every thread busy
on workers that hung) or stuck in a call that does not honour its timeout would still be answered
late. The route therefore waits for its thread only until the deadline and then answers a 503
``deadline_exceeded`` itself; the thread's late answer is dropped. The thread's own attempts end
``REPLY_WRAP_UP_S`` before the deadline, so that its more informative 503 (naming every attempt)
comes first whenever the thread is not stuck: either way, the reply comes by the deadline.

The deadline is known once the thread has read the query's targets; until then, the longest any
query may take bounds the wait (``MAX_INVOKE_TIMEOUT_S`` from its arrival).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from modelless.dispatch.attempts import MAX_INVOKE_TIMEOUT_S, QueryClock
from modelless.exceptions import DeadlineExceededError
from modelless.types import QueryTargets

T = TypeVar("T")


class ReplyDeadline:
    """When a query's reply is due (``time.perf_counter()``'s clock). Made on the event loop;
    ``know`` is called from the thread that reads the query's targets."""

    def __init__(self, received: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._known = asyncio.Event()
        self.received = received
        self.due = received + MAX_INVOKE_TIMEOUT_S
        self.describe = f"{MAX_INVOKE_TIMEOUT_S:g} s at most"

    def know(self, targets: QueryTargets) -> None:
        """The query's targets are read: its reply is due at its clock's deadline."""
        clock = QueryClock.start(self.received, targets)
        self._loop.call_soon_threadsafe(self._set, clock.deadline, clock.describe())

    def _set(self, due: float, describe: str) -> None:
        self.due, self.describe = due, describe
        self._known.set()

    async def wait(self, work: Awaitable[T], what: str) -> T:
        """``work``'s result, or a DeadlineExceededError once the reply is due."""
        task = asyncio.ensure_future(work)
        known = asyncio.ensure_future(self._known.wait())
        try:
            while (left := self.due - time.perf_counter()) > 0:
                waiting = {task} if known.done() else {task, known}
                done, _ = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    return task.result()
        finally:
            known.cancel()
        # The thread goes on until its own clock stops it; its answer (or error) is dropped.
        task.add_done_callback(_drop)
        raise DeadlineExceededError(
            f"{what} was not answered within its deadline ({self.describe}, from its arrival)",
            retry_after_s=1,
        )


def _drop(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so that asyncio does not log it as never retrieved
