"""Faults of the compute behind the gateway, under load, on the embedded stack's real processes:
a worker killed, a worker stopped (hung), a Lambda container killed.

Each asserts what a user is promised: no query lost (every query gets a JSON answer), none later
than its deadline plus the documented grace, the broken process out of selection within 2 s and
capacity back by itself. The measured times are printed (run with ``-s``) for the issue's note.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from modelless.pools.health import Verdict
from tests.faults.stack_kit import REPLY_BOUND_S, QueryLoad, served_stack, summary
from tests.functional.workers_kit import APP
from tests.waiting import wait_for

# A dead or hung worker leaves selection within this long (the bound).
LEAVES_SELECTION_S = 2.0


def report(name: str, **numbers: object) -> None:
    print(f"\nFAULT {name}: {json.dumps(numbers)}")


def _serving_worker(load: QueryLoad) -> str:
    """Once the load runs warm, the worker that has answered most of it."""
    wait_for(
        lambda: sum(1 for r in load.since(0) if r.status == 200 and r.worker) >= 20 or None,
        30,
        "20 queries answered by a pool worker",
    )
    counts: dict[str, int] = {}
    for r in load.since(0):
        if r.worker:
            counts[r.worker] = counts.get(r.worker, 0) + 1
    return max(counts, key=lambda worker: counts[worker])


def _assert_no_query_lost(replies: list, allow_503: bool = False) -> None:  # type: ignore[type-arg]
    assert replies, "the load sent nothing"
    unanswered = [r for r in replies if r.status == 0 or not r.json_body]
    assert not unanswered, f"{len(unanswered)} queries got no JSON answer: {unanswered[:3]}"
    late = [r for r in replies if r.elapsed_s > REPLY_BOUND_S]
    assert not late, f"{len(late)} replies came after budget + grace ({REPLY_BOUND_S} s): {late[:3]}"
    failed = [r for r in replies if r.status != 200]
    if allow_503:
        assert all(r.status == 503 and r.retry_after for r in failed), failed[:3]
    else:
        assert not failed, f"{len(failed)} queries failed: {failed[:3]}"


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_broken_worker_leaves_selection_and_is_replaced_under_load(tmp_path: Path, fault: str) -> None:
    with served_stack(tmp_path / "stack", workers=2) as served:
        pool = served.stack.pool
        load = QueryLoad(served.url, served.api_key, callers=3).start()
        try:
            victim = _serving_worker(load)
            child = pool.workers()[victim]
            broken_at = time.monotonic()
            os.kill(child.process.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

            def out_of_selection() -> bool:
                _, seen, _ = served.stack.services.dispatcher.live_view.view(APP, refresh=True)
                return victim not in {w.worker_id for w in seen}

            wait_for(out_of_selection, LEAVES_SELECTION_S, f"{victim} to leave selection")
            left_s = time.monotonic() - broken_at
            wait_for(lambda: (pool.replacements and pool.replacements[0].ready_at) or None, 30, "a successor")
            replacement = pool.replacements[0]
            assert replacement.worker_id == victim
            assert replacement.verdict is (Verdict.DEAD if fault == "kill" else Verdict.HUNG)
            successor = replacement.successor
            assert successor is not None and successor != victim
            assert child.process.poll() is not None, "the broken worker was left running"
            # Capacity back: the successor reports and serves queries again.
            wait_for(
                lambda: any(w.worker_id == successor for w in served.store.list_workers()) or None,
                30,
                f"{successor} to report",
            )
            capacity_back_s = time.monotonic() - broken_at
            assert pool.size == 2
            replies = load.stop()
        finally:
            load.stop()
        after = [r for r in replies if r.sent_at + r.elapsed_s >= broken_at]
        _assert_no_query_lost(replies)
        sent_after = [r for r in replies if r.sent_at > broken_at]
        assert sent_after, "no query was sent after the fault"
        assert not [r for r in sent_after if r.worker == victim], "the dead worker answered"
        report(
            f"worker {fault}",
            left_selection_s=round(left_s, 3),
            detected_s=round(replacement.detected_at - broken_at, 3),
            replaced_s=round((replacement.ready_at or 0) - broken_at, 3),
            capacity_back_s=round(capacity_back_s, 3),
            **summary(after),
        )


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_broken_lambda_container_is_dropped_and_its_query_served_by_another(
    tmp_path: Path, fault: str
) -> None:
    # No pool workers: every query runs on the Lambda tier's containers.
    with served_stack(tmp_path / "stack", workers=0, lambda_concurrency=2) as served:
        tier = served.stack.lambda_tier
        load = QueryLoad(served.url, served.api_key, callers=2, pause_s=0.0).start()
        try:
            wait_for(lambda: (tier.size >= 1 and load.count() >= 20) or None, 60, "warm containers")
            # One running a query: that query must be served by another container.
            busy = wait_for(lambda: next((c for c in list(tier._containers) if c.busy), None), 10, "a busy")
            victim = busy.child
            broken_at = time.monotonic()
            os.kill(victim.process.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            wait_for(
                lambda: victim.name not in {c.child.name for c in tier._containers} or None,
                10,
                "the container dropped",
            )
            dropped_s = time.monotonic() - broken_at
            wait_for(lambda: len(load.since(broken_at)) >= 20 or None, 30, "queries after the fault")
            replies = load.stop()
        finally:
            load.stop()
        assert victim.process.poll() is not None, "the broken container was left running"
        _assert_no_query_lost(replies)
        assert {r.tier for r in replies} == {"lambda"}
        report(
            f"lambda container {fault}",
            dropped_s=round(dropped_s, 3),
            **summary([r for r in replies if r.sent_at + r.elapsed_s >= broken_at]),
        )
