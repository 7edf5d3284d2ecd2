"""Prometheus metrics of the gateway and the scaler outside Lambda (the embedded stack), read at
``GET /metrics`` (``modelless.api.routers.metrics``; docs/OBSERVABILITY.md).

They are recorded where the EMF metrics are (``modelless.observability.metrics.record_query``, once per
query) and where the embedded stack's scaler ticks (``record_scaling``). In Lambda, CloudWatch's
EMF metrics stand instead: prometheus-client is in the ``server`` extra, not in any Lambda package,
and without it every function here does nothing.

The series (one process's; each gateway process keeps its own):

- ``modelless_query_duration_seconds{model, variant, tier}``: histogram of a query's total time;
- ``modelless_queries_total{tier}``: queries served (its rate is the QPS), by tier
  (``worker``, ``lambda``, ``cache``);
- ``modelless_cold_starts_total{variant}``, ``modelless_worker_retries_total{variant}``;
- ``modelless_cache_lookups_total{result}``: the prediction cache's ``hit``\\ s and ``miss``\\ es;
- ``modelless_scaler_ticks_total``, ``modelless_scaler_plan_cost_dollars_per_hour``,
  ``modelless_scaler_workers{pool}``, ``modelless_scaler_instances{pool, variant}`` (instances the
  tick assigned) and ``modelless_scaler_instances_added_total`` / ``_removed_total{pool, variant}``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

prometheus_client: Any
try:
    import prometheus_client
except ImportError:  # Lambda: no prometheus-client; CloudWatch's EMF metrics stand instead
    prometheus_client = None

if TYPE_CHECKING:
    from modelless.dispatch import QueryResult
    from modelless.scaling.controller import ScalingReport

# The content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Query latency buckets, seconds: from a cache hit (about a millisecond) to a cold Lambda start.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def available() -> bool:
    """Whether prometheus-client is installed (and the metrics recorded)."""
    return prometheus_client is not None


class PrometheusMetrics:
    """The series, in a registry of their own (the default one would mix in whatever else in the
    process registers there) with the process's own CPU, memory and file descriptors."""

    def __init__(self) -> None:
        client = prometheus_client
        assert client is not None
        self.registry = client.CollectorRegistry()
        client.ProcessCollector(registry=self.registry)
        self.query_duration = client.Histogram(
            "modelless_query_duration_seconds",
            "A query's time in the gateway, from its arrival to its answer (timingsMs.total_ms)",
            ["model", "variant", "tier"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queries = client.Counter(
            "modelless_queries", "Queries served, by tier", ["tier"], registry=self.registry
        )
        self.cold_starts = client.Counter(
            "modelless_cold_starts",
            "Queries that waited for a Lambda container's cold start",
            ["variant"],
            registry=self.registry,
        )
        self.retries = client.Counter(
            "modelless_worker_retries",
            "Queries served elsewhere after their first place failed",
            ["variant"],
            registry=self.registry,
        )
        self.cache_lookups = client.Counter(
            "modelless_cache_lookups",
            "Prediction cache lookups, by result (hit, miss)",
            ["result"],
            registry=self.registry,
        )
        self.scaler_ticks = client.Counter("modelless_scaler_ticks", "Scaling ticks", registry=self.registry)
        self.plan_cost = client.Gauge(
            "modelless_scaler_plan_cost_dollars_per_hour",
            "The last scaling plan's cost",
            registry=self.registry,
        )
        self.workers = client.Gauge(
            "modelless_scaler_workers",
            "Workers the last tick asked for, per pool",
            ["pool"],
            registry=self.registry,
        )
        self.instances = client.Gauge(
            "modelless_scaler_instances",
            "Variant instances the last tick assigned",
            ["pool", "variant"],
            registry=self.registry,
        )
        self.instances_added = client.Counter(
            "modelless_scaler_instances_added",
            "Variant instances the scaler added",
            ["pool", "variant"],
            registry=self.registry,
        )
        self.instances_removed = client.Counter(
            "modelless_scaler_instances_removed",
            "Variant instances the scaler removed",
            ["pool", "variant"],
            registry=self.registry,
        )
        # (pool, variant) -> instances the previous tick assigned: the next one's changes.
        self._assigned: dict[tuple[str, str], int] = {}
        self._scaling_lock = threading.Lock()

    def record_query(self, result: QueryResult) -> None:
        variant = result.decision.variant
        self.query_duration.labels(variant.model_name, variant.variant_id, result.tier.value).observe(
            result.timings_ms["total_ms"] / 1000
        )
        self.queries.labels(result.tier.value).inc()
        if "cache_ms" in result.timings_ms:  # the prediction cache is on
            self.cache_lookups.labels("hit" if result.cached else "miss").inc()
        if result.cold_start:
            self.cold_starts.labels(variant.variant_id).inc()
        if result.retried:
            self.retries.labels(variant.variant_id).inc()

    def record_scaling(self, report: ScalingReport) -> None:
        with self._scaling_lock:  # one tick at a time: the changes are counted from the last one
            self.scaler_ticks.inc()
            self.plan_cost.set(report.plan.cost_per_second * 3600)
            for pool, count in report.workers.items():
                self.workers.labels(pool).set(count)
            assigned = {
                (pool, variant): count
                for pool, instances in report.instances.items()
                for variant, count in instances.items()
            }
            # A pool the tick did not assign keeps its instances as they were.
            for key, before in self._assigned.items():
                if key[0] not in report.instances:
                    assigned.setdefault(key, before)
            for key in assigned.keys() | self._assigned.keys():
                before, after = self._assigned.get(key, 0), assigned.get(key, 0)
                if after > before:
                    self.instances_added.labels(*key).inc(after - before)
                elif after < before:
                    self.instances_removed.labels(*key).inc(before - after)
                if after:
                    self.instances.labels(*key).set(after)
                elif key in self._assigned:
                    self.instances.remove(*key)  # gone: no series stuck at its last value
            self._assigned = {key: count for key, count in assigned.items() if count}

    def exposition(self) -> bytes:
        """Every series, in the text exposition format."""
        text: bytes = prometheus_client.generate_latest(self.registry)
        return text


_metrics: PrometheusMetrics | None = None
_lock = threading.Lock()


def metrics() -> PrometheusMetrics | None:
    """The process's metrics; None without prometheus-client."""
    global _metrics
    if _metrics is None and prometheus_client is not None:
        with _lock:
            if _metrics is None:
                _metrics = PrometheusMetrics()
    return _metrics


def record_query(result: QueryResult) -> None:
    recorded = metrics()
    if recorded is not None:
        recorded.record_query(result)


def record_scaling(report: ScalingReport) -> None:
    recorded = metrics()
    if recorded is not None:
        recorded.record_scaling(report)
