"""Powertools Logger and Metrics shared by the gateway: structured logs with correlation ids,
EMF metrics per variant (latency), cold starts and spills to the Lambda tier."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from modelless.dispatch import QueryResult
from modelless.types import Tier

logger = Logger(service="gateway")
metrics = Metrics(namespace="Modelless", service="gateway")


def record_query(result: QueryResult) -> None:
    variant = result.decision.variant.variant_id
    # One EMF blob per query: its dimension is the variant that served it.
    single = EphemeralMetrics(namespace="Modelless", service="gateway")
    single.add_metadata(key="query_id", value=result.query_id)
    single.add_dimension(name="variant", value=variant)
    single.add_metric(name="QueryLatency", unit=MetricUnit.Milliseconds, value=result.timings_ms["total_ms"])
    single.add_metric(
        name="SelectionLatency", unit=MetricUnit.Milliseconds, value=result.timings_ms["selection_ms"]
    )
    if result.tier is Tier.LAMBDA:
        single.add_metric(name="LambdaTierQueries", unit=MetricUnit.Count, value=1)
    if result.cold_start:
        single.add_metric(name="LambdaColdStarts", unit=MetricUnit.Count, value=1)
    if result.retried:
        single.add_metric(name="WorkerRetries", unit=MetricUnit.Count, value=1)
    single.flush_metrics()
    logger.info(
        "query served",
        extra={
            "variant": variant,
            "tier": result.tier.value,
            "worker": result.worker_id,
            "timings_ms": result.timings_ms,
        },
    )
