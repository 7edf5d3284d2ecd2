"""The embedded stack under bounded load, for the fault tests: a real gateway (uvicorn in a
thread of the test), real worker processes and real Lambda containers on 127.0.0.1, serving a
small model published straight into the stack's store (profiling is not what these tests are
about), and closed-loop callers that keep every reply with its timing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from infra.local.ports import free_port
from infra.local.stack import LocalStack, ThreadedGateway, start_stack
from modelless.dispatch.attempts import DEADLINE_GRACE_S
from modelless.metadata.base import MetadataStore
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import npy_bytes
from tests.functional.workers_kit import APP, ARTIFACT_KEY, make_variant, publish_linear_model, sample_inputs
from tests.models import linear_model

# Load is bounded in count and in time, whatever happens.
MAX_QUERIES_PER_CALLER = 2000
LOAD_LIMIT_S = 120.0
# The latency target the load asks for: generous for a linear model, so that a reply's lateness
# comes from the fault, not from a busy machine.
BUDGET_MS = 500.0
# What a client may add to the server's deadline: its own HTTP round trip on a loaded machine.
CLIENT_SLACK_S = 1.0
REPLY_BOUND_S = BUDGET_MS / 1000 + DEADLINE_GRACE_S + CLIENT_SLACK_S



@dataclass
class Served:
    stack: LocalStack
    gateway: ThreadedGateway
    api_key: str

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def store(self) -> MetadataStore:
        return self.stack.services.store


@contextmanager
def served_stack(
    state_dir: Path, workers: int, lambda_concurrency: int = 2, metadata: str = "memory://"
) -> Iterator[Served]:
    """The embedded stack with the in-memory store (workers report to the gateway over HTTP,
    with the token they get through their environment) or the ``metadata`` store given (a
    ``redis://`` one: workers report into it), the linear model published for the cpu pool, and
    an app key; everything stopped afterwards."""
    port = free_port()
    stack = start_stack(state_dir, "127.0.0.1", port, workers, lambda_concurrency, metadata)
    gateway = ThreadedGateway(stack, port)
    try:
        admin = gateway.admin()
        api_key = admin.create_app(APP)
        LocalModelRepository(Path(stack.services.settings.repository_url)).put(ARTIFACT_KEY, linear_model())
        publish_linear_model(stack.services.store, make_variant(pool="cpu"))
        yield Served(stack, gateway, api_key)
    finally:
        gateway.close()


@dataclass(frozen=True)
class Reply:
    sent_at: float  # monotonic
    elapsed_s: float
    status: int  # 0: no HTTP answer at all (the connection failed or timed out)
    code: str = ""
    tier: str = ""
    worker: str = ""
    retry_after: str | None = None
    json_body: bool = True


@dataclass
class QueryLoad:
    """Closed-loop callers sending binary queries with a latency and an accuracy target."""

    url: str
    api_key: str
    callers: int = 3
    pause_s: float = 0.01
    replies: list[Reply] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> QueryLoad:
        body = npy_bytes(np.ascontiguousarray(sample_inputs(1)))
        for _ in range(self.callers):
            thread = threading.Thread(target=self._run, args=(body,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, body: bytes) -> None:
        params: dict[str, str | float] = {"appID": APP, "latency": BUDGET_MS, "accuracy": 0.5}
        headers = {"X-Api-Key": self.api_key, "Content-Type": "application/x-npy"}
        ends = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(base_url=self.url, timeout=REPLY_BOUND_S + 30) as client:
            for _ in range(MAX_QUERIES_PER_CALLER):
                if self._stop.is_set() or time.monotonic() > ends:
                    return
                sent = time.monotonic()
                try:
                    response = client.post("/v1/online_query", content=body, params=params, headers=headers)
                except httpx.HTTPError:
                    self._keep(Reply(sent, time.monotonic() - sent, 0, json_body=False))
                    continue
                elapsed = time.monotonic() - sent
                try:
                    reply = response.json()
                    is_json = isinstance(reply, dict)
                except ValueError:
                    reply, is_json = {}, False
                error = reply.get("error", {}) if is_json else {}
                self._keep(
                    Reply(
                        sent,
                        elapsed,
                        response.status_code,
                        str(error.get("code", "")),
                        str(reply.get("tier", "")) if is_json else "",
                        str(reply.get("worker") or "") if is_json else "",
                        response.headers.get("Retry-After"),
                        is_json,
                    )
                )
                self._stop.wait(self.pause_s)

    def _keep(self, reply: Reply) -> None:
        with self._lock:
            self.replies.append(reply)

    def count(self) -> int:
        with self._lock:
            return len(self.replies)

    def since(self, moment: float) -> list[Reply]:
        """The replies that came after ``moment`` (monotonic), queries in flight then included."""
        with self._lock:
            return [r for r in self.replies if r.sent_at + r.elapsed_s >= moment]

    def stop(self) -> list[Reply]:
        self._stop.set()
        for thread in self._threads:
            thread.join(REPLY_BOUND_S + 35)
        assert not any(t.is_alive() for t in self._threads), "a caller hung"
        with self._lock:
            return list(self.replies)


def summary(replies: list[Reply]) -> dict[str, object]:
    statuses: dict[int, int] = {}
    for reply in replies:
        statuses[reply.status] = statuses.get(reply.status, 0) + 1
    return {
        "queries": len(replies),
        "statuses": statuses,
        "worst_s": round(max((r.elapsed_s for r in replies), default=0.0), 3),
        "tiers": sorted({r.tier for r in replies if r.tier}),
    }
