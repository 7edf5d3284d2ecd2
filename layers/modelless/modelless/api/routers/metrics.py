"""GET /metrics: the gateway's Prometheus series (``modelless.observability.prometheus``), for the admin key.

Behind the admin key, not open: the series name every app's models and variants. Prometheus
sends it as a bearer token (``authorization: {credentials: <admin key>}`` in the scrape config;
docs/OBSERVABILITY.md). Without prometheus-client (the Lambda packages) it is a 404 that says so:
there CloudWatch holds the metrics (EMF).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from modelless.api.dependencies import AdminDep
from modelless.api.openapi import error_responses
from modelless.exceptions import NotFoundError
from modelless.observability import prometheus

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {prometheus.CONTENT_TYPE: {}}, "description": "text exposition format"},
        **error_responses(401, 403, 404),
    },
)
def prometheus_metrics(_: AdminDep) -> Response:
    recorded = prometheus.metrics()
    if recorded is None:
        raise NotFoundError(
            "this gateway keeps no Prometheus metrics (prometheus-client is not installed: the "
            "server extra has it); in Lambda the metrics are in CloudWatch (EMF)"
        )
    return Response(content=recorded.exposition(), media_type=prometheus.CONTENT_TYPE)
