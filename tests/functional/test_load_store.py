"""Load counts per group in both metadata stores (the real Redis one included)."""

from __future__ import annotations

from typing import Any

import pytest

from modelless.metadata.base import LOAD_RETENTION_S


def test_recent_load_is_the_rate_over_whole_past_seconds(any_store: Any) -> None:
    now = 10_000.5
    any_store.add_load({"g1": 30, "g2": 5}, 9_998)
    any_store.add_load({"g1": 10}, 9_999)
    any_store.add_load({"g1": 1000}, 10_000)  # the current second: not yet complete, not counted
    any_store.add_load({"g1": 7}, 9_990)  # outside a 5 s window
    load = any_store.recent_load(5, now)
    assert load == pytest.approx({"g1": 40 / 5, "g2": 5 / 5})
    assert any_store.recent_load(10, now)["g1"] == pytest.approx(47 / 10)


def test_counts_add_up_across_gateways(any_store: Any) -> None:
    any_store.add_load({"g": 3}, 500)
    any_store.add_load({"g": 4}, 500)  # a second gateway, same second
    assert any_store.recent_load(1, 501.2) == pytest.approx({"g": 7.0})


def test_an_empty_flush_writes_nothing_and_old_seconds_are_dropped(any_store: Any) -> None:
    any_store.add_load({}, 100)
    assert any_store.recent_load(3, 101.0) == {}
    any_store.add_load({"g": 1}, 100)
    any_store.add_load({"g": 1}, 100 + LOAD_RETENTION_S + 5)
    assert any_store.recent_load(LOAD_RETENTION_S, 100 + LOAD_RETENTION_S + 6) == pytest.approx(
        {"g": 1 / LOAD_RETENTION_S}
    )


def test_the_load_series_gives_each_past_second_oldest_first(any_store: Any) -> None:
    any_store.add_load({"g1": 30, "g2": 5}, 9_998)
    any_store.add_load({"g1": 10}, 9_999)
    any_store.add_load({"g1": 1000}, 10_000)  # the current second: not yet complete
    series = any_store.load_series(4, 10_000.5)
    assert series == {"g1": [0, 0, 30, 10], "g2": [0, 0, 5, 0]}
    assert any_store.recent_load(4, 10_000.5) == pytest.approx({"g1": 10.0, "g2": 1.25})


def test_peaks_are_kept_per_second_beside_the_counts_and_add_up_across_gateways(any_store: Any) -> None:
    any_store.add_load({"g1": 30, "g2": 5}, 9_998, {"g1": 12, "g2": 1})
    any_store.add_load({"g1": 10}, 9_999, {"g1": 2})
    any_store.add_load({"g1": 4}, 9_999, {"g1": 3})  # a second gateway, same second: a bound
    any_store.add_load({"g1": 1000}, 10_000, {"g1": 900})  # the current second: not yet complete
    assert any_store.peak_series(3, 10_000.5) == {"g1": [0, 12, 5], "g2": [0, 1, 0]}
    assert any_store.load_series(3, 10_000.5) == {"g1": [0, 30, 14], "g2": [0, 5, 0]}
    any_store.add_load({"g3": 1}, 9_999)  # a gateway that sends no peaks (before this field)
    assert "g3" not in any_store.peak_series(3, 10_000.5)
