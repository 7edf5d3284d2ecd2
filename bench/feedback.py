"""Selection from feedback (Clipper §5) against the static INFaaS choice when a model goes bad.

    scripts/bench selection-feedback [--queries 900] [--window 25] [--quick]

The embedded stack (real worker processes, the gateway over HTTP) and the demo zoo's digits
models ``digits-mlp``, ``digits-small-cnn`` and ``digits-cnn`` registered for real (generated,
profiled, accuracy measured) in one app; the queries' targets (accuracy 0.975, 100 ms) admit all
three. A stream of labelled test images is replayed, each query followed by its feedback (its
true label), in five runs, each from fresh weights:

- ``infaas``, ``exp3``, ``exp4``: half way through, the model INFaaS picks (the cheapest that
  meets the targets) goes bad;
- ``exp3-favourite``, ``exp4-favourite``: half way through, the model the bandit relied on most
  over the last window goes bad (its worst case: the learner's own choice fails).

Going bad: the benchmark wraps the gateway's invokers so that the model's outputs come back with
their classes shifted by one (every answer it got right becomes wrong). No code path of the
library corrupts anything; the wrapper lives here.

Reported per run: the error rate before and after the drop; how many queries (and seconds) after
it until the error rate over the next ``--window`` queries is back within ``--tolerance`` of its
level before the drop (``never`` when not within the run); and how many queries (of them,
feedbacks on the bad model) until the bad model's part in the decisions (Exp3: the share of
queries sent to it; Exp4: its vote share) over the next window is under 0.2. Plot: the error
rate over a trailing window per run, the drop marked, and the bad model's part.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, write_fragment
from modelless.serving.invocation import Invocation, Reply

PART = "selection-feedback"
MODELS = ("digits-mlp", "digits-small-cnn", "digits-cnn")
APP = "feedback-bench"
# The bad model's part in the decisions is "down" once under this (the threshold of the
# down-weighting bound docs/QUERIES.md states).
DOWN = 0.2


@dataclass(frozen=True)
class Run:
    """``corrupts``: "pick", the model INFaaS picks; "favourite", the model the run relied on most
    over the window before the drop."""

    name: str
    policy: str
    corrupts: str


RUNS = (
    Run("infaas", "infaas", "pick"),
    Run("exp3", "exp3", "pick"),
    Run("exp4", "exp4", "pick"),
    Run("exp3-favourite", "exp3", "favourite"),
    Run("exp4-favourite", "exp4", "favourite"),
)


@dataclass(frozen=True)
class Plan:
    queries: int = 900  # per run; the drop comes half way
    window: int = 25
    tolerance: float = 0.1  # recovered: within this of the error rate before the drop
    latency_ms: float = 100.0
    accuracy: float = 0.975
    metadata: str = "memory://"
    seed: int = 7

    @property
    def drop_at(self) -> int:
        return self.queries // 2


@dataclass
class Step:
    """One query of a run: when it was answered (s since the run began), whether its answer was
    right, and the model(s) that answered with their part in the decision (1 for a single model;
    each member's vote share for an ensemble)."""

    at_s: float
    correct: bool
    parts: dict[str, float]


@dataclass
class Recovery:
    before: float  # error rate over the queries before the drop (after the first window)
    after: float  # error rate over every query after the drop
    queries: int | None  # after the drop, until the next window's error rate is back; None: never
    seconds: float | None
    extra_errors: float  # errors after the drop beyond what the rate before it would make
    down_queries: int | None  # after the drop, until the bad model's part is under DOWN
    down_feedbacks: int | None  # of which answered (in part) by the bad model


@dataclass
class Outcome:
    plan: Plan
    pick: str  # the model INFaaS picks
    bad: dict[str, str] = field(default_factory=dict)  # per run, the model that went bad
    steps: dict[str, list[Step]] = field(default_factory=dict)
    recoveries: dict[str, Recovery] = field(default_factory=dict)


# --- the corruption: the benchmark's own invoker wrapper ---------------------------------------


def shifted_classes(reply: Reply) -> Reply:
    """A reply whose outputs have their classes shifted by one (class c's score moves to c + 1):
    every argmax moves to the next class."""
    return replace(reply, outputs=np.ascontiguousarray(np.roll(reply.outputs, 1, axis=1)))


class Corrupting:
    """Wraps a worker or Lambda invoker: while ``on`` is set, replies of ``model``'s variants come
    back with shifted classes (``shifted_classes``). ``model`` may change between runs."""

    def __init__(self, inner: Any, on: threading.Event, model: str = "") -> None:
        self._inner = inner
        self._on = on
        self.model = model

    def invoke(self, *args: Any) -> Reply:
        reply: Reply = self._inner.invoke(*args)
        invocation = next(a for a in args if isinstance(a, Invocation))
        if self._on.is_set() and model_of(invocation.variant_id) == self.model:
            return shifted_classes(reply)
        return reply

    def __getattr__(self, name: str) -> Any:  # tier_state, close, ...: the inner invoker's
        return getattr(self._inner, name)


def model_of(variant_id: str) -> str:
    """``app/model/recipe/pool`` -> model."""
    return variant_id.split("/")[1]


# --- the measures --------------------------------------------------------------------------


def trailing_error(correct: Sequence[bool], window: int) -> list[float]:
    """Per query, the error rate over it and the ``window - 1`` before it (fewer at the start)."""
    rates, wrong = [], 0
    for index, right in enumerate(correct):
        wrong += not right
        if index >= window:
            wrong -= not correct[index - window]
        rates.append(wrong / min(index + 1, window))
    return rates


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    return [float(np.mean(values[max(0, i - window + 1) : i + 1])) for i in range(len(values))]


def parts_of(steps: Sequence[Step], model: str) -> list[float]:
    """Per query, ``model``'s part in the decision."""
    return [s.parts.get(model, 0.0) for s in steps]


def favourite(steps: Sequence[Step], window: int) -> str:
    """The model with the largest part in the last ``window`` decisions."""
    totals: dict[str, float] = {}
    for step in steps[-window:]:
        for model, part in step.parts.items():
            totals[model] = totals.get(model, 0.0) + part
    return max(sorted(totals), key=lambda m: totals[m])


def recovery(steps: Sequence[Step], bad: str, drop_at: int, window: int, tolerance: float) -> Recovery:
    """How a run came back after ``bad`` went bad at query ``drop_at``: the first k such that
    queries drop_at + k .. drop_at + k + window - 1 err at most ``tolerance`` above the rate
    before the drop (that rate measured after the first window: the bandits' first learning left
    out); and the first k from which ``bad``'s mean part over the next window is under DOWN."""
    correct = [s.correct for s in steps]
    before_part = correct[min(window, drop_at // 2) : drop_at]
    before = 1 - sum(before_part) / len(before_part)
    after_part = correct[drop_at:]
    after = 1 - sum(after_part) / len(after_part) if after_part else float("nan")
    found = next(
        (
            k
            for k in range(len(correct) - drop_at - window + 1)
            if 1 - sum(correct[drop_at + k : drop_at + k + window]) / window <= before + tolerance
        ),
        None,
    )
    seconds = None if found is None else steps[drop_at + found].at_s - steps[drop_at].at_s
    extra = (after - before) * len(after_part) if after_part else 0.0
    parts = parts_of(steps[drop_at:], bad)
    down = next(
        (k for k in range(len(parts) - window + 1) if float(np.mean(parts[k : k + window])) < DOWN), None
    )
    down_feedbacks = None if down is None else sum(p > 0 for p in parts[:down])
    return Recovery(before, after, found, seconds, extra, down, down_feedbacks)


# --- the run ---------------------------------------------------------------------------------


def run(plan: Plan, state_dir: Path, log: Callable[[str], None] = print) -> Outcome:
    from infra.local.stack import ThreadedGateway, start_stack
    from infra.zoo.digits import build_zoo
    from modelless.client import Client
    from modelless.feedback.policy import Policy
    from modelless.observability.metrics import logger as gateway_logger

    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    # Every answer must come from the models (and their corruption), never from a cache.
    os.environ["MODELLESS_PREDICTION_CACHE_ENABLED"] = "false"
    gateway_logger.setLevel("WARNING")
    zoo_dir = state_dir / "demo"
    build_zoo(zoo_dir)
    with np.load(zoo_dir / "testset.npz", allow_pickle=False) as test:
        images, labels = test["inputs"], test["labels"]
    order = list(range(len(images)))
    random.Random(plan.seed).shuffle(order)
    stream = [order[i % len(order)] for i in range(plan.queries)]
    with tempfile.TemporaryDirectory(prefix="modelless-feedback-") as tmp:
        port = 18500 + os.getpid() % 500
        stack = start_stack(Path(tmp), "127.0.0.1", port, 2, 2, plan.metadata)
        gateway = ThreadedGateway(stack, port)
        try:
            admin = gateway.admin()
            client = Client(stack.url, api_key=admin.create_app(APP))
            for name in MODELS:
                started = time.monotonic()
                reply = client.register_model(name, zoo_dir / f"{name}.onnx", zoo_dir / "valset.npz", APP)
                client.wait_for_registration(reply["registrationId"])
                log(f"registered {name} in {time.monotonic() - started:.1f} s")
            for name in MODELS:  # every model loaded: the runs measure the warm path
                for _ in range(3):
                    client.online_query(images[0], APP, model_name=name)
            picks = [
                client.online_query(images[i], APP, plan.latency_ms, plan.accuracy)["model"] for i in range(5)
            ]
            outcome = Outcome(plan, max(sorted(set(picks)), key=picks.count))
            log(
                f"INFaaS picks {outcome.pick} for accuracy >= {plan.accuracy:g} within {plan.latency_ms:g} ms"
            )
            on = threading.Event()
            # The benchmark's corruption, around the gateway's own invokers (see Corrupting).
            attempts = stack.services.dispatcher.attempts
            workers = attempts._workers = Corrupting(attempts._workers, on)
            lambdas = None if attempts._lambda is None else Corrupting(attempts._lambda, on)
            attempts._lambda = lambdas
            for spec in RUNS:
                client.set_selection(APP, spec.policy)
                if spec.policy != "infaas":  # each run learns from scratch
                    stack.services.feedback.store.update_weights(APP, Policy(spec.policy), lambda _: {})
                on.clear()

                def go_bad(steps: list[Step], spec: Run = spec) -> str:
                    bad = outcome.pick if spec.corrupts == "pick" else favourite(steps, plan.window)
                    for wrapper in (workers, lambdas):
                        if wrapper is not None:
                            wrapper.model = bad
                    on.set()
                    return bad

                steps, bad = replay(client, plan, images, labels, stream, go_bad)
                outcome.steps[spec.name], outcome.bad[spec.name] = steps, bad
                outcome.recoveries[spec.name] = recovery(
                    steps, bad, plan.drop_at, plan.window, plan.tolerance
                )
                log(describe(spec.name, bad, outcome.recoveries[spec.name]))
        finally:
            gateway.close()
    return outcome


def replay(
    client: Any,
    plan: Plan,
    images: np.ndarray,
    labels: np.ndarray,
    stream: Sequence[int],
    go_bad: Callable[[list[Step]], str],
) -> tuple[list[Step], str]:
    """The stream, each answer followed by its feedback; at the drop, ``go_bad`` turns a model
    bad (given the steps so far) and names it."""
    steps: list[Step] = []
    bad = ""
    started = time.perf_counter()
    for index, row in enumerate(stream):
        if index == plan.drop_at:
            bad = go_bad(steps)
        reply = client.online_query(images[row], APP, plan.latency_ms, plan.accuracy)
        label = int(labels[row])
        client.feedback(reply["queryId"], APP, label=label)
        ensemble = reply.get("ensemble")
        parts = dict(ensemble["weights"]) if ensemble else {reply["model"]: 1.0}
        steps.append(Step(time.perf_counter() - started, reply["predictions"] == [label], parts))
    return steps, bad


def describe(name: str, bad: str, rec: Recovery) -> str:
    return (
        f"{name:15} {bad} went bad: error {rec.before:.3f} before, {rec.after:.3f} after; "
        f"back within tolerance after {_back(rec)}; {rec.extra_errors:.0f} extra errors; "
        f"its part under {DOWN} after {_down(rec)}"
    )


def _back(rec: Recovery) -> str:
    return "never" if rec.queries is None else f"{rec.queries} queries ({rec.seconds:.1f} s)"


def _down(rec: Recovery) -> str:
    if rec.down_queries is None:
        return "never"
    return f"{rec.down_queries} queries ({rec.down_feedbacks} feedbacks on it)"


# --- the write-up ----------------------------------------------------------------------------

COLOURS = {"infaas": "tab:red", "exp3": "tab:blue", "exp4": "tab:green"}


def plot(outcome: Outcome, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = outcome.plan
    figure, (errors, part) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=[2, 1])
    for name, steps in outcome.steps.items():
        policy = name.split("-")[0]
        style = {
            "color": COLOURS.get(policy),
            "linestyle": "--" if "favourite" in name else "-",
            "linewidth": 1.3,
        }
        label = f"{name} ({outcome.bad.get(name, '?')} goes bad)"
        errors.plot(trailing_error([s.correct for s in steps], plan.window), label=label, **style)
        if policy != "infaas":
            part.plot(trailing_mean(parts_of(steps, outcome.bad.get(name, "")), plan.window), **style)
    for axis in (errors, part):
        axis.axvline(plan.drop_at, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    errors.legend(loc="upper left", fontsize=8)
    errors.set_ylabel(f"error rate (last {plan.window} queries)")
    errors.set_title(f"a model's answers corrupted from query {plan.drop_at} (dotted line)")
    part.set_ylabel("bad model's part")
    part.set_xlabel("query")
    figure.tight_layout()
    name = f"{PART}.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_dir / name, dpi=90)
    plt.close(figure)
    return [name]


def headline(outcome: Outcome) -> str:
    rec = outcome.recoveries
    parts = []
    for name in ("exp3-favourite", "exp4-favourite"):
        if name in rec:
            r = rec[name]
            parts.append(
                f"{name.split('-')[0]} had it under {DOWN} of its decisions after {_down(r)}, "
                f"error back within {outcome.plan.tolerance:g} after {_back(r)}"
            )
    if "infaas" in rec:
        r = rec["infaas"]
        moved = infaas_moved(outcome)
        parts.append(
            f"INFaaS, which learns nothing from feedback, erred {r.before:.3f} -> {r.after:.3f}"
            + (
                " and never moved off the bad model"
                if moved is None
                else f", moved off it after {moved} queries"
            )
        )
    return "When the model a policy relied on went bad mid-run: " + "; ".join(parts)


def infaas_moved(outcome: Outcome) -> int | None:
    """Queries after the drop until INFaaS first sent one to another model than the bad one
    (its own reasons: the instances' live state, load; never the feedback); None: never."""
    steps, bad = outcome.steps.get("infaas", []), outcome.bad.get("infaas", "")
    drop_at = outcome.plan.drop_at
    return next((k for k, step in enumerate(steps[drop_at:]) if bad not in step.parts), None)


def infaas_note(outcome: Outcome) -> str:
    moved = infaas_moved(outcome)
    if moved is None:
        return "In this run INFaaS sent every query after the drop to the bad model."
    return (
        f"In this run INFaaS moved off the bad model {moved} queries after the drop, for reasons of its "
        "own (its live view of the instances: one it skips as Overloaded or Interfered on this loaded "
        "2-core machine, or the load between equally cheap variants), not from the feedback: what "
        "its error after the drop owes to chance."
    )


def markdown(outcome: Outcome, command: str, plots: list[str], took_s: float) -> str:
    plan = outcome.plan
    rows = [
        [
            name,
            outcome.bad.get(name, "?"),
            f"{rec.before:.3f}",
            f"{rec.after:.3f}",
            _back(rec),
            f"{rec.extra_errors:.0f}",
            _down(rec),
        ]
        for name, rec in outcome.recoveries.items()
    ]
    table = markdown_table(
        [
            "run",
            "goes bad",
            "error before the drop",
            "error after",
            f"back within {plan.tolerance:g}",
            "extra errors",
            f"its part under {DOWN}",
        ],
        rows,
    )
    images = "\n".join(f"![{name}]({name})" for name in plots)
    return f"""## Selection from feedback: a model goes bad mid-run

Machine: `{machine()}`. Reproduce: `{command}` ({took_s:.0f} s, registrations included).

The embedded stack with real workers and the demo zoo's {", ".join(MODELS)} registered for real
in one app; {plan.queries} labelled test images replayed per run (targets: accuracy
{plan.accuracy:g} within {plan.latency_ms:g} ms, which all three meet), each answer followed by
its feedback, each run from fresh weights. From query {plan.drop_at} on, one model answers with
its classes shifted by one (corrupted on purpose by the benchmark's invoker wrapper,
`bench/feedback.py`): in `infaas`, `exp3` and `exp4` the model INFaaS picks,
**{outcome.pick}**; in the `-favourite` runs the model the bandit relied on most over the
{plan.window} queries before the drop (its worst case). "Back": the first query after the drop
from which the next {plan.window} queries err at most {plan.tolerance:g} above the error rate
before the drop. "Its part": the bad model's share of the next {plan.window} decisions (Exp3:
queries sent to it; Exp4: its vote share), with the feedbacks it got until then.

{table}

Static INFaaS keeps sending queries to the model it profiled as cheapest and accurate enough:
it never hears that the model went wrong. {infaas_note(outcome)} Exp3 learns from the feedback on the queries
it sends to the bad model (each wrong answer lowers its log-weight by 0.3/p, p the probability it
was chosen with; the weights are floored at e^-3 of the best, so that a long good history cannot
delay the fall: at most 16 such feedbacks to a probability under 0.2, see
[QUERIES.md](../QUERIES.md)). It keeps exploring, though: gamma/K of its queries, and the floor's
share, still go to the bad model, which keeps its error after the drop above the level before it.
Exp4 asks every eligible model and combines their votes by weight: the bad member is outvoted
while the others agree, and its weight falls by 0.3 per wrong answer. Where the bad model was
one the bandit hardly used (INFaaS's pick is the cheapest, not the most accurate; the bandits
learn the latter), the drop barely shows.

{images}
"""


def columns(steps: Sequence[Step]) -> dict[str, list[Any]]:
    """A run's steps as columns, rounded: the raw numbers, compactly."""
    return {
        "at_s": [round(s.at_s, 4) for s in steps],
        "correct": [int(s.correct) for s in steps],
        "parts": [{m: round(p, 4) for m, p in s.parts.items()} for s in steps],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.feedback",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--queries", type=int, default=Plan.queries, help="per run; the drop is half way")
    parser.add_argument("--window", type=int, default=Plan.window)
    parser.add_argument("--tolerance", type=float, default=Plan.tolerance)
    parser.add_argument(
        "--latency", type=float, default=Plan.latency_ms, help="the queries' latency target, ms"
    )
    parser.add_argument("--metadata", default=Plan.metadata, help="memory:// or redis://host:port/db")
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".modelless"), help="where the demo zoo is built"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 160 queries per run, window 20")
    parser.add_argument("--out-dir", "--out", type=Path, default=DEFAULT_OUT_DIR, dest="out_dir")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    plan = Plan(
        queries=160 if args.quick else args.queries,
        window=20 if args.quick else args.window,
        tolerance=args.tolerance,
        latency_ms=args.latency,
        metadata=args.metadata,
    )
    print(f"machine: {machine()}", flush=True)
    started = time.perf_counter()
    outcome = run(plan, args.state_dir)
    took = time.perf_counter() - started
    plots = plot(outcome, args.out_dir)
    command = " ".join(["scripts/bench", PART, *argv])
    data = {
        "machine": machine(),
        "plan": asdict(plan),
        "pick": outcome.pick,
        "bad": outcome.bad,
        "recoveries": {name: asdict(r) for name, r in outcome.recoveries.items()},
        "steps": {name: columns(steps) for name, steps in outcome.steps.items()},
        "headlines": [headline(outcome)],
    }
    write_fragment(args.out_dir, PART, markdown(outcome, command, plots, took), data)
    print(headline(outcome), flush=True)


if __name__ == "__main__":
    main()
