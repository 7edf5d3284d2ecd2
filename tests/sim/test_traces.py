"""Workloads for the simulator: the trace loaders and their scaling, INFaaS's patterns, Zipf
popularity and the arrivals they make (issue 7, part 1); recorded arrival times replayed at a
target rate, the bursty processes (Gamma gaps, on-off) and the burstiness statistics (issue 14).
No timing is asserted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from modelless.types import QueryTargets
from sim.traces import (
    PATTERNS,
    TRACE_PATH,
    Architecture,
    ArrivalTimes,
    GammaProcess,
    Mix,
    OnOffProcess,
    RateCurve,
    arrivals,
    arrivals_at,
    burstiness,
    fluctuating_rate,
    gamma_arrivals,
    load_arrival_times,
    load_trace,
    on_off_arrivals,
    on_off_rates,
    replay,
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


# --- issue 14: recorded times replayed, bursty processes, burstiness -------------------------------


def test_the_generic_loader_reads_seconds_iso_times_and_the_azure_format(tmp_path: Path) -> None:
    seconds = tmp_path / "s.csv"
    seconds.write_text("arrived_at,num_prefill_tokens\n10.5,1\n10.0,2\n\n12.25,3\n")
    assert load_arrival_times(seconds) == pytest.approx([0.0, 0.5, 2.25])
    iso = tmp_path / "i.csv"
    iso.write_text(
        "id,Time\n1,2023-11-16T23:59:59.5Z\n2,2023-11-17T00:00:01.25+00:00\n3,2023-11-17T01:00:01.25+01:00\n"
    )
    assert load_arrival_times(iso) == pytest.approx([0.0, 1.75, 1.75])
    azure = write_trace(tmp_path / "t.csv", ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690"])
    assert load_arrival_times(azure) == pytest.approx(load_trace(azure))
    named = tmp_path / "n.csv"
    named.write_text("when,sent\n5,1\n7,4\n")
    assert load_arrival_times(named, column="sent") == pytest.approx([0.0, 3.0])
    with pytest.raises(ValueError, match="no arrival-time column"):
        load_arrival_times(named)
    named.write_text("time\n5\nlater\n")
    with pytest.raises(ValueError, match=r"n.csv:3: bad arrival time 'later'"):
        load_arrival_times(named)


def test_compression_keeps_the_recorded_order_and_gaps_and_reaches_the_mean() -> None:
    recorded = [0.0, 0.1, 0.15, 3.0, 3.01, 3.02, 9.0, 20.0]  # bursts at 0 s and 3 s, a lull
    replayed = replay(recorded, 10.0, method="compress")
    # The trace is one period of its span plus a mean gap: 8 arrivals in 20 + 20/7 s.
    factor = 10.0 / (8 / (20.0 + 20.0 / 7))
    assert replayed.times == pytest.approx(np.array(recorded) / factor)
    assert replayed.mean_qps == pytest.approx(10.0)
    assert replayed.count == len(recorded)
    # auto without a length asked for is compression alone
    assert replay(recorded, 10.0).times == pytest.approx(replayed.times)


def test_superposed_copies_keep_the_mean_and_each_copys_own_gaps() -> None:
    generator = np.random.default_rng(3)
    recorded = np.sort(generator.uniform(0.0, 3600.0, 2000))
    for copies in (1, 4, 25):
        replayed = replay(recorded, 200.0, method="superpose", copies=copies, seed=7)
        assert replayed.count == copies * len(recorded)
        assert replayed.mean_qps == pytest.approx(200.0)
        assert np.all(np.diff(replayed.times) >= 0)
        assert replayed.times[0] >= 0 and replayed.times[-1] < replayed.duration_s
    # The first copy is the recorded trace itself, compressed by the factor left after 4 copies.
    four = replay(recorded, 200.0, method="superpose", copies=4, seed=7)
    base = recorded - recorded[0]
    compression = base[-1] * (1 + 1 / (len(base) - 1)) / four.duration_s
    wanted = base / compression
    after = np.clip(np.searchsorted(four.times, wanted), 1, four.count - 1)
    nearest = np.minimum(np.abs(four.times[after] - wanted), np.abs(four.times[after - 1] - wanted))
    assert nearest.max() < 1e-9


def test_auto_replay_superposes_the_fewest_copies_that_last_as_long_as_asked() -> None:
    recorded = np.linspace(0.0, 999.0, 1000)  # 1 QPS for 1,000 s (one period)
    long_enough = replay(recorded, 2.0, min_span_s=400.0)  # compressed 2x: 500 s, long enough
    assert long_enough.count == 1000 and long_enough.duration_s == pytest.approx(500.0)
    superposed = replay(recorded, 100.0, min_span_s=60.0, seed=1)  # 10 s compressed: 6 copies
    assert superposed.count == 6000 and superposed.duration_s == pytest.approx(60.0)
    assert superposed.mean_qps == pytest.approx(100.0)
    assert replay(recorded, 100.0, min_span_s=60.0, seed=1).times == pytest.approx(superposed.times)
    assert not np.allclose(replay(recorded, 100.0, min_span_s=60.0, seed=2).times, superposed.times)
    with pytest.raises(ValueError, match="at least two"):
        replay([1.0], 10.0)


def test_a_window_of_a_replay_starts_at_zero_and_the_busiest_one_is_found() -> None:
    times = ArrivalTimes("t", np.array([0.5, 1.0, 10.0, 10.2, 10.4, 10.6, 30.0]), 40.0)
    assert times.busiest_window(5.0) == 10.0
    window = times.window(10.0, 5.0)
    assert window.times == pytest.approx([0.0, 0.2, 0.4, 0.6]) and window.duration_s == 5.0
    assert window.mean_qps == pytest.approx(4 / 5)
    assert times.busiest_window(40.0) == 0.0  # the whole duration
    assert times.rate_over(0.0, 10.0) == pytest.approx(0.2)
    assert times.peak_qps(1.0) == 4.0


def test_burstiness_of_a_hand_made_sequence() -> None:
    # 10 s: a burst of 5 arrivals within 0.08 s at 2 s, then 5 arrivals 1 s apart from 4.5 s.
    times = [2.0, 2.02, 2.04, 2.06, 2.08, 4.5, 5.5, 6.5, 7.5, 8.5]
    stats = burstiness(times, duration_s=10.0)
    assert stats.count == 10 and stats.mean_qps == pytest.approx(1.0)
    assert stats.at(0.1) == pytest.approx(5 / 0.1)  # 5 in a 0.1 s window against 0.1 expected
    assert stats.at(1.0) == pytest.approx(5.0)
    assert stats.at(10.0) == pytest.approx(1.0)  # the whole sequence in one window
    assert stats.at(60.0) == pytest.approx(10 / 60)
    gaps = np.diff(times)
    assert stats.cv == pytest.approx(gaps.std() / gaps.mean())
    # Without a duration the mean rate is one over the mean gap.
    assert burstiness(times).mean_qps == pytest.approx(1 / gaps.mean())
    even = burstiness(np.arange(0.0, 100.0, 0.5), duration_s=100.0)
    assert even.cv == pytest.approx(0.0) and even.at(10.0) == pytest.approx(1.0)


@pytest.mark.parametrize("cv", [1.0, 4.0, 8.0])
def test_gamma_gaps_have_the_asked_coefficient_of_variation_and_mean(cv: float) -> None:
    drawn = gamma_arrivals(50.0, cv, 4000.0, seed=11)
    assert drawn.count == 200_000 and drawn.mean_qps == pytest.approx(50.0)
    assert np.all(np.diff(drawn.times) >= 0) and drawn.times[-1] < 4000.0
    assert burstiness(drawn.times, drawn.duration_s).cv == pytest.approx(cv, rel=0.05)
    # The process draws the same times for the same seed.
    assert GammaProcess(50.0, cv, 4000.0).draw(11).times == pytest.approx(drawn.times)


def test_gamma_arrivals_stay_within_the_duration_when_the_last_gaps_are_tiny() -> None:
    drawn = gamma_arrivals(100.0, 8.0, 300.0, seed=1)  # its last gap rounds to nothing
    assert drawn.count == 30_000 and drawn.times[-1] < 300.0


def test_burstier_gamma_gaps_make_higher_short_window_peaks() -> None:
    peaks = [burstiness(gamma_arrivals(100.0, cv, 600.0, seed=2).times, 600.0).at(1.0) for cv in (1, 4, 8)]
    assert peaks[0] < peaks[1] < peaks[2]


def test_on_off_bursts_have_the_asked_mean_and_rates() -> None:
    on_qps, off_qps = on_off_rates(100.0, 10.0, 30.0, 10.0)
    assert on_qps == pytest.approx(10 * off_qps)
    assert (10.0 * on_qps + 30.0 * off_qps) / 40.0 == pytest.approx(100.0)
    for exact_share in (True, False):
        drawn = on_off_arrivals(100.0, 40_000.0, seed=4, exact_share=exact_share)
        assert drawn.mean_qps == pytest.approx(100.0, rel=0.03), exact_share
    short = [on_off_arrivals(100.0, 600.0, seed=s).mean_qps for s in range(1, 6)]
    assert short == pytest.approx([100.0] * 5, rel=0.03)  # the ON share made exact
    drawn = OnOffProcess(100.0, 600.0).draw(1)
    stats = drawn.burstiness()
    assert stats.at(10.0) > 2.5  # a 10 s burst at 3.1x the mean
    assert drawn.times == pytest.approx(on_off_arrivals(100.0, 600.0, seed=1).times)


def test_arrivals_at_given_times_draw_architectures_by_popularity_after_a_poisson_warm_up() -> None:
    workload = mix()
    times = np.sort(np.random.default_rng(1).uniform(0.0, 30.0, 30_000))
    made = list(arrivals_at(times, workload, seed=5, warmup_s=20.0, warmup_qps=100.0))
    warm = [a for a in made if a.at < 20.0]
    assert abs(len(warm) - 2000) <= 4 * 2000**0.5
    assert [a.at for a in made[len(warm) :]] == pytest.approx((times + 20.0).tolist())
    counts = Counter(a.model for a in made)
    for architecture, share in zip(workload.architectures, workload.shares, strict=True):
        assert counts[architecture.model] / len(made) == pytest.approx(share, abs=0.01)
    chosen = {a.model: a for a in workload.architectures}
    assert all(a.targets == chosen[a.model].targets and a.slo_ms == chosen[a.model].slo_ms for a in made)
    assert list(arrivals_at(times, workload, seed=5, warmup_s=20.0, warmup_qps=100.0)) == made


@pytest.mark.skipif(not TRACE_PATH.exists(), reason="the shared trace is not on this machine")
def test_the_shared_trace_replayed_at_1000_qps_keeps_its_mean_over_its_busiest_window() -> None:
    replayed = replay(load_trace(), 1000.0, min_span_s=600.0, seed=1)
    assert replayed.mean_qps == pytest.approx(1000.0) and replayed.duration_s >= 600.0
    busiest = replayed.window(replayed.busiest_window(300.0), 300.0)
    assert busiest.duration_s == 300.0 and busiest.mean_qps >= replayed.mean_qps
