"""The local pool provider: a pool's workers are real ``modelless.worker`` processes here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from modelless import worker
from modelless.pools.catalog import PoolSpec
from modelless.pools.processes import ChildProcess, spawn
from modelless.pools.provider import InstancePlacer
from modelless.types import VariantProfile
from modelless.worker import WorkerLaunch


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
        self._next_index = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self._workers)

    def workers(self) -> dict[str, ChildProcess]:
        return dict(self._workers)

    def scale_to(self, count: int, stopping: Callable[[str], None] = lambda worker_id: None) -> list[str]:
        """Start or stop worker processes until ``count`` run; returns the ids of those stopped.

        A worker is stopped gracefully: it is sent SIGTERM (it stops reporting, finishes the
        queries in flight, then exits), ``stopping`` is told its id at once (to take it out of
        selection), and it is waited for.
        """
        stopped: list[str] = []
        with self._lock:
            while len(self._workers) < count:
                worker_id = f"{self.pool.name}-{self._next_index}"
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
                self._workers[worker_id] = spawn(
                    worker_id,
                    worker.MODULE,
                    launch.argv(),
                    self._log_dir,
                    # A worker gets the threads its instances are given, no more.
                    env={"OMP_NUM_THREADS": "1"},
                )
            leaving: list[tuple[str, ChildProcess]] = []
            while len(self._workers) > count:
                worker_id, child = self._workers.popitem()  # the newest first
                child.terminate()
                stopping(worker_id)
                leaving.append((worker_id, child))
            for worker_id, child in leaving:
                child.wait_stopped()
                stopping(worker_id)  # again: a report sent just before SIGTERM may have landed since
                stopped.append(worker_id)
        return stopped

    def kill(self, worker_id: str) -> None:
        """Kill one worker abruptly (fault tests)."""
        child = self._workers.pop(worker_id)
        child.process.kill()
        child.process.wait()

    def close(self) -> None:
        self.scale_to(0)


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

    def size(self, pool: str) -> int:
        local = self._pools.get(pool)
        return local.size if local is not None else 0

    def scale(self, pool: str, workers: int) -> int:
        local = self._pools.get(pool)
        if local is None:
            return 0
        local.scale_to(workers, stopping=self._forget)
        return local.size

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
