"""Provisioning for the arrival envelope (modelless.scaling.envelope): pure functions over
per-second counts, then the scaler that uses them."""

from __future__ import annotations

import numpy as np
import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.query_load import PEAK_SLICE_S
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.scaling.envelope import (
    burst_window_s,
    envelope,
    growth_qps_per_s,
    poisson_equivalent_qps,
    provision,
    window_rates,
)
from tests.unit.test_scaler import GROUP, FakeProvider, store  # noqa: F401 (a fixture)


def test_window_rates_and_the_envelope_are_the_sliding_window_maxima() -> None:
    counts = [0, 10, 0, 0, 4, 4, 4, 4]
    assert window_rates(counts, 2).tolist() == [5.0, 5.0, 0.0, 2.0, 4.0, 4.0, 4.0]
    assert envelope(counts, (1, 2, 4, 10)) == {1: 10.0, 2: 5.0, 4: 4.0}  # no 10 s window in 8 s


def test_the_burst_window_holds_about_thirty_poisson_arrivals() -> None:
    assert burst_window_s(1000.0) == 1
    assert burst_window_s(4.0) == 8
    assert burst_window_s(0.01) == 30 and burst_window_s(0.0) == 30


def test_a_steady_rise_is_a_trend_and_a_step_or_noise_is_not() -> None:
    rising = [100 + 5 * t for t in range(60)]
    assert growth_qps_per_s(rising) == pytest.approx(5.0)
    step = [0] * 30 + [2500] * 30  # the step is over: the last 15 s are flat
    assert growth_qps_per_s(step) == 0.0
    noise = np.random.default_rng(1).poisson(50, 60).tolist()
    assert growth_qps_per_s(noise) <= 1.0


def test_cheap_hardware_provisions_for_the_bursts_and_dear_hardware_leaves_them_to_lambda() -> None:
    # 1,000 q/s on average: 200 for 4 s, then 4,200 for 1 s, again and again.
    counts = ([200] * 4 + [4200]) * 12
    mean = sum(counts) / len(counts)
    cheap = provision(counts, mean, hardware_price_per_qps=1e-8, lambda_price_per_query=1e-6)
    assert cheap.load_qps == pytest.approx(4200.0)  # P(rate > C) = 1 % < 20 %: cover the bursts
    dear = provision(counts, mean, hardware_price_per_qps=5e-7, lambda_price_per_query=1e-6)
    assert dear.load_qps == pytest.approx(mean)  # P(rate > C) = 50 %: the bursts go to Lambda
    assert cheap.envelope[1] == 4200.0 and cheap.envelope[5] == pytest.approx(mean)


def test_a_group_lambda_may_not_serve_is_provisioned_for_its_envelope() -> None:
    counts = [10, 10, 10, 90] * 15
    found = provision(counts, 30.0, hardware_price_per_qps=1e-6, lambda_price_per_query=None)
    assert found.quantile == 1.0
    assert found.load_qps == pytest.approx(max(window_rates(counts, found.window_s)))


def test_what_lambdas_concurrency_cannot_take_is_provisioned() -> None:
    counts = ([100] * 9 + [1100]) * 6
    mean = sum(counts) / len(counts)
    free = provision(counts, mean, hardware_price_per_qps=9e-7, lambda_price_per_query=1e-6)
    assert free.load_qps == pytest.approx(mean)  # hardware is nearly as dear as Lambda
    limited = provision(
        counts, mean, hardware_price_per_qps=9e-7, lambda_price_per_query=1e-6, lambda_qps_limit=500.0
    )
    assert limited.load_qps == pytest.approx(600.0)  # the 1,100 q/s second, less Lambda's 500


def test_no_hardware_option_or_no_arrivals_keeps_the_mean() -> None:
    assert provision([5, 5], 5.0, hardware_price_per_qps=None, lambda_price_per_query=1e-6).load_qps == 5.0
    assert provision([], 3.0, hardware_price_per_qps=1e-8, lambda_price_per_query=1e-6).load_qps == 3.0


def test_the_scaler_provisions_a_bursty_group_above_its_mean(store: InMemoryMetadataStore) -> None:  # noqa: F811
    # Bursts of 2,400 q/s one second in five, 400 q/s between them: 800 q/s on average.
    for second in range(1000, 1060):
        store.add_load({GROUP.key: 2400 if second % 5 == 0 else 400}, second)
    reports = {}
    for envelope_on in (False, True):
        config = ScalerConfig(
            window_s=30, slack=0.0, max_workers={"cpu": 8}, provision_for_envelope=envelope_on
        )
        reports[envelope_on] = Scaler(store, FakeProvider({"cpu": 0}), DEFAULT_POOLS, config).tick(now=1060.5)
    mean, bursty = reports[False], reports[True]
    assert mean.load_qps[GROUP.key] == pytest.approx(800.0)
    assert bursty.provisioned_qps[GROUP.key] > 800.0
    assert bursty.summary()["provisioned_qps"] == {GROUP.key: round(bursty.provisioned_qps[GROUP.key], 2)}
    assert bursty.plan.total_instances > mean.plan.total_instances


def peaks_of(arrival_times: np.ndarray, seconds: int) -> list[int]:
    """Each second's most arrivals in one PEAK_SLICE_S slice, as the gateway counts them."""
    slices = np.bincount((arrival_times / PEAK_SLICE_S).astype(int), minlength=int(seconds / PEAK_SLICE_S))
    return [int(peak) for peak in slices.reshape(seconds, -1).max(axis=1)]


def test_the_peaks_of_poisson_arrivals_read_as_no_burst() -> None:
    rng = np.random.default_rng(7)
    bursts = 0
    for rate in (2.0, 5.0, 50.0, 500.0):
        for _ in range(20):
            times = np.sort(rng.uniform(0, 60, rng.poisson(rate * 60)))
            found = poisson_equivalent_qps(peaks_of(times, 60), len(times) / 60)
            bursts += found > 0
            assert found < 1.6 * rate
    assert bursts <= 3  # a 1 % test, 80 times


def test_clumped_arrivals_read_as_a_rate_well_above_their_mean() -> None:
    # 50 q/s on average, but in clumps of 25 queries within a few ms, two a second.
    rng = np.random.default_rng(3)
    starts = rng.uniform(0, 60, 120)
    times = np.sort(np.concatenate([start + rng.uniform(0, 0.005, 25) for start in starts]))
    times = times[times < 60]
    assert poisson_equivalent_qps(peaks_of(times, 60), len(times) / 60) > 4 * 50.0
    assert poisson_equivalent_qps([]) == 0.0 and poisson_equivalent_qps([0, 0]) == 0.0


def test_sub_second_bursts_are_provisioned_only_where_lambda_cannot_take_them_in_time() -> None:
    counts = [50] * 60
    peaks = [25] * 60  # every second: 25 of its 50 queries in one 100 ms slice
    prices = {"hardware_price_per_qps": 9e-7, "lambda_price_per_query": 1e-6}
    in_time = provision(counts, 50.0, peaks=peaks, lambda_takes_bursts=True, **prices)
    assert in_time.load_qps == pytest.approx(50.0) and in_time.burst_qps == 0.0
    late = provision(counts, 50.0, peaks=peaks, lambda_takes_bursts=False, **prices)
    assert late.burst_qps > 100.0 and late.load_qps == pytest.approx(late.burst_qps)
    no_lambda = provision(counts, 50.0, 9e-7, None, peaks=peaks)
    assert no_lambda.load_qps == pytest.approx(late.load_qps)


def test_the_scaler_covers_the_clumps_of_a_group_whose_budget_a_cold_start_misses(
    store: InMemoryMetadataStore,  # noqa: F811
) -> None:
    # 200 q/s, every second all of it in one 100 ms clump; the group's budget is 50 ms.
    for second in range(1000, 1060):
        store.add_load({GROUP.key: 200}, second, {GROUP.key: 200})
    reports = {}
    for init_ms in (5.0, 500.0):  # a cold start that fits the budget, and one that does not
        config = ScalerConfig(window_s=30, slack=0.0, max_workers={"cpu": 8}, lambda_init_ms=init_ms)
        reports[init_ms] = Scaler(store, FakeProvider({"cpu": 0}), DEFAULT_POOLS, config).tick(now=1060.5)
    assert reports[500.0].provisioned_qps[GROUP.key] > 2 * reports[5.0].provisioned_qps.get(GROUP.key, 200.0)
    assert reports[500.0].plan.total_instances > reports[5.0].plan.total_instances
    assert reports[500.0].summary()["burst_qps"] == {GROUP.key: round(reports[500.0].burst_qps[GROUP.key], 2)}
    assert reports[5.0].burst_qps == {}
