"""Logging a failure that repeats while a part is down (the metadata store, the gateway): the
first failure, a reminder every ``log_every_s`` while they go on, and the first success after them
(with how many failed). A loop that retries every second through an outage would otherwise log a
line (or a traceback) a second.
"""

from __future__ import annotations

import time

from aws_lambda_powertools import Logger

from modelless.exceptions import first_line

# While failures go on, they are logged again at most this often.
FAILURE_LOG_EVERY_S = 60.0


class RepeatedFailures:
    """``failing``: the warning each logged failure says; ``resumed``: the one said at the first
    success after failures."""

    def __init__(
        self, logger: Logger, failing: str, resumed: str, log_every_s: float = FAILURE_LOG_EVERY_S
    ) -> None:
        self._logger = logger
        self._failing = failing
        self._resumed = resumed
        self._log_every_s = log_every_s
        self._failed = 0  # failures since the last success
        self._logged_at = 0.0  # monotonic

    def failed(self, error: Exception) -> None:
        self._failed += 1
        now = time.monotonic()
        if self._failed == 1 or now - self._logged_at >= self._log_every_s:
            self._logged_at = now
            self._logger.warning(
                self._failing, extra={"error": first_line(error), "failed_in_a_row": self._failed}
            )

    def succeeded(self) -> None:
        if self._failed:
            self._logger.warning(self._resumed, extra={"failed_before": self._failed})
            self._failed = 0
