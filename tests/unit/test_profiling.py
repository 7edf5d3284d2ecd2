"""Profiling until stable and accuracy with uncertainty: the interval arithmetic, the stopping
rules on a fake timer, the batch sizes timed, and the child steps' measurements on tiny real
ONNX models with several and integer inputs."""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelless.exceptions import InvalidInputError
from modelless.registration.profiling import screened_out
from modelless.types import TensorSpec
from tests.models import linear_model, valset_npz
from variants.__main__ import REFERENCE_FILE
from variants.__main__ import main as variants_main
from variants.examples import read_examples, session_specs
from variants.generator import build_artifacts, static_int8_unsupported
from variants.profiler import (
    WARMUP_MAX_RUNS,
    BatchTiming,
    TimingPlan,
    batch_sizes_to_time,
    measure_accuracy,
    measure_latency,
    reference_top1,
    time_batch,
    time_briefly,
    warm_up,
)
from variants.stats import median_ci, median_ci_pct, median_ci_ranks, wilson_interval

# --- screening: optimisation levels of one precision, at batch 1 ------------------------------


def test_a_level_more_than_the_threshold_slower_than_its_precision_s_fastest_is_screened_out() -> None:
    medians = {
        "fp32_all": 10.0,
        "fp32_basic": 15.0,  # 50 % slower than fp32_all: out
        "fp32_extended": 10.9,  # within 10 %: kept, its full profile decides
        "int8_basic": 5.0,
        "int8_all": 8.0,  # slower than int8_basic, never compared with fp32
        "fp16_basic": 30.0,  # its precision's only level: nothing to compare it with
    }
    assert screened_out(medians, 10.0) == {"fp32_basic": "fp32_all", "int8_all": "int8_basic"}
    assert screened_out(medians, 55.0) == {"int8_all": "int8_basic"}


def test_sub_microsecond_differences_are_timer_noise_not_a_slower_level() -> None:
    assert screened_out({"fp32_all": 0.001, "fp32_basic": 0.0025}, 10.0) == {}


# --- the median's distribution-free interval ----------------------------------------------------


def binomial_below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return float(sum(math.comb(n, i) for i in range(k)) / 2**n)


@pytest.mark.parametrize("n", range(6, 120))
def test_median_interval_ranks_are_the_tightest_with_95_percent_coverage(n: int) -> None:
    low, high = median_ci_ranks(n)

    assert high == n - 1 - low  # symmetric
    coverage = 1 - 2 * binomial_below(n, low + 1)
    assert coverage >= 0.95
    # One rank tighter would cover less than 95 %.
    assert 1 - 2 * binomial_below(n, low + 2) < 0.95


@pytest.mark.parametrize("n", [1, 2, 5])
def test_too_few_runs_give_the_whole_range(n: int) -> None:
    assert median_ci_ranks(n) == (0, n - 1)


def test_the_normal_approximation_takes_over_smoothly() -> None:
    exact_low, _ = median_ci_ranks(200)
    approx_low, approx_high = median_ci_ranks(201)
    assert abs(approx_low - exact_low) <= 1
    assert approx_high == 201 - approx_low or approx_high == 200 - approx_low


def test_median_ci_of_known_timings() -> None:
    timings = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0]  # 1..10 shuffled
    median, low, high = median_ci(timings)
    assert median == 5.5
    assert (low, high) == (2.0, 9.0)  # ranks 1 and 8 of 10
    assert median_ci_pct([4.0] * 12) == 0.0
    assert median_ci_pct([100.0] * 5 + [103.0] * 5) == pytest.approx(1.5 / 101.5 * 100)  # (the wider side)


# --- the accuracy's Wilson interval ----------------------------------------------------------------


def test_wilson_interval_matches_published_values() -> None:
    low, high = wilson_interval(90, 100)
    assert low == pytest.approx(0.8256, abs=1e-4) and high == pytest.approx(0.9448, abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0


def test_wilson_interval_narrows_with_examples_and_holds_the_estimate() -> None:
    widths = []
    for n in (20, 75, 300, 1200, 5000):
        low, high = wilson_interval(round(0.8 * n), n)
        assert low < 0.8 < high
        widths.append(high - low)
    assert widths == sorted(widths, reverse=True)
    # 75 examples, as the registrations of the issue had: +-9 points, so noise decided.
    low, high = wilson_interval(60, 75)
    assert high - low > 0.17


def test_wilson_interval_without_examples_says_nothing() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


# --- stopping rules, on a fake timer ----------------------------------------------------------------


class FakeTimer:
    """A clock that moves only when a fake run takes its (given) time."""

    def __init__(self, durations_ms: Iterator[float]) -> None:
        self.now = 0.0
        self.runs = 0
        self._durations = durations_ms

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += next(self._durations) / 1000
        self.runs += 1


def noisy(centre: float, spread: float, seed: int = 0) -> Iterator[float]:
    rng = np.random.default_rng(seed)
    while True:
        yield float(centre * (1 + rng.uniform(-spread, spread)))


def test_warm_up_lasts_until_two_consecutive_runs_agree() -> None:
    timer = FakeTimer(iter([50.0, 20.0, 11.0, 10.0, 10.0, 10.0]))
    assert warm_up(timer.run, budget_s=10.0, clock=timer) == 4  # 11 and 10 agree within 10 %
    endless = FakeTimer(itertools.cycle([10.0, 20.0]))
    assert warm_up(endless.run, budget_s=100.0, clock=endless) == WARMUP_MAX_RUNS


def test_a_steady_batch_stops_at_the_minimum_runs() -> None:
    timer = FakeTimer(itertools.chain([30.0, 10.0, 10.0], itertools.repeat(10.0)))
    plan = TimingPlan(min_runs=10, max_runs=500, stability_pct=3.0)

    timing = time_batch(timer.run, plan, timer)

    assert len(timing.timings_ms) == 10
    assert timing.p50_ms == pytest.approx(10.0) and timing.ci_pct < 1e-9


def test_a_noisy_batch_runs_until_the_median_is_stable() -> None:
    timer = FakeTimer(noisy(10.0, 0.3))
    plan = TimingPlan(min_runs=10, max_runs=5000, stability_pct=3.0, batch_budget_s=1000.0)

    timing = time_batch(timer.run, plan, timer)

    runs = len(timing.timings_ms)
    assert runs > 10  # +-30 % noise needs more than the minimum...
    assert timing.ci_pct <= 3.0  # ...and stops once the median's interval is within +-3 %
    assert median_ci_pct(timing.timings_ms[:-1]) > 3.0  # not one run later than needed
    assert timing.p50_ms == pytest.approx(10.0, rel=0.05)  # (a 95 % interval: 1 in 20 is off)


def test_a_noisy_batch_stops_at_its_budget_or_its_maximum() -> None:
    budget = FakeTimer(noisy(10.0, 0.9))
    timing = time_batch(budget.run, TimingPlan(min_runs=5, max_runs=10000, batch_budget_s=0.2), budget)
    assert 5 <= len(timing.timings_ms) <= 22  # ~0.2 s of ~10 ms runs, past the minimum
    capped = FakeTimer(noisy(10.0, 0.9))
    timing = time_batch(capped.run, TimingPlan(min_runs=5, max_runs=8, batch_budget_s=1000.0), capped)
    assert len(timing.timings_ms) == 8


def test_a_very_slow_batch_stops_at_three_runs_past_three_budgets() -> None:
    timer = FakeTimer(noisy(2500.0, 0.5))  # 2.5 s a run, 1 s budget
    timing = time_batch(timer.run, TimingPlan(min_runs=10, batch_budget_s=1.0), timer)
    assert len(timing.timings_ms) == 3


def fake_batches(
    per_row_ms: dict[int, float],
) -> tuple[list[tuple[int, bool]], Callable[[int, bool], BatchTiming]]:
    """A measure_batch whose batch takes ``per_row_ms[batch] * batch``; records (batch, brief)."""
    timed: list[tuple[int, bool]] = []

    def measure_batch(batch: int, brief: bool) -> BatchTiming:
        timed.append((batch, brief))
        return BatchTiming([per_row_ms[batch] * batch] * (3 if brief else 10), warmup_runs=2)

    return timed, measure_batch


STABLE, BRIEF = False, True


def test_doubling_stops_paying_then_the_larger_sizes_are_timed_briefly() -> None:
    # Per-row cost falls until batch 8, then flat: 16 gains < 5 %.
    per_row = {1: 10.0, 2: 6.0, 4: 4.0, 8: 3.0, 16: 2.95, 32: 2.9, 64: 2.9}
    timed, measure_batch = fake_batches(per_row)

    measured = batch_sizes_to_time(measure_batch, TimingPlan(max_batch=64))

    assert timed == [
        (1, STABLE),
        (2, STABLE),
        (4, STABLE),
        (8, STABLE),
        (16, STABLE),
        (32, BRIEF),
        (64, BRIEF),
    ]
    assert sorted(measured) == [1, 2, 4, 8, 16, 32, 64]


def test_doubling_stops_past_the_ceiling_and_never_beyond_the_request_cap() -> None:
    timed, measure_batch = fake_batches({1: 100.0, 2: 60.0, 4: 50.0, 8: 45.0, 48: 40.0})
    batch_sizes_to_time(measure_batch, TimingPlan(max_batch=48, ceiling_ms=150.0))
    # Batch 4 takes 200 ms > 150: no more doubling; the largest a request can carry, briefly.
    assert timed == [(1, STABLE), (2, STABLE), (4, STABLE), (48, BRIEF)]

    # Rows cost less and less... until the cap of 6 rows (a request's body limit) ends it.
    timed, measure_batch = fake_batches({1: 10.0, 2: 5.0, 4: 2.5, 6: 2.0})
    batch_sizes_to_time(measure_batch, TimingPlan(max_batch=6))
    assert timed == [(1, STABLE), (2, STABLE), (4, STABLE), (6, BRIEF)]

    timed, measure_batch = fake_batches({1: 5.0})
    batch_sizes_to_time(measure_batch, TimingPlan(max_batch=1))
    assert timed == [(1, STABLE)]


def test_a_brief_timing_is_one_warm_up_and_three_runs() -> None:
    timer = FakeTimer(iter([40.0, 10.0, 11.0, 12.0]))
    timing = time_briefly(timer.run, timer)
    assert timing.timings_ms == pytest.approx([10.0, 11.0, 12.0]) and timer.runs == 4


# --- tiny real models: one float input, two int64 inputs, two float inputs --------------------------


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def token_model(path: Path, length: int = 4) -> Path:
    """A 'text' classifier: logits = (float(ids) * float(mask)) @ W: two int64 inputs."""
    weights = np.random.default_rng(1).normal(0, 1, (length, 10)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", "mask_f"], ["masked"]),
        helper.make_node("MatMul", ["masked", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", length]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", length]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(weights, "w")],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def token_valset(path: Path, count: int = 60, length: int = 4) -> Path:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 5, (count, length)).astype(np.int64)
    mask = rng.integers(0, 2, (count, length)).astype(np.int64)
    np.savez(path, input_ids=ids, attention_mask=mask, labels=rng.integers(0, 10, count))
    return path


def two_float_model(path: Path) -> Path:
    """logits = (a + b) @ W over two float inputs [batch, 8]."""
    weights = np.random.default_rng(3).normal(0, 1, (8, 10)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("MatMul", ["sum", "w"], ["logits"])],
        "pair",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 8]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(weights, "w")],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_examples_of_several_int64_inputs_become_one_structured_batch(tmp_path: Path) -> None:
    import onnxruntime as ort

    model = token_model(tmp_path / "tokens.onnx")
    valset = token_valset(tmp_path / "tokens.npz")
    specs = session_specs(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]))

    batch, labels = read_examples(valset, specs)

    assert [(s.name, s.dtype) for s in specs] == [("input_ids", "int64"), ("attention_mask", "int64")]
    assert batch.dtype.names == ("input_ids", "attention_mask") and len(batch) == len(labels) == 60
    with np.load(valset) as data:
        assert np.array_equal(batch["attention_mask"], data["attention_mask"])


def test_int64_inputs_are_profiled_and_measured_with_agreement(tmp_path: Path) -> None:
    model = token_model(tmp_path / "tokens.onnx")
    valset = token_valset(tmp_path / "tokens.npz")
    answers = reference_top1(model, valset, accuracy_from=10, threads=1)
    reference = tmp_path / "answers.npy"
    np.save(reference, answers)

    accuracy = measure_accuracy(model, valset, 1, accuracy_from=10, batch_sizes=(1, 16), reference=reference)
    timing = measure_latency(
        model, valset, 1, TimingPlan(max_runs=6, min_runs=3, batch_budget_s=0.1, max_batch=4)
    )

    assert accuracy.accuracy_examples == 50
    assert accuracy.agreement == 1.0  # the model agrees with itself, at every batch size
    assert accuracy.agreement_by_batch == {1: 1.0, 16: 1.0}
    assert accuracy.accuracy_low <= accuracy.accuracy <= accuracy.accuracy_high
    assert 1 in timing.latency_p50_ms and 4 in timing.latency_p50_ms


def test_static_int8_is_skipped_for_integer_inputs_with_the_reason(tmp_path: Path) -> None:
    model = token_model(tmp_path / "tokens.onnx")
    valset = token_valset(tmp_path / "tokens.npz")
    import onnxruntime as ort

    specs = session_specs(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]))
    calibration, _ = read_examples(valset, specs)
    notes: list[str] = []

    artifacts = build_artifacts(model, tmp_path / "out", calibration[:20], notes)

    assert "int8-static" not in {a.recipe.precision for a in artifacts}
    assert "fp32" in {a.recipe.precision for a in artifacts}
    reason = static_int8_unsupported(model)
    assert reason is not None and "input_ids (int64)" in reason
    assert any(note.startswith("int8-static skipped: ") and "int64" in note for note in notes)


def test_static_int8_calibration_feeds_every_float_input(tmp_path: Path) -> None:
    model = two_float_model(tmp_path / "pair.onnx")
    rng = np.random.default_rng(4)
    calibration = np.empty(32, dtype=[("a", np.float32, (8,)), ("b", np.float32, (8,))])
    calibration["a"] = rng.random((32, 8))
    calibration["b"] = rng.random((32, 8))
    notes: list[str] = []

    artifacts = build_artifacts(model, tmp_path / "out", calibration, notes)

    assert static_int8_unsupported(model) is None
    assert {a.recipe.name for a in artifacts} >= {"int8-static_all", "int8_all", "fp32_all"}
    assert not [n for n in notes if n.startswith("int8-static")]


def test_the_build_step_writes_the_reference_answers_of_the_held_out_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source.onnx"
    source.write_bytes(linear_model())
    valset = tmp_path / "valset.npz"
    valset.write_bytes(valset_npz())

    variants_main(
        ["build", str(source), str(tmp_path / "out"), "--valset", str(valset), "--calibration-count", "50"]
    )

    import json

    built = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    answers = np.load(tmp_path / "out" / REFERENCE_FILE)
    assert built["reference"] == str(tmp_path / "out" / REFERENCE_FILE)
    assert len(answers) == 150
    with np.load(io.BytesIO(valset_npz())) as data:
        inputs = data["inputs"].astype(np.float32)[50:]
    import onnxruntime as ort

    logits = ort.InferenceSession(linear_model(), providers=["CPUExecutionProvider"]).run(
        None, {"input": inputs}
    )[0]
    assert np.array_equal(answers, logits.argmax(axis=1))
    assert {a["recipe"] for a in built["artifacts"]} >= {"fp32_all", "int8_all", "int8-static_all"}
    assert all(a["size_bytes"] > 0 for a in built["artifacts"])


def test_read_examples_keeps_to_the_validation_sets_unpacked_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    valset = tmp_path / "valset.npz"
    np.savez_compressed(valset, inputs=np.zeros((10_000, 8), np.float32), labels=np.zeros(10_000, np.int64))
    specs = [TensorSpec("x", [8], "float32")]
    assert read_examples(valset, specs)[0].shape == (10_000, 8)  # the default limit holds it

    monkeypatch.setenv("MODELLESS_MAX_VALSET_UNPACKED_BYTES", "100000")  # 320 KB would unpack
    with pytest.raises(InvalidInputError, match="may unpack to at most 100000 bytes"):
        read_examples(valset, specs)
