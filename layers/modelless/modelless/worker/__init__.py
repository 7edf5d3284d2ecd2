"""The pool worker: the process that runs on every EC2 worker instance (and, locally, as the
embedded stack's worker processes). It loads variants on demand, serves invocations over HTTP,
batches them adaptively and reports its live state every second.

    python -m modelless.worker --worker-id cpu-0 --pool cpu --slots 2 --repository … --report-url …

The library starts it through ``WorkerLaunch`` (the command line the worker takes), never by
naming a module of its own: ``modelless.pools.local`` for local processes, the EC2 boot script
(``infra/aws/worker-boot.sh``) through systemd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# ``python -m`` this package runs the worker (``__main__``).
MODULE = __name__

# How long after a drain that reserved its slot a query for the drained variant is refused instead
# of loading it again on demand: longer than a gateway may route from an old view (its live-state
# snapshot, 0.2 s, over a report up to a second old, or a load of its own it counts as Active for
# RECENT_LOAD_S, 3 s).
DRAINED_REFUSAL_S = 5.0
# (Here, not in server.py, so that the simulator can model it without importing onnxruntime.)


# The environment variable that carries the token a worker's reports to the gateway present
# (the embedded stack's in-memory store): a secret, so never on the command line, where every
# user of the machine reads it (``ps``, /proc/PID/cmdline).
REPORT_TOKEN_ENV = "MODELLESS_REPORT_TOKEN"


@dataclass(frozen=True)
class WorkerLaunch:
    """What one worker process is started with: its identity, its pool, where variants and
    reports go. ``argv`` is the command line ``python -m modelless.worker`` takes, ``env`` what
    goes in its environment (the secrets)."""

    worker_id: str
    pool: str
    slots: int
    repository_url: str
    cache_dir: Path
    report_url: str
    report_token: str = ""
    extra_args: tuple[str, ...] = field(default=())

    def argv(self) -> list[str]:
        return [
            "--worker-id", self.worker_id,
            "--pool", self.pool,
            "--slots", str(self.slots),
            "--repository", self.repository_url,
            "--cache-dir", str(self.cache_dir),
            "--report-url", self.report_url,
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {REPORT_TOKEN_ENV: self.report_token}
