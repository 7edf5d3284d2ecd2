"""Provisioning for the arrival envelope (modelless.scaling.envelope): pure functions over
per-second counts, then the scaler that uses them."""

from __future__ import annotations

import numpy as np
import pytest

from modelless.metadata.memory import InMemoryMetadataStore
from modelless.pools.catalog import DEFAULT_POOLS
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.scaling.envelope import (
    burst_window_s,
    envelope,
    growth_qps_per_s,
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
