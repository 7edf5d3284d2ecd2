"""Query groups and the gateway's query-load counting (pure, on explicit clocks)."""

from __future__ import annotations

import pytest

from modelless.query_load import (
    LATENCY_CLASSES_MS,
    PEAK_SLICE_S,
    QueryGroup,
    QueryLoad,
    QueryLoadCounter,
    group_of,
)
from modelless.types import QueryTargets


@pytest.mark.parametrize(
    ("latency", "accuracy", "expected_latency", "expected_accuracy"),
    [
        (50.0, 0.9, 50.0, 0.90),
        (73.0, 0.901, 70.0, 0.91),  # latency rounds down, accuracy up: the stricter side
        (8.0, 0.9, 7.0, 0.90),  # not 5 ms: a 7 ms model meets an 8 ms budget, and its class
        (1.7, 0.9, 1.5, 0.90),
        (0.5, 0.0, 0.5, 0.0),  # below the smallest class: the budget itself
        (None, 0.95, LATENCY_CLASSES_MS[-1], 0.95),
    ],
)
def test_groups_round_to_the_stricter_class(
    latency: float | None, accuracy: float, expected_latency: float, expected_accuracy: float
) -> None:
    group = group_of(QueryTargets("app", latency_ms=latency, min_accuracy=accuracy))
    assert group.latency_ms == expected_latency
    assert group.min_accuracy == pytest.approx(expected_accuracy)


def test_a_budget_loses_at_most_40_percent_to_its_class_up_to_a_second() -> None:
    assert list(LATENCY_CLASSES_MS) == sorted(set(LATENCY_CLASSES_MS))
    for budget in (1.0 + 0.01 * step for step in range(100_000)):  # 1 ms .. 1 s
        planned = group_of(QueryTargets("app", latency_ms=budget)).latency_ms
        assert 0.6 * budget <= planned <= budget, budget


def test_group_keys_round_trip_and_separate_named_models() -> None:
    named = group_of(QueryTargets("app", latency_ms=20, model_name="m"))
    anonymous = group_of(QueryTargets("app", latency_ms=20))
    assert named.key != anonymous.key
    assert QueryGroup.parse(named.key) == named
    assert QueryGroup.parse(anonymous.key) == anonymous
    fractional = group_of(QueryTargets("app", latency_ms=1.9, min_accuracy=0.9))
    assert fractional.key == "app|*|0.90|1.5"
    assert QueryGroup.parse(fractional.key) == fractional


def test_the_counter_hands_counts_over_once_a_second_and_starts_again() -> None:
    counter = QueryLoadCounter()
    group = group_of(QueryTargets("app", latency_ms=20, min_accuracy=0.9))
    assert counter.due(1000.0)
    for _ in range(5):
        counter.record(group, 999.95)
    assert counter.take(1000.0).counts == {group.key: 5}
    counter.record(group, 1000.2)
    assert not counter.due(1000.5)
    assert counter.due(1001.0)
    assert counter.take(1001.0).counts == {group.key: 1}
    assert counter.take(1002.0) == QueryLoad({}, {})


def test_the_peak_is_the_most_queries_in_one_slice_of_the_second() -> None:
    counter = QueryLoadCounter()
    clumped = group_of(QueryTargets("app", latency_ms=50, min_accuracy=0.9))
    spread = group_of(QueryTargets("app", latency_ms=500, min_accuracy=0.9))
    for i in range(10):
        counter.record(spread, 1000.0 + i * PEAK_SLICE_S + 0.01)  # one per slice
    for _ in range(7):
        counter.record(clumped, 1000.43)  # seven in one slice
    counter.record(clumped, 1000.91)
    taken = counter.take(1001.0)
    assert taken.counts == {spread.key: 10, clumped.key: 8}
    assert taken.peaks == {spread.key: 1, clumped.key: 7}


def test_a_clump_split_by_a_take_is_still_one_clump() -> None:
    counter = QueryLoadCounter()
    group = group_of(QueryTargets("app", latency_ms=50, min_accuracy=0.9))
    for _ in range(3):
        counter.record(group, 1000.95)
    assert counter.take(1000.96).peaks == {group.key: 3}
    for _ in range(2):
        counter.record(group, 1000.97)  # the same slice
    assert counter.take(1001.0).peaks == {group.key: 5}
    counter.record(group, 1001.05)  # a new slice
    assert counter.take(1002.0).peaks == {group.key: 1}
