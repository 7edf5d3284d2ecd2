"""The scaling function (``functions/scaler``), run on a schedule (EventBridge): solve the variant
mix and apply it to the EC2 Auto Scaling groups of the worker pools: their desired capacity
(scale-in picks the instances that leave; their workers drain under the groups' termination
lifecycle hook), and the variant instances their workers hold, loaded and unloaded over the VPC
at the addresses the workers advertise in the metadata store (``modelless.pools.aws``).

EventBridge schedules it once a minute at most; each invocation ticks every
``MODELLESS_SCALER_PERIOD_S`` (default 10 s) until the next one is due, one invocation at a time
under a lease in the metadata store (``modelless.scaling.ticks``). The scaler is kept for as long
as the container: its scale-down holds run across ticks and warm invocations.

Settings: ``MODELLESS_METADATA_URL`` (ElastiCache Redis), ``MODELLESS_POOL_GROUPS`` (JSON: pool
-> Auto Scaling group name), ``MODELLESS_MAX_WORKERS`` and ``MODELLESS_MIN_WORKERS`` (JSON: pool
-> count; only pools listed in MAX are managed), ``MODELLESS_SCALER_PERIOD_S``,
``MODELLESS_LAMBDA_FUNCTION`` (the cpu_worker functions, as the gateway names them: the warm pool
invokes them to keep containers warm for the bursts a cold start would miss; unset: none kept).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent
from aws_lambda_powertools.utilities.typing import LambdaContext

from modelless.catalog import DEFAULT_POOLS
from modelless.config import Settings
from modelless.metadata import open_metadata_store
from modelless.pools.aws import AwsPoolProvider
from modelless.pools.invokers import AwsLambdaInvoker
from modelless.pools.warm import InvokingWarmPool
from modelless.scaling.controller import Scaler, ScalerConfig, record_plan
from modelless.scaling.ticks import ScheduledTicks

logger = Logger(service="scaler")
metrics = Metrics(namespace="Modelless", service="scaler")
# X-Ray (template.yaml: Tracing: Active); off outside Lambda. Patched: Auto Scaling calls
# (botocore), load and unload calls to the workers (httpx).
tracer = Tracer(service="scaler", patch_modules=("botocore", "httpx"))


# Kept back from the invocation's remaining time when waiting for the warm pool's rounds: the
# handler's own return (its logs and metrics) must still fit.
SETTLE_MARGIN_S = 2.0


class ScalerFunction:
    """One container: the store's connection pool, the boto3 client and the HTTP client to the
    workers, reused by every warm invocation, and the scaler, whose hold timers run on."""

    def __init__(self, settings: Settings) -> None:
        self.store = open_metadata_store(settings.metadata_url)
        self.pools = AwsPoolProvider(dict(settings.pool_groups), self.store)
        self.warm_pool = (
            InvokingWarmPool(AwsLambdaInvoker(settings.lambda_function), self.store)
            if settings.lambda_function
            else None
        )
        self.scaler = Scaler(
            self.store,
            self.pools,
            DEFAULT_POOLS,
            ScalerConfig(
                max_workers=dict(settings.max_workers),
                min_workers=dict(settings.min_workers),
                lambda_init_ms=settings.lambda_init_ms,
            ),
            warm_pool=self.warm_pool,
        )
        self.ticks = ScheduledTicks(self.scaling_tick, self.store, period_s=settings.scaler_period_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalerFunction:
        return cls(settings)

    def scaling_tick(self, now: float) -> dict[str, Any]:
        """One tick: the plan, applied; its summary logged and its figures added to the metrics."""
        report = self.scaler.tick(now)
        record_plan(self.store, report, now)  # what the gateways' dashboard shows
        shortfall = self.pools.shortfall
        # Instances the plan wants that no worker took yet (workers still booting, or full).
        summary = {**report.summary(), "unplaced": {pool: dict(v) for pool, v in shortfall.items() if v}}
        # Dollars per hour: CloudWatch has no currency unit, so the unit is None and the name says it.
        # One value per tick: the invocation's metrics carry them all.
        metrics.add_metric(
            name="PlanCostPerHour", unit=MetricUnit.NoUnit, value=report.plan.cost_per_second * 3600
        )
        metrics.add_metric(
            name="SolveTime", unit=MetricUnit.Milliseconds, value=report.plan.solve_seconds * 1000
        )
        metrics.add_metric(
            name="LambdaTierQps", unit=MetricUnit.CountPerSecond, value=sum(report.plan.lambda_qps.values())
        )
        metrics.add_metric(
            name="InstancesUnplaced",
            unit=MetricUnit.Count,
            value=sum(sum(short.values()) for short in shortfall.values()),
        )
        # Instances handed to their group for replacement (their worker went silent).
        replaced = sum(len(ids) for ids in report.healed.values())
        metrics.add_metric(name="WorkersReplaced", unit=MetricUnit.Count, value=replaced)
        logger.info("scaling tick", extra=summary)
        return summary

    def handle(self, event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
        window = self.ticks.run(
            scheduled_at(event), context.get_remaining_time_in_millis, context.aws_request_id
        )
        # Lambda freezes the container once the handler returns: the warm-ups the last ticks
        # started are sent now, not a minute later when it thaws.
        unsettled = 0
        if self.warm_pool is not None:
            unsettled = self.warm_pool.settle(context.get_remaining_time_in_millis() / 1000 - SETTLE_MARGIN_S)
            if unsettled:
                logger.warning(
                    "keep-warm rounds still in flight at the invocation's end", extra={"rounds": unsettled}
                )
        outcome = {
            "ticks": len(window.results),
            "skipped": window.skipped,
            "failed": window.failed,
            "stopped": window.stopped,
            "period_s": self.ticks.period_s,
            "warm_rounds_unsettled": unsettled,
        }
        metrics.add_metric(name="ScalingTicks", unit=MetricUnit.Count, value=len(window.results))
        metrics.add_metric(name="ScalingTicksFailed", unit=MetricUnit.Count, value=window.failed)
        logger.info("scaling window", extra={"schedule": event.detail_type, **outcome})
        # The last tick's summary (the plan in force now), and what the invocation did.
        return {**(window.results[-1] if window.results else {}), **outcome}


def scheduled_at(event: EventBridgeEvent) -> float | None:
    """The event's scheduled time (epoch seconds); None when it has none that parses."""
    try:
        when = datetime.fromisoformat(event.time)
    except (KeyError, TypeError, ValueError):
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
