"""Adaptive batching on a worker (Clipper §4.3): concurrent queries to one variant share a run.

Each loaded variant gets one ``VariantBatcher``: request threads ``submit`` their inputs and block;
one dispatch thread takes queued requests up to the current batch-size limit (counted in rows,
since one request may carry several inputs), runs the model once on the concatenated inputs and
hands each caller its own rows back.

Two mechanisms from Clipper, both bounded by each query's own latency budget:

- **AIMD batch-size limit** (``AimdController``): grow the limit by ``step`` after a full batch
  that ran within the tightest budget it carried, shrink it by ``backoff`` after a batch that ran
  over. The limit never leaves ``[1, max_limit]`` (the variant's largest useful batch).
- **Deadline cap**: a batch takes no more rows than keep its profiled latency within the
  tightest deadline among the queries it takes (those that can still meet theirs), so that a
  tight query joining a long queue of loose ones is not run in a batch too large for it; the
  rest wait for the next batch. The head of the queue is always taken.
- **Recent-budget cap**: a batch's profiled latency also stays within half the tightest budget
  the instance served over the last few seconds (``RecentTightestBudget``,
  ``budget_batch_cap``), whether or not such a query is queued now. One instance may serve
  queries of several budgets (model-less selection sends any query whose budget its profile
  meets); a tight query arriving while a batch sized for loose ones runs waits for that batch,
  then runs in the next: it meets its budget only if each takes at most half of it (the
  budget/2 rule the scaler plans an instance's capacity with,
  ``modelless.scaling.problem.saturation_for_budget``).
- **Delayed batching**: when fewer rows are queued than the limit, wait a short while (default
  0.5 ms) for more to arrive, but never past the moment where the tightest deadline in the batch
  could no longer be met given the profiled latency of the batch. While queries arrive sparsely
  (smoothed gap over twice the delay) there is no wait at all: a lone query pays nothing.

AIMD's signal is the batch's run time against the tightest budget among the requests it carried
that a run of their own rows could have met (``deadline - arrival``, as the profile has it).
Queueing is left out: it is load, which batching relieves, and shrinking batches because queries
queued would only deepen an overload. Budgets no batch size could meet are left out too.

A query never waits for batching past its own deadline. One already late when its batch is
formed (its deadline minus the batch's profiled latency is past) makes the batch leave at once,
with whatever is queued now: no fill delay at all. It is neither failed nor run alone: a late
answer is still an answer (the budget is a target, INFaaS §4.1), and under overload, where every
queued query is late, running them one by one would collapse throughput exactly when it is most
needed. What bounds a caller's wait is ``result_timeout_s``: past it, ``submit`` raises
``BatchTimeoutError`` (a model that hangs must not hang its callers forever).

**Concurrent runs** (``runners``): an instance tuned to run several batches at once
(``modelless.tuning``: RRL's request-level parallelism) gets that many dispatch threads over the
one queue; each takes the next batch as soon as it is free, so batches overlap on the session.

Deadlines are absolute times on ``time.monotonic()``'s clock (``deadline_after`` makes one).

Offline batch work (docs/ARCHITECTURE.md §6) has a lane of its own, ``submit_background``: the dispatch thread
runs a background request only when no online request is queued, alone (never batched with
online queries) and outside the AIMD controller. An online query that arrives meanwhile waits for
at most that one run, and the wait shows as queueing, not as a slower inference.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelless.exceptions import (
    BatcherClosedError,
    BatchTimeoutError,
    InvalidInputError,
)
from modelless.types import VariantProfile

DEFAULT_MAX_DELAY_S = 0.0005  # Clipper found ~ms delays enough; ours stay below a round trip
# The fill wait is skipped while queries arrive further apart than this many max delays on average:
# a lone query would pay the whole delay for a companion that is unlikely to come (with Poisson
# arrivals, under 1 - e^-0.5 = 40 % of the time). Where the model is the bottleneck, queries queue
# behind the running batch and are batched without any wait anyway.
IDLE_GAP_FACTOR = 2.0
GAP_SMOOTHING = 0.3  # weight of the newest gap in the smoothed one
GAP_CAP_FACTOR = 4.0  # gaps count for at most this many idle gaps
# A model that hangs must not hang its callers: under the dispatcher's 30 s cap on any query
# (MAX_INVOKE_TIMEOUT_S), so a caller still waiting hears a clear 503, not its own timeout. (A
# query with a latency target is abandoned by the dispatcher far sooner: its budget plus a grace.)
DEFAULT_RESULT_TIMEOUT_S = 25.0
# How long a budget an instance served keeps capping its batches. Long enough to span the gaps
# between a tight group's queries at the rates a shared instance sees (one every few hundred ms
# at a few QPS), short enough that an instance whose tight traffic has moved elsewhere gets its
# large batches back within a few seconds (the monitor's window, over which selection and the
# scaler see the instance, is as long).
BUDGET_WINDOW_S = 5.0

ModelFn = Callable[[np.ndarray], np.ndarray]  # a batch of inputs in, one output row per input row
EstimateFn = Callable[[int], float]  # rows -> expected latency (ms) of a batch of that many rows


def deadline_after(budget_ms: float) -> float:
    """The absolute deadline (``time.monotonic()`` clock) ``budget_ms`` from now."""
    return time.monotonic() + budget_ms / 1000.0


class AimdController:
    """Additive-increase / multiplicative-decrease of the batch-size limit (Clipper §4.3).

    Pure: no clock, no threads. Feed it one observation per batch and read ``limit``.

    Two choices differ from Clipper's, because our budgets are per query, not one SLO per model:
    the default backoff is 0.5 rather than Clipper's 0.9, so a tight-budget query arriving among
    loose ones brings the limit down in a couple of batches rather than a dozen late ones; and the
    limit grows only after a batch that filled it. A batch smaller than the limit says nothing
    about whether a larger one would fit, and growing on it anyway would let the limit drift to
    its maximum under light load, untested, until a burst forms a batch that is far too large
    (TCP's congestion-window validation, RFC 7661, for the same reason).
    """

    def __init__(self, max_limit: int, *, initial: int = 1, step: int = 1, backoff: float = 0.5) -> None:
        if max_limit < 1:
            raise ValueError(f"max_limit must be at least 1, not {max_limit}")
        if step < 1:
            raise ValueError(f"step must be at least 1, not {step}")
        if not 0.0 < backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), not {backoff}")
        self.max_limit = max_limit
        self.step = step
        self.backoff = backoff
        self._limit = min(max(1, initial), max_limit)

    @property
    def limit(self) -> int:
        return self._limit

    def observe(self, rows: int, latency_ms: float, budget_ms: float) -> int:
        """One batch of ``rows`` ran in ``latency_ms`` against the tightest ``budget_ms`` it
        carried; returns the new limit."""
        if latency_ms > budget_ms:
            # floor(limit * backoff) < limit for any limit > 1, so an overshoot always shrinks it.
            self._limit = max(1, math.floor(self._limit * self.backoff))
        elif rows >= self._limit:
            self._limit = min(self.max_limit, self._limit + self.step)
        return self._limit


class RecentTightestBudget:
    """The tightest latency budget seen over the last ``window_s`` seconds: a sliding-window
    minimum (a deque of budgets increasing from its head, each kept only while no tighter one
    came after it: O(1) amortised per observation).

    Pure: no clock, no threads (the caller passes ``now``, any monotonic clock in seconds), so it
    is driven tick by tick in tests; not thread-safe on its own (the batcher calls it under its
    lock)."""

    def __init__(self, window_s: float = BUDGET_WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        self.window_s = window_s
        self._seen: deque[tuple[float, float]] = deque()  # (when, budget_ms), budgets increasing

    def observe(self, budget_ms: float, now: float) -> None:
        """A query with ``budget_ms`` arrived at ``now``."""
        while self._seen and self._seen[-1][1] >= budget_ms:
            self._seen.pop()  # older and no tighter: it can never be the minimum again
        self._seen.append((now, budget_ms))
        self._expire(now)

    def tightest(self, now: float) -> float:
        """The tightest budget seen within the window (ms); infinity when none was."""
        self._expire(now)
        return self._seen[0][1] if self._seen else math.inf

    def _expire(self, now: float) -> None:
        while self._seen and self._seen[0][0] <= now - self.window_s:
            self._seen.popleft()


class BudgetCaps:
    """``budget_batch_cap`` of one profile, tabulated once: each lookup is then a bisection (the
    budget a query brings changes from query to query; the profile does not)."""

    def __init__(self, estimate_ms: EstimateFn, max_limit: int) -> None:
        # needs[i]: the smallest budget at which batches of 2..i+2 rows all fit (budget/2 rule).
        self._needs: list[float] = []
        worst = 0.0
        for rows in range(2, max_limit + 1):
            try:
                need = 2.0 * float(estimate_ms(rows))
            except Exception:  # a bad estimate caps nothing more than what is known to fit
                break
            if not math.isfinite(need):
                break
            worst = max(worst, need)
            self._needs.append(worst)

    def cap(self, budget_ms: float) -> int:
        return 1 + bisect.bisect_right(self._needs, budget_ms)


def budget_batch_cap(estimate_ms: EstimateFn, budget_ms: float, max_limit: int) -> int:
    """The largest batch (rows, 1..``max_limit``) whose profiled latency is at most half of
    ``budget_ms``: a query with that budget arriving while such a batch runs waits for it, then
    runs in the next one, and still meets its budget (the budget/2 rule). Sizes are tried upwards
    and the first that does not fit ends the search (profiles grow with the batch). 1 when even
    two rows do not fit (the head of the queue always runs); ``max_limit`` for an infinite
    budget. (``BudgetCaps`` answers the same for many budgets of one profile.)"""
    return BudgetCaps(estimate_ms, max_limit).cap(budget_ms)


def batch_limit(aimd_limit: int, tightest_budget_ms: float, caps: BudgetCaps) -> int:
    """The rows the next batch may take: the AIMD limit, capped by the recent-budget cap."""
    return min(aimd_limit, caps.cap(tightest_budget_ms))


def max_limit_for(variant: VariantProfile) -> int:
    """The largest batch worth forming: the profiler's largest useful batch, else the largest
    profiled one."""
    return max(1, variant.max_useful_batch or variant.max_batch)


def profile_estimate(variant: VariantProfile) -> EstimateFn:
    """Expected latency of a batch from the variant's profile (p99 at the next profiled size up;
    linear beyond the largest profiled size, where a request carrying many rows may land)."""

    def estimate(rows: int) -> float:
        if rows <= variant.max_batch:
            return variant.latency_ms(max(1, rows))
        return variant.latency_ms(variant.max_batch) * rows / variant.max_batch

    return estimate


@dataclass(frozen=True)
class BatchResult:
    """One caller's share of a batch run."""

    outputs: np.ndarray  # this caller's rows of the batch output, in its input order
    batch: int  # rows in the whole batch
    requests: int  # requests in the whole batch
    position: int  # this request's place in the batch (0: the first)
    queue_ms: float  # from submit to the start of the batch run
    inference_ms: float  # the batch run
    limit: int  # the AIMD limit after this batch


@dataclass(eq=False)
class _Request:
    inputs: np.ndarray
    arrived: float
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    result: BatchResult | None = None
    error: BaseException | None = None

    @property
    def rows(self) -> int:
        return int(self.inputs.shape[0])

    def joins(self, head: _Request) -> bool:
        # Only inputs of the same row shape and dtype concatenate; a request that does not match
        # waits for the next batch rather than failing a batch it was never part of.
        return self.inputs.shape[1:] == head.inputs.shape[1:] and self.inputs.dtype == head.inputs.dtype


class VariantBatcher:
    """The batching queue of one variant instance and its dispatch thread."""

    def __init__(
        self,
        name: str,
        model: ModelFn,
        estimate_ms: EstimateFn,
        max_limit: int,
        *,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        idle_gap_s: float | None = None,
        result_timeout_s: float = DEFAULT_RESULT_TIMEOUT_S,
        controller: AimdController | None = None,
        budget_window_s: float = BUDGET_WINDOW_S,
        runners: int = 1,
    ) -> None:
        if runners < 1:
            raise ValueError(f"runners must be at least 1, not {runners}")
        self.name = name
        self._model = model
        self._estimate_ms = estimate_ms
        self._max_delay_s = max_delay_s
        self._idle_gap_s = IDLE_GAP_FACTOR * max_delay_s if idle_gap_s is None else idle_gap_s
        self._gap_s = math.inf  # smoothed time between arrivals; none seen yet: no concurrency
        self._last_arrival: float | None = None
        self._result_timeout_s = result_timeout_s
        self.controller = controller or AimdController(max_limit)
        # The tightest budget among the online queries of the last BUDGET_WINDOW_S (lock held).
        self.recent_budgets = RecentTightestBudget(budget_window_s)
        self._caps = BudgetCaps(self._expected_ms, self.controller.max_limit)
        self._queue: deque[_Request] = deque()
        self._background: deque[_Request] = deque()  # offline work: runs only when _queue is empty
        self._cond = threading.Condition()
        self._closed = False
        # Counters for /stats and tests; written by the dispatch threads, under the lock.
        self.batches = 0
        self.requests = 0
        self.rows = 0
        self.largest_batch = 0
        self.background_runs = 0
        self.background_rows = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"batch-{name}-{index}", daemon=True)
            for index in range(runners)
        ]
        for thread in self._threads:
            thread.start()
        self._thread = self._threads[0]  # the one dispatch thread of an untuned instance

    @property
    def runners(self) -> int:
        return len(self._threads)

    # --- callers' side ------------------------------------------------------------------------

    def submit(self, inputs: np.ndarray, deadline: float) -> BatchResult:
        """Queue ``inputs`` (rows along the first axis) and block until their outputs are ready.

        Raises the model's own exception if the batch failed, ``BatchTimeoutError`` past the
        bounded wait, ``BatcherClosedError`` if the batcher no longer accepts work.
        """
        if inputs.ndim == 0:
            raise InvalidInputError("inputs must have a batch dimension")
        request = _Request(inputs, time.monotonic(), deadline)
        with self._cond:
            if self._closed:
                raise BatcherClosedError(f"batcher {self.name} is closed")
            self._note_arrival(request.arrived)
            self._note_budget(request)
            self._queue.append(request)
            self._cond.notify()
        if not request.done.wait(self._result_timeout_s):
            with self._cond:
                # Still queued: take it out so no batch runs it for nobody. Already running: its
                # result is simply dropped.
                if request in self._queue:
                    self._queue.remove(request)
            if not request.done.is_set():
                raise BatchTimeoutError(
                    f"batch on {self.name} did not complete within {self._result_timeout_s:.1f} s"
                )
        if request.error is not None:
            raise request.error
        assert request.result is not None  # done is set only after result or error
        return request.result

    def submit_background(self, inputs: np.ndarray) -> BatchResult:
        """Run ``inputs`` as background (offline) work and block until done: when no online
        request is queued, on its own. Its ``queue_ms`` is the wait for an idle moment. Raises
        like ``submit`` (``BatchTimeoutError`` when online traffic never left a gap in time)."""
        if inputs.ndim == 0:
            raise InvalidInputError("inputs must have a batch dimension")
        now = time.monotonic()
        request = _Request(inputs, now, now + self._result_timeout_s)
        with self._cond:
            if self._closed:
                raise BatcherClosedError(f"batcher {self.name} is closed")
            self._background.append(request)
            self._cond.notify()
        if not request.done.wait(self._result_timeout_s):
            with self._cond:
                if request in self._background:
                    self._background.remove(request)
            if not request.done.is_set():
                raise BatchTimeoutError(
                    f"background run on {self.name} found no idle moment within "
                    f"{self._result_timeout_s:.1f} s"
                )
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _note_arrival(self, now: float) -> None:
        """Smooth the time between arrivals (lock held). A gap after a long idle spell is capped,
        so that the first few queries of a burst bring the average down at once."""
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, GAP_CAP_FACTOR * self._idle_gap_s)
            self._gap_s = (
                gap if math.isinf(self._gap_s) else self._gap_s + GAP_SMOOTHING * (gap - self._gap_s)
            )
        self._last_arrival = now

    def _note_budget(self, request: _Request) -> None:
        """Remember the request's budget for the recent-budget cap (lock held). A budget that a
        run of its own rows could not meet is left out: that query is late whatever the batch
        size, and capping batches for it would only cost everyone else throughput."""
        budget_ms = (request.deadline - request.arrived) * 1000
        if budget_ms >= self._expected_ms(request.rows):
            self.recent_budgets.observe(budget_ms, request.arrived)

    def _limit(self, now: float) -> int:
        """The rows the next batch may take (lock held)."""
        return batch_limit(self.controller.limit, self.recent_budgets.tightest(now), self._caps)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting requests; what is already queued is still served, then the thread ends."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        ends = time.monotonic() + timeout_s
        for thread in self._threads:
            if threading.current_thread() is not thread:
                thread.join(max(0.0, ends - time.monotonic()))

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def current_limit(self) -> int:
        """The rows the next batch may take: AIMD's limit within the recent budgets' cap."""
        with self._cond:
            return self._limit(time.monotonic())

    def stats(self) -> dict[str, Any]:
        with self._cond:
            now = time.monotonic()
            return {
                "limit": self.controller.limit,
                "max_limit": self.controller.max_limit,
                "runners": len(self._threads),
                "budget_limit": self._limit(now),
                "tightest_budget_ms": _finite_or_none(self.recent_budgets.tightest(now)),
                "batches": self.batches,
                "requests": self.requests,
                "rows": self.rows,
                "largest_batch": self.largest_batch,
                "queued": len(self._queue),
                "background_runs": self.background_runs,
                "background_rows": self.background_rows,
                "arrival_gap_ms": None if math.isinf(self._gap_s) else round(self._gap_s * 1000, 3),
            }

    # --- the dispatch thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            work = self._next_batch()
            if work is None:
                return
            if isinstance(work, _Request):
                self._execute_background(work)
            else:
                self._execute(work)

    def _execute_background(self, request: _Request) -> None:
        started = time.monotonic()
        try:
            outputs = self._model(request.inputs)
            if outputs.ndim == 0 or outputs.shape[0] != request.rows:
                raise RuntimeError(f"model of {self.name} returned {outputs.shape} for {request.rows} rows")
        except Exception as error:
            request.error = error
            request.done.set()
            return
        finished = time.monotonic()
        with self._cond:
            self.background_runs += 1
            self.background_rows += request.rows
        request.result = BatchResult(
            outputs=outputs,
            batch=request.rows,
            requests=1,
            position=0,
            queue_ms=(started - request.arrived) * 1000,
            inference_ms=(finished - started) * 1000,
            limit=self.controller.limit,
        )
        request.done.set()

    def _take(self, limit: int, now: float) -> tuple[int, int]:
        """How many queued requests (a FIFO prefix) the next batch takes, and their rows.

        At most ``limit`` rows, and no more than keep the batch's profiled latency within the
        tightest deadline among the requests taken that can still meet theirs: a tight query
        never lands in a batch too large for it. Requests already late (their own rows alone
        would miss) do not cap it: they are late whatever the batch, and under overload, where
        all are, batching them is what keeps throughput up. The head is always taken, even alone
        over the limit (a request is never split). Called with the lock held.
        """
        head = self._queue[0]
        count, rows = 1, head.rows
        tightest = head.deadline if self._can_meet(head, now) else math.inf
        for request in itertools.islice(self._queue, 1, None):
            if rows + request.rows > limit or not request.joins(head):
                break
            joined_tightest = min(tightest, request.deadline) if self._can_meet(request, now) else tightest
            if now + self._expected_ms(rows + request.rows) / 1000.0 > joined_tightest:
                break  # it, and whoever queued behind it, go in the next batch
            count += 1
            rows += request.rows
            tightest = joined_tightest
        return count, rows

    def _can_meet(self, request: _Request, now: float) -> bool:
        """Whether a run of the request's own rows, started now, would meet its deadline."""
        return now + self._expected_ms(request.rows) / 1000.0 <= request.deadline

    def _expected_ms(self, rows: int) -> float:
        try:
            return max(0.0, float(self._estimate_ms(rows)))
        except Exception:  # a bad estimate must not kill the dispatch thread: just do not wait
            return math.inf

    def _next_batch(self) -> list[_Request] | _Request | None:
        """The next online batch; else, when no online request is queued, one background request;
        None once closed and drained."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._background:
                        # No online request waits: an idle moment for one background run.
                        return self._background.popleft()
                    # Nothing queued (or a caller whose wait ran out took itself out meanwhile).
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                now = time.monotonic()
                limit = self._limit(now)
                count, rows = self._take(limit, now)
                if rows >= limit or count < len(self._queue) or self._closed:
                    break  # full, or what is queued cannot join it anyway: waiting gains nothing
                if self._gap_s > self._idle_gap_s:
                    break  # queries arrive too sparsely for a wait to catch another one
                taken = list(itertools.islice(self._queue, count))
                # Leave early enough that the tightest deadline still holds for a batch this size.
                latest_start = min(r.deadline for r in taken) - self._expected_ms(rows) / 1000.0
                fill_until = min(taken[0].arrived + self._max_delay_s, latest_start)
                now = time.monotonic()
                if now >= fill_until:
                    break
                self._cond.wait(fill_until - now)  # an arrival wakes us to re-check
            return [self._queue.popleft() for _ in range(count)]

    def _execute(self, batch: list[_Request]) -> None:
        rows = sum(r.rows for r in batch)
        started = time.monotonic()
        try:
            inputs = batch[0].inputs if len(batch) == 1 else np.concatenate([r.inputs for r in batch])
            outputs = self._model(inputs)
            if outputs.ndim == 0 or outputs.shape[0] != rows:
                raise RuntimeError(
                    f"model of {self.name} returned {outputs.shape} for {rows} input rows: "
                    "outputs cannot be split back to their callers"
                )
        except Exception as error:  # every caller of the batch hears it; the thread lives on
            for request in batch:
                request.error = error
                request.done.set()
            return  # a failed run says nothing about latency: the limit stays
        finished = time.monotonic()
        inference_ms = (finished - started) * 1000
        # The tightest budget the batch carried, among requests that a run of their own rows could
        # have met: one that arrived with too little left (or none) is late whatever the batch
        # size, and shrinking the limit for it would only cost everyone else throughput.
        budgets = [
            (r.deadline - r.arrived) * 1000
            for r in batch
            if (r.deadline - r.arrived) * 1000 >= self._expected_ms(r.rows)
        ]
        with self._cond:
            limit = (
                self.controller.observe(rows, inference_ms, min(budgets))
                if budgets
                else self.controller.limit
            )
            self.batches += 1
            self.requests += len(batch)
            self.rows += rows
            self.largest_batch = max(self.largest_batch, rows)
        offset = 0
        for position, request in enumerate(batch):
            request.result = BatchResult(
                outputs=outputs[offset : offset + request.rows],
                batch=rows,
                requests=len(batch),
                position=position,
                queue_ms=(started - request.arrived) * 1000,
                inference_ms=inference_ms,
                limit=limit,
            )
            offset += request.rows
            request.done.set()


def _finite_or_none(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 3)
