"""Workloads for the simulator: the trace loader and its scaling, INFaaS's patterns, Zipf
popularity and the arrivals they make (issue 7, part 1). No timing is asserted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from modelless.types import QueryTargets
from sim.traces import (
    PATTERNS,
    TRACE_PATH,
    Architecture,
    Mix,
    RateCurve,
    arrivals,
    fluctuating_rate,
    load_trace,
    trace_curve,
    zipf_weights,
)


def write_trace(path: Path, stamps: list[str]) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{s},10,20\n" for s in stamps))
    return path


def test_the_trace_loader_gives_seconds_from_the_first_request(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.csv",
        ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690", "2023-11-16 18:16:46.6805900"],
    )
    assert load_trace(path) == pytest.approx([0.0, 4.314579, 60.0])


def test_the_trace_loader_crosses_midnight_and_sorts(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.csv", ["2023-11-17 00:00:01.5", "2023-11-16 23:59:59.5"])
    assert load_trace(path) == pytest.approx([0.0, 2.0])


def test_a_bad_timestamp_is_a_clear_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.csv", ["2023-11-16 18:15:46.68", "yesterday"])
    with pytest.raises(ValueError, match=r"t.csv:3: bad timestamp 'yesterday'"):
        load_trace(path)
    (tmp_path / "u.csv").write_text("WHEN,X\n1,2\n")
    with pytest.raises(ValueError, match="TIMESTAMP"):
        load_trace(tmp_path / "u.csv")


def test_the_curve_counts_arrivals_per_bin_and_scaling_keeps_its_shape() -> None:
    offsets = [0.1, 0.2, 0.3, 10.5, 25.0, 29.9, 30.0]  # bins of 10 s: 3, 1, 2 (and a partial one)
    curve = trace_curve(offsets, 10.0)
    assert curve.rates == pytest.approx((0.3, 0.1, 0.2))
    scaled = curve.scaled_to_mean(100.0)
    assert scaled.mean == pytest.approx(100.0)
    assert [r / scaled.rates[0] for r in scaled.rates] == pytest.approx(
        [r / curve.rates[0] for r in curve.rates]
    )
    assert scaled.peak == pytest.approx(150.0)


def test_a_window_is_contiguous_and_the_busiest_one_is_found() -> None:
    curve = RateCurve("c", 10.0, (1.0, 1.0, 5.0, 6.0, 1.0, 1.0))
    assert curve.busiest_window(20.0) == 20.0
    assert curve.window(20.0, 20.0).rates == (5.0, 6.0)
    assert curve.window(20.0, 20.0).duration_s == 20.0


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not on this machine")
def test_the_shared_azure_trace_is_one_hour_of_about_19_thousand_requests() -> None:
    offsets = load_trace()
    assert len(offsets) == 19_366  # its README says 19,365; the file holds 19,366 rows
    assert 3500 < offsets[-1] <= 3600
    curve = trace_curve(offsets, 10.0)
    assert 5.0 < curve.mean < 6.0  # 5.5 requests/s on average (its README)


def test_the_fluctuating_pattern_spikes_at_60_90_and_150_180_seconds_as_in_infaas() -> None:
    for t, rate in (
        (0, 4),
        (59.9, 4),
        (60, 80),
        (89.9, 80),
        (90, 4),
        (120, 4),
        (149, 4),
        (150, 80),
        (179, 80),
        (180, 4),
        (299, 4),
    ):
        assert fluctuating_rate(t) == rate, t
    curve = PATTERNS["fluctuating"]
    assert curve.duration_s == 300
    assert sum(1 for r in curve.rates if r == 80.0) == 60
    assert PATTERNS["flat"].rates == (4.0,) * 300
    assert PATTERNS["steady"].rates[0] == 650.0 and 699.0 < PATTERNS["steady"].rates[-1] < 700.0


def test_zipf_popularity_falls_as_one_over_rank() -> None:
    weights = zipf_weights(5)
    assert sum(weights) == pytest.approx(1.0)
    assert [weights[0] / w for w in weights] == pytest.approx([1, 2, 3, 4, 5])
    assert zipf_weights(3, exponent=2.0)[0] / zipf_weights(3, exponent=2.0)[2] == pytest.approx(9.0)


def mix(count: int = 3) -> Mix:
    return Mix.zipf(
        [
            Architecture(f"m{i}", QueryTargets("a", latency_ms=float(i + 1), min_accuracy=0.9), float(i + 1))
            for i in range(count)
        ]
    )


def test_arrivals_draw_architectures_by_their_popularity_and_send_their_targets() -> None:
    workload = mix()
    made = list(arrivals(RateCurve("c", 1.0, (1000.0,) * 30), workload, seed=5))
    counts = Counter(a.model for a in made)
    for architecture, share in zip(workload.architectures, workload.shares, strict=True):
        assert counts[architecture.model] / len(made) == pytest.approx(share, abs=0.01)
    for arrival in made[:50]:
        chosen = next(a for a in workload.architectures if a.model == arrival.model)
        assert arrival.targets == chosen.targets and arrival.slo_ms == chosen.slo_ms


def test_arrivals_are_a_poisson_process_at_the_curves_rate_after_the_warm_up() -> None:
    curve = RateCurve("c", 10.0, (100.0, 0.0, 300.0))
    made = list(arrivals(curve, mix(), seed=1, warmup_s=20.0))
    times = [a.at for a in made]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 50.0
    during = Counter(int(t // 10) for t in times)
    # Warm-up (0-20 s) at the first rate, then the curve: 100, 0, 300 QPS for 10 s each.
    for bin_index, expected in ((0, 1000), (1, 1000), (2, 1000), (3, 0), (4, 3000)):
        assert abs(during[bin_index] - expected) <= 4 * expected**0.5, bin_index
    assert list(arrivals(curve, mix(), seed=1, warmup_s=20.0)) == made
