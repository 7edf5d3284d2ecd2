"""Where a worker's monitoring loop sends its state: straight into Redis, or, for the embedded
stack's in-memory store, to the gateway that owns it."""

from __future__ import annotations

from typing import Protocol

import httpx

from modelless.types import WorkerState

INTERNAL_STATE_PATH = "/internal/worker-state"


class StateSink(Protocol):
    """Where a worker's reports go: ``report`` its state, every period; ``withdraw`` it once, as
    the worker stops, so that no record of a stopped worker stays for the scaler, the offline
    throttle or another gateway to count (until it went stale, WORKER_STALE_AFTER_S)."""

    def report(self, state: WorkerState) -> None: ...

    def withdraw(self, worker_id: str) -> None: ...


class GatewaySink:
    """Reports to the gateway that owns the embedded stack's in-memory store."""

    def __init__(self, url: str, token: str) -> None:
        self._client = httpx.Client(base_url=url, timeout=2.0, headers={"Authorization": f"Bearer {token}"})

    def report(self, state: WorkerState) -> None:
        self._client.post(INTERNAL_STATE_PATH, content=state.to_json()).raise_for_status()

    def withdraw(self, worker_id: str) -> None:
        self._client.delete(f"{INTERNAL_STATE_PATH}/{worker_id}").raise_for_status()


class StoreSink:
    """Reports straight into the metadata store (Redis)."""

    def __init__(self, url: str) -> None:
        from modelless.metadata import open_metadata_store

        self._store = open_metadata_store(url)

    def report(self, state: WorkerState) -> None:
        self._store.put_worker_state(state)

    def withdraw(self, worker_id: str) -> None:
        self._store.remove_worker(worker_id)


def make_state_sink(url: str, token: str = "") -> StateSink:
    if url.startswith(("http://", "https://")):
        return GatewaySink(url, token)
    return StoreSink(url)
