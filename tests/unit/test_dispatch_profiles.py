"""The profile cache (``modelless.dispatch.profiles``): per-target candidate lists, revalidated by
the app's profiles version, bounded, behind a TTL."""

from __future__ import annotations

import pytest

import modelless.dispatch.profiles as profiles_module
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher
from modelless.selection import InfaasPolicy
from tests.unit.dispatch_kit import (
    APP,
    WORKER_OUT,
    CountingStore,
    FakeWorkers,
    fake_clock,
    make_variant,
    seed,
    snapshot_dispatcher,
    targets,
)


def test_dispatcher_candidates_cache_honours_the_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fake_clock(monkeypatch)
    store = CountingStore()
    seed(store, [make_variant("v")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None, cache_ttl_s=60)
    version = store.profiles_version(APP)
    query = targets(accuracy=0.5)

    first = dispatcher.profiles.candidates(query, version)
    clock.now += 59
    second = dispatcher.profiles.candidates(query, version)
    assert store.candidate_reads == 1
    assert first is second

    clock.now += 2  # 61 s after the first read: expired
    dispatcher.profiles.candidates(query, version)
    assert store.candidate_reads == 2


def test_dispatcher_candidates_cache_is_revalidated_by_the_profiles_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_clock(monkeypatch)
    store = CountingStore()
    seed(store, [make_variant("v1")])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None, cache_ttl_s=60)
    query = targets(accuracy=0.5)

    before = dispatcher.profiles.candidates(query, store.profiles_version(APP))
    seed(store, [make_variant("v2", model="m2")], name="m2")  # bumps the version
    after = dispatcher.profiles.candidates(query, store.profiles_version(APP))

    assert [v.variant_id for v in before] == ["v1"]
    assert [v.variant_id for v in after] == ["v1", "v2"]
    assert store.candidate_reads == 2


def test_dispatcher_candidates_cache_is_keyed_by_accuracy_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch)
    store = CountingStore()
    seed(store, [make_variant("low", accuracy=0.6), make_variant("high", accuracy=0.95)])
    dispatcher = Dispatcher(store, InfaasPolicy(DEFAULT_POOLS), FakeWorkers(WORKER_OUT), None)
    version = store.profiles_version(APP)

    profiles = dispatcher.profiles
    assert [v.variant_id for v in profiles.candidates(targets(accuracy=0.5), version)] == ["high", "low"]
    assert [v.variant_id for v in profiles.candidates(targets(accuracy=0.9), version)] == ["high"]
    assert profiles.candidates(targets(accuracy=0.5, model="other"), version) == []
    # One read of the app's profiles serves every target: the lists share its objects.
    assert store.candidate_reads == 1


def test_dispatcher_per_target_lists_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiles_module, "MAX_CACHED_TARGETS", 3)
    store = CountingStore()
    seed(store, [make_variant("v", accuracy=0.95)])
    dispatcher, _ = snapshot_dispatcher(monkeypatch, store)

    for accuracy in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
        assert dispatcher.select(targets(accuracy=accuracy)).variant.variant_id == "v"
        assert len(dispatcher.profiles._by_target) <= 3
    assert store.candidate_reads == 1  # the app's parsed profiles outlive the target lists
