"""The Lambda tier on one machine: containers are real processes running ``functions/cpu_worker``.

It behaves like Lambda where it matters to the dispatcher: a new container is a cold start
(measured: process start, imports, model load), warm containers are reused, concurrency is
capped, idle containers are reclaimed, and a container's threads follow its memory size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelless.exceptions import ServiceUnavailableError
from modelless.pools.catalog import LAMBDA_MB_PER_VCPU, lambda_threads
from modelless.pools.invokers import WorkerUnreachableError, raise_for_worker_error
from modelless.pools.processes import ChildProcess, spawn
from modelless.types import InstanceState, InstanceStats, WorkerState

INVOKE_PATH = "/2015-03-31/functions/function/invocations"  # the Lambda runtime emulator's path
LAMBDA_TIER_ID = "lambda-tier"


@dataclass
class _Container:
    child: ChildProcess
    memory_mb: int
    busy: bool = False
    invocations: int = 0
    last_used: float = field(default_factory=time.monotonic)
    variants: set[str] = field(default_factory=set)


class LocalLambdaTier:
    def __init__(
        self,
        repository_url: str,
        log_dir: Path,
        cache_dir: Path,
        memory_mb: int = LAMBDA_MB_PER_VCPU,
        concurrency: int = 4,
        idle_timeout_s: float = 300.0,
    ) -> None:
        self.memory_mb = memory_mb
        self.concurrency = concurrency
        self.idle_timeout_s = idle_timeout_s
        self._repository_url = repository_url
        self._log_dir = log_dir
        self._cache_dir = cache_dir
        self._containers: list[_Container] = []
        self._starting = 0
        self._next_index = 0
        self._cond = threading.Condition()
        self._client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=32))
        self.cold_starts = 0

    def invoke(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # Each memory size is its own function in AWS: containers serve one size only.
        container, cold = self._acquire(int(payload.get("memory_mb") or self.memory_mb), timeout_s)
        try:
            response = self._client.post(
                f"{container.child.address}{INVOKE_PATH}", json=payload, timeout=timeout_s
            )
        except httpx.HTTPError as error:
            self._discard(container)
            raise WorkerUnreachableError(f"Lambda container did not answer: {error}") from error
        finally:
            self._release(container, payload)
        body = raise_for_worker_error(
            int(response.json().get("statusCode", response.status_code)), response.json()
        )
        body["cold_start"] = cold
        body["init_ms"] = container.child.started_ms if cold else 0.0
        return body

    def _acquire(self, memory_mb: int, timeout_s: float) -> tuple[_Container, bool]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._reap_idle_locked()
                idle = [c for c in self._containers if not c.busy and c.memory_mb == memory_mb]
                if idle:
                    chosen = max(idle, key=lambda c: c.last_used)  # warmest first, like Lambda
                    chosen.busy = True
                    return chosen, False
                if len(self._containers) + self._starting >= self.concurrency:
                    # At the limit: an idle container of another size gives its place up.
                    spare = [c for c in self._containers if not c.busy]
                    if spare:
                        victim = min(spare, key=lambda c: c.last_used)
                        self._containers.remove(victim)
                        victim.child.stop(timeout_s=1.0)
                if len(self._containers) + self._starting < self.concurrency:
                    self._starting += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServiceUnavailableError(
                        f"Lambda tier at its concurrency limit ({self.concurrency}); retry later",
                        concurrency=self.concurrency,
                    )
                self._cond.wait(remaining)
            name = f"lambda-{self._next_index}"
            self._next_index += 1
        try:
            child = spawn(
                name,
                "infra.lambda_container",
                ["--repository", self._repository_url, "--cache-dir", str(self._cache_dir)],
                self._log_dir,
                env={
                    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb),
                    "OMP_NUM_THREADS": str(lambda_threads(memory_mb)),
                },
            )
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        container = _Container(child, memory_mb, busy=True)
        with self._cond:
            # One step: between "no longer starting" and "running", nobody may count neither.
            self._starting -= 1
            self._containers.append(container)
            self.cold_starts += 1
        return container, True

    def _release(self, container: _Container, payload: dict[str, Any]) -> None:
        with self._cond:
            container.busy = False
            container.invocations += 1
            container.last_used = time.monotonic()
            variant_id = str(payload.get("variant_id", ""))
            if variant_id:
                container.variants.add(variant_id)
            self._cond.notify()

    def _discard(self, container: _Container) -> None:
        with self._cond:
            if container in self._containers:
                self._containers.remove(container)
        container.child.stop()

    def _reap_idle_locked(self) -> None:
        now = time.monotonic()
        for container in list(self._containers):
            if not container.busy and (
                now - container.last_used > self.idle_timeout_s or not container.child.alive()
            ):
                self._containers.remove(container)
                container.child.stop(timeout_s=1.0)

    def state(self) -> WorkerState:
        """The tier as selection sees it: variants warm in some container are Active."""
        with self._cond:
            warm = sorted({v for c in self._containers for v in c.variants})
            busy = sum(1 for c in self._containers if c.busy)
            free = self.concurrency - len(self._containers) - self._starting
        return WorkerState(
            worker_id=LAMBDA_TIER_ID,
            pool="lambda-cpu",
            address="",
            utilisation=busy / self.concurrency,
            free_slots=max(0, free),
            reported_at=time.time(),
            instances=tuple(InstanceStats(v, InstanceState.ACTIVE, 0.0, 0.0, 0.0, 0) for v in warm),
        )

    @property
    def size(self) -> int:
        return len(self._containers)

    def close(self) -> None:
        with self._cond:
            containers, self._containers = self._containers, []
        for container in containers:
            container.child.stop(timeout_s=2.0)
        self._client.close()
