"""The scaler's schedule, fired: an EventBridge rule with template.yaml's schedule expression for the
Scaler function, its events delivered to an SQS queue (the emulator cannot run Lambda code), and
the first one handed to the scaler's handler in-process, which ticks on it against a real Redis.

Only against LocalStack (scripts/test-localstack), whose EventBridge fires scheduled rules; moto's
stores them and never fires them. The load is served by the Lambda tier (no Auto Scaling group:
LocalStack has none without Docker), so the tick's plan is made and returned without one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.build.lambda_artifacts import load_template
from modelless.catalog import LAMBDA_POOL, Placement, lambda_threads
from modelless.metadata.redis import RedisMetadataStore
from modelless.query_load import QueryGroup
from modelless.scaling.ticks import SCHEDULE_S, ScheduledTicks
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url
from tests.functional.aws_kit import fresh_import
from tests.functional.test_scaler_function import FakeClock, InvocationContext
from tests.waiting import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.localstack(moto=False)


def scaler_schedule() -> str:
    """The Scaler function's schedule expression, as template.yaml deploys it."""
    scaler = load_template(ROOT / "template.yaml")["Resources"]["Scaler"]["Properties"]
    expression: str = scaler["Events"]["Tick"]["Properties"]["Schedule"]
    return expression


def seed_lambda_load(store: RedisMetadataStore, now: int) -> QueryGroup:
    """A model with one Lambda-tier variant, and 50 q/s of load over the 40 s before ``now``."""
    record = ModelRecord("app", "m", "input", [1, 8, 8], "float32", 10, "reg", "src", True)
    registration = Registration("reg", "app", "m", RegistrationStatus.READY)
    store.add_model(record, registration)
    placement = Placement(LAMBDA_POOL, lambda_threads(1769), 1769)
    profile = VariantProfile(
        variant_id=f"app/m/fp32_all/{placement.name}", app_id="app", model_name="m",
        pool=LAMBDA_POOL.name, precision="fp32", opt_level="all", threads=placement.threads,
        artifact_key="k", size_bytes=1, load_latency_ms=5.0, latency_p50_ms={1: 1.6, 8: 8.0},
        latency_p99_ms={1: 2.0, 8: 10.0}, peak_memory_mb=20.0, accuracy=0.95,
        price_per_second=placement.price_per_second, request_price=LAMBDA_POOL.request_price,
        hardware="test", measured_on_target=True, memory_mb=1769, saturation_qps=1000.0,
        max_useful_batch=8,
    )  # fmt: skip
    store.publish_variants(record, [profile], registration)
    group = QueryGroup("app", None, 0.9, 50.0)
    for second in range(now - 40, now):
        store.add_load({group.key: 50}, second)
    return group


@pytest.fixture
def schedule_queue(aws_endpoint: str) -> Iterator[tuple[Any, str, str]]:
    """An SQS queue the scaler's schedule rule delivers its events to: (sqs client, queue URL,
    rule ARN)."""
    sqs = boto3.client("sqs", endpoint_url=aws_endpoint)
    events = boto3.client("events", endpoint_url=aws_endpoint)
    suffix = uuid.uuid4().hex[:8]
    url = sqs.create_queue(QueueName=f"scaler-schedule-{suffix}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = f"modelless-scaler-{suffix}"
    rule_arn = events.put_rule(Name=rule, ScheduleExpression=scaler_schedule(), State="ENABLED")["RuleArn"]
    events.put_targets(Rule=rule, Targets=[{"Id": "scaler", "Arn": arn}])
    try:
        yield sqs, url, rule_arn
    finally:
        events.remove_targets(Rule=rule, Ids=["scaler"])
        events.delete_rule(Name=rule)
        sqs.delete_queue(QueueUrl=url)


def next_scheduled_event(sqs: Any, queue_url: str) -> dict[str, Any]:
    def received() -> dict[str, Any] | None:
        messages = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5).get("Messages", [])
        if not messages:
            return None
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=messages[0]["ReceiptHandle"])
        event: dict[str, Any] = json.loads(messages[0]["Body"])
        return event

    # A rate(1 minute) rule first fires a minute after it is created.
    return wait_for(received, scaled(SCHEDULE_S + 30), "the scaler's schedule rule to fire")


def test_the_scaler_schedule_fires_and_its_event_drives_a_scaling_window(
    schedule_queue: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sqs, queue_url, rule_arn = schedule_queue
    url = f"{service_url('MODELLESS_TEST_REDIS_URL')}?prefix=schedule-{uuid.uuid4().hex[:8]}:"
    store = RedisMetadataStore.from_url(url)
    try:
        monkeypatch.setenv("MODELLESS_METADATA_URL", url)
        monkeypatch.setenv("MODELLESS_POOL_GROUPS", "{}")
        monkeypatch.setenv("MODELLESS_MAX_WORKERS", "{}")  # no worker pool: the Lambda tier serves
        scaler_function = fresh_import("functions.scaler.app")

        event = next_scheduled_event(sqs, queue_url)

        # The event as EventBridge hands it to the function.
        assert (event["source"], event["detail-type"]) == ("aws.events", "Scheduled Event")
        assert event["resources"] == [rule_arn]
        scheduled = float(int(time.time()))
        group_key = seed_lambda_load(store, int(scheduled)).key
        # The window it opens, its minute passing on a fake clock: a tick every period from the
        # event's scheduled time until the next event is due, under the scaler's lease.
        clock = FakeClock(scheduled)
        ticked: list[dict[str, Any]] = []

        def tick(now: float) -> dict[str, Any]:
            summary: dict[str, Any] = scaler_function.scaler.scaling_tick(now)
            ticked.append(summary)
            return summary

        period_s = scaler_function.scaler.ticks.period_s
        monkeypatch.setattr(
            scaler_function.scaler,
            "ticks",
            ScheduledTicks(tick, store, period_s=period_s, clock=clock, sleep=clock.sleep),
        )

        summary = scaler_function.handler(event, InvocationContext(clock, "req-scheduled"))

        assert summary["stopped"] == "the next invocation is due" and summary["failed"] == 0
        assert summary["ticks"] == len(ticked) >= 1 and summary["status"] == "optimal"
        # Its first tick sees the load (50 q/s) and gives it to the Lambda tier, with nothing
        # unmet; every later one keeps the tier provisioned for the load as it fades.
        assert ticked[0]["load_qps"] == {group_key: 50.0}
        for each in ticked:
            assert each["status"] == "optimal" and not each["unmet"]
            assert each["lambda_qps"].get(group_key, 0.0) >= each["load_qps"][group_key]
        assert store.scaler_lease_holder() is None  # released when the window closed
    finally:
        store.flush_namespace()
        store.close()
