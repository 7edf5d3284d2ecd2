"""Where a worker's monitoring loop sends its state: straight into Redis, or, for the embedded
stack's in-memory store, to the gateway that owns it."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from aws_lambda_powertools import Logger

from modelless.exceptions import first_line
from modelless.types import WorkerState

StateSink = Callable[[WorkerState], None]

INTERNAL_STATE_PATH = "/internal/worker-state"
# While reports keep failing (the store or the gateway is down), the failure is logged again at
# most this often.
REPORT_FAILURE_LOG_EVERY_S = 60.0


class ReportFailures:
    """What a worker logs of its failing reports: the first failure, a reminder every
    REPORT_FAILURE_LOG_EVERY_S while they go on, and the first success after them (with how many
    failed). A report every second through a store outage would otherwise log a line a second."""

    def __init__(self, logger: Logger, log_every_s: float = REPORT_FAILURE_LOG_EVERY_S) -> None:
        self._logger = logger
        self._log_every_s = log_every_s
        self._failed = 0  # reports failed since the last success
        self._logged_at = 0.0  # monotonic

    def failed(self, error: Exception) -> None:
        self._failed += 1
        now = time.monotonic()
        if self._failed == 1 or now - self._logged_at >= self._log_every_s:
            self._logged_at = now
            self._logger.warning(
                "state report failed; retrying every period",
                extra={"error": first_line(error), "failed_in_a_row": self._failed},
            )

    def succeeded(self) -> None:
        if self._failed:
            self._logger.warning("state reports resumed", extra={"failed_before": self._failed})
            self._failed = 0


def make_state_sink(url: str, token: str = "") -> StateSink:
    if url.startswith(("http://", "https://")):
        client = httpx.Client(base_url=url, timeout=2.0, headers={"Authorization": f"Bearer {token}"})

        def post(state: WorkerState) -> None:
            client.post(INTERNAL_STATE_PATH, content=state.to_json()).raise_for_status()

        return post

    from modelless.metadata import open_metadata_store

    store = open_metadata_store(url)
    return store.put_worker_state
