"""Variant recipes, the profiler's arithmetic, dominance pruning, the pool catalog's placements,
and artifact generation on a real (tiny) ONNX classifier, in this process."""

from __future__ import annotations

import io
import itertools
import random
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modelless.catalog import (
    ACCEL_POOL,
    CPU_POOL,
    DEFAULT_POOLS,
    GPU_POOL,
    LAMBDA_POOL,
    LAMBDA_PRICE_PER_GB_SECOND,
    Placement,
    PoolKind,
    PoolSpec,
    lambda_threads,
    placements,
)
from modelless.types import VariantProfile
from tests.models import linear_model, valset_npz
from variants.generator import build_artifacts
from variants.profiler import TimingPlan, max_useful_batch, measure_accuracy, measure_latency, top_k_correct
from variants.pruning import accuracy_tie, dominates, prune_dominated, prune_variants
from variants.recipes import ACCURACY_METRICS, OPT_LEVEL_NAMES, PRECISIONS, Recipe
from variants.stats import wilson_interval

# --- recipes ----------------------------------------------------------------------------------


def test_recipe_name_joins_precision_and_level() -> None:
    assert Recipe("fp32", "basic").name == "fp32_basic"
    assert Recipe("int8-static", "all").name == "int8-static_all"
    assert Recipe("fp16", "basic").name == "fp16_basic"


@pytest.mark.parametrize(
    ("precision", "level"), list(itertools.product(PRECISIONS, OPT_LEVEL_NAMES)), ids=lambda v: str(v)
)
def test_recipe_parse_round_trips_every_recipe(precision: str, level: str) -> None:
    recipe = Recipe.parse(f"{precision}_{level}")

    assert recipe == Recipe(precision, level)
    assert (recipe.precision, recipe.opt_level) == (precision, level)
    assert Recipe.parse(recipe.name) == recipe


def test_the_trade_off_space_is_the_documented_one() -> None:
    assert PRECISIONS == ("fp32", "fp16", "int8", "int8-static")
    assert OPT_LEVEL_NAMES == ("basic", "extended", "all")
    assert ACCURACY_METRICS == ("top1", "top5")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "fp32",
        "fp32-all",  # the old scheme's separator
        "fp32_",
        "_basic",
        "fp64_basic",
        "fp32_none",
        "int8_static_all",
        "fp32_all_extra",
        "FP32_basic",
        "fp32 basic",
    ],
)
def test_recipe_parse_refuses_what_is_not_a_recipe(name: str) -> None:
    with pytest.raises(ValueError, match="is not a recipe"):
        Recipe.parse(name)


def test_recipes_are_values() -> None:
    assert len({Recipe("int8", "all"), Recipe.parse("int8_all")}) == 1
    with pytest.raises(AttributeError):
        Recipe("int8", "all").precision = "fp32"  # type: ignore[misc]


# --- the profiler's arithmetic ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("throughput", "expected"),
    [
        ({1: 100.0, 2: 200.0, 4: 300.0, 8: 310.0}, 4),  # 8 adds only 3 %
        ({1: 100.0, 2: 105.0}, 2),  # exactly +5 % still pays
        ({1: 100.0, 2: 104.9}, 1),
        ({1: 100.0, 2: 101.0, 4: 400.0}, 1),  # the first doubling that does not pay ends it
        ({1: 100.0, 2: 90.0}, 1),
        ({8: 50.0}, 8),
        ({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0, 32: 32.0, 64: 64.0}, 64),
        ({64: 64.0, 1: 1.0, 4: 2.0, 2: 2.0}, 2),  # insertion order does not matter
    ],
)
def test_max_useful_batch(throughput: dict[int, float], expected: int) -> None:
    assert max_useful_batch(throughput) == expected


def test_top_k_correct_counts_top1_and_top5() -> None:
    # Per row, class scores rank: row 0 label is best; row 1 label is 3rd; row 2 label is 5th;
    # row 3 label is 6th (outside the top 5); row 4 label is last.
    logits = np.zeros((5, 10), dtype=np.float32)
    ranking = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]  # class c gets score ranking[c]: class 0 is best
    for row in range(5):
        logits[row] = ranking
    labels = np.array([0, 2, 4, 5, 9])

    assert top_k_correct(logits, labels, "top1") == 1
    assert top_k_correct(logits, labels, "top5") == 3


def test_top5_is_at_least_top1_on_a_real_classifier() -> None:
    with np.load(io.BytesIO(valset_npz()), allow_pickle=False) as data:
        inputs, labels = data["inputs"].astype(np.float32), data["labels"]
    session = ort.InferenceSession(linear_model(), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": inputs})[0]

    top1 = top_k_correct(logits, labels, "top1")
    top5 = top_k_correct(logits, labels, "top5")

    assert top1 == int((logits.argmax(axis=1) == labels).sum())
    assert top1 < top5 <= len(labels)


# --- dominance and pruning --------------------------------------------------------------------


def profile(
    name: str,
    p99: dict[int, float],
    *,
    pool: str = "cpu",
    model: str = "m",
    accuracy: float = 0.9,
    load_ms: float = 10.0,
    price: float = 1e-5,
    request_price: float = 0.0,
    precision: str = "fp32",
    examples: int = 0,
    agreement: float | None = None,
) -> VariantProfile:
    """A hand-made profile; ``examples`` > 0 gives its accuracy the Wilson interval that many
    validation examples would."""
    low, high = wilson_interval(round(accuracy * examples), examples) if examples else (0.0, 1.0)
    return VariantProfile(
        variant_id=f"app/{model}/{name}/{pool}",
        app_id="app",
        model_name=model,
        pool=pool,
        precision=precision,
        opt_level="all",
        threads=1,
        artifact_key=f"apps/app/{model}/variants/{name}.onnx",
        size_bytes=1000,
        load_latency_ms=load_ms,
        latency_p50_ms={b: t / 2 for b, t in p99.items()},
        latency_p99_ms=dict(p99),
        peak_memory_mb=1.0,
        accuracy=accuracy,
        price_per_second=price,
        request_price=request_price,
        hardware="test",
        measured_on_target=True,
        accuracy_examples=examples,
        accuracy_low=low,
        accuracy_high=high,
        agreement=agreement,
    )


def ids(variants: list[VariantProfile]) -> list[str]:
    return sorted(v.variant_id for v in variants)


def test_strictly_better_dominates_and_the_worse_is_pruned() -> None:
    fast = profile("fast", {1: 1.0, 8: 2.0})
    slow = profile("slow", {1: 2.0, 8: 4.0})

    assert dominates(fast, slow)
    assert not dominates(slow, fast)
    kept, pruned = prune_dominated([slow, fast])
    assert ids(kept) == [fast.variant_id]
    assert ids(pruned) == [slow.variant_id]


def test_within_the_tolerance_two_variants_are_equal_and_exactly_one_is_kept() -> None:
    a = profile("a", {1: 1.0, 8: 2.0})
    b = profile("b", {1: 1.05, 8: 2.08}, load_ms=10.5)  # 5 % and 4 % slower: noise

    assert dominates(a, b) and not dominates(b, a)
    for order in ([a, b], [b, a]):
        kept, pruned = prune_dominated(order)
        assert ids(kept) == [a.variant_id]  # the better of the two, whichever came first
        assert ids(pruned) == [b.variant_id]


def test_identical_profiles_keep_exactly_one_whatever_the_order() -> None:
    a, b = profile("a", {1: 1.0, 8: 2.0}), profile("b", {1: 1.0, 8: 2.0})
    assert dominates(a, b) != dominates(b, a)
    for order in ([a, b], [b, a]):
        kept, pruned = prune_dominated(order)
        assert len(kept) == 1 and len(pruned) == 1


def test_outside_the_tolerance_the_slower_is_not_equal() -> None:
    a = profile("a", {1: 1.0})
    slower = profile("b", {1: 1.2})
    assert dominates(a, slower) and not dominates(slower, a)


def test_sub_microsecond_latency_noise_counts_as_equal_on_lambda() -> None:
    # 15 % apart, but within the 0.002 ms timer slack: only one of the two is worth keeping.
    def on_lambda(name: str, p99: float) -> VariantProfile:
        return profile(name, {1: p99}, pool="lambda-cpu", price=2.9e-5, request_price=2e-7)

    tiny = on_lambda("tiny", 0.010)
    kept, pruned = prune_dominated([on_lambda("other", 0.0115), tiny])
    assert len(kept) == 1 and len(pruned) == 1
    assert not dominates(on_lambda("slow", 0.05), tiny)


def test_sub_microsecond_noise_counts_as_equal_on_a_provisioned_pool() -> None:
    tiny = profile("tiny", {1: 0.010})
    noisy = profile("other", {1: 0.0115})

    kept, pruned = prune_dominated([noisy, tiny])
    assert len(kept) == 1 and len(pruned) == 1


def test_a_more_accurate_variant_is_never_pruned_by_a_faster_less_accurate_one() -> None:
    accurate = profile("accurate", {1: 10.0, 8: 40.0}, accuracy=0.95, load_ms=100.0, price=1e-3)
    fast = profile("fast", {1: 0.1, 8: 0.4}, accuracy=0.94, load_ms=1.0, price=1e-6)

    assert not dominates(fast, accurate)
    kept, pruned = prune_dominated([fast, accurate])
    assert ids(kept) == ids([accurate, fast])  # the faster one stays too: accurate does not beat it
    assert pruned == []


def test_slower_load_or_higher_cost_or_worse_large_batch_keeps_a_variant() -> None:
    base = profile("base", {1: 1.0, 64: 10.0})
    fast_but_slow_to_load = profile("load", {1: 0.5, 64: 5.0}, load_ms=50.0)
    fast_but_costly = profile("costly", {1: 0.5, 64: 5.0}, price=1e-4)
    fast_but_worse_at_64 = profile("big", {1: 0.5, 64: 20.0})

    for other in (fast_but_slow_to_load, fast_but_costly, fast_but_worse_at_64):
        assert not dominates(other, base), other.variant_id
    kept, pruned = prune_dominated([base, fast_but_slow_to_load, fast_but_costly, fast_but_worse_at_64])
    assert base.variant_id in ids(kept)
    assert base.variant_id not in ids(pruned)


def test_the_request_fee_counts_in_the_cost() -> None:
    cheap = profile("cheap", {1: 1.0})
    with_fee = profile("fee", {1: 1.0}, request_price=1e-3)
    assert dominates(cheap, with_fee)
    assert not dominates(with_fee, cheap)


def test_variants_without_a_common_batch_size_are_incomparable() -> None:
    small = profile("small", {1: 1.0})
    large = profile("large", {64: 1.0})
    assert not dominates(small, large) and not dominates(large, small)
    kept, pruned = prune_dominated([small, large])
    assert len(kept) == 2 and pruned == []


def test_a_lambda_variant_is_never_pruned_for_a_provisioned_one() -> None:
    provisioned = profile("x", {1: 1.0, 8: 2.0}, pool="cpu", load_ms=1.0, price=1e-6)
    on_lambda = profile(
        "x", {1: 3.0, 8: 6.0}, pool="lambda-cpu", load_ms=100.0, price=1e-4, request_price=2e-7
    )

    assert dominates(provisioned, on_lambda)  # it would be, were they compared
    kept, pruned = prune_dominated([provisioned, on_lambda])
    assert ids(kept) == ids([provisioned, on_lambda])
    assert pruned == []


def test_variants_of_different_models_are_never_compared() -> None:
    one = profile("x", {1: 1.0}, model="one")
    other = profile("x", {1: 5.0}, model="other")
    kept, pruned = prune_dominated([one, other])
    assert len(kept) == 2 and pruned == []


def mixed_variants() -> list[VariantProfile]:
    return [
        profile("a", {1: 1.0, 8: 4.0}, accuracy=0.90),
        profile("b", {1: 1.05, 8: 4.1}, accuracy=0.90),  # a's twin within the tolerance
        profile("c", {1: 2.0, 8: 8.0}, accuracy=0.90),  # dominated
        profile("d", {1: 3.0, 8: 9.0}, accuracy=0.93),  # more accurate
        profile("e", {1: 0.5, 8: 6.0}, accuracy=0.90),  # best at 1, worse at 8
        profile("f", {1: 1.0, 8: 4.0}, accuracy=0.90, price=3e-5),  # costlier a
        profile("g", {1: 9.0, 8: 30.0}, accuracy=0.80, pool="lambda-cpu", price=3e-5),
        profile("h", {1: 9.5, 8: 31.0}, accuracy=0.80, pool="lambda-cpu", price=3e-5),
        profile("i", {1: 0.1, 8: 0.3}, accuracy=0.85, model="other"),
    ]


def test_prune_splits_the_input_and_every_pruned_variant_has_a_kept_dominator() -> None:
    variants = mixed_variants()

    kept, pruned = prune_dominated(variants)

    assert ids(kept + pruned) == ids(variants)
    assert not set(ids(kept)) & set(ids(pruned))
    assert ids(pruned) == ["app/m/b/cpu", "app/m/c/cpu", "app/m/f/cpu", "app/m/h/lambda-cpu"]
    for loser in pruned:
        assert any(
            dominates(winner, loser)
            for winner in kept
            if (winner.model_name, winner.pool) == (loser.model_name, loser.pool)
        ), loser.variant_id


def test_the_result_does_not_depend_on_the_input_order() -> None:
    variants = mixed_variants()
    expected = tuple(map(ids, prune_dominated(variants)))
    rng = random.Random(7)
    for _ in range(50):
        shuffled = variants[:]
        rng.shuffle(shuffled)
        assert tuple(map(ids, prune_dominated(shuffled))) == expected


def test_kept_are_exactly_the_undominated_on_random_noisy_profiles() -> None:
    # Near-equal timings (within a few %) are where a tolerance-based comparison loses
    # transitivity; the grid keeps both invariants whatever the numbers.
    rng = random.Random(3)
    for _ in range(200):
        group = [
            profile(
                f"v{i}",
                {1: rng.uniform(0.9, 1.1), 8: rng.uniform(1.8, 2.2), 64: rng.uniform(9.5, 10.5)},
                load_ms=rng.uniform(9.5, 10.5),
                accuracy=rng.choice([0.95, 0.96]),
            )
            for i in range(8)
        ]
        kept, pruned = prune_dominated(group)
        assert kept, "something is always kept"
        assert not [(a.variant_id, b.variant_id) for a in kept for b in kept if dominates(a, b)]
        for loser in pruned:
            assert any(dominates(winner, loser) for winner in kept)


# --- pruning with measured accuracies: intervals, agreement, what is always kept, reasons ------


def test_accuracies_inside_their_intervals_tie_and_agreement_breaks_the_tie() -> None:
    # 75 examples (as in the issue): 0.88 and 0.91 are the same accuracy, measured twice.
    faithful = profile("fp32_all", {1: 2.0, 8: 8.0}, accuracy=0.88, examples=75, agreement=1.0)
    quantised = profile(
        "int8_all", {1: 1.0, 8: 4.0}, accuracy=0.91, examples=75, agreement=0.90, precision="int8"
    )
    assert accuracy_tie(faithful, quantised)
    # The INT8 one is faster and "more accurate" by noise: on agreement, it is the less faithful.
    assert not dominates(quantised, faithful)
    assert not dominates(faithful, quantised)  # slower: both stay

    twin = profile(
        "int8_extended", {1: 1.0, 8: 4.0}, accuracy=0.92, examples=75, agreement=0.85, precision="int8"
    )
    assert dominates(quantised, twin)  # same speed, a tie in accuracy, agrees more with the original
    assert not dominates(twin, quantised)


def test_a_difference_beyond_the_intervals_is_not_a_tie() -> None:
    accurate = profile("fp32_all", {1: 2.0}, accuracy=0.92, examples=5000, agreement=1.0)
    collapsed = profile("int8_all", {1: 1.0}, accuracy=0.16, examples=5000, agreement=0.15, precision="int8")
    assert not accuracy_tie(accurate, collapsed)
    assert not dominates(collapsed, accurate)


def test_pruning_keeps_fp32_and_one_variant_per_precision_and_explains_every_prune() -> None:
    # On this pool INT8 is both faster and (by noise) more accurate than every FP32 level, and
    # FP16 is slower than everything: dominance alone would drop all of FP32 and FP16.
    def measured(name: str, precision: str, p50: float, accuracy: float, agreement: float) -> VariantProfile:
        return profile(
            name,
            {1: p50 * 2, 8: p50 * 8},
            precision=precision,
            accuracy=accuracy,
            examples=150,
            agreement=agreement,
        )

    variants = [
        measured("fp32_all", "fp32", 2.0, 0.90, 1.0),
        measured("fp32_basic", "fp32", 2.6, 0.90, 1.0),
        measured("int8_all", "int8", 1.0, 0.90, 1.0),
        measured("int8_basic", "int8", 1.3, 0.90, 1.0),
        measured("fp16_basic", "fp16", 5.0, 0.90, 1.0),
    ]

    result = prune_variants(variants)

    kept = {v.variant_id.split("/")[2] for v in result.kept}
    assert kept == {"int8_all", "fp32_all", "fp16_basic"}  # the best of each precision
    assert {v.variant_id.split("/")[2] for v in result.pruned} == {"fp32_basic", "int8_basic"}
    assert set(result.reasons) == {v.variant_id for v in result.pruned}
    reason = result.reasons["app/m/int8_basic/cpu"]
    assert reason.startswith("dominated by int8_all/cpu: ")
    assert "0.900 [" in reason and "agreement 1.000" in reason and "not faster at batch 1/8" in reason
    for loser in result.pruned:
        winner_name = result.reasons[loser.variant_id].split(":")[0].removeprefix("dominated by ")
        winner = next(v for v in result.kept if v.variant_id.endswith(winner_name))
        assert dominates(winner, loser)
    assert (result.kept, result.pruned) == tuple(map(list, prune_dominated(variants)))


def test_pruning_never_leaves_a_pool_without_the_registered_precision() -> None:
    for pool in ("cpu", "lambda-cpu"):
        fp32 = profile("fp32_all", {1: 4.0}, pool=pool, accuracy=0.80, precision="fp32")
        int8 = profile("int8_all", {1: 1.0}, pool=pool, accuracy=0.85, precision="int8")  # beats it outright
        assert dominates(int8, fp32)
        result = prune_variants([fp32, int8])
        assert ids(result.kept) == ids([fp32, int8]) and result.pruned == [] and result.reasons == {}


# --- the pool catalog's placements -------------------------------------------------------------


def test_lambda_placements_take_threads_from_memory() -> None:
    found = placements(LAMBDA_POOL)

    assert [p.name for p in found] == ["lambda-cpu-1769mb", "lambda-cpu-3538mb"]
    assert [(p.threads, p.memory_mb) for p in found] == [(1, 1769), (2, 3538)]
    for placement in found:
        assert placement.pool is LAMBDA_POOL
        assert placement.price_per_second == pytest.approx(
            LAMBDA_PRICE_PER_GB_SECOND * placement.memory_mb / 1024
        )
    assert found[1].price_per_second == pytest.approx(2 * found[0].price_per_second)
    assert LAMBDA_POOL.kind is PoolKind.LAMBDA and LAMBDA_POOL.request_price == pytest.approx(2e-7)


def test_cpu_placements_are_per_thread_count_and_priced_per_vcpu() -> None:
    found = placements(CPU_POOL)

    assert [p.name for p in found] == ["cpu-1t", "cpu-2t"]
    assert [(p.threads, p.memory_mb) for p in found] == [(1, 0), (2, 0)]
    assert found[0].price_per_second == pytest.approx(0.085 / 3600 / 2)
    assert found[1].price_per_second == pytest.approx(0.085 / 3600)
    assert CPU_POOL.request_price == 0.0


@pytest.mark.parametrize(
    ("pool", "name", "price"),
    [(GPU_POOL, "gpu-1t", 0.526 / 3600 / 4), (ACCEL_POOL, "accel-1t", 0.228 / 3600 / 4)],
)
def test_accelerator_placements_share_the_device_price(pool: PoolSpec, name: str, price: float) -> None:
    [placement] = placements(pool)
    assert placement.name == name
    assert placement.threads == 1
    assert placement.price_per_second == pytest.approx(price)
    # Threads do not change an accelerator instance's price: it shares the device, not vCPUs.
    assert Placement(pool, 4).price_per_second == pytest.approx(price)


@pytest.mark.parametrize(
    ("memory", "threads"), [(128, 1), (1768, 1), (1769, 1), (3537, 1), (3538, 2), (10240, 5)]
)
def test_lambda_threads_follow_memory(memory: int, threads: int) -> None:
    assert lambda_threads(memory) == threads


def test_default_pools_and_their_cpu_placements() -> None:
    assert list(DEFAULT_POOLS) == ["lambda-cpu", "cpu", "gpu", "accel"]
    cpu_names = [p.name for pool in DEFAULT_POOLS.values() if pool.device == "cpu" for p in placements(pool)]
    assert cpu_names == ["lambda-cpu-1769mb", "lambda-cpu-3538mb", "cpu-1t", "cpu-2t"]
    assert {pool.device for pool in DEFAULT_POOLS.values()} == {"cpu", "cuda", "neuron"}


# --- artifacts from a real model --------------------------------------------------------------


def valset_arrays(count: int = 200) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(valset_npz(count)), allow_pickle=False) as data:
        return data["inputs"].astype(np.float32), data["labels"].astype(np.int64)


def accuracy_of(path: Path, inputs: np.ndarray, labels: np.ndarray) -> float:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: inputs})[0]
    return float((logits.argmax(axis=1) == labels).mean())


def test_build_artifacts_writes_ten_recipes_all_runnable_on_cpu(tmp_path: Path) -> None:
    source = tmp_path / "source.onnx"
    source.write_bytes(linear_model())
    inputs, labels = valset_arrays()

    artifacts = build_artifacts(source, tmp_path / "out", calibration=inputs[:50])

    names = [a.recipe.name for a in artifacts]
    expected = [f"{p}_{level}" for p in ("fp32", "int8", "int8-static") for level in OPT_LEVEL_NAMES]
    assert sorted(names) == sorted([*expected, "fp16_basic"])
    assert len(set(names)) == 10
    for artifact in artifacts:
        assert artifact.path == tmp_path / "out" / f"{artifact.recipe.name}.onnx"
        assert artifact.path.stat().st_size > 0
        assert artifact.runs_on_cpu, artifact.recipe.name
    # The source is never overwritten.
    assert source.read_bytes() == linear_model()

    size = {a.recipe.name: a.path.stat().st_size for a in artifacts}
    for level in OPT_LEVEL_NAMES:
        assert size[f"int8_{level}"] < size[f"fp32_{level}"]
        assert size[f"int8-static_{level}"] < size[f"fp32_{level}"]
    assert size["fp16_basic"] < size["fp32_basic"]

    # Every artifact is a working classifier of the same digits (quantisation costs a little).
    reference = accuracy_of(source, inputs, labels)
    assert reference > 0.8
    for artifact in artifacts:
        measured = accuracy_of(artifact.path, inputs, labels)
        if artifact.recipe.precision == "fp32":
            assert measured == pytest.approx(reference), artifact.recipe.name
        else:
            assert measured >= reference - 0.05, artifact.recipe.name


def test_build_artifacts_without_calibration_skips_static_int8(tmp_path: Path) -> None:
    source = tmp_path / "source.onnx"
    source.write_bytes(linear_model())

    for calibration in (None, np.zeros((0, 1, 8, 8), dtype=np.float32)):
        out = tmp_path / f"out-{calibration is None}"
        artifacts = build_artifacts(source, out, calibration)
        precisions = sorted({a.recipe.precision for a in artifacts})
        assert precisions == ["fp16", "fp32", "int8"]
        assert len(artifacts) == 7
        assert not list(out.glob("int8-static*"))


def test_measure_in_process_scores_only_examples_past_the_calibration(tmp_path: Path) -> None:
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(linear_model())
    valset = tmp_path / "valset.npz"
    valset.write_bytes(valset_npz())
    inputs, labels = valset_arrays()

    top1 = measure_accuracy(artifact, valset, threads=1, accuracy_from=50, batch_sizes=(1, 64))
    top5 = measure_accuracy(artifact, valset, threads=1, metric="top5", accuracy_from=50)

    assert top1.accuracy_examples == top5.accuracy_examples == 150
    assert top1.accuracy == pytest.approx(accuracy_of(artifact, inputs[50:], labels[50:]), abs=1e-6)
    assert top1.accuracy != pytest.approx(accuracy_of(artifact, inputs, labels), abs=1e-6)
    assert set(top1.accuracy_by_batch) == {1, 64} and set(top5.accuracy_by_batch) == {1}
    assert top1.accuracy == min(top1.accuracy_by_batch.values())
    assert top1.accuracy_low < top1.accuracy < top1.accuracy_high
    assert (top1.accuracy_metric, top5.accuracy_metric) == ("top1", "top5")
    assert top5.accuracy > top1.accuracy
    assert top1.agreement is None  # no reference answers given
    with pytest.raises(ValueError, match="unknown accuracy metric"):
        measure_accuracy(artifact, valset, threads=1, metric="top3")


def test_measure_latency_in_process_records_runs_and_stops_at_the_request_cap(tmp_path: Path) -> None:
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(linear_model())
    valset = tmp_path / "valset.npz"
    valset.write_bytes(valset_npz())
    plan = TimingPlan(max_runs=12, min_runs=5, batch_budget_s=0.2, max_batch=6)

    measured = measure_latency(artifact, valset, threads=1, plan=plan)

    batches = set(measured.latency_p50_ms)
    assert batches <= {1, 2, 4, 6} and {1, 6} <= batches  # doubling below the cap, then the cap
    assert set(measured.latency_p99_ms) == batches == set(measured.runs_per_batch)
    assert all(measured.latency_p99_ms[b] >= measured.latency_p50_ms[b] > 0 for b in batches)
    assert 5 <= measured.runs_per_batch[1] <= 12  # until stable; sizes past the gains: 3 runs
    assert all(3 <= runs <= 12 for runs in measured.runs_per_batch.values())
    assert measured.profile_runs == sum(measured.runs_per_batch.values())
    assert measured.p50_ci_pct == measured.ci_pct_per_batch[1] >= 0
    assert measured.saturation_qps == max(measured.throughput_qps.values()) > 0
    assert measured.max_useful_batch == max_useful_batch(measured.throughput_qps)
    assert measured.size_bytes == len(linear_model())
    assert "1 intra-op thread" in measured.hardware
