"""The tuning benchmark (bench/tuning.py) end to end on a tiny stand-in model: real worker
processes, the load generator, the static sweep and both tuners, the write-up and its plot. The
numbers are not judged (a tiny model on a shared machine); the shape of the run is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench import tuning
from modelless.tuning.base import config_space
from tests.bench.standins import image_model


def test_the_quick_benchmark_runs_the_sweep_and_both_tuners_and_writes_its_section(tmp_path: Path) -> None:
    model = image_model(tmp_path / "image")
    with np.load(model.testset_path, allow_pickle=False) as data:
        inputs = np.ascontiguousarray(data["input"][:1])
    subject = tuning.built_subject("standin", model.onnx_path, inputs, tmp_path / "work")
    assert subject.variant.latency_p99_ms.keys() == set(tuning.PROFILE_BATCHES)
    lines: list[str] = []
    run = tuning.run_bench(
        subject,
        tmp_path / "work",
        (("medium", 0.3),),
        window_s=0.4,
        cores=2,
        command="test",
        log=lines.append,
        tune_windows=4,
    )
    [level] = run.levels
    assert set(level.sweep) == {c.label() for c in config_space(2)}
    assert level.default == "intra=1,inter=1,conc=1" and level.best in level.sweep
    best = level.sweep[level.best]
    assert all(best.score <= w.score + 1e-6 for w in level.sweep.values())
    for policy in ("region", "ucb"):
        outcome = level.tuned[policy]
        assert outcome["trials"] >= 1 and outcome["final"].queries > 0
        assert outcome["history"], "the worker's tuner observed no window"
    assert run.budget_ms > 0 and run.capacity_qps > 0
    path = tuning.write(run, tmp_path / "out")
    text = path.read_text()
    assert text.startswith("## Parallelism tuning") and "best static" in text and "trials" in text
    assert (tmp_path / "out" / "tuning.png").stat().st_size > 0
    data = json.loads((tmp_path / "out" / "tuning.json").read_text())
    assert len(data["headlines"]) == 1 and "RRL-style tuner" in data["headlines"][0]
    print("\n".join(lines))
