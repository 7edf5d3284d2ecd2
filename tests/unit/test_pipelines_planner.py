"""The pipeline planner over explicit profiles: stage probabilities from measured branches,
latency splits that keep every path within the SLO, and plans from the variant-mix program that
pick each stage's variant, batch and instances at the least cost within the end-to-end p99."""

from __future__ import annotations

from typing import Any

import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.pipelines.planner import latency_splits, plan_pipeline, stage_probabilities
from modelless.pipelines.spec import PipelineSpec
from modelless.types import VariantProfile

BATCHES = {1: 1.0, 4: 2.5, 16: 8.0}  # p99 at batch b, as multiples of batch one's


def profile(
    model: str, name: str, p99_ms: float, accuracy: float = 0.9, pool: str = "cpu", precision: str = "fp32"
) -> VariantProfile:
    spec = DEFAULT_POOLS[pool]
    return VariantProfile(
        variant_id=f"app/{model}/{name}/{pool}",
        app_id="app",
        model_name=model,
        pool=pool,
        precision=precision,
        opt_level="all",
        threads=1,
        artifact_key="",
        size_bytes=1000,
        load_latency_ms=50.0,
        latency_p50_ms={b: p99_ms * f * 0.7 for b, f in BATCHES.items()},
        latency_p99_ms={b: p99_ms * f for b, f in BATCHES.items()},
        peak_memory_mb=100.0,
        accuracy=accuracy,
        price_per_second=spec.instance_price_per_second(1),
        request_price=spec.request_price,
        hardware="test",
        measured_on_target=True,
    )


def pipeline(slo_ms: float, **overrides: Any) -> PipelineSpec:
    body: dict[str, Any] = {
        "name": "cascade",
        "stages": [{"name": "cheap", "model": "small"}, {"name": "expensive", "model": "large"}],
        "edges": [
            {"source": "cheap", "target": "expensive", "when": {"kind": "confidence_below", "threshold": 0.8}}
        ],
        "latencySlo": slo_ms,
        **overrides,
    }
    spec = PipelineSpec.model_validate(body)
    spec.validate_dag()
    return spec


SEQUENTIAL = {"edges": [{"source": "cheap", "target": "expensive"}]}


def test_a_stage_is_reached_with_the_product_of_the_measured_branches() -> None:
    cascade = pipeline(100.0)
    assert stage_probabilities(cascade, {"cheap->expensive": 0.3}) == pytest.approx(
        {"cheap": 1.0, "expensive": 0.3}
    )
    assert stage_probabilities(cascade, {}) == {"cheap": 1.0, "expensive": 0.5}  # not measured yet
    assert stage_probabilities(pipeline(100.0, **SEQUENTIAL), {}) == {"cheap": 1.0, "expensive": 1.0}
    diamond = pipeline(
        100.0,
        stages=[{"name": n, "model": "small"} for n in "abcd"],
        edges=[
            {"source": "a", "target": "b", "when": {"kind": "predicted_in", "classes": [1]}},
            {"source": "a", "target": "c", "when": {"kind": "predicted_in", "classes": [2]}},
            {"source": "b", "target": "d"},
            {"source": "c", "target": "d"},
        ],
    )
    reached = stage_probabilities(diamond, {"a->b": 0.2, "a->c": 0.5})
    assert reached["d"] == pytest.approx(1 - (1 - 0.2) * (1 - 0.5))


def test_every_split_keeps_every_path_within_the_slo() -> None:
    diamond = pipeline(
        100.0,
        stages=[{"name": n, "model": "small"} for n in "abcd"],
        edges=[
            {"source": "a", "target": "b"},
            {"source": "a", "target": "c"},
            {"source": "b", "target": "d"},
            {"source": "c", "target": "d"},
        ],
    )
    splits = latency_splits(diamond, max_splits=81)
    assert 1 < len(splits) <= 81
    for share in splits:
        for path in diamond.paths():
            assert sum(share[s] for s in path) <= 1.0 + 1e-9
    assert latency_splits(pipeline(100.0), max_splits=1) == [{"cheap": 0.5, "expensive": 0.5}]


def test_the_plan_splits_the_slo_unevenly_when_one_stage_needs_more() -> None:
    profiles = [profile("small", "fp32", 10.0), profile("large", "fp32", 60.0)]
    spec = pipeline(100.0, **SEQUENTIAL)

    plan = plan_pipeline(spec, profiles, DEFAULT_POOLS, 5.0)
    # With one grid split, the even one (50 ms cannot hold the large model's 60 ms p99), the
    # split in proportion to the stages' fastest p99s (10:60) is tried too, and holds.
    assert latency_splits(spec, max_splits=1) == [{"cheap": 0.5, "expensive": 0.5}]
    proportional = plan_pipeline(spec, profiles, DEFAULT_POOLS, 5.0, max_splits=1)

    assert proportional.feasible and proportional.splits_tried == 2
    assert proportional.budgets()["expensive"] == pytest.approx(100.0 * 60 / 70, abs=1e-3)
    assert plan.feasible and plan.splits_tried > 2
    assert plan.cost_per_second <= proportional.cost_per_second
    budgets = plan.budgets()
    assert budgets["expensive"] >= 60.0 and budgets["cheap"] >= 10.0
    assert plan.critical_path_ms <= 100.0 + 1e-6
    for stage in plan.stages:
        assert stage.choices and all(c.p99_ms <= stage.budget_ms for c in stage.choices)
        assert sum(c.qps for c in stage.choices) == pytest.approx(stage.load_qps, rel=1e-6)
    assert plan.cost_per_second > 0 and "critical path" in plan.explanation[-1]


def test_the_plan_picks_the_cheapest_variant_that_fits_and_respects_the_accuracy_floor() -> None:
    profiles = [
        profile("small", "fp32", 5.0),
        profile("large", "fp32", 40.0),
        profile("large", "int8", 15.0, precision="int8"),  # faster: fewer instances for the load
        profile("large", "int8-lossy", 8.0, accuracy=0.5, precision="int8"),  # below the floor
    ]
    plan = plan_pipeline(pipeline(100.0, accuracy=0.8, **SEQUENTIAL), profiles, DEFAULT_POOLS, 200.0)

    assert plan.feasible
    chosen = {c.variant_id for s in plan.stages for c in s.choices}
    assert "app/large/int8-lossy/cpu" not in chosen
    assert "app/large/int8/cpu" in chosen
    large = next(s for s in plan.stages if s.stage == "expensive")
    assert all(c.batch in BATCHES for c in large.choices)
    assert sum(c.instances for c in large.choices) >= 1


def test_a_rarely_taken_branch_costs_less_to_provision() -> None:
    profiles = [profile("small", "fp32", 5.0), profile("large", "fp32", 30.0)]
    spec = pipeline(100.0)

    always = plan_pipeline(spec, profiles, DEFAULT_POOLS, 100.0, {"cheap->expensive": 1.0})
    rarely = plan_pipeline(spec, profiles, DEFAULT_POOLS, 100.0, {"cheap->expensive": 0.1})

    assert always.feasible and rarely.feasible
    assert rarely.stages[1].load_qps == pytest.approx(10.0)
    assert rarely.instances()["expensive"] < always.instances()["expensive"]
    assert rarely.cost_per_second < always.cost_per_second


def test_an_slo_no_variant_meets_is_an_infeasible_plan_that_says_so() -> None:
    plan = plan_pipeline(
        pipeline(20.0, **SEQUENTIAL),
        [profile("small", "a", 5.0), profile("large", "b", 30.0)],
        DEFAULT_POOLS,
        5.0,
    )

    assert not plan.feasible
    assert plan.stages[1].unmet_qps == pytest.approx(5.0)
    assert "unmet" in plan.explanation[2]
