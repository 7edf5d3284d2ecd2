"""OpenTelemetry spans of a query's stages in the embedded stack (and any gateway outside Lambda).

``span(name, attributes)`` opens a span where tracing is on, and is a shared do-nothing context
otherwise. Tracing is on when the standard environment names an exporter:
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP), or
``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``; ``none`` turns it off), and the ``tracing`` extra
(opentelemetry-sdk and the OTLP/HTTP exporter) is installed. Without them nothing of the SDK is
imported or set up: a stage costs one function call. In Lambda the Powertools Tracer (X-Ray) is
the tracer; this module stays off there unless its environment names an exporter.

The spans (docs/OBSERVABILITY.md): ``modelless.query`` (the whole query, in the API route),
``modelless.decode``, ``modelless.cache`` (the prediction cache's lookup), ``modelless.selection``
and ``modelless.dispatch`` (the attempt on a worker or the Lambda tier: queue, load and
inference, whose worker-side times are its attributes), with the ``modelless.*`` attributes below.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol

from aws_lambda_powertools import Logger

logger = Logger(service="gateway", child=True)

# The attributes the spans carry (their values: str, bool, int or float).
APP = "modelless.app"
MODEL = "modelless.model"
VARIANT = "modelless.variant"
TIER = "modelless.tier"
WORKER = "modelless.worker"
CACHE_HIT = "modelless.cache.hit"
COLD_START = "modelless.cold_start"
RETRIED = "modelless.retried"

SpanValue = str | bool | int | float
TRACER_NAME = "modelless"


class StageSpan(Protocol):
    """What the stages do with their span: an OpenTelemetry ``Span``, or the no-op one."""

    def set_attribute(self, key: str, value: Any) -> Any: ...

    def set_attributes(self, attributes: Mapping[str, Any]) -> Any: ...


class _NoSpan:
    """The span of a stage while tracing is off: one shared instance, entered any number of
    times, at once too (it holds no state)."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


NO_SPAN = _NoSpan()
_UNRESOLVED = object()
_tracer: Any = _UNRESOLVED  # an opentelemetry Tracer, None (tracing off) or _UNRESOLVED
_lock = threading.Lock()


def span(name: str, attributes: Mapping[str, SpanValue] | None = None) -> AbstractContextManager[StageSpan]:
    """A span named ``name`` around the ``with`` block, a child of the current one; it records an
    exception that leaves the block. The do-nothing ``NO_SPAN`` while tracing is off."""
    tracer = _tracer if _tracer is not _UNRESOLVED else _resolve()
    if tracer is None:
        return NO_SPAN
    started: AbstractContextManager[StageSpan] = tracer.start_as_current_span(name, attributes=attributes)
    return started


def enabled() -> bool:
    """Whether spans are recorded (known once the first span was asked for): the attributes
    that cost something to gather are gathered only then."""
    return _tracer is not None and _tracer is not _UNRESOLVED


def exporter_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard OpenTelemetry environment names a trace exporter."""
    chosen = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen == "none":
        return False
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(chosen or endpoint)


def use_tracer_provider(provider: Any) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``; tests give one with an in-memory
    exporter), whatever the environment says; None turns tracing off."""
    global _tracer
    with _lock:
        _tracer = None if provider is None else provider.get_tracer(TRACER_NAME)


def reset_tracing() -> None:
    """Forget the tracer: the next span reads the environment again."""
    global _tracer
    with _lock:
        _tracer = _UNRESOLVED


def _resolve() -> Any:
    """The tracer the environment asks for, set up once per process; None when it asks for none
    or the SDK is not installed."""
    global _tracer
    with _lock:
        if _tracer is _UNRESOLVED:
            _tracer = _tracer_from_environment() if exporter_configured() else None
        return _tracer


def _tracer_from_environment() -> Any:
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        logger.warning(
            "an OpenTelemetry exporter is configured but opentelemetry-sdk is not installed "
            "(pip install 'modelless[tracing]'): no spans are recorded"
        )
        return None
    chosen = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: SpanExporter
    if chosen == "console":
        exporter = ConsoleSpanExporter()
    elif chosen == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning(
                "OTLP export needs opentelemetry-exporter-otlp-proto-http (pip install "
                "'modelless[tracing]'): no spans are recorded"
            )
            return None
        exporter = OTLPSpanExporter()  # its endpoint, headers and timeout from OTEL_EXPORTER_OTLP_*
    else:
        logger.warning(f"OTEL_TRACES_EXPORTER={chosen!r} is not supported (otlp, console, none): no spans")
        return None
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default service name.
    resource = Resource.create({"service.name": "modelless-gateway"}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))  # exports off the query's thread
    # Global too, so that other instrumentation in the process (httpx, FastAPI) joins the traces.
    trace.set_tracer_provider(provider)
    logger.info("OpenTelemetry tracing on", extra={"exporter": chosen})
    return provider.get_tracer(TRACER_NAME)
