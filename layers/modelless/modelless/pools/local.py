"""The local pool provider: a pool's workers are real ``infra.worker_server`` processes here."""

from __future__ import annotations

import threading
from pathlib import Path

from modelless.pools.catalog import PoolSpec
from modelless.pools.processes import ChildProcess, spawn


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
    ) -> None:
        self.pool = pool
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

    def scale_to(self, count: int) -> None:
        """Start or stop worker processes until ``count`` run."""
        with self._lock:
            while len(self._workers) < count:
                worker_id = f"{self.pool.name}-{self._next_index}"
                self._next_index += 1
                self._workers[worker_id] = spawn(
                    worker_id,
                    "infra.worker_server",
                    [
                        "--worker-id",
                        worker_id,
                        "--pool",
                        self.pool.name,
                        "--slots",
                        str(self._slots),
                        "--repository",
                        self._repository_url,
                        "--cache-dir",
                        str(self._cache_dir),
                        "--report-url",
                        self._report_url,
                        "--report-token",
                        self._report_token,
                    ],
                    self._log_dir,
                    # A worker gets the threads its instances are given, no more.
                    env={"OMP_NUM_THREADS": "1"},
                )
            while len(self._workers) > count:
                _, child = self._workers.popitem()
                child.stop()

    def kill(self, worker_id: str) -> None:
        """Kill one worker abruptly (fault tests)."""
        child = self._workers.pop(worker_id)
        child.process.kill()
        child.process.wait()

    def close(self) -> None:
        self.scale_to(0)
