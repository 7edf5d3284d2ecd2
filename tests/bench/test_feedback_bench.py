"""bench/feedback.py's parts on tiny inputs: the corruption wrapper (only the named model's
replies, only while on), the error-rate window, the recovery and down-weighting measures, and
the write-up with its plot. The whole run (zoo, registrations, real workers) is
``scripts/bench selection-feedback --quick``."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from bench import feedback as bench
from modelless.serving.invocation import Invocation, Reply
from tests.unit.dispatch_kit import make_variant


class EchoInvoker:
    """Replies with the same logits for every call (argmax: class 2)."""

    def __init__(self) -> None:
        self.calls = 0

    def invoke(self, address: str, invocation: Invocation, timeout_s: float) -> Reply:
        self.calls += 1
        logits = np.zeros((2, 10), dtype=np.float32)
        logits[:, 2] = 1.0
        return Reply(logits, batch=2, queue_ms=0.1)

    def tier_state(self) -> str:
        return "inner"


def invocation_of(model: str) -> Invocation:
    return Invocation(make_variant(f"app/{model}/fp32/cpu", model=model), np.zeros((2, 4), np.float32), "q")


def test_the_corruption_shifts_the_named_models_classes_only_while_on() -> None:
    on = threading.Event()
    wrapped = bench.Corrupting(EchoInvoker(), on, "bad")

    def classes(model: str) -> list[int]:
        reply = wrapped.invoke("addr", invocation_of(model), 1.0)
        return [int(c) for c in np.argmax(reply.outputs, axis=1)]

    assert classes("bad") == [2, 2]
    on.set()
    assert classes("bad") == [3, 3] and classes("good") == [2, 2]
    assert wrapped.tier_state() == "inner"  # what the wrapper does not change, it passes on
    reply = wrapped.invoke("addr", invocation_of("bad"), 1.0)
    assert reply.queue_ms == 0.1


def test_trailing_error_rate() -> None:
    assert bench.trailing_error([True, False, False, True], window=2) == [0.0, 0.5, 1.0, 0.5]


def steps(correct: list[bool], part: list[float]) -> list[bench.Step]:
    """A run in which "bad" decides ``part`` of each query and "good" the rest."""
    return [
        bench.Step(at_s=i * 0.1, correct=c, parts={"bad": p, "good": 1 - p})
        for i, (c, p) in enumerate(zip(correct, part, strict=True))
    ]


def test_recovery_counts_queries_until_the_error_rate_is_back_and_the_model_is_down() -> None:
    # 40 right, then 6 wrong answers by the corrupted model, then right ones by another.
    correct = [True] * 40 + [False] * 6 + [True] * 34
    part = [1.0] * 46 + [0.0] * 34
    recovered = bench.recovery(steps(correct, part), "bad", drop_at=40, window=10, tolerance=0.1)

    assert recovered.before == 0.0 and recovered.after == pytest.approx(6 / 40)
    assert recovered.queries == 5  # queries 45..54: one error in ten
    assert recovered.seconds == pytest.approx(0.5)
    assert recovered.extra_errors == pytest.approx(6.0)
    assert recovered.down_queries == 5 and recovered.down_feedbacks == 5


def test_a_policy_that_never_learns_never_recovers() -> None:
    correct = [True] * 40 + [False] * 40
    recovered = bench.recovery(steps(correct, [1.0] * 80), "bad", drop_at=40, window=10, tolerance=0.1)

    assert recovered.queries is None and recovered.seconds is None and recovered.down_queries is None


def test_the_write_up_and_its_plot(tmp_path: Path) -> None:
    plan = bench.Plan(queries=80, window=10)
    outcome = bench.Outcome(plan, "bad")
    for name, learns in (("infaas", False), ("exp3-favourite", True), ("exp4", True)):
        correct = [True] * 40 + ([False] * 5 + [True] * 35 if learns else [False] * 40)
        part = [1.0] * 45 + ([0.0] * 35 if learns else [1.0] * 35)
        outcome.steps[name], outcome.bad[name] = steps(correct, part), "bad"
        outcome.recoveries[name] = bench.recovery(outcome.steps[name], "bad", 40, 10, 0.1)

    plots = bench.plot(outcome, tmp_path)
    text = bench.markdown(outcome, "scripts/bench selection-feedback --quick", plots, 1.0)

    assert (tmp_path / plots[0]).stat().st_size > 0
    assert "| infaas | bad | 0.000 | 1.000 | never |" in text
    assert (
        "| exp3-favourite | bad | 0.000 | 0.125 | 4 queries (0.4 s) | 5 | 4 queries (4 feedbacks on it) |"
        in text
    )
    headline = bench.headline(outcome)
    assert "never moved off the bad model" in headline and "exp3 had it under 0.2" in headline
    assert "INFaaS sent every query after the drop to the bad model" in text
    raw = bench.columns(outcome.steps["exp4"])
    assert (
        raw["correct"][:2] == [1, 1]
        and raw["parts"][0] == {"bad": 1.0, "good": 0.0}
        and len(raw["at_s"]) == 80
    )
    # An INFaaS that moves off the model for reasons of its own is said to, with when.
    outcome.steps["infaas"][50].parts = {"good": 1.0}
    assert "moved off it after 10 queries" in bench.headline(outcome)


def test_the_favourite_is_the_model_with_the_largest_recent_part() -> None:
    run = steps([True] * 6, [1.0, 1.0, 1.0, 0.0, 0.0, 0.4])

    assert bench.favourite(run, window=3) == "good" and bench.favourite(run, window=6) == "bad"
