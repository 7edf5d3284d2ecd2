"""Where a worker's monitoring loop sends its state: straight into Redis, or, for the embedded
stack's in-memory store, to the gateway that owns it."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from modelless.types import WorkerState

StateSink = Callable[[WorkerState], None]

INTERNAL_STATE_PATH = "/internal/worker-state"


def make_state_sink(url: str, token: str = "") -> StateSink:
    if url.startswith(("http://", "https://")):
        client = httpx.Client(base_url=url, timeout=2.0, headers={"Authorization": f"Bearer {token}"})

        def post(state: WorkerState) -> None:
            client.post(INTERNAL_STATE_PATH, content=state.to_json()).raise_for_status()

        return post

    from modelless.metadata import open_metadata_store

    store = open_metadata_store(url)
    return store.put_worker_state
