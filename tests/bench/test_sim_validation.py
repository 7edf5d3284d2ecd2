"""The trace-driven validation's pure parts (issue 14): which recorded arrivals a seed replays and
how they are compressed, the arrivals it sends, and the verdict against the targets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from bench.sim_profiles import Zoo
from bench.sim_validation import (
    ATTAINMENT_TOLERANCE_POINTS,
    MAX_VALIDATION_QPS,
    P99_TOLERANCE,
    TRACE_PHASES,
    VALIDATION_LOAD,
    Comparison,
    LiveQuery,
    LiveRun,
    Phases,
    command_line,
    judge,
    live_against_live,
    live_or_saved,
    parse,
    trace_schedule,
    trace_window,
    validation_rate_qps,
)
from modelless.types import QueryTargets, VariantProfile
from sim.traces import Architecture, Mix

# A recorded trace with structure: bursts of five arrivals 0.1 s apart, one burst every 4 s, and a
# lull of 20 s after every fifth burst (200 arrivals, unevenly spaced).
RECORDED = sorted(
    burst * 4.0 + (burst // 5) * 20.0 + position * 0.1 for burst in range(40) for position in range(5)
)


def test_a_window_is_consecutive_recorded_arrivals_at_the_asked_mean() -> None:
    window = trace_window(RECORDED, rate_qps=5.0, duration_s=10.0, seed=1)
    assert window.count == 50 and window.first == 0
    assert window.times.count == 50
    assert window.times.duration_s == pytest.approx(10.0)
    assert window.times.mean_qps == pytest.approx(5.0)
    assert window.recorded_from_s == RECORDED[0] and window.recorded_to_s == RECORDED[49]


def test_a_window_keeps_the_recorded_gaps_in_proportion() -> None:
    window = trace_window(RECORDED, rate_qps=5.0, duration_s=10.0, seed=2)
    recorded_gaps = np.diff(RECORDED[window.first : window.first + window.count])
    replayed_gaps = np.diff(window.times.times)
    # One compression factor for every gap: no gap redrawn (no Poissonisation).
    assert replayed_gaps == pytest.approx(recorded_gaps / window.compression)
    assert window.compression > 1  # 200 arrivals over ~190 s replayed at 5 QPS: faster than recorded


def test_seeds_take_successive_disjoint_windows_then_wrap_around() -> None:
    firsts = [trace_window(RECORDED, 5.0, 10.0, seed).first for seed in (1, 2, 3, 4, 5)]
    assert firsts[:4] == [0, 50, 100, 150]
    assert 0 <= firsts[4] <= len(RECORDED) - 50  # the fifth would run past the end: wrapped


def test_a_window_longer_than_the_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than"):
        trace_window(RECORDED, rate_qps=50.0, duration_s=10.0, seed=1)


def architecture(model: str, slo_ms: float) -> Architecture:
    return Architecture(model, QueryTargets("app", latency_ms=slo_ms, min_accuracy=0.5), slo_ms)


def test_the_schedule_sends_each_window_arrival_once_drawn_from_the_mix() -> None:
    mix = Mix.zipf([architecture("big", 50.0), architecture("small", 10.0)])
    window = trace_window(RECORDED, 5.0, 10.0, seed=1)
    schedule = trace_schedule(window, mix, seed=1)
    assert [a.at for a in schedule] == pytest.approx(list(window.times.times))
    assert {a.model for a in schedule} == {"big", "small"}
    assert all(a.slo_ms == (50.0 if a.model == "big" else 10.0) for a in schedule)
    assert [a.model for a in trace_schedule(window, mix, seed=1)] == [a.model for a in schedule]
    assert [a.model for a in trace_schedule(window, mix, seed=2)] != [a.model for a in schedule]


def comparison(simulated_p99_ms: float, simulated_attainment: float) -> Comparison:
    return Comparison(
        measured_p99_ms=100.0,
        simulated_p99_ms=simulated_p99_ms,
        measured_attainment=0.98,
        simulated_attainment=simulated_attainment,
        measured_queries=1000,
        simulated_queries=1000,
        gateway_p50_ms=1.0,
        gateway_p99_ms=2.0,
        measured_refused=0,
        simulated_refused=0,
        measured_on_lambda=0,
        simulated_on_lambda=0,
    )


def test_the_verdict_takes_the_median_simulation_against_the_live_run() -> None:
    verdict = judge([comparison(90.0, 0.975), comparison(130.0, 0.99), comparison(110.0, 0.985)])
    assert verdict.live_p99_ms == 100.0 and verdict.simulated_p99_ms == 110.0
    assert verdict.simulated_p99_range_ms == (90.0, 130.0)
    assert verdict.p99_difference == pytest.approx(0.10)
    assert verdict.attainment_difference_points == pytest.approx(0.5)
    # The live run's own noise over its 1,000 queries at 98 %: 0.44 points.
    assert verdict.live_attainment_standard_error_points == pytest.approx(0.4427, abs=1e-3)
    assert verdict.p99_met and verdict.attainment_met


@pytest.mark.parametrize(
    ("simulated_p99_ms", "simulated_attainment", "p99_met", "attainment_met"),
    [
        (100.0 * (1 + P99_TOLERANCE) + 1, 0.98, False, True),
        (100.0 * (1 - P99_TOLERANCE) - 1, 0.98, False, True),
        (100.0, 0.98 - ATTAINMENT_TOLERANCE_POINTS / 100 - 0.001, True, False),
        (100.0, 0.98 + ATTAINMENT_TOLERANCE_POINTS / 100 + 0.001, True, False),
    ],
)
def test_the_targets_bound_the_difference_either_way(
    simulated_p99_ms: float, simulated_attainment: float, p99_met: bool, attainment_met: bool
) -> None:
    verdict = judge([comparison(simulated_p99_ms, simulated_attainment)])
    assert (verdict.p99_met, verdict.attainment_met) == (p99_met, attainment_met)


def test_no_simulation_is_no_verdict() -> None:
    with pytest.raises(ValueError):
        judge([])


def test_the_reproduce_command_names_only_what_differs_from_the_defaults() -> None:
    assert command_line(parse([])) == "scripts/bench sim-validation"
    args = parse(["--seeds", "3", "4", "--duration-s", "120", "--only", "resnet18", "resnet50"])
    assert args.calibration_s == TRACE_PHASES.calibration_s
    assert command_line(args) == (
        "scripts/bench sim-validation --seeds 3 4 --duration-s 120 --only resnet18 resnet50"
    )
    assert command_line(parse(["--quick"])) == "scripts/bench sim-validation --quick"
    assert command_line(parse(["--live-repeats", "1"])) == "scripts/bench sim-validation --live-repeats 1"
    with pytest.raises(SystemExit):
        parse(["--live-repeats", "0"])


def live_run(latencies_ms: Sequence[float | None], slo_ms: float = 100.0) -> LiveRun:
    """A live run whose compared phase (after 10 s) holds one query per latency (None: refused);
    one earlier query, in the calibration phase, that no figure may count."""
    phases = Phases(rate_qps=1.0, duration_s=100.0, calibration_qps=1.0, calibration_s=5.0, warmup_s=5.0)

    def query(at: float, latency: float | None) -> LiveQuery:
        status = 422 if latency is None else 200
        return LiveQuery(at, "m", slo_ms, status, latency or 1.0, latency, latency, "worker")

    compared = [query(10.0 + i, ms) for i, ms in enumerate(latencies_ms)]
    return LiveRun([query(1.0, 10_000.0), *compared], [300.0], [250.0], phases)


def test_the_live_run_against_itself_compares_the_compared_phase_with_the_same_figures() -> None:
    first = live_run([50.0] * 98 + [90.0, 120.0])  # 99 of 100 within 100 ms
    again = live_run([50.0] * 97 + [60.0, 150.0, None])  # 98 within; one late, one refused
    found = live_against_live(first, again, repeat=1)
    assert found["repeat"] == 1
    assert found["live_attainment_pct"] == pytest.approx(99.0)
    assert found["again_attainment_pct"] == pytest.approx(98.0)
    assert found["attainment_difference_points"] == pytest.approx(-1.0)
    assert found["live_p99_ms"] < found["again_p99_ms"]  # the refused query has no latency
    assert found["p99_difference"] == pytest.approx(found["again_p99_ms"] / found["live_p99_ms"] - 1)
    same = live_against_live(first, first, repeat=2)
    assert same["p99_difference"] == 0.0 and same["attainment_difference_points"] == 0.0


def test_reusing_live_runs_finds_none_where_none_was_saved_and_runs_nothing(tmp_path: Path) -> None:
    # Nothing else is read on that path: a live run would need the zoo, the mix and the schedule.
    nothing = live_or_saved(
        cast(Zoo, None),
        cast(Mix, None),
        [],
        trace_window(RECORDED, 1.0, 10.0, 1),
        TRACE_PHASES,
        tmp_path,
        tmp_path / "live-1.json",
        reuse_live=True,
    )
    assert nothing is None and list(tmp_path.iterdir()) == []


def cpu_variant(model: str, recipe: str, threads: int, p50_ms: float, accuracy: float) -> VariantProfile:
    return VariantProfile(
        variant_id=f"app/{model}/{recipe}/cpu-{threads}t",
        app_id="app",
        model_name=model,
        pool="cpu",
        precision=recipe.split("_")[0],
        opt_level=recipe.split("_")[1],
        threads=threads,
        artifact_key="",
        size_bytes=1,
        load_latency_ms=10.0,
        latency_p50_ms={1: p50_ms},
        latency_p99_ms={1: 1.2 * p50_ms},
        peak_memory_mb=60.0,
        accuracy=accuracy,
        price_per_second=1e-5,
        request_price=0.0,
        hardware="here",
        measured_on_target=True,
    )


def test_the_validation_rate_counts_the_cores_a_query_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    one_thread = cpu_variant("m", "fp32_all", 1, 20.0, 0.9)
    two_threads = cpu_variant("m", "fp32_basic", 2, 10.0, 0.9)  # faster, but on both cores
    too_inaccurate = cpu_variant("m", "int8_all", 1, 1.0, 0.5)
    mix = Mix((Architecture("m", QueryTargets("app", latency_ms=50.0, min_accuracy=0.8), 50.0),), (1.0,))
    zoo = Zoo([one_thread, two_threads, too_inaccurate])
    # The fastest accurate variant (10 ms) on 2 threads: 20 core-ms a query, 100 QPS on 2 cores.
    assert validation_rate_qps(zoo, mix) == pytest.approx(min(MAX_VALIDATION_QPS, VALIDATION_LOAD * 100.0))
    alone = Zoo([one_thread, too_inaccurate])
    assert validation_rate_qps(alone, mix) == pytest.approx(min(MAX_VALIDATION_QPS, VALIDATION_LOAD * 100.0))
    slower = Zoo([cpu_variant("m", "fp32_all", 2, 40.0, 0.9)])
    assert validation_rate_qps(slower, mix) == pytest.approx(VALIDATION_LOAD * 25.0)


def test_the_verdict_says_whether_the_simulations_cover_the_live_run() -> None:
    covering = judge([comparison(90.0, 0.97), comparison(110.0, 0.99)])
    assert covering.live_within_simulated_range == (True, True)
    above = judge([comparison(120.0, 0.985), comparison(130.0, 0.99)])
    assert above.live_within_simulated_range == (False, False)
