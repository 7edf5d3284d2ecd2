"""Powertools event data classes for the events this project defines itself (the Lambda tier's
invocation, the registrar's job), beside Powertools' own for AWS's events (API Gateway v2, S3,
EventBridge), and what a function needs to say about its own cold start."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.data_classes.common import DictWrapper

if TYPE_CHECKING:
    from modelless.registration.service import RegistrationJob


class InvocationEvent(DictWrapper):
    """The Lambda tier's event: an ``Invocation`` (``modelless.serving.invocation``) in its JSON form."""

    @property
    def variant_id(self) -> str:
        return str(self.get("variant_id") or "unknown")

    @property
    def correlation_id(self) -> str:
        return str(self.get("correlation_id") or "")

    @property
    def memory_mb(self) -> int:
        return int(self.get("memory_mb") or 0)

    @property
    def payload(self) -> dict[str, Any]:
        return self.raw_event


class RegistrationEvent(DictWrapper):
    """The registrar's event: one registration's background part, sent by the gateway."""

    @property
    def registration_id(self) -> str:
        return str(self.get("registrationId") or "")

    @property
    def correlation_id(self) -> str:
        return str(self.get("correlationId") or "")

    @property
    def job(self) -> RegistrationJob:
        from modelless.registration.service import (
            RegistrationJob,  # the Lambda tier never imports registration
        )

        return RegistrationJob.from_event(self.raw_event)


def container_init_ms(import_started: float) -> float:
    """A container's init time, in ms, read at the end of a function module's import;
    ``import_started`` is ``time.perf_counter()`` taken at the top of that module.

    In the Lambda runtime (``AWS_LAMBDA_RUNTIME_API`` set) the process was started for this
    container, so its age is the init time the function can measure: interpreter, runtime
    bootstrap, imports, clients. Imported into a process that was already running (a test, a host
    that loads the function), the process's age would be that host's, so only the module's own
    import and set-up count."""
    own_ms = (time.perf_counter() - import_started) * 1000
    if not os.environ.get("AWS_LAMBDA_RUNTIME_API"):
        return own_ms
    return max(own_ms, process_age_ms())


def process_age_ms() -> float:
    """How long this process has existed, in ms; 0 where /proc is not there."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22 is the start time in clock ticks since boot; the name (field 2) may hold spaces.
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            uptime_s = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return max(0.0, (uptime_s - started_ticks / ticks) * 1000)
