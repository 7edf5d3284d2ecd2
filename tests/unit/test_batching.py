"""Adaptive batching (Clipper §4.3): the AIMD controller tick by tick, and the batcher with a fake
model (a plain callable, no onnxruntime).

Batches are formed deterministically by holding the fake model's first run on a gate while the
next requests queue up behind it. Every wait is bounded; no sleep is longer than a few ms.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from modelless.exceptions import BatcherClosedError, BatchTimeoutError
from modelless.serving.batching import (
    AimdController,
    BatchResult,
    BudgetCaps,
    RecentTightestBudget,
    VariantBatcher,
    batch_limit,
    budget_batch_cap,
    deadline_after,
    max_limit_for,
    profile_estimate,
)
from modelless.types import VariantProfile
from tests.waiting import scaled, wait_for

WAIT_S = 5.0  # bound on every wait for a thread or a queue (scaled); never reached when things work
LOOSE_MS = 10_000.0  # a budget no test comes near


# --- the AIMD controller ----------------------------------------------------------------------


def linear_latency(batch: int) -> float:
    """1 ms fixed cost + 0.5 ms per row: batches up to 18 rows fit a 10 ms budget."""
    return 1.0 + 0.5 * batch


def run_saturated(controller: AimdController, ticks: int, budget_ms: float) -> list[int]:
    """Every batch fills the limit (a saturated queue); the limits seen, tick by tick."""
    limits = []
    for _ in range(ticks):
        rows = controller.limit
        controller.observe(rows, linear_latency(rows), budget_ms)
        limits.append(controller.limit)
    return limits


def test_aimd_increases_additively_while_full_batches_fit_the_budget() -> None:
    controller = AimdController(max_limit=64, initial=1, step=2)

    assert [controller.observe(controller.limit, 1.0, 10.0) for _ in range(4)] == [3, 5, 7, 9]


def test_aimd_does_not_grow_on_a_batch_smaller_than_the_limit() -> None:
    controller = AimdController(max_limit=64, initial=8)

    assert controller.observe(3, 1.0, 10.0) == 8  # 3 rows say nothing about whether 9 would fit
    assert controller.observe(8, 1.0, 10.0) == 9


def test_aimd_halves_when_a_batch_runs_over_its_budget() -> None:
    controller = AimdController(max_limit=64, initial=20)

    assert controller.observe(20, 12.0, 10.0) == 10
    assert controller.observe(10, 12.0, 10.0) == 5
    assert controller.observe(3, 12.0, 10.0) == 2  # a partial batch over budget still backs off


def test_aimd_respects_its_bounds() -> None:
    controller = AimdController(max_limit=4, initial=100)
    assert controller.limit == 4  # the initial limit is clamped too
    for _ in range(10):
        controller.observe(controller.limit, 0.1, 10.0)
    assert controller.limit == 4
    for _ in range(10):
        controller.observe(controller.limit, 50.0, 10.0)
    assert controller.limit == 1
    assert AimdController(max_limit=8, initial=0).limit == 1


@pytest.mark.parametrize(
    "kwargs", [{"max_limit": 0}, {"max_limit": 8, "step": 0}, {"max_limit": 8, "backoff": 1.0}]
)
def test_aimd_rejects_nonsense_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AimdController(**kwargs)  # type: ignore[arg-type]


def test_aimd_converges_near_the_largest_batch_that_fits() -> None:
    controller = AimdController(max_limit=64, initial=1)

    limits = run_saturated(controller, 200, budget_ms=10.0)

    # Climbs to 18 (the largest fit), probes 19 once (over: 10.5 ms), halves, climbs again.
    assert max(limits) == 19
    settled = limits[50:]
    assert min(settled) >= 9
    over = sum(linear_latency(limit) > 10.0 for limit in settled)
    assert over <= len(settled) // 10 + 1  # one probe over budget per climb of ~10 batches
    # The first time the limit reaches 19, it went there one step at a time from 1.
    assert limits[:18] == list(range(2, 20))


def test_aimd_with_clippers_gentle_backoff_settles_tightly() -> None:
    controller = AimdController(max_limit=64, initial=1, backoff=0.9)

    settled = run_saturated(controller, 200, budget_ms=10.0)[50:]

    assert set(settled) <= {17, 18, 19}
    assert abs(sum(settled) / len(settled) - 18) < 1.0


def test_aimd_follows_a_budget_that_tightens_and_loosens() -> None:
    controller = AimdController(max_limit=64, initial=1)
    run_saturated(controller, 100, budget_ms=10.0)

    tight = run_saturated(controller, 100, budget_ms=4.0)[20:]  # fits up to 6 rows
    assert max(tight) <= 7 and min(tight) >= 3
    loose = run_saturated(controller, 100, budget_ms=1000.0)
    assert loose[-1] == 64


# --- the recent-budget cap, tick by tick on a fake clock ----------------------------------------


def test_the_tightest_recent_budget_is_a_sliding_window_minimum() -> None:
    window = RecentTightestBudget(window_s=5.0)
    assert window.tightest(0.0) == math.inf  # nothing seen: no cap

    window.observe(10.0, now=0.0)
    window.observe(2.0, now=1.0)
    window.observe(10.0, now=2.0)  # a looser one after a tight one does not loosen it
    assert window.tightest(2.0) == 2.0
    assert window.tightest(5.9) == 2.0
    assert window.tightest(6.0) == 10.0  # the tight one left the window; the t=2 loose one has not
    assert window.tightest(7.0) == math.inf
    window.observe(4.0, now=8.0)
    window.observe(3.0, now=9.0)
    assert window.tightest(9.0) == 3.0
    assert window.tightest(14.0) == math.inf
    with pytest.raises(ValueError):
        RecentTightestBudget(window_s=0.0)


def test_the_budget_cap_keeps_a_batch_within_half_the_budget() -> None:
    # linear_latency: 1 ms + 0.5 ms per row.
    assert budget_batch_cap(linear_latency, 10.0, max_limit=64) == 8  # 2 x 5.0 ms fits, 2 x 5.5 does not
    assert budget_batch_cap(linear_latency, 4.0, max_limit=64) == 2
    assert budget_batch_cap(linear_latency, 1.0, max_limit=64) == 1  # the head always runs
    assert budget_batch_cap(linear_latency, math.inf, max_limit=64) == 64
    assert budget_batch_cap(linear_latency, 1000.0, max_limit=16) == 16
    # The first size that does not fit ends the search, whatever larger sizes say.
    bumpy = {1: 1.0, 2: 1.0, 3: 9.0, 4: 1.0}
    assert budget_batch_cap(lambda rows: bumpy[rows], 4.0, max_limit=4) == 2
    # A failing estimate caps at what is known to fit.
    assert budget_batch_cap(lambda rows: 1.0 if rows < 3 else 1 / 0, 100.0, max_limit=8) == 2
    caps = BudgetCaps(linear_latency, 64)
    for budget in (0.5, 3.0, 4.0, 10.0, 10.9, 11.0, 33.0, 66.0, 1e9):
        assert caps.cap(budget) == budget_batch_cap(linear_latency, budget, 64)


def test_mixed_budgets_size_every_batch_for_the_tightest_recent_query() -> None:
    """One instance, two groups: a 4 ms group at 2 QPS and a 40 ms group saturating it. Tick by
    tick (1 ms), every batch's profiled latency fits half the tight budget while tight queries
    keep coming, so one arriving during any batch waits at most half its budget and runs in the
    next; once the tight group stops, batches grow back after the window."""
    window = RecentTightestBudget(window_s=5.0)
    caps = BudgetCaps(linear_latency, 64)
    aimd = AimdController(max_limit=64, initial=64)
    tight_ms, loose_ms = 4.0, 40.0
    sized: list[tuple[float, int]] = []
    for tick in range(20_000):
        now = tick / 1000.0
        window.observe(loose_ms, now)  # the saturating loose group: a query every ms
        if tick % 500 == 0 and now < 10.0:  # the tight group, for the first 10 s
            window.observe(tight_ms, now)
        rows = batch_limit(aimd.limit, window.tightest(now), caps)
        sized.append((now, rows))

    while_tight = [rows for now, rows in sized if now < 10.0]
    assert set(while_tight) == {budget_batch_cap(linear_latency, tight_ms, 64)} == {2}
    assert all(2 * linear_latency(rows) <= tight_ms for rows in while_tight)
    # The last tight query came at t=9.5: its cap holds until t=14.5, then the loose one applies.
    assert {rows for now, rows in sized if 10.0 <= now < 14.5} == {2}
    assert {rows for now, rows in sized if now >= 14.5} == {budget_batch_cap(linear_latency, loose_ms, 64)}


def test_the_aimd_limit_still_bounds_the_batch() -> None:
    caps = BudgetCaps(linear_latency, 64)
    assert batch_limit(3, 1000.0, caps) == 3
    assert batch_limit(64, 10.0, caps) == 8
    assert batch_limit(64, math.inf, caps) == 64


# --- helpers for the batcher ------------------------------------------------------------------


@dataclass
class FakeModel:
    """outputs = inputs * 10 + 1, row for row. Optionally holds its first run on a gate, sleeps a
    few ms per run, or fails on chosen runs."""

    hold_first: bool = False
    latency_s: float = 0.0
    fail_on: set[int] = field(default_factory=set)
    wrong_rows_on: set[int] = field(default_factory=set)
    gate: threading.Event = field(default_factory=threading.Event)
    calls: list[int] = field(default_factory=list)  # rows of each run
    running: threading.Event = field(default_factory=threading.Event)

    def __call__(self, inputs: np.ndarray) -> np.ndarray:
        index = len(self.calls)
        self.calls.append(int(inputs.shape[0]))
        self.running.set()
        if self.hold_first and index == 0:
            assert self.gate.wait(scaled(WAIT_S)), "the test never opened the gate"
        if self.latency_s:
            time.sleep(self.latency_s)
        if index in self.fail_on:
            raise ValueError(f"model failed on run {index}")
        outputs: np.ndarray = inputs * 10 + 1
        return outputs[1:] if index in self.wrong_rows_on else outputs


@dataclass
class Call:
    thread: threading.Thread
    result: BatchResult | None = None
    error: BaseException | None = None
    elapsed_s: float = 0.0

    def join(self) -> None:
        self.thread.join(scaled(WAIT_S))
        assert not self.thread.is_alive(), "a submit never returned"


def submit_async(
    batcher: VariantBatcher,
    inputs: np.ndarray,
    deadline: float,
    barrier: threading.Barrier | None = None,
) -> Call:
    call = Call(threading.Thread(target=lambda: None))

    def run() -> None:
        if barrier is not None:
            barrier.wait(scaled(WAIT_S))
        started = time.monotonic()
        try:
            call.result = batcher.submit(inputs, deadline)
        except BaseException as error:  # checked by the test thread
            call.error = error
        call.elapsed_s = time.monotonic() - started

    call.thread = threading.Thread(target=run, daemon=True)
    call.thread.start()
    return call


def wait_until(probe: Callable[[], bool], what: str) -> None:
    wait_for(probe, WAIT_S, what, interval_s=0.0005)  # a fine poll: the batcher acts in microseconds


def queued_is(batcher: VariantBatcher, count: int) -> Callable[[], bool]:
    return lambda: batcher.queued == count


def rows(value: float, count: int = 1, width: int = 4) -> np.ndarray:
    """``count`` rows of ``width`` features, each row distinct and tagged by ``value``."""
    return (value + np.arange(count * width, dtype=np.float32).reshape(count, width) / 1000).astype(
        np.float32
    )


def no_latency(_: int) -> float:
    return 0.0


Factory = Callable[..., VariantBatcher]


@pytest.fixture
def make_batcher() -> Iterator[Factory]:
    made: list[tuple[VariantBatcher, FakeModel]] = []

    def factory(
        model: FakeModel,
        *,
        max_limit: int = 16,
        initial: int | None = None,
        estimate: Callable[[int], float] = no_latency,
        max_delay_s: float = 0.001,
        idle_gap_s: float = math.inf,  # always wait to fill (Clipper's rule) unless a test says
        result_timeout_s: float = WAIT_S,
        budget_window_s: float = 5.0,
    ) -> VariantBatcher:
        controller = AimdController(max_limit, initial=max_limit if initial is None else initial)
        batcher = VariantBatcher(
            "test-variant",
            model,
            estimate,
            max_limit,
            max_delay_s=max_delay_s,
            idle_gap_s=idle_gap_s,
            result_timeout_s=result_timeout_s,
            controller=controller,
            budget_window_s=budget_window_s,
        )
        made.append((batcher, model))
        return batcher

    yield factory
    for batcher, model in made:
        model.gate.set()  # a held model must not keep its batcher's thread alive
        batcher.close()
        assert not batcher._thread.is_alive(), "a dispatch thread outlived its batcher"


def hold_then_queue(
    batcher: VariantBatcher, model: FakeModel, inputs: list[np.ndarray], deadline: float | None = None
) -> tuple[Call, list[Call]]:
    """Start a first request whose run holds on the gate, then queue ``inputs`` behind it."""
    first = submit_async(batcher, rows(-1), deadline_after(LOOSE_MS))
    wait_until(model.running.is_set, "the first run to start")
    calls: list[Call] = []
    for count, batch in enumerate(inputs, start=1):
        calls.append(submit_async(batcher, batch, deadline or deadline_after(LOOSE_MS)))
        # One at a time, so the queue order (and so each batch's content) is the submit order.
        wait_until(queued_is(batcher, count), f"{count} queued requests")
    return first, calls


def assert_own_rows(call: Call, inputs: np.ndarray) -> BatchResult:
    call.join()
    assert call.error is None, call.error
    assert call.result is not None
    np.testing.assert_array_equal(call.result.outputs, inputs * 10 + 1)
    return call.result


# --- the batcher ------------------------------------------------------------------------------


def test_concurrent_submitters_share_one_batch_and_each_gets_its_own_rows(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16)
    inputs = [rows(i) for i in range(8)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    results = [assert_own_rows(call, batch) for call, batch in zip(calls, inputs, strict=True)]
    assert model.calls == [1, 8]
    assert {r.batch for r in results} == {8}
    assert {r.requests for r in results} == {8}
    assert sorted(r.position for r in results) == list(range(8))
    assert all(r.inference_ms >= 0 for r in results)
    # They waited behind the held run, and each reports its own wait.
    assert all(r.queue_ms > 0 for r in results)
    assert batcher.stats()["batches"] == 2 and batcher.stats()["largest_batch"] == 8


def test_concurrent_submitters_without_a_gate_are_batched(make_batcher: Factory) -> None:
    model = FakeModel(latency_s=0.002)
    batcher = make_batcher(model, max_limit=16, max_delay_s=0.002)
    barrier = threading.Barrier(12)
    inputs = [rows(i) for i in range(12)]

    calls = [submit_async(batcher, batch, deadline_after(LOOSE_MS), barrier) for batch in inputs]

    results = [assert_own_rows(call, batch) for call, batch in zip(calls, inputs, strict=True)]
    assert sum(model.calls) == 12
    assert max(r.batch for r in results) > 1
    assert len(model.calls) < 12


def test_a_batch_never_takes_more_rows_than_the_limit(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=4)
    inputs = [rows(i) for i in range(10)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    for call, batch in zip(calls, inputs, strict=True):
        assert_own_rows(call, batch)
    assert model.calls == [1, 4, 4, 2]


def test_requests_carrying_several_rows_are_batched_and_split_back(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=12)
    inputs = [rows(1, 3), rows(2, 5), rows(3, 2), rows(4, 9)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    results = [assert_own_rows(call, batch) for call, batch in zip(calls, inputs, strict=True)]
    # 3 + 5 + 2 fit a limit of 12; 9 more would not, so that request runs in the next batch.
    assert model.calls == [1, 10, 9]
    assert [r.batch for r in results] == [10, 10, 10, 9]
    assert [r.outputs.shape[0] for r in results] == [3, 5, 2, 9]


def test_a_request_larger_than_the_limit_runs_whole(make_batcher: Factory) -> None:
    model = FakeModel()
    batcher = make_batcher(model, max_limit=4)

    result = batcher.submit(rows(7, 10), deadline_after(LOOSE_MS))

    np.testing.assert_array_equal(result.outputs, rows(7, 10) * 10 + 1)
    assert model.calls == [10]


def test_requests_of_different_shapes_do_not_share_a_batch(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16)
    inputs = [rows(1, width=4), rows(2, width=5), rows(3, width=5)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    for call, batch in zip(calls, inputs, strict=True):
        assert_own_rows(call, batch)
    assert model.calls == [1, 1, 2]


def test_batching_never_waits_past_a_requests_deadline(make_batcher: Factory) -> None:
    # A fill delay of a whole second: only the deadline can make the batch leave early.
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0)

    started = time.monotonic()
    result = batcher.submit(rows(1), deadline_after(30.0))
    elapsed_s = time.monotonic() - started

    np.testing.assert_array_equal(result.outputs, rows(1) * 10 + 1)
    assert elapsed_s < 0.5
    assert result.queue_ms < 250


def test_batching_leaves_early_enough_for_the_profiled_latency_of_the_batch(
    make_batcher: Factory,
) -> None:
    # 50 ms of budget, 40 of which the profile says the run needs: it may wait ~10 ms, not 50.
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0, estimate=lambda _: 40.0)

    result = batcher.submit(rows(1), deadline_after(50.0))

    assert result.queue_ms < 35


def test_a_tight_deadline_arriving_during_the_fill_wait_shortens_it(make_batcher: Factory) -> None:
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=0.4)

    loose = submit_async(batcher, rows(1), deadline_after(LOOSE_MS))
    wait_until(lambda: batcher.queued == 1, "the first request to queue")
    tight = submit_async(batcher, rows(2), deadline_after(20.0))

    loose_result = assert_own_rows(loose, rows(1))
    tight_result = assert_own_rows(tight, rows(2))
    assert model.calls == [2]  # they shared the batch...
    assert tight.elapsed_s < 0.3  # ...which left for the tight deadline, not at the 0.4 s delay
    assert loose_result.batch == tight_result.batch == 2


def test_sparse_arrivals_skip_the_fill_wait(make_batcher: Factory) -> None:
    # A 1 s fill delay that queries arriving ~5 ms apart (over the 2 ms idle gap) never pay.
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0, idle_gap_s=0.002)

    waits = []
    for i in range(4):
        time.sleep(0.005)
        waits.append(batcher.submit(rows(i), deadline_after(LOOSE_MS)).queue_ms)

    assert max(waits) < 250
    assert batcher.stats()["arrival_gap_ms"] > 2.0


def test_dense_arrivals_wait_to_fill_a_batch(make_batcher: Factory) -> None:
    # The same batcher once queries arrive close together: the next one waits for company (and
    # leaves, alone, at its deadline since none comes).
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0, idle_gap_s=0.2)
    for i in range(3):
        batcher.submit(rows(i), time.monotonic())  # already late: no wait, but they set the pace

    result = batcher.submit(rows(9), deadline_after(30.0))

    assert result.queue_ms > 20  # it waited for company...
    assert result.queue_ms < 250  # ...until its deadline, not the 1 s delay


def test_a_tight_request_is_not_put_in_a_batch_too_large_for_its_deadline(make_batcher: Factory) -> None:
    # The profile says 200 ms per row; the tight request has 1 s: a batch of at most 4 rows (fewer
    # if the test was slow to queue) fits it. Nine loose requests queue behind it.
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, estimate=lambda rows: 200.0 * rows)
    first = submit_async(batcher, rows(-1), deadline_after(LOOSE_MS))
    wait_until(model.running.is_set, "the first run to start")
    tight = submit_async(batcher, rows(0), deadline_after(1000.0))
    wait_until(queued_is(batcher, 1), "the tight request to queue")
    loose_inputs = [rows(i) for i in range(1, 10)]
    loose = []
    for count, batch in enumerate(loose_inputs, start=2):
        loose.append(submit_async(batcher, batch, deadline_after(LOOSE_MS)))
        wait_until(queued_is(batcher, count), f"{count} queued requests")
    model.gate.set()

    assert_own_rows(first, rows(-1))
    tight_result = assert_own_rows(tight, rows(0))
    for call, batch in zip(loose, loose_inputs, strict=True):
        assert_own_rows(call, batch)
    # Without the cap, the limit of 16 would have run all ten rows at once (2 s by the profile).
    assert 1 <= tight_result.batch <= 4
    assert model.calls[1] == tight_result.batch
    assert sum(model.calls) == 11  # every row ran exactly once; the rest in later batches


def test_a_tight_request_behind_loose_ones_caps_the_batch_it_joins(make_batcher: Factory) -> None:
    # Loose requests first, then a tight one: the batch stops growing where the tight one's
    # deadline would break; it and what queued after it wait for the next batch.
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, estimate=lambda rows: 200.0 * rows)
    first = submit_async(batcher, rows(-1), deadline_after(LOOSE_MS))
    wait_until(model.running.is_set, "the first run to start")
    calls = []
    deadlines = [LOOSE_MS, LOOSE_MS, 1000.0, LOOSE_MS, LOOSE_MS, LOOSE_MS, LOOSE_MS]
    for count, budget in enumerate(deadlines, start=1):
        calls.append(submit_async(batcher, rows(count), deadline_after(budget)))
        wait_until(queued_is(batcher, count), f"{count} queued requests")
    model.gate.set()

    assert_own_rows(first, rows(-1))
    results = [assert_own_rows(call, rows(i)) for i, call in enumerate(calls, start=1)]
    tight = results[2]
    assert tight.batch * 200.0 <= 1000.0  # its batch's profiled latency fits its deadline
    assert model.calls[1] < len(deadlines)  # the loose ones did not all ride along
    assert sum(model.calls) == 1 + len(deadlines)


def test_a_tight_query_served_recently_caps_batches_of_loose_ones_queued_now(make_batcher: Factory) -> None:
    # A tight query (1 s budget, 200 ms a row) runs; loose ones queue behind it. None of them is
    # tight, but the next tight one may arrive while their batch runs: a batch stays within half
    # of the tight budget (2 rows, 400 ms), so that it waits at most that long and runs in time.
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, estimate=lambda rows: 200.0 * rows)
    tight = submit_async(batcher, rows(0), deadline_after(1000.0))
    wait_until(model.running.is_set, "the tight request to run")
    loose = queue_behind(batcher, [rows(i) for i in range(1, 7)])
    model.gate.set()

    assert_own_rows(tight, rows(0))
    for count, call in enumerate(loose, start=1):
        assert_own_rows(call, rows(count))
    assert model.calls == [1, 2, 2, 2]  # without the cap: [1, 6]
    assert batcher.stats()["budget_limit"] == 2
    assert batcher.stats()["tightest_budget_ms"] <= 1000.0


def test_a_budget_no_run_could_meet_does_not_cap_later_batches(make_batcher: Factory) -> None:
    # 50 ms for a row that takes 200 ms: late whatever happens, it is no reason for small batches.
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, estimate=lambda rows: 200.0 * rows)
    late = submit_async(batcher, rows(0), deadline_after(50.0))
    wait_until(model.running.is_set, "the late request to run")
    loose = queue_behind(batcher, [rows(i) for i in range(1, 7)])
    model.gate.set()

    assert_own_rows(late, rows(0))
    for count, call in enumerate(loose, start=1):
        assert_own_rows(call, rows(count))
    assert model.calls == [1, 6]


def queue_behind(batcher: VariantBatcher, inputs: list[np.ndarray]) -> list[Call]:
    """Queue loose ``inputs`` one by one behind a run already held on the gate."""
    calls = []
    for count, batch in enumerate(inputs, start=1):
        calls.append(submit_async(batcher, batch, deadline_after(LOOSE_MS)))
        wait_until(queued_is(batcher, count), f"{count} queued requests")
    return calls


def test_a_late_request_does_not_cap_the_batch(make_batcher: Factory) -> None:
    # Already late whatever the batch (its budget is under one row's 200 ms): batching it with
    # the others costs it nothing and keeps throughput; running it alone would help no one.
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, estimate=lambda rows: 200.0 * rows)
    first, calls = hold_then_queue(batcher, model, [rows(1), rows(2), rows(3)])
    late = submit_async(batcher, rows(4), deadline_after(50.0))
    wait_until(queued_is(batcher, 4), "the late request to queue")
    model.gate.set()

    assert_own_rows(first, rows(-1))
    for i, call in enumerate([*calls, late], start=1):
        assert_own_rows(call, rows(i))
    assert model.calls == [1, 4]


def test_a_late_request_is_run_at_once_not_failed(make_batcher: Factory) -> None:
    model = FakeModel()
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0)

    started = time.monotonic()
    result = batcher.submit(rows(1), time.monotonic() - 1.0)

    assert time.monotonic() - started < 0.5
    np.testing.assert_array_equal(result.outputs, rows(1) * 10 + 1)


def test_a_late_request_takes_what_is_queued_without_waiting(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, max_delay_s=1.0)
    inputs = [rows(1), rows(2), rows(3)]

    first, calls = hold_then_queue(batcher, model, inputs, deadline=time.monotonic() - 1.0)
    started = time.monotonic()
    model.gate.set()

    for call, batch in zip(calls, inputs, strict=True):
        assert_own_rows(call, batch)
    assert time.monotonic() - started < 0.5  # no 1 s fill wait, and not one run per request
    assert model.calls == [1, 3]
    assert_own_rows(first, rows(-1))


def test_a_model_exception_reaches_every_caller_of_the_batch(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True, fail_on={1})
    batcher = make_batcher(model, max_limit=16)
    inputs = [rows(i) for i in range(3)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    for call in calls:
        call.join()
        assert isinstance(call.error, ValueError)
        assert "failed on run 1" in str(call.error)
    # The dispatch thread lives on and serves the next request.
    assert_own_rows(submit_async(batcher, rows(9), deadline_after(LOOSE_MS)), rows(9))
    assert model.calls == [1, 3, 1]


def test_outputs_that_cannot_be_split_fail_the_batch_clearly(make_batcher: Factory) -> None:
    model = FakeModel(wrong_rows_on={0})
    batcher = make_batcher(model)

    with pytest.raises(RuntimeError, match="cannot be split"):
        batcher.submit(rows(1, 3), deadline_after(LOOSE_MS))


def test_the_batch_limit_grows_under_load(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, max_limit=16, initial=1)
    inputs = [rows(i) for i in range(6)]

    first, calls = hold_then_queue(batcher, model, inputs)
    model.gate.set()

    assert_own_rows(first, rows(-1))
    results = [assert_own_rows(call, batch) for call, batch in zip(calls, inputs, strict=True)]
    # Limit 1 -> a full batch of 1 -> 2 -> a full batch of 2 -> 3 -> a full 3 -> 4; the last one
    # request fills nothing and leaves the limit at 4.
    assert model.calls == [1, 2, 3, 1]
    assert results[-1].limit == 4
    assert batcher.controller.limit == 4


def test_a_batch_over_its_budget_shrinks_the_limit(make_batcher: Factory) -> None:
    model = FakeModel(latency_s=0.003)
    batcher = make_batcher(model, max_limit=8)  # starts at 8

    result = batcher.submit(rows(1), deadline_after(1.0))  # 1 ms budget, a 3 ms run

    assert result.limit == 4


def test_a_budget_no_batch_could_meet_does_not_shrink_the_limit(make_batcher: Factory) -> None:
    # The profile says one row needs 5 ms: a 1 ms budget is missed whatever the batch size, so it
    # is no evidence against batching.
    model = FakeModel(latency_s=0.003)
    batcher = make_batcher(model, max_limit=8, estimate=lambda _: 5.0)

    result = batcher.submit(rows(1), deadline_after(1.0))

    assert result.limit == 8


def test_a_bounded_wait_ends_with_a_clear_error(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model, result_timeout_s=0.05)

    with pytest.raises(BatchTimeoutError, match="did not complete"):
        batcher.submit(rows(1), deadline_after(LOOSE_MS))
    queued = submit_async(batcher, rows(2), deadline_after(LOOSE_MS))
    queued.join()
    assert isinstance(queued.error, BatchTimeoutError)
    assert batcher.queued == 0  # the abandoned request left the queue: no batch runs it for nobody
    model.gate.set()
    assert_own_rows(submit_async(batcher, rows(3), deadline_after(LOOSE_MS)), rows(3))
    assert model.calls == [1, 1]


def test_close_serves_what_is_queued_and_refuses_the_rest(make_batcher: Factory) -> None:
    model = FakeModel(hold_first=True)
    batcher = make_batcher(model)
    first, calls = hold_then_queue(batcher, model, [rows(1), rows(2)])

    closer = threading.Thread(target=batcher.close, daemon=True)
    closer.start()
    wait_until(lambda: batcher._closed, "the batcher to close")
    with pytest.raises(BatcherClosedError):
        batcher.submit(rows(3), deadline_after(LOOSE_MS))
    model.gate.set()
    closer.join(scaled(WAIT_S))

    assert_own_rows(first, rows(-1))
    assert_own_rows(calls[0], rows(1))
    assert_own_rows(calls[1], rows(2))
    assert not batcher._thread.is_alive()


def test_scalar_inputs_are_refused(make_batcher: Factory) -> None:
    batcher = make_batcher(FakeModel())

    with pytest.raises(Exception, match="batch dimension"):
        batcher.submit(np.ones((), dtype=np.float32), deadline_after(LOOSE_MS))


# --- from a variant's profile -----------------------------------------------------------------


def make_profile(max_useful_batch: int = 0) -> VariantProfile:
    return VariantProfile(
        variant_id="a/m/v/cpu",
        app_id="a",
        model_name="m",
        pool="cpu",
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key="k",
        size_bytes=1,
        load_latency_ms=1.0,
        latency_p50_ms={1: 1.0, 4: 2.0, 16: 4.0},
        latency_p99_ms={1: 2.0, 4: 3.0, 16: 8.0},
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=0.0,
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
        max_useful_batch=max_useful_batch,
    )


def test_the_limit_is_bounded_by_the_variants_largest_useful_batch() -> None:
    assert max_limit_for(make_profile(max_useful_batch=8)) == 8
    assert max_limit_for(make_profile()) == 16  # none measured: the largest profiled batch


def test_the_profile_estimate_covers_every_batch_size() -> None:
    estimate = profile_estimate(make_profile())

    assert estimate(0) == 2.0
    assert estimate(1) == 2.0
    assert estimate(3) == 3.0  # next profiled size up
    assert estimate(16) == 8.0
    assert estimate(32) == 16.0  # beyond the profile: linear in rows


# --- concurrent runs (a tuned instance's request-level parallelism) ---------------------------


@pytest.mark.parametrize("runners", [1, 2])
def test_runners_let_that_many_batches_run_at_once(runners: int) -> None:
    """Two batches meet inside the model only when two dispatch threads run them: with one, the
    second waits for the first, whose model gives up waiting for a partner."""
    partner = threading.Barrier(2, timeout=scaled(0.5) if runners == 1 else scaled(10.0))
    met = []

    def model(inputs: np.ndarray) -> np.ndarray:
        try:
            partner.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return inputs * 2

    batcher = VariantBatcher("v", model, lambda rows: 1.0, max_limit=1, runners=runners)
    try:
        assert batcher.runners == runners and batcher.stats()["runners"] == runners
        results: list[np.ndarray] = []

        def call(value: float) -> None:
            results.append(
                batcher.submit(np.full((1, 2), value, dtype=np.float32), deadline_after(10_000)).outputs
            )

        callers = [threading.Thread(target=call, args=(float(i),)) for i in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(scaled(10.0))
        assert sorted(float(r[0, 0]) for r in results) == [0.0, 2.0]  # both answered, either way
        assert all(met) == (runners == 2)
    finally:
        batcher.close()
    assert not any(thread.is_alive() for thread in batcher._threads)


def test_runners_must_be_positive() -> None:
    with pytest.raises(ValueError, match="runners"):
        VariantBatcher("v", lambda x: x, lambda rows: 1.0, max_limit=1, runners=0)
