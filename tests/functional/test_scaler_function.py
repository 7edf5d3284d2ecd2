"""The scaling function's handler with a real EventBridge schedule event: load and profiles in a
real Redis, the pool an Auto Scaling group on the emulated AWS endpoint; its ticks within the
invocation (on a fake clock) and the lease in Redis that keeps two invocations from ticking at
once (on both store backends)."""

from __future__ import annotations

import importlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from modelless.catalog import CPU_POOL
from modelless.metadata.base import MetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.aws import PLAN_TAG
from modelless.query_load import QueryGroup
from modelless.scaling.ticks import ScheduledTicks
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url

EVENTS = Path(__file__).resolve().parents[2] / "events"


class Context:
    function_name = "scaler"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:scaler"
    aws_request_id = "req-scaler"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def seed(store: RedisMetadataStore, now: int | None = None) -> QueryGroup:
    """A model with one cpu variant, and 2,000 q/s of load over the 40 s before ``now``."""
    record = ModelRecord("app", "m", "input", [1, 8, 8], "float32", 10, "reg", "src", True)
    registration = Registration("reg", "app", "m", RegistrationStatus.READY)
    store.add_model(record, registration)
    profile = VariantProfile(
        variant_id="app/m/fp32_all/cpu-1t", app_id="app", model_name="m", pool="cpu", precision="fp32",
        opt_level="all", threads=1, artifact_key="k", size_bytes=1, load_latency_ms=5.0,
        latency_p50_ms={1: 1.6, 8: 8.0}, latency_p99_ms={1: 2.0, 8: 10.0}, peak_memory_mb=20.0,
        accuracy=0.95, price_per_second=CPU_POOL.instance_price_per_second(1), request_price=0.0,
        hardware="test", measured_on_target=True,
    )  # fmt: skip
    store.publish_variants(record, [profile], registration)
    group = QueryGroup("app", None, 0.9, 50.0)
    now = int(time.time()) if now is None else now
    for second in range(now - 40, now):
        store.add_load({group.key: 2000}, second)
    return group


def test_a_scheduled_tick_scales_the_auto_scaling_group(
    autoscaling_group: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, group_name = autoscaling_group
    url = f"{service_url('MODELLESS_TEST_REDIS_URL')}?prefix=scaler-{uuid.uuid4().hex[:8]}:"
    store = RedisMetadataStore.from_url(url)
    try:
        seed(store)
        monkeypatch.setenv("MODELLESS_METADATA_URL", url)
        monkeypatch.setenv("MODELLESS_POOL_GROUPS", json.dumps({"cpu": group_name}))
        monkeypatch.setenv("MODELLESS_MAX_WORKERS", json.dumps({"cpu": 4}))
        sys.modules.pop("functions.scaler.app", None)
        scaler_function = importlib.import_module("functions.scaler.app")
        event = json.loads((EVENTS / "scheduled.json").read_text())

        summary = scaler_function.handler(event, Context())

        assert summary["ticks"] == 1  # the sample event's schedule is past: it ticks once
        assert summary["status"] == "optimal"
        desired = client.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])[
            "AutoScalingGroups"
        ][0]
        assert desired["DesiredCapacity"] == summary["workers"]["cpu"] >= 2
        tags = {t["Key"]: t["Value"] for t in desired["Tags"]}
        assert json.loads(tags[PLAN_TAG])["app/m/fp32_all/cpu-1t"] >= 4
        # The plan is recorded where the gateways' dashboard reads it (GET /v1/dashboard/state).
        recorded = json.loads(store.scaling_plan() or "null")
        assert recorded["cost_per_hour"] == summary["cost_per_hour"] > 0
        planned = {(i["variant"], i["pool"]): i["count"] for i in recorded["instances"]}
        assert planned[("app/m/fp32_all/cpu-1t", "cpu")] >= 4
    finally:
        store.flush_namespace()
        store.close()


# --- ticks within the invocation, one invocation at a time ------------------------------------


@dataclass
class Deployed:
    function: ModuleType
    store: RedisMetadataStore
    autoscaling: Any
    group_name: str
    seeded_until: int  # the load runs until this second

    def desired(self) -> int:
        found = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group_name])
        return int(found["AutoScalingGroups"][0]["DesiredCapacity"])


@pytest.fixture
def deployed(autoscaling_group: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployed]:
    client, group_name = autoscaling_group
    url = f"{service_url('MODELLESS_TEST_REDIS_URL')}?prefix=scaler-{uuid.uuid4().hex[:8]}:"
    store = RedisMetadataStore.from_url(url)
    try:
        now = int(time.time())
        seed(store, now)
        monkeypatch.setenv("MODELLESS_METADATA_URL", url)
        monkeypatch.setenv("MODELLESS_POOL_GROUPS", json.dumps({"cpu": group_name}))
        monkeypatch.setenv("MODELLESS_MAX_WORKERS", json.dumps({"cpu": 4}))
        sys.modules.pop("functions.scaler.app", None)
        yield Deployed(importlib.import_module("functions.scaler.app"), store, client, group_name, now)
    finally:
        store.flush_namespace()
        store.close()


class FakeClock:
    """Seconds that pass when slept, from the time the load in Redis was stamped with."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class InvocationContext(Context):
    """An invocation with template.yaml's 70 s timeout, on the fake clock."""

    def __init__(self, clock: FakeClock, request_id: str) -> None:
        self._clock = clock
        self._deadline = clock.now + 70.0
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - self._clock.now) * 1000)


def schedule_event(at: float) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "scheduled.json").read_text())
    event["time"] = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


def test_an_invocation_ticks_every_period_until_the_next_one_is_due(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduled = float(deployed.seeded_until)  # EventBridge's times are whole seconds
    clock = FakeClock(scheduled + 0.5)
    holders: list[str | None] = []
    workers: list[int] = []

    def tick(now: float) -> dict[str, Any]:
        holders.append(deployed.store.scaler_lease_holder())
        summary: dict[str, Any] = deployed.function.scaler.scaling_tick(now)
        workers.append(summary["workers"]["cpu"])
        return summary

    # The function's own loop and scaler, the clock faked: the minute passes in a moment.
    assert deployed.function.scaler.ticks.period_s == 10.0  # MODELLESS_SCALER_PERIOD_S's default
    monkeypatch.setattr(
        deployed.function.scaler,
        "ticks",
        ScheduledTicks(tick, deployed.store, period_s=10.0, clock=clock, sleep=clock.sleep),
    )

    summary = deployed.function.handler(schedule_event(scheduled), InvocationContext(clock, "req-a"))

    assert summary["ticks"] == 6 and summary["stopped"] == "the next invocation is due"
    assert clock.now < scheduled + 60  # its last tick at +50: the next invocation takes over
    # Every tick under the invocation's lease in Redis, released when it returned.
    assert holders == [f"{scheduled + 60:.3f}/req-a"] * 6
    assert deployed.store.scaler_lease_holder() is None
    # The load (2,000 q/s until now) scales the group up at once. It fades from the 30 s window's
    # mean, but not from the arrival envelope's 60 s history (modelless.scaling.envelope): the
    # group stays provisioned for the burst through the minute, and its workers stay.
    peak = workers[0]
    assert peak >= 2 and workers == [peak] * 6
    assert summary["provisioned_qps"] and all(
        summary["provisioned_qps"][group] >= qps for group, qps in summary["load_qps"].items()
    )
    assert summary["status"] == "optimal"
    assert deployed.desired() == summary["workers"]["cpu"] == workers[-1]


def test_a_duplicate_invocation_of_a_schedule_does_nothing(deployed: Deployed) -> None:
    scheduled = float(int(time.time()))
    twin = f"{scheduled + 60:.3f}/req-twin"  # the first delivery of the same event, ticking
    assert deployed.store.acquire_scaler_lease(twin, ttl_s=60.0)

    summary = deployed.function.handler(schedule_event(scheduled), Context())

    assert summary["ticks"] == 0 and "status" not in summary
    assert summary["stopped"] == "another invocation ticks for this schedule or a later one"
    assert deployed.desired() == 1  # untouched
    assert deployed.store.scaler_lease_holder() == twin


def test_the_scaler_lease_is_held_by_one_owner_until_released_or_expired(any_store: MetadataStore) -> None:
    assert any_store.scaler_lease_holder() is None
    assert any_store.acquire_scaler_lease("60.000/a", 30.0)
    assert any_store.acquire_scaler_lease("60.000/a", 30.0)  # its holder extends it
    assert not any_store.acquire_scaler_lease("120.000/b", 30.0)
    assert any_store.scaler_lease_holder() == "60.000/a"
    any_store.release_scaler_lease("120.000/b")  # not its lease: nothing happens
    assert any_store.scaler_lease_holder() == "60.000/a"
    # A job's lease is another lease.
    assert any_store.acquire_job_lease("scaler", "runner", 30.0)
    any_store.release_scaler_lease("60.000/a")
    assert any_store.scaler_lease_holder() is None
    assert any_store.job_lease_holder("scaler") == "runner"
    assert any_store.acquire_scaler_lease("120.000/b", 0.2)
    time.sleep(0.35)
    assert any_store.scaler_lease_holder() is None  # expired: its holder crashed
    assert any_store.acquire_scaler_lease("180.000/c", 30.0)
