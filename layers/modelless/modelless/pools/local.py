"""The local pool provider: a pool's workers are real ``modelless.worker`` processes here."""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_lambda_powertools import Logger

from modelless import worker
from modelless.catalog import PoolSpec
from modelless.pools.health import HealthPolicy, ProcessWatch, Verdict
from modelless.pools.processes import ChildProcess, spawn
from modelless.pools.provider import InstancePlacer
from modelless.types import VariantProfile
from modelless.worker import WorkerLaunch

# The embedded stack's own logger (the gateway process runs the pools): a child of its config.
logger = Logger(service="gateway", child=True)

# Called with a worker's id when it must leave selection now: it died, hung, or stopped
# answering (every health period while it stays silent). The embedded stack removes its report
# from the metadata store and has its dispatcher hold it out.
UnhealthyHook = Callable[[str], None]


@dataclass(frozen=True)
class Replacement:
    """One worker the pool replaced: what was wrong, when it was found, and its successor."""

    worker_id: str
    verdict: Verdict
    detected_at: float  # monotonic
    successor: str | None = None
    ready_at: float | None = None  # monotonic: the successor said READY


class LocalWorkerPool:
    def __init__(
        self,
        pool: PoolSpec,
        repository_url: str,
        report_url: str,
        report_token: str,
        log_dir: Path,
        cache_dir: Path,
        slots_per_worker: int = 2,
        worker_args: Sequence[str] = (),
        health: HealthPolicy | None = None,
    ) -> None:
        self.pool = pool
        # More flags for the workers started from now on (e.g. ``--no-batching``).
        self.worker_args = tuple(worker_args)
        self._repository_url = repository_url
        self._report_url = report_url
        self._report_token = report_token
        self._log_dir = log_dir
        self._cache_dir = cache_dir
        self._slots = slots_per_worker
        self._workers: dict[str, ChildProcess] = {}
        self._target = 0  # the size last asked for: what replacements restore
        self._next_index = 0
        self._lock = threading.Lock()  # one scaling operation at a time
        self._members = threading.Lock()  # guards _workers: held briefly, never across a spawn
        self._health = health or HealthPolicy()
        self._watch: ProcessWatch | None = None
        self._on_unhealthy: UnhealthyHook = lambda worker_id: None
        self._replacing = threading.Lock()
        self.replacements: list[Replacement] = []

    @property
    def size(self) -> int:
        return len(self._workers)

    def workers(self) -> dict[str, ChildProcess]:
        with self._members:
            return dict(self._workers)

    def scale_to(self, count: int, stopping: Callable[[str], None] = lambda worker_id: None) -> list[str]:
        """Start or stop worker processes until ``count`` run; returns the ids of those stopped.

        A worker is stopped gracefully: it is sent SIGTERM (it stops reporting, finishes the
        queries in flight, then exits), ``stopping`` is told its id at once (to take it out of
        selection), and it is waited for.
        """
        stopped: list[str] = []
        with self._lock:
            self._target = count
            while self.size < count:
                # The boot nonce: a process of an earlier stack (or one this pool gave up on)
                # can never report under the id of one started now.
                worker_id = f"{self.pool.name}-{self._next_index}-{secrets.token_hex(3)}"
                self._next_index += 1
                launch = WorkerLaunch(
                    worker_id,
                    self.pool.name,
                    self._slots,
                    self._repository_url,
                    self._cache_dir,
                    self._report_url,
                    self._report_token,
                    tuple(self.worker_args),
                )
                child = spawn(
                    worker_id,
                    worker.MODULE,
                    launch.argv(),
                    self._log_dir,
                    # A worker gets the threads its instances are given, no more.
                    env={"OMP_NUM_THREADS": "1", **launch.env()},
                )
                with self._members:
                    self._workers[worker_id] = child
            leaving: list[tuple[str, ChildProcess]] = []
            with self._members:
                while len(self._workers) > count:
                    leaving.append(self._workers.popitem())  # the newest first
            for worker_id, child in leaving:
                child.terminate()
                stopping(worker_id)
            for worker_id, child in leaving:
                child.wait_stopped()
                stopping(worker_id)  # again: a report sent just before SIGTERM may have landed since
                stopped.append(worker_id)
        return stopped

    def supervise(self, on_unhealthy: UnhealthyHook) -> None:
        """Watch the workers (``modelless.pools.health``): one that stops answering leaves
        selection (``on_unhealthy``) within ``suspect_after_s``; a dead or hung one is killed and
        replaced by a new process, so the pool keeps the size last asked for."""
        self._on_unhealthy = on_unhealthy
        self._watch = ProcessWatch(self.workers, self._judged, policy=self._health)
        self._watch.start(f"{self.pool.name}-pool-health")

    def _judged(self, worker_id: str, verdict: Verdict) -> None:
        self._leave_selection(worker_id)
        if verdict is Verdict.SUSPECT:
            return
        with self._members:
            child = self._workers.pop(worker_id, None)
        if child is None:
            return  # stopped by a scale-down meanwhile
        if child.alive():
            child.process.kill()  # hung: it gets no graceful stop, it would not act on one
        child.wait_stopped(timeout_s=2.0)
        self._leave_selection(worker_id)  # a report it sent before it was killed may have landed
        record = Replacement(worker_id, verdict, time.monotonic())
        self.replacements.append(record)
        threading.Thread(target=self._replace, args=(record,), name="replace-worker", daemon=True).start()

    def _replace(self, record: Replacement) -> None:
        """Restore the pool's size (one replacement at a time; a failed start is retried on the
        next verdict or scale-up)."""
        with self._replacing:
            before = set(self.workers())
            try:
                self.scale_to(self._target)
            except Exception:
                logger.exception(
                    "could not start a replacement worker", extra={"worker_id": record.worker_id}
                )
                return
            started = sorted(set(self.workers()) - before)
            index = self.replacements.index(record)
            self.replacements[index] = dataclasses.replace(
                record, successor=started[0] if started else None, ready_at=time.monotonic()
            )
            logger.info(
                "worker replaced",
                extra={"worker_id": record.worker_id, "verdict": record.verdict.value, "successor": started},
            )

    def _leave_selection(self, worker_id: str) -> None:
        try:
            self._on_unhealthy(worker_id)
        except Exception:  # e.g. the metadata store is unreachable: its report goes stale anyway
            logger.exception("could not take a worker out of selection", extra={"worker_id": worker_id})

    def kill(self, worker_id: str) -> None:
        """Kill one worker abruptly (fault tests)."""
        with self._members:
            child = self._workers.pop(worker_id)
        child.process.kill()
        child.process.wait()

    def close(self, stopping: Callable[[str], None] = lambda worker_id: None) -> None:
        """Stop every worker, as ``scale_to(0, stopping)`` does."""
        if self._watch is not None:
            self._watch.close()
        self.scale_to(0, stopping)


class LocalPoolProvider:
    """The pool provider of the embedded stack: each managed pool is a ``LocalWorkerPool``.

    ``forget`` is told the id of every worker being stopped (the stack removes its state from the
    metadata store at once, so that selection stops routing to it while it drains).
    """

    def __init__(
        self, pools: Mapping[str, LocalWorkerPool], forget: Callable[[str], None], timeout_s: float = 30.0
    ) -> None:
        self._pools = dict(pools)
        self._forget = forget
        self._placer = InstancePlacer(timeout_s)
        self.assignments: dict[str, dict[str, int]] = {}
        self.shortfall: dict[str, dict[str, int]] = {}  # pool -> variant -> instances not placed
        self._healed: dict[str, int] = {}  # pool -> replacements already returned by ``heal``

    def size(self, pool: str) -> int:
        local = self._pools.get(pool)
        return local.size if local is not None else 0

    def scale(self, pool: str, workers: int) -> int:
        local = self._pools.get(pool)
        if local is None:
            return 0
        local.scale_to(workers, stopping=self._forget)
        return local.size

    def heal(self, pool: str) -> list[str]:
        """The workers the pool's own watch replaced since the last call (it heals as soon as it
        finds one, not on the scaler's tick)."""
        local = self._pools.get(pool)
        if local is None:
            return []
        seen = self._healed.get(pool, 0)
        replaced = local.replacements[seen:]
        self._healed[pool] = seen + len(replaced)
        return [record.worker_id for record in replaced]

    def assign(self, pool: str, instances: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        """Make the pool's workers hold the plan's instances (``InstancePlacer.place``, the code the
        AWS provider applies a plan with too)."""
        self.assignments[pool] = dict(instances)
        local = self._pools.get(pool)
        if local is None:
            return
        addresses = {worker_id: child.address for worker_id, child in local.workers().items()}
        self.shortfall[pool] = self._placer.place(addresses, instances, profiles)

    def close(self) -> None:
        self._placer.close()
