"""The Lambda tier on one machine: containers are real processes running ``functions/cpu_worker``.

It behaves like Lambda where it matters to the dispatcher: a new container is a cold start
(measured: process start, imports, model load), warm containers are reused, concurrency is
capped, idle containers are reclaimed, and a container's threads follow its memory size.

Unlike AWS, it can say which containers are idle and what they hold, and selection uses that
(``state`` and ``tier_state``): a variant is an Active instance of the tier while an idle
container holds it, Overloaded while every container that holds it is busy (a query now would
start another container), and a Lambda decision with no idle container counts the cold start.
An invocation takes an idle container that holds its variant before any other idle one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from modelless.catalog import LAMBDA_MB_PER_VCPU, lambda_threads
from modelless.exceptions import ServiceUnavailableError, WorkerUnreachableError
from modelless.pools.health import HealthPolicy, ProcessWatch, Verdict
from modelless.pools.invokers import raise_for_worker_error
from modelless.pools.processes import ChildProcess, spawn
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.wire import to_json_message
from modelless.types import InstanceState, InstanceStats, LambdaTierState, WorkerState

INVOKE_PATH = "/2015-03-31/functions/function/invocations"  # the Lambda runtime emulator's path
LAMBDA_TIER_ID = "lambda-tier"
# The function's timeout (what infra/local/lambda_container.py tells the handler it has): an invocation
# still running past it ends with its container, whether or not its caller still waits.
FUNCTION_TIMEOUT_S = 30.0
# What a container's start is expected to take until the tier has measured one of its own: the
# order of a Python process importing onnxruntime (0.6-0.9 s on an idle 2-core VM). An
# assumption for decisions only, never reported as a measurement; replaced by the measured mean.
UNMEASURED_COLD_START_MS = 1000.0
COLD_STARTS_KEPT = 20  # the expected cold start is the mean of this many latest ones
# A container silent for 2 s is replaced, sooner than a pool worker (4 s): its query has no other
# place to go until it is (a container serves one invocation at a time), and a new container
# costs one cold start, where a new worker loses every variant it had loaded.
CONTAINER_HEALTH = HealthPolicy(replace_after_s=2.0)


@dataclass
class _Container:
    child: ChildProcess
    memory_mb: int
    busy: bool = False
    invocations: int = 0
    last_used: float = field(default_factory=time.monotonic)
    variants: set[str] = field(default_factory=set)
    suspect: bool = False  # stopped answering health probes: not chosen until it answers again

    def usable(self) -> bool:
        return not self.suspect and self.child.alive()


@dataclass(eq=False)
class _Running:
    """One invocation running in a container: its reply (or error) once done."""

    done: threading.Event = field(default_factory=threading.Event)
    response: httpx.Response | None = None
    error: Exception | None = None


@dataclass(eq=False)
class _ColdStart:
    """A container being started for one invocation: handed to it if it still waits, else idle."""

    done: threading.Event = field(default_factory=threading.Event)
    container: _Container | None = None
    error: BaseException | None = None
    abandoned: bool = False  # the invocation stopped waiting (its deadline passed)


class LocalLambdaTier:
    def __init__(
        self,
        container_module: str,
        repository_url: str,
        log_dir: Path,
        cache_dir: Path,
        memory_mb: int = LAMBDA_MB_PER_VCPU,
        concurrency: int = 4,
        idle_timeout_s: float = 300.0,
        health: HealthPolicy | None = None,
    ) -> None:
        # What a container runs (``python -m container_module --repository … --cache-dir …``):
        # the embedded stack's emulation of the Lambda runtime around functions/cpu_worker
        # (``infra.local.lambda_container``), which the library does not ship.
        self._container_module = container_module
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
        self._closed = False
        self.cold_starts = 0
        self._cold_start_ms: deque[float] = deque(maxlen=COLD_STARTS_KEPT)  # measured starts
        # Containers are watched as pool workers are (``modelless.pools.health``): a dead or hung
        # one is killed and dropped, and the invocation it held fails over to another container.
        self._watch = ProcessWatch(self._children, self._judged, self._recovered, health or CONTAINER_HEALTH)
        self._watch.start("lambda-tier-health")

    def invoke(self, invocation: Invocation, timeout_s: float) -> Reply:
        # One deadline for the whole invocation: the wait for a container, a cold start, the run.
        deadline = time.monotonic() + timeout_s
        # Each memory size is its own function in AWS: containers serve one size only.
        container, cold = self._acquire(
            invocation.variant.memory_mb or self.memory_mb, deadline, invocation.variant_id
        )
        # The run goes on in a thread of its own, as a Lambda invocation runs to its end whether
        # or not its caller still waits: a container that is slow, not dead, is not killed for it
        # and serves the next invocation once this one is done.
        running = _Running()
        threading.Thread(
            target=self._run_in, args=(container, invocation, running), name="lambda-invoke", daemon=True
        ).start()
        if not running.done.wait(max(0.0, deadline - time.monotonic())):
            raise ServiceUnavailableError(
                f"Lambda tier: the invocation did not complete within {timeout_s:.3g} s "
                "(its container finishes it, then serves the next)"
            )
        if running.error is not None:
            raise WorkerUnreachableError(
                f"Lambda container did not answer: {running.error!r}"
            ) from running.error
        response = running.response
        assert response is not None  # done is set after a response or an error
        message = raise_for_worker_error(
            int(response.json().get("statusCode", response.status_code)), response.json()
        )
        # The container's own start is measured here, where it was waited for.
        init_ms = container.child.started_ms if cold else 0.0
        return dataclasses.replace(Reply.from_message(message), cold_start=cold, init_ms=init_ms)

    def _run_in(self, container: _Container, invocation: Invocation, running: _Running) -> None:
        try:
            running.response = self._client.post(
                f"{container.child.address}{INVOKE_PATH}",
                json=to_json_message(invocation.to_message()),  # a Lambda event is JSON: arrays as base64
                timeout=FUNCTION_TIMEOUT_S,
            )
        except Exception as error:  # httpx's, or the tier closed meanwhile: the caller hears it
            # Dead, or past the function's timeout (where Lambda ends a function too): not reused.
            running.error = error
            self._discard(container)
        finally:
            self._release(container, invocation.variant_id)
            running.done.set()

    def _acquire(self, memory_mb: int, deadline: float, variant_id: str = "") -> tuple[_Container, bool]:
        with self._cond:
            while True:
                self._reap_idle_locked()
                idle = [c for c in self._containers if not c.busy and c.memory_mb == memory_mb and c.usable()]
                if idle:
                    # One that holds the variant (no model load), then the warmest, like Lambda.
                    chosen = max(idle, key=lambda c: (variant_id in c.variants, c.last_used))
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
        # The start runs in a thread of its own, so that the invocation waits no longer than its
        # deadline; a container it stopped waiting for still joins the tier, idle, for the next.
        start = _ColdStart()
        threading.Thread(
            target=self._start_container, args=(name, memory_mb, start), name=f"start-{name}", daemon=True
        ).start()
        start.done.wait(max(0.0, deadline - time.monotonic()))
        with self._cond:
            if start.container is not None:
                return start.container, True
            if start.error is not None:
                raise start.error
            start.abandoned = True
        raise ServiceUnavailableError(
            f"Lambda tier: container {name} was still starting (a cold start) when the invocation's "
            "time ran out; it serves the next one"
        )

    def _start_container(self, name: str, memory_mb: int, start: _ColdStart) -> None:
        try:
            child = spawn(
                name,
                self._container_module,
                ["--repository", self._repository_url, "--cache-dir", str(self._cache_dir)],
                self._log_dir,
                env={
                    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb),
                    "OMP_NUM_THREADS": str(lambda_threads(memory_mb)),
                },
            )
            container = _Container(child, memory_mb, busy=True)
        except BaseException as error:
            with self._cond:
                self._starting -= 1
                start.error = error
                self._cond.notify()
            start.done.set()
            return
        with self._cond:
            # One step: between "no longer starting" and "running", nobody may count neither.
            self._starting -= 1
            closed = self._closed
            if not closed:
                container.busy = not start.abandoned  # abandoned: idle, for the next invocation
                self._containers.append(container)
                self.cold_starts += 1
                self._cold_start_ms.append(child.started_ms)
                if not start.abandoned:
                    start.container = container
                else:
                    container.last_used = time.monotonic()
            else:
                start.error = ServiceUnavailableError("Lambda tier closed while a container was starting")
            self._cond.notify()
        if closed:
            child.stop(timeout_s=1.0)
        start.done.set()

    def _release(self, container: _Container, variant_id: str) -> None:
        with self._cond:
            container.busy = False
            container.invocations += 1
            container.last_used = time.monotonic()
            if variant_id:
                container.variants.add(variant_id)
            self._cond.notify()

    def _discard(self, container: _Container) -> None:
        with self._cond:
            if container in self._containers:
                self._containers.remove(container)
        container.child.stop()

    def _children(self) -> dict[str, ChildProcess]:
        with self._cond:
            return {c.child.name: c.child for c in self._containers}

    def _judged(self, name: str, verdict: Verdict) -> None:
        with self._cond:
            container = next((c for c in self._containers if c.child.name == name), None)
            if container is None:
                return
            if verdict is Verdict.SUSPECT:
                container.suspect = True
                return
            self._containers.remove(container)
            self._cond.notify()
        # Killed, not stopped: a hung process would not act on SIGTERM. An invocation it held
        # sees its connection fail and the dispatcher tries another container.
        if container.child.alive():
            container.child.process.kill()
        container.child.wait_stopped(timeout_s=2.0)

    def _recovered(self, name: str) -> None:
        with self._cond:
            for container in self._containers:
                if container.child.name == name:
                    container.suspect = False

    def _reap_idle_locked(self) -> None:
        now = time.monotonic()
        for container in list(self._containers):
            if not container.busy and (
                now - container.last_used > self.idle_timeout_s or not container.child.alive()
            ):
                self._containers.remove(container)
                container.child.stop(timeout_s=1.0)

    def state(self) -> WorkerState:
        """The tier as selection sees it: a variant that some container holds is an instance,
        Active while one of those containers is idle, Overloaded while all of them are busy (a
        query now would start another container); its queue is its busy containers."""
        with self._cond:
            holders: dict[str, list[_Container]] = {}
            for container in self._containers:
                if not container.usable():
                    continue
                for variant_id in container.variants:
                    holders.setdefault(variant_id, []).append(container)
            busy = sum(1 for c in self._containers if c.busy)
            free = self.concurrency - len(self._containers) - self._starting
            instances = tuple(
                InstanceStats(
                    variant_id,
                    InstanceState.OVERLOADED if all(c.busy for c in held) else InstanceState.ACTIVE,
                    0.0,
                    0.0,
                    0.0,
                    sum(1 for c in held if c.busy),
                )
                for variant_id, held in sorted(holders.items())
            )
        return WorkerState(
            worker_id=LAMBDA_TIER_ID,
            pool="lambda-cpu",
            address="",
            utilisation=busy / self.concurrency,
            free_slots=max(0, free),
            reported_at=time.time(),
            instances=instances,
        )

    def tier_state(self) -> LambdaTierState:
        """Idle containers per memory size and the expected cold start, for selection."""
        with self._cond:
            idle: dict[int, int] = {}
            for container in self._containers:
                if not container.busy and container.usable():
                    idle[container.memory_mb] = idle.get(container.memory_mb, 0) + 1
            busy = len(self._containers) - sum(idle.values())
            full = busy + self._starting >= self.concurrency  # an idle one would give its place up
            measured = list(self._cold_start_ms)
        expected = sum(measured) / len(measured) if measured else UNMEASURED_COLD_START_MS
        return LambdaTierState(idle, self.memory_mb, expected, full)

    @property
    def size(self) -> int:
        return len(self._containers)

    def close(self) -> None:
        self._watch.close()
        with self._cond:
            self._closed = True
            containers, self._containers = self._containers, []
        for container in containers:
            container.child.stop(timeout_s=2.0)
        self._client.close()
