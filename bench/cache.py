"""The prediction cache (Clipper §4.2): a hit's latency against a miss's, over HTTP, in one run.

    python -m bench.cache [--quick] [--pairs 300] [--model mobilenetv3_small_100]
                          [--state-dir .modelless] [--out docs/bench]

The embedded stack (``infra.local.stack``: the gateway on 127.0.0.1 in this process, a real
worker process, the in-memory store and so the in-process cache) serves one model: a real-zoo
model from the registered zoo's cache (``bench.real_zoo``; ``--model``) when it is there, else
the demo zoo's digits MLP, registered over the API. Each pair sends one input never sent before
(a miss: selection, the worker, inference; its answer is cached) and the previous pair's input
again (a hit: the cache's lookup only), back to back, in turns each first, so that whatever else
the machine does weighs on both alike. Latency is the client's round trip and the gateway's own
``total_ms``; the result is their p50 and p99, and the miss/hit ratios, within this one run.

Writes ``<out>/cache.md`` (its section of docs/BENCHMARKS.md), ``cache.json`` and ``cache.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, percentile, today, write_fragment

PART = "cache"
DEFAULT_MODEL = "mobilenetv3_small_100"
PAIRS, QUICK_PAIRS = 300, 30
WARMUP = 5  # pairs sent first and not measured: connections, the instance's first runs


@dataclass
class Pairs:
    """What the pairs measured, in milliseconds, in the order they were sent."""

    miss_client_ms: list[float] = field(default_factory=list)
    hit_client_ms: list[float] = field(default_factory=list)
    miss_server_ms: list[float] = field(default_factory=list)
    hit_server_ms: list[float] = field(default_factory=list)
    hit_lookup_ms: list[float] = field(default_factory=list)  # the hit's timingsMs.cache_ms
    miss_tiers: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0  # a first query answered from the cache, or a repeat that was not
    mismatched: int = 0  # a hit whose outputs differ from its miss's


def distinct_inputs(base: np.ndarray, count: int) -> np.ndarray:
    """``count`` inputs, each sent once before its repeat: ``base``'s rows in turn, each pass
    over them shifted by a small constant (so that every input is new to the cache, and still an
    input of the model's kind)."""
    rows = [base[i % len(base)] + np.asarray((i // len(base)) * 1e-3, dtype=base.dtype) for i in range(count)]
    return np.ascontiguousarray(np.stack(rows))


def measure_pairs(
    query: Callable[[np.ndarray], dict[str, Any]], inputs: np.ndarray, warmup: int = WARMUP
) -> Pairs:
    """For each row: a query never sent before (a miss), beside a repeat of the previous row's (a
    hit), in turns miss-then-hit and hit-then-miss, so that neither always follows the other (a
    worker busy after a miss would otherwise weigh on the hit alone). ``query`` sends a batch of
    one and returns the reply (with the client's ``clientTimingsMs.roundTrip``)."""
    pairs = Pairs()
    answers: list[Any] = []  # each row's miss outputs, to check its hit's against
    for index, row in enumerate(inputs):
        previous = max(0, index - 1)
        if index % 2 == 0:
            miss = query(row[None])
            answers.append(miss["outputs"])
            hit = query(inputs[previous][None] if index else row[None])
        else:
            hit = query(inputs[previous][None])
            miss = query(row[None])
            answers.append(miss["outputs"])
        if miss["cached"] or not hit["cached"]:
            pairs.unexpected += 1
        if hit["outputs"] != answers[previous]:
            pairs.mismatched += 1
        if index < warmup:
            continue
        pairs.miss_client_ms.append(float(miss["clientTimingsMs"]["roundTrip"]))
        pairs.hit_client_ms.append(float(hit["clientTimingsMs"]["roundTrip"]))
        pairs.miss_server_ms.append(float(miss["timingsMs"]["total_ms"]))
        pairs.hit_server_ms.append(float(hit["timingsMs"]["total_ms"]))
        pairs.hit_lookup_ms.append(float(hit["timingsMs"].get("cache_ms", 0.0)))
        pairs.miss_tiers[miss["tier"]] = pairs.miss_tiers.get(miss["tier"], 0) + 1
    return pairs


def summarise(pairs: Pairs) -> dict[str, Any]:
    """p50 and p99 of each series, and the miss/hit ratios of the round trips and the gateway's
    own time."""

    def stats(values: list[float]) -> dict[str, float]:
        return {"p50_ms": round(percentile(values, 50), 3), "p99_ms": round(percentile(values, 99), 3)}

    summary: dict[str, Any] = {
        "pairs": len(pairs.miss_client_ms),
        "miss_client": stats(pairs.miss_client_ms),
        "hit_client": stats(pairs.hit_client_ms),
        "miss_server": stats(pairs.miss_server_ms),
        "hit_server": stats(pairs.hit_server_ms),
        "hit_lookup": stats(pairs.hit_lookup_ms),
        "miss_tiers": dict(pairs.miss_tiers),
        "unexpected": pairs.unexpected,
        "mismatched": pairs.mismatched,
    }
    for where in ("client", "server"):
        for q in ("p50", "p99"):
            hit = summary[f"hit_{where}"][f"{q}_ms"]
            miss = summary[f"miss_{where}"][f"{q}_ms"]
            summary[f"ratio_{where}_{q}"] = round(miss / hit, 2) if hit > 0 else None
    return summary


# --- the stack and its model -------------------------------------------------------------------------


@dataclass
class Subject:
    label: str  # what the write-up names
    app_id: str
    model_name: str
    base: np.ndarray  # example inputs of the model (a batch)
    client: Any  # modelless.client.Client with the app's key
    inference_ms: float  # the profiled p50 of the variant at batch 1, for the write-up


def cache_on() -> None:
    """The stack reads its settings from the environment: the cache on, in memory, sized for
    every pair (``scripts/bench`` turns it off for the other parts)."""
    os.environ["MODELLESS_PREDICTION_CACHE_ENABLED"] = "true"
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # EMF on stdout would drown the report


def registered_real_model(name: str, state_dir: Path) -> Any | None:
    """The real zoo's ``name`` when the registered zoo's cache holds it (never registered here:
    that takes minutes per model; ``scripts/bench real-zoo`` does it), else None."""
    from bench.real_zoo import _artifacts_present, _read_entry, cache_dir

    directory = cache_dir(state_dir)
    entry = _read_entry(directory / f"{name}.json")
    if entry is None or not _artifacts_present(entry, directory / "repo"):
        return None
    return entry


@contextlib.contextmanager
def real_zoo_subject(model: Any, state_dir: Path, tmp: Path) -> Iterator[Subject]:
    """The real model published into the embedded stack, its cheapest one-thread cpu variant
    loaded on one worker ahead of the queries (``bench.serving``'s stack)."""
    from bench.real_zoo import RealZoo, cache_dir, held_out_batch
    from bench.serving import ProjectStack, serving_variant
    from modelless.client import Client

    zoo = RealZoo([model], cache_dir(state_dir) / "repo")
    project = ProjectStack(tmp, zoo, lambda_concurrency=1)
    try:
        admin = project.gateway.admin(ready_s=60)
        key = admin.create_app(model.app)
        variant = serving_variant(model)
        project.run_worker(batching=True, preload=variant)
        with Client(project.stack.url, api_key=key) as client:
            yield Subject(
                f"`{model.name}` (real zoo; variant `{variant.variant_id}`)",
                model.app,
                model.name,
                held_out_batch(model, 16),
                client,
                variant.median_ms(1),
            )
    finally:
        project.close()


@contextlib.contextmanager
def digits_subject(state_dir: Path, tmp: Path) -> Iterator[Subject]:
    """The demo zoo's digits MLP, registered over the API in the embedded stack (one worker)."""
    from infra.local.stack import ThreadedGateway, start_stack
    from infra.zoo.digits import build_zoo
    from modelless.client import Client

    zoo_dir = state_dir / "demo"
    build_zoo(zoo_dir)
    port = 18600 + os.getpid() % 300
    stack = start_stack(tmp, "127.0.0.1", port, 1, 1, "memory://")
    gateway = ThreadedGateway(stack, port)
    try:
        admin = gateway.admin(ready_s=60)
        with Client(stack.url, api_key=admin.create_app("cache")) as client:
            name = "digits-mlp"
            reply = client.register_model(name, zoo_dir / f"{name}.onnx", zoo_dir / "valset.npz", "cache")
            client.wait_for_registration(reply["registrationId"])
            with np.load(zoo_dir / "testset.npz", allow_pickle=False) as test:
                base = np.ascontiguousarray(test["inputs"][:64])
            yield Subject(f"`{name}` (demo zoo)", "cache", name, base, client, 0.0)
    finally:
        gateway.close()


def run(subject: Subject, pairs: int) -> Pairs:
    inputs = distinct_inputs(subject.base, pairs + WARMUP)

    def query(batch: np.ndarray) -> dict[str, Any]:
        reply: dict[str, Any] = subject.client.online_query(
            batch, subject.app_id, model_name=subject.model_name
        )
        return reply

    return measure_pairs(query, inputs)


# --- the write-up ------------------------------------------------------------------------------------


def headline(summary: dict[str, Any], label: str) -> str:
    return (
        f"Prediction cache, {label}: a hit answers in {summary['hit_client']['p50_ms']:.2f} ms p50 / "
        f"{summary['hit_client']['p99_ms']:.2f} ms p99 over HTTP against a miss's "
        f"{summary['miss_client']['p50_ms']:.2f} / {summary['miss_client']['p99_ms']:.2f} ms "
        f"({summary['ratio_client_p50']}x / {summary['ratio_client_p99']}x)"
    )


def markdown(summary: dict[str, Any], label: str, command: str, inference_ms: float) -> str:
    def row(name: str, key: str) -> list[str]:
        return [name, f"{summary[key]['p50_ms']:.3f}", f"{summary[key]['p99_ms']:.3f}"]

    table = markdown_table(
        ["", "p50 ms", "p99 ms"],
        [
            row("miss: client round trip", "miss_client"),
            row("hit: client round trip", "hit_client"),
            row("miss: gateway `total_ms`", "miss_server"),
            row("hit: gateway `total_ms`", "hit_server"),
            row("hit: the lookup (`cache_ms`)", "hit_lookup"),
        ],
    )
    tiers = ", ".join(f"{tier} {count}" for tier, count in sorted(summary["miss_tiers"].items()))
    profiled = f" (its profiled p50 at batch 1: {inference_ms:.2f} ms)" if inference_ms else ""
    return f"""## The prediction cache: a hit against a miss

Machine: `{machine()}`, {today()}. Reproduce: `{command}`.

The embedded stack (gateway in-process on 127.0.0.1, one worker process, in-memory store and
cache) serving {label}{profiled}. {summary["pairs"]} pairs after {WARMUP} unmeasured ones: an
input never sent before (a miss: selection, the worker, inference; served by: {tiers}) and the
previous pair's input again (a hit: the cache's lookup only, `"cached": true` in the reply), back
to back and in alternating order, so that the machine's other work weighs on both alike.

{table}

**Cache hit latency vs a miss: {summary["ratio_client_p50"]}x faster at p50 and
{summary["ratio_client_p99"]}x at p99 over HTTP** (the gateway's own time: {summary["ratio_server_p50"]}x
and {summary["ratio_server_p99"]}x). What a hit still pays is the HTTP stack (uvicorn, FastAPI,
the body's decoding, the reply's encoding) and the lookup itself. Replies that did not say what
was expected (a first query cached, a repeat not): {summary["unexpected"]}; hits whose outputs
differed from their miss's: {summary["mismatched"]}.

![hit and miss latency](cache.png)
"""


def plot(pairs: Pairs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for values, name in ((pairs.miss_client_ms, "miss"), (pairs.hit_client_ms, "hit")):
        ordered = np.sort(np.asarray(values))
        axis.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered), label=name)
    axis.set_xscale("log")
    axis.set_xlabel("client round trip (ms, log scale)")
    axis.set_ylabel("share of queries")
    axis.set_title("Prediction cache: hit vs miss latency over HTTP")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write(pairs: Pairs, label: str, command: str, inference_ms: float, out_dir: Path) -> Path:
    summary = summarise(pairs)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(pairs, out_dir / f"{PART}.png")
    data = {
        "machine": machine(),
        "date": today(),
        "command": command,
        "subject": label,
        "summary": summary,
        "pairs": {
            "miss_client_ms": pairs.miss_client_ms,
            "hit_client_ms": pairs.hit_client_ms,
            "miss_server_ms": pairs.miss_server_ms,
            "hit_server_ms": pairs.hit_server_ms,
        },
        "headlines": [headline(summary, label)],
    }
    return write_fragment(out_dir, PART, markdown(summary, label, command, inference_ms), data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench cache", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PAIRS} pairs (a smoke run)")
    parser.add_argument(
        "--pairs", type=int, help=f"measured pairs (default {PAIRS}; {QUICK_PAIRS} with --quick)"
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="the real-zoo model, when the zoo's cache has it"
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    pairs = args.pairs or (QUICK_PAIRS if args.quick else PAIRS)
    command = (
        "scripts/bench cache"
        + (" --quick" if args.quick else "")
        + (f" --pairs {args.pairs}" if args.pairs else "")
    )
    cache_on()
    from modelless.observability.metrics import logger as gateway_logger

    gateway_logger.setLevel("WARNING")
    print(f"machine: {machine()}", flush=True)
    real = registered_real_model(args.model, args.state_dir)
    with tempfile.TemporaryDirectory(prefix="modelless-cache-bench-") as tmp:
        subject_of = (
            real_zoo_subject(real, args.state_dir, Path(tmp))
            if real is not None
            else digits_subject(args.state_dir, Path(tmp))
        )
        if real is None:
            print(f"{args.model} is not in the registered zoo's cache: the digits MLP instead", flush=True)
        with subject_of as subject:
            measured = run(subject, pairs)
            label, inference_ms = subject.label, subject.inference_ms
    path = write(measured, label, command, inference_ms, args.out)
    print(headline(summarise(measured), label), flush=True)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
