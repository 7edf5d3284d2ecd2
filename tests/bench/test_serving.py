"""The serving benchmark's reading of its loads (bench/serving.py), the load generator's binary
bodies (bench/loadgen.py) and docs/BENCHMARKS.md's assembly (bench/__main__.py): hand-built
loads and fragments; nothing is served or timed here."""

from __future__ import annotations

import argparse
import base64
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench import real_zoo, serving
from bench.__main__ import ARCHIVED_NOTE, assemble, demote
from bench.loadgen import Job
from bench.real_zoo import RealZoo
from bench.serving import (
    BUDGET_MS,
    PROJECT_BATCHED,
    PROJECT_JSON,
    PROJECT_PLAIN,
    RAY_BATCHED,
    RAY_PLAIN,
    Direct,
    Level,
    Plan,
    Run,
    Served,
)


def level(
    model: str, system: str, repeat: int, callers: int, qps: float, p99: float, **extra: object
) -> Level:
    return Level(
        model=model,
        system=system,
        repeat=repeat,
        mode="sequential" if callers == 1 else "closed",
        load=callers,
        sent=100,
        ok=100,
        errors=0,
        throughput=qps,
        p50_ms=p99 / 2,
        p99_ms=p99,
        max_ms=p99,
        **extra,  # type: ignore[arg-type]
    )


def served(name: str, per_row_at_8: float) -> Served:
    p50 = {"1": 10.0, "8": 8 * per_row_at_8}
    return Served(
        name,
        {
            "id": f"zoo-images/{name}/fp32_all/cpu-1t",
            "precision": "fp32",
            "opt_level": "all",
            "threads": 1,
            "max_batch": 8,
            "batch_delay_ms": 0.5,
            "profile_p50_ms": p50,
            "profile_p99_ms": p50,
            "p50_ci_pct": 2.0,
            "load_ms": 300.0,
            "accuracy": 0.9,
        },
        {"kept": 5, "pruned": 10, "registered": "today"},
    )


def hand_built_run() -> Run:
    """Two repeats on two models: batching pays on "cheap-rows" (its per-row cost falls) and not
    on "flat-rows"; Ray is measured on the first."""
    run = Run(
        machine="here",
        date="today",
        command="scripts/bench serving",
        plan=Plan(2, 1.0, 1.0, 0.1, (1, 2, 4, 8), 1.0, 10),
        models=[served("cheap-rows", 2.0), served("flat-rows", 10.0)],
        ray_model="cheap-rows",
        ray="measured",
        ray_version="2",
        netns=True,
    )
    for repeat in range(2):
        for model in ("cheap-rows", "flat-rows"):
            run.direct.append(Direct(model, 10.0, 12.0, 100, {1: 10.0, 8: 16.0}, 0.1, 5.0))
            run.levels.append(level(model, PROJECT_JSON, repeat, 1, 60.0, 30.0))
            run.levels[-1].p50_ms = 16.0
            run.levels += [
                level(model, PROJECT_BATCHED, repeat, 1, 90.0, 14.0, path_p50_ms=0.8, mean_batch=1.0),
                level(model, PROJECT_BATCHED, repeat, 2, 150.0, 60.0, mean_batch=2.0, batch_limit=4),
                level(model, PROJECT_BATCHED, repeat, 4, 300.0, 150.0, mean_batch=3.5, batch_limit=8),
                level(model, PROJECT_BATCHED, repeat, 8, 320.0, 400.0, mean_batch=7.0, batch_limit=8),
                level(model, PROJECT_PLAIN, repeat, 1, 90.0, 14.0),
                level(model, PROJECT_PLAIN, repeat, 2, 100.0, 120.0),
                level(model, PROJECT_PLAIN, repeat, 4, 100.0, 250.0),
            ]
            run.levels[-7].p50_ms = 11.0  # the binary path's one-caller median
        for system, qps in ((RAY_BATCHED, 100.0), (RAY_PLAIN, 50.0)):
            run.levels += [
                level("cheap-rows", system, repeat, 1, 40.0, 20.0),
                level("cheap-rows", system, repeat, 2, qps, 180.0),
                level("cheap-rows", system, repeat, 4, qps, 900.0),
            ]
    return run


def test_throughput_within_the_budget_is_the_best_load_whose_p99_stayed_in_it() -> None:
    run = hand_built_run()
    batched = serving.levels_of(run, "cheap-rows", PROJECT_BATCHED, 0)
    assert serving.throughput_within(batched) == 300.0  # 4 callers; 8 passed the budget
    assert serving.within(batched, BUDGET_MS) is not None
    assert serving.ratios(run, "cheap-rows", PROJECT_BATCHED, PROJECT_PLAIN, serving.throughput_within) == [
        3.0,
        3.0,
    ]
    failed = [level("m", PROJECT_PLAIN, 0, 1, 10.0, 5.0)]
    failed[0].errors = 1  # a load with an error never counts as within the budget
    assert serving.throughput_within(failed) == 0.0


def test_the_overhead_is_the_clients_encoding_and_round_trip_over_a_direct_call() -> None:
    run = hand_built_run()
    # binary: 0.1 ms to encode + an 11 ms median round trip - a 10 ms direct call
    assert serving.overheads(run, "cheap-rows", PROJECT_BATCHED) == pytest.approx([1.1, 1.1])
    # JSON: 5 ms to encode + 16 ms - 10 ms
    assert serving.overheads(run, "cheap-rows", PROJECT_JSON) == pytest.approx([11.0, 11.0])


def test_batching_has_a_target_only_where_the_per_row_cost_falls() -> None:
    run = hand_built_run()
    assert serving.per_row_falls(run, "cheap-rows")[0] is True  # 2 ms a row at 8 against 10 at 1
    assert serving.per_row_falls(run, "flat-rows")[0] is False
    section = serving.batching_section(run)
    assert f"target ≥ 2{serving.TIMES}: met in every repeat" in section
    assert "no target: batching cannot pay" in section


def test_the_write_up_says_which_targets_were_met(tmp_path: Path) -> None:
    run = hand_built_run()
    text = serving.write_markdown(run, tmp_path).read_text()
    assert text.startswith("## Serving the real zoo")
    # 1.1 ms over a 10 ms call: 11 % (over the 10 % target) but within 2 ms.
    assert "`cheap-rows` ≤ 10 % of its direct p50: 11.0 % (missed in every repeat)" in text
    assert "`cheap-rows` ≤ 2 ms: met in every repeat" in text
    # Ray: the project's 300 q/s against Ray's 100 (batched) and 100 against 50 (plain).
    assert "3.00 (met in every repeat)" in text and "2.00 (met in every repeat)" in text
    headlines = serving.serving_headlines(run)
    assert any("Against Ray Serve" in line for line in headlines)


def test_a_saved_run_reads_back_as_it_was() -> None:
    run = hand_built_run()
    raw = json.loads(json.dumps({**asdict(run), "headlines": []}))
    again = Run.from_json(raw)
    assert again == run


def test_the_load_generator_sends_binary_bodies_with_their_content_type() -> None:
    body = b"\x93NUMPY\x01\x00binary\x00bytes"
    parsed = Job.parse(
        {
            "url": "http://127.0.0.1:8080/v1/online_query?appID=a&latency=200",
            "body_b64": base64.b64encode(body).decode(),
            "content_type": "application/x-npy",
        }
    )
    head, _, sent = parsed.request.partition(b"\r\n\r\n")
    assert sent == body
    assert head.startswith(b"POST /v1/online_query?appID=a&latency=200 HTTP/1.1")
    assert b"Content-Type: application/x-npy" in head and f"Content-Length: {len(body)}".encode() in head
    plain = Job.parse({"url": "http://127.0.0.1:8080/x", "body": '{"a": 1}'})
    assert b"Content-Type: application/json" in plain.request


def test_the_report_puts_the_real_zoo_first_and_the_digits_numbers_after(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "bench"
    out.mkdir(parents=True)
    (out / "real-zoo.md").write_text("## The real zoo\n\nSee [ZOO.md](../ZOO.md).\n\n### Detail\n")
    (out / "real-zoo.json").write_text(json.dumps({"headlines": ["zoo line"]}))
    (out / "digits-serving.md").write_text("## Serving digits\n\nOld figures ![p](digits-serving_x.png)\n")
    (out / "digits-serving.json").write_text(json.dumps({"headlines": ["digits line"]}))
    (out / "scaler.json").write_text(json.dumps({"headlines": ["scaler line"]}))
    (out / "scaler-xeon.json").write_text(json.dumps({"headlines": ["second machine's line"]}))
    doc = tmp_path / "docs" / "BENCHMARKS.md"
    assemble(out, doc)
    text = doc.read_text()
    # A second machine's run is quoted after its part's own headlines, not lost on a rewrite.
    scaler, second = text.index("- scaler line"), text.index("- second machine's line")
    assert scaler < second < text.index("## Real architectures")
    real, small = text.index("## Real architectures"), text.index("## Small models")
    assert real < small < text.index("## The control plane")
    assert text.index("### The real zoo") < small < text.index("### Serving digits")
    assert "#### Detail" in text and "[ZOO.md](ZOO.md)" in text and "(bench/digits-serving_x.png)" in text
    assert ARCHIVED_NOTE in text
    assert text.index("zoo line") < text.index("digits line")
    assert "Not measured yet: run `scripts/bench costs`" in text
    assert demote("```\n# not a heading\n```\n## Heading") == "```\n# not a heading\n```\n### Heading"


def test_the_serving_bench_runs_end_to_end_on_the_stand_in_zoo(
    zoo: RealZoo, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole path of ``scripts/bench serving --quick --no-ray`` (the embedded stack, a real
    worker process, the local Lambda tier, the load generator's binary and JSON bodies, direct
    runs), with very short loads on the two stand-ins: every load answered, the batcher's figures
    read, the write-up written. No figure is judged."""
    monkeypatch.setattr(real_zoo, "real_zoo", lambda *args, **kwargs: zoo)
    args = argparse.Namespace(
        models=["tiny-image", "tiny-text"], quick=True, no_ray=True, state_dir=state_dir, lambda_concurrency=1
    )
    plan = Plan(1, 0.4, 0.4, 0.1, (1, 2), 0.2, 20)
    run = serving.run_bench(args, plan, "scripts/bench serving --quick --no-ray")
    assert run.ray.startswith("left out")
    for model in ("tiny-image", "tiny-text"):
        for system in (PROJECT_BATCHED, PROJECT_PLAIN, PROJECT_JSON):
            measured = [m for m in run.levels if m.model == model and m.system == system]
            assert measured, f"{model}: no load of {system}"
            assert all(m.ok > 0 and m.errors == 0 for m in measured), measured
        batched = [m for m in run.levels if m.model == model and m.system == PROJECT_BATCHED]
        assert all(m.decode_p50_ms is not None and m.mean_batch is not None for m in batched)
        assert [d.model for d in run.direct].count(model) == 1
    serving.write_outputs(run, tmp_path)
    assert (tmp_path / "serving.md").exists() and (tmp_path / "serving_batching.png").exists()
    assert Run.from_json(json.loads((tmp_path / "serving.json").read_text())) == run
