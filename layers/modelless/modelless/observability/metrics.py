"""Powertools Logger, Metrics and Tracer shared by the gateway: structured logs with correlation
ids, EMF metrics per variant (latency), cold starts and spills to the Lambda tier, X-Ray traces."""

from __future__ import annotations

import threading
import time

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from modelless.cache.predictions import CachedPredictions
from modelless.dispatch import QueryResult
from modelless.observability.prometheus import record_query as record_prometheus_query
from modelless.types import Tier

logger = Logger(service="gateway")
metrics = Metrics(namespace="Modelless", service="gateway")
# X-Ray in Lambda (template.yaml: Tracing: Active), off elsewhere (the embedded stack's spans are
# OpenTelemetry's: modelless.tracing). Patched: S3, Secrets Manager and Lambda invocations
# (botocore), the calls to workers (httpx).
tracer = Tracer(service="gateway", patch_modules=("botocore", "httpx"))


def record_query(result: QueryResult) -> None:
    """One query's EMF metrics and log line, and its Prometheus series where prometheus-client
    is installed (outside Lambda: GET /metrics)."""
    record_prometheus_query(result)
    variant = result.decision.variant.variant_id
    # One EMF blob per query: its dimension is the variant that served it.
    single = EphemeralMetrics(namespace="Modelless", service="gateway")
    single.add_metadata(key="query_id", value=result.query_id)
    single.add_dimension(name="variant", value=variant)
    single.add_metric(name="QueryLatency", unit=MetricUnit.Milliseconds, value=result.timings_ms["total_ms"])
    single.add_metric(
        name="SelectionLatency", unit=MetricUnit.Milliseconds, value=result.timings_ms["selection_ms"]
    )
    if "cache_ms" in result.timings_ms:  # the prediction cache is on: hits and misses
        single.add_metric(
            name="CacheHits" if result.cached else "CacheMisses", unit=MetricUnit.Count, value=1
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
            "cached": result.cached,
            "timings_ms": result.timings_ms,
        },
    )


class CacheStatsReporter:
    """The prediction cache's hit rate, size and evictions as EMF metrics, at most once per
    ``period_s`` (read from the backend then: one round trip a minute, whatever the query rate)."""

    def __init__(self, period_s: float = 60.0) -> None:
        self._period_s = period_s
        self._due = 0.0
        self._lock = threading.Lock()

    def maybe_report(self, predictions: CachedPredictions | None) -> None:
        now = time.monotonic()
        if predictions is None or now < self._due:
            return
        with self._lock:
            if now < self._due:
                return
            self._due = now + self._period_s
        try:
            stats = predictions.stats()
        except Exception:  # the cache's own outage: queries go on; the next period tries again
            logger.debug("prediction cache stats not read")
            return
        emf = EphemeralMetrics(namespace="Modelless", service="gateway")
        emf.add_dimension(name="cache", value=stats.backend)
        emf.add_metric(name="CacheHitRate", unit=MetricUnit.Percent, value=round(100 * stats.hit_rate, 3))
        emf.add_metric(name="CacheBytes", unit=MetricUnit.Bytes, value=stats.bytes_used)
        emf.add_metric(name="CacheEntries", unit=MetricUnit.Count, value=stats.entries)
        emf.add_metric(name="CacheEvictions", unit=MetricUnit.Count, value=stats.evictions)
        emf.flush_metrics()


cache_stats_reporter = CacheStatsReporter()
