"""The embedded stack's telemetry: OpenTelemetry spans of a query's stages (modelless.tracing)
and the Prometheus series at GET /metrics (modelless.observability.prometheus), on test_api.py's
in-process API with the prediction cache on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from modelless import tracing
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.catalog import DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.observability import prometheus
from modelless.repository.local import LocalModelRepository
from modelless.scaling.controller import Scaler, ScalerConfig, ScalingReport
from modelless.scaling.problem import PlanStatus, ScalingPlan
from tests.unit.test_api import ADMIN, Api, InProcessLambda, images, make_settings, query, seed_digits
from tests.unit.test_scaler import FakeProvider, load
from tests.unit.test_scaler import store as store

APP = "digits"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    settings = make_settings(tmp_path, prediction_cache_enabled=True)
    services = build_services(settings, store=store, lambda_tier=lambda_tier)
    built = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)
    monkeypatch.setattr(services.registrar._background, "submit", lambda *args, **kwargs: None)
    # The process's series start from nothing in each test.
    monkeypatch.setattr(prometheus, "_metrics", prometheus.PrometheusMetrics())
    try:
        yield built
    finally:
        built.client.close()
        services.close()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.reset_tracing()
        provider.shutdown()


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in finished}
    assert len(named) == len(finished), [span.name for span in finished]  # one of each per query
    return named


# --- OpenTelemetry --------------------------------------------------------------------------


def test_a_query_is_one_trace_with_a_span_per_stage(api: Api, spans: InMemorySpanExporter) -> None:
    key = api.create_app(APP)
    linear, _ = seed_digits(api, APP)
    spans.clear()  # creating the app is no query

    reply = query(api, key, appID=APP, inputs=images(2).tolist(), latency=10, accuracy=0.8).json()

    named = by_name(spans.get_finished_spans())
    assert set(named) == {
        "modelless.query",
        "modelless.decode",
        "modelless.cache",
        "modelless.selection",
        "modelless.dispatch",
    }
    root = named["modelless.query"]
    assert root.parent is None
    for stage in ("modelless.decode", "modelless.cache", "modelless.selection", "modelless.dispatch"):
        parent, context = named[stage].parent, named[stage].context
        assert parent is not None and root.context is not None and context is not None
        assert parent.span_id == root.context.span_id
        assert context.trace_id == root.context.trace_id
    expected = {tracing.MODEL: "linear", tracing.VARIANT: linear.variant_id, tracing.TIER: "lambda"}
    for name in ("modelless.query", "modelless.selection", "modelless.dispatch"):
        attributes = dict(named[name].attributes or {})
        assert {k: attributes.get(k) for k in expected} == expected, name
    dispatch = dict(named["modelless.dispatch"].attributes or {})
    assert dispatch[tracing.COLD_START] is True and dispatch[tracing.RETRIED] is False
    assert dispatch["modelless.inference_ms"] == pytest.approx(reply["timingsMs"]["inference_ms"], abs=1e-3)
    assert dict(named["modelless.cache"].attributes or {})[tracing.CACHE_HIT] is False


def test_a_cache_hit_is_traced_without_selection_or_dispatch(api: Api, spans: InMemorySpanExporter) -> None:
    key = api.create_app(APP)
    seed_digits(api, APP)
    batch = images(1).tolist()
    query(api, key, appID=APP, inputs=batch, latency=10, accuracy=0.8)
    spans.clear()

    reply = query(api, key, appID=APP, inputs=batch, latency=10, accuracy=0.8).json()

    assert reply["cached"] is True
    named = by_name(spans.get_finished_spans())
    assert set(named) == {"modelless.query", "modelless.decode", "modelless.cache"}
    assert dict(named["modelless.cache"].attributes or {})[tracing.CACHE_HIT] is True
    assert dict(named["modelless.query"].attributes or {})[tracing.TIER] == "cache"


def test_a_refused_query_ends_its_span_with_the_error(api: Api, spans: InMemorySpanExporter) -> None:
    key = api.create_app(APP)
    seed_digits(api, APP)
    spans.clear()

    refused = query(api, key, appID=APP, inputs=images(1).tolist(), accuracy=0.999)

    assert refused.status_code == 422, refused.text  # targets_unreachable
    named = by_name(spans.get_finished_spans())
    assert not named["modelless.query"].status.is_ok
    assert not named["modelless.selection"].status.is_ok
    assert "modelless.dispatch" not in named


def test_without_an_exporter_in_the_environment_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing.reset_tracing()
    try:
        assert tracing.span("modelless.query") is tracing.NO_SPAN
        with tracing.span("modelless.selection") as stage:
            stage.set_attribute(tracing.MODEL, "m")  # accepted, and dropped
    finally:
        tracing.reset_tracing()


def test_an_exporter_named_in_the_environment_gets_the_spans() -> None:
    """In a child process: the SDK is set up from the environment once per process."""
    program = (
        "from opentelemetry import trace\n"
        "from modelless import tracing\n"
        "with tracing.span('modelless.query', {tracing.MODEL: 'm'}):\n"
        "    pass\n"
        "trace.get_tracer_provider().shutdown()\n"  # flushes the batch
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ |= {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "modelless-test"}
    done = subprocess.run(
        [sys.executable, "-c", program], env=environ, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "modelless.query"' in done.stdout
    assert '"modelless.model": "m"' in done.stdout
    assert '"service.name": "modelless-test"' in done.stdout


@pytest.mark.parametrize(
    ("environ", "configured"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ],
)
def test_the_standard_environment_turns_tracing_on(environ: dict[str, str], configured: bool) -> None:
    assert tracing.exporter_configured(environ) is configured


# --- Prometheus -----------------------------------------------------------------------------


def samples(api: Api) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = api.client.get("/metrics", headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def labels(**given: str) -> frozenset[tuple[str, str]]:
    return frozenset(given.items())


def test_metrics_count_each_query_by_variant_tier_and_cache(api: Api) -> None:
    key = api.create_app(APP)
    linear, _ = seed_digits(api, APP)
    batch = images(1).tolist()
    before = samples(api)
    served = labels(model="linear", variant=linear.variant_id, tier="lambda")
    assert ("modelless_query_duration_seconds_count", served) not in before

    first = query(api, key, appID=APP, inputs=batch, latency=10, accuracy=0.8).json()
    query(api, key, appID=APP, inputs=batch, latency=10, accuracy=0.8)  # the cache answers
    after = samples(api)

    assert after[("modelless_query_duration_seconds_count", served)] == 1
    assert after[("modelless_query_duration_seconds_sum", served)] == pytest.approx(
        first["timingsMs"]["total_ms"] / 1000, abs=1e-6
    )
    # Every bucket at or above the query's time holds it.
    assert after[("modelless_query_duration_seconds_bucket", labels(le="+Inf", **dict(served)))] == 1
    cached = labels(model="linear", variant=linear.variant_id, tier="cache")
    assert after[("modelless_query_duration_seconds_count", cached)] == 1
    assert after[("modelless_queries_total", labels(tier="lambda"))] == 1
    assert after[("modelless_queries_total", labels(tier="cache"))] == 1
    assert after[("modelless_cold_starts_total", labels(variant=linear.variant_id))] == 1
    assert after[("modelless_cache_lookups_total", labels(result="miss"))] == 1
    assert after[("modelless_cache_lookups_total", labels(result="hit"))] == 1


def test_metrics_need_the_admin_key(api: Api) -> None:
    key = api.create_app(APP)
    assert api.client.get("/metrics").status_code == 401
    assert api.client.get("/metrics", headers=key).status_code in (401, 403)
    assert (
        api.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN['X-Api-Key']}"}).status_code
        == 200
    )


def test_without_prometheus_client_metrics_are_a_404_in_the_api_shape(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus, "metrics", lambda: None)
    response = api.client.get("/metrics", headers=ADMIN)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def scaling_report(
    workers: dict[str, int], instances: dict[str, dict[str, int]], cost_per_hour: float
) -> ScalingReport:
    plan = ScalingPlan(
        instances={(v, pool): n for pool, counts in instances.items() for v, n in counts.items()},
        workers=workers,
        lambda_qps={},
        served={},
        cost_per_second=cost_per_hour / 3600,
        objective=cost_per_hour / 3600,
        solver="milp",
        status=PlanStatus.OPTIMAL,
        solve_seconds=0.01,
    )
    return ScalingReport(plan, {}, workers, {}, instances=instances)


def test_scaler_decisions_count_instances_added_and_removed_per_variant() -> None:
    recorded = prometheus.PrometheusMetrics()

    recorded.record_scaling(scaling_report({"cpu": 2}, {"cpu": {"a": 2, "b": 1}}, 0.17))
    recorded.record_scaling(scaling_report({"cpu": 1}, {"cpu": {"a": 3}}, 0.085))

    exposed = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(recorded.exposition().decode())
        for sample in family.samples
    }
    assert exposed[("modelless_scaler_ticks_total", frozenset())] == 2
    assert exposed[("modelless_scaler_plan_cost_dollars_per_hour", frozenset())] == pytest.approx(0.085)
    assert exposed[("modelless_scaler_workers", labels(pool="cpu"))] == 1
    assert exposed[("modelless_scaler_instances", labels(pool="cpu", variant="a"))] == 3
    assert ("modelless_scaler_instances", labels(pool="cpu", variant="b")) not in exposed  # gone
    assert exposed[("modelless_scaler_instances_added_total", labels(pool="cpu", variant="a"))] == 3
    assert exposed[("modelless_scaler_instances_added_total", labels(pool="cpu", variant="b"))] == 1
    assert exposed[("modelless_scaler_instances_removed_total", labels(pool="cpu", variant="b"))] == 1
    assert ("modelless_scaler_instances_removed_total", labels(pool="cpu", variant="a")) not in exposed


def test_a_real_scalers_ticks_are_recorded_as_it_assigned_them(store: InMemoryMetadataStore) -> None:
    provider = FakeProvider({"cpu": 1})
    config = ScalerConfig(
        window_s=10, slack=0.0, min_hold_s=0, max_workers={"cpu": 8}, provision_for_envelope=False
    )
    scaler = Scaler(store, provider, DEFAULT_POOLS, config)
    recorded = prometheus.PrometheusMetrics()

    load(store, 2500, start=1000, seconds=20)
    busy = scaler.tick(now=1020.5)
    recorded.record_scaling(busy)

    exposed = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(recorded.exposition().decode())
        for sample in family.samples
    }
    assigned = provider.assigned["cpu"]
    assert assigned
    for variant, count in assigned.items():
        assert exposed[("modelless_scaler_instances", labels(pool="cpu", variant=variant))] == count
        assert (
            exposed[("modelless_scaler_instances_added_total", labels(pool="cpu", variant=variant))] == count
        )
    assert exposed[("modelless_scaler_workers", labels(pool="cpu"))] == busy.workers["cpu"]
