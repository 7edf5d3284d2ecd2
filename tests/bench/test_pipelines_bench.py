"""bench/pipelines.py's parts on tiny inputs: the workers a set of replicas is billed for, the
simulation of the three systems on a short trace (every query answered, end to end, within
what each system held), and the write-up with its plots. The whole study (the real zoo's
profiles, the conv trace and Gamma CV 1 and 4) is ``scripts/bench pipelines --quick``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import pipelines as bench
from modelless.catalog import DEFAULT_POOLS
from modelless.pipelines.spec import PipelineSpec
from modelless.types import VariantProfile
from sim.traces import gamma_arrivals
from tests.unit.test_pipelines_planner import profile

SLO_MS = 250.0


def zoo() -> list[VariantProfile]:
    return [
        profile("mobilenetv3_small_100", "fp32", 4.0, accuracy=0.6),
        profile("resnet18", "fp32", 40.0, accuracy=0.9),
        profile("resnet50", "fp32", 60.0, accuracy=0.94),
        profile("resnet50", "fast", 10.0, accuracy=0.94, pool="gpu"),
    ]


def config(variant_index: int, replicas: int) -> bench.StageConfig:
    variant = zoo()[variant_index]
    return bench.StageConfig(variant, 1, 10.0, replicas, 100.0, 20.0)


def test_replicas_are_billed_as_the_workers_they_need() -> None:
    cpu = DEFAULT_POOLS["cpu"]
    worker = cpu.price_per_vcpu_second * cpu.vcpus_per_worker
    one_each = [bench.Replica(0.0, config(0, 1)), bench.Replica(0.0, config(1, 1))]
    # Two one-thread instances of different variants share a 2-vCPU worker...
    assert bench.workers_per_second(one_each) == pytest.approx(worker)
    # ...two of the same variant do not (a worker holds one instance of a variant).
    same = [bench.Replica(0.0, config(0, 1)), bench.Replica(0.0, config(0, 1))]
    assert bench.workers_per_second(same) == pytest.approx(2 * worker)
    assert bench.workers_per_second([]) == 0.0


def test_the_three_systems_answer_every_query_of_a_short_trace(tmp_path: Path) -> None:
    plan = bench.Plan(mean_qps=8.0, duration_s=120.0, planning_s=30.0, slo_ms=SLO_MS, bin_s=30.0)
    arrivals = gamma_arrivals(plan.mean_qps, 1.0, plan.duration_s, seed=3)
    results = {}
    for name, (spec, branches) in bench.pipelines(SLO_MS).items():
        outcomes = bench.run_one(spec, branches, zoo(), arrivals, plan)
        assert set(outcomes) == set(bench.SYSTEMS)
        for outcome in outcomes.values():
            assert len(outcome.latencies_ms) == arrivals.count  # every query answered once
            assert min(outcome.latencies_ms) > 0 and outcome.cost > 0
            assert 0.0 <= outcome.attainment <= 1.0
            assert len(outcome.cost_per_bin) == 4
        results[name] = {"gamma-cv1": outcomes}

    rows = bench.summary(results)
    assert [r["pipeline"] for r in rows] == ["sequential", "cascade"]
    for row in rows:
        assert row["peak/ours cost"] == pytest.approx(row["peak $"] / row["inferline $"], rel=0.05)
    plots = bench.plot(results, plan, tmp_path)
    assert all((tmp_path / name).stat().st_size > 0 for name in plots)
    text = bench.markdown(rows, plan, {}, "scripts/bench pipelines --quick", plots, 1.0)
    assert "7.6x" in text and "| sequential | gamma-cv1 |" in text
    assert "(InferLine: up to 7.6x)" in bench.headline(rows)


def test_a_missing_zoo_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="scripts/bench real-zoo"):
        bench.zoo_profiles(tmp_path)


def test_a_branch_probability_is_measured_through_the_source_model(tmp_path: Path) -> None:
    """On held-out inputs, through the real ONNX model: the share its condition holds for."""
    from infra.zoo.real import MODEL_FILE, TESTSET
    from tests.models import digits, linear_model

    spec = PipelineSpec.model_validate(
        {
            "name": "c",
            "stages": [{"name": "cheap", "model": "small"}, {"name": "expensive", "model": "big"}],
            "edges": [
                {
                    "source": "cheap",
                    "target": "expensive",
                    "when": {"kind": "confidence_below", "threshold": 0.2},
                }
            ],
            "latencySlo": 100.0,
        }
    )
    assumed, notes = bench.measured_branches(spec, tmp_path)
    assert assumed == {"cheap->expensive": bench.BRANCH_P} and "assumed" in notes[0]

    (tmp_path / "small").mkdir()
    (tmp_path / "small" / MODEL_FILE).write_bytes(linear_model())
    inputs = digits()[0][-100:]
    np.savez(tmp_path / "small" / TESTSET, inputs=inputs, labels=np.zeros(len(inputs), dtype=np.int64))
    measured, notes = bench.measured_branches(spec, tmp_path, rows=100)

    import onnxruntime as ort

    session = ort.InferenceSession(linear_model(), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": inputs})[0].astype(np.float64)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    want = float((probabilities.max(axis=1) < 0.2).mean())
    assert 0 < want < 1 and measured == {"cheap->expensive": pytest.approx(want)}
    assert "measured" in notes[0] and "100 held-out" in notes[0]
