"""A small HTTP/1.1 load generator for the serving benchmark (stdlib only, asyncio, keep-alive).

It runs in a process of its own, so that its CPU time is not taken from the server it measures
under one GIL, and it is the one client every system is measured with (the project's gateway,
Ray Serve): the same request bytes, the same connections, the same clock.

    python -m bench.loadgen      # reads one JSON job per line on stdin, answers one JSON line each

A job: ``{"url": "http://127.0.0.1:8080/v1/online_query", "headers": {...}, "body": "<json text>",
"mode": "closed" | "open", "concurrency": 8, "rate": 500.0, "duration_s": 3.0, "warmup_s": 0.5,
"max_requests": 20000, "max_connections": 256, "timeout_s": 10.0, "keep": ["timingsMs", "tier"]}``.
A binary body (an ``.npy`` query) comes as ``"body_b64"`` (base64 of the bytes) with its
``"content_type"`` (``application/x-npy``); a text ``body`` is sent as ``application/json`` unless
``content_type`` says otherwise.

- ``closed``: ``concurrency`` callers, each on its own connection, send the next request as soon
  as the previous reply arrived.
- ``open``: requests arrive at ``rate`` per second (Poisson, seeded) whatever the replies do; each
  is sent on an idle connection, or a new one up to ``max_connections`` (then it waits for one).
  Its latency runs from its scheduled arrival, so a server that falls behind is charged for the
  wait (no coordinated omission).

Every load is bounded in time (``duration_s``, then at most ``timeout_s`` for the replies still
outstanding) and in count (``max_requests``). Requests that arrive during ``warmup_s`` are sent
but not counted. The answer: per counted request its latency (ms), HTTP status (0: no reply, or
a timeout) and the reply's top-level ``keep`` fields, plus the measured window in seconds.
Traffic goes only where ``url`` says; the benchmark only ever gives it 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Job:
    host: str
    port: int
    request: bytes
    mode: str
    concurrency: int
    rate: float
    duration_s: float
    warmup_s: float
    max_requests: int
    max_connections: int
    timeout_s: float
    keep: tuple[str, ...]
    seed: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Job:
        url = urlsplit(str(raw["url"]))
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"only plain http URLs: {raw['url']!r}")
        if "body_b64" in raw:
            body = base64.b64decode(str(raw["body_b64"]), validate=True)
        else:
            body = str(raw.get("body", "")).encode()
        host = url.hostname
        port = url.port or 80
        path = url.path + (f"?{url.query}" if url.query else "")
        content_type = str(raw.get("content_type") or "application/json")
        headers = {"Host": f"{host}:{port}", "Content-Type": content_type, **raw.get("headers", {})}
        head = f"POST {path or '/'} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"Content-Length: {len(body)}\r\n\r\n"
        mode = str(raw.get("mode", "closed"))
        if mode not in ("closed", "open"):
            raise ValueError(f"mode must be closed or open, not {mode!r}")
        return cls(
            host=host,
            port=port,
            request=head.encode() + body,
            mode=mode,
            concurrency=max(1, int(raw.get("concurrency", 1))),
            rate=float(raw.get("rate", 0.0)),
            duration_s=float(raw.get("duration_s", 3.0)),
            warmup_s=float(raw.get("warmup_s", 0.5)),
            max_requests=int(raw.get("max_requests", 50_000)),
            max_connections=int(raw.get("max_connections", 256)),
            timeout_s=float(raw.get("timeout_s", 10.0)),
            keep=tuple(raw.get("keep", ())),
            seed=int(raw.get("seed", 1)),
        )


# An idle kept-alive connection is not reused past this: servers close theirs after a few idle
# seconds (uvicorn: 5 s), and a request written as the server closes gets no reply, a failure of
# the client's making (HTTP clients retry it; this one would count it). Open loop only: a
# closed-loop caller's connection is never idle.
IDLE_REUSE_S = 4.0


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used_at = time.perf_counter()  # when its last exchange ended (or it opened)

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one request, read its reply: status, body, and whether the connection stays open."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            body = b"".join(p[:-2] for p in parts)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        self.used_at = time.perf_counter()
        return status, body, headers.get("connection", "").lower() != "close"

    def close(self) -> None:
        self.writer.close()


@dataclass
class Record:
    arrived: float  # when the request was due (open loop) or sent (closed loop)
    latency_ms: float
    status: int
    body: bytes


@dataclass
class Recorder:
    job: Job
    started: float
    records: list[Record] = field(default_factory=list)
    sent: int = 0

    @property
    def measuring_from(self) -> float:
        return self.started + self.job.warmup_s

    @property
    def ends(self) -> float:
        return self.started + self.job.warmup_s + self.job.duration_s

    def add(self, arrived: float, status: int, body: bytes) -> None:
        if arrived >= self.measuring_from:
            self.records.append(Record(arrived, (time.perf_counter() - arrived) * 1000, status, body))


async def _one(
    job: Job, recorder: Recorder, arrived: float, connection: Connection | None
) -> Connection | None:
    """One request on ``connection`` (a new one if None); the connection, if still usable."""
    try:
        if connection is None:
            connection = await Connection.open(job.host, job.port)
        status, body, reusable = await asyncio.wait_for(connection.exchange(job.request), job.timeout_s)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
        recorder.add(arrived, 0, b"")
        if connection is not None:
            connection.close()
        return None
    recorder.add(arrived, status, body)
    if not reusable:
        connection.close()
        return None
    return connection


async def run_closed(job: Job) -> Recorder:
    connections = [await Connection.open(job.host, job.port) for _ in range(job.concurrency)]
    recorder = Recorder(job, time.perf_counter())

    async def caller(connection: Connection | None) -> None:
        while recorder.sent < job.max_requests:
            now = time.perf_counter()
            if now >= recorder.ends:
                break
            recorder.sent += 1
            connection = await _one(job, recorder, now, connection)
        if connection is not None:
            connection.close()

    await asyncio.gather(*(caller(c) for c in connections))
    return recorder


def take_idle(idle: list[Connection], now: float) -> Connection | None:
    """The most recently used idle connection, unless it has idled past ``IDLE_REUSE_S`` (then
    it and every older one are closed: None, and the caller opens a new one)."""
    if not idle:
        return None
    connection = idle.pop()
    if now - connection.used_at <= IDLE_REUSE_S:
        return connection
    for stale in (connection, *idle):  # the list is in order of use: the rest are older still
        stale.close()
    idle.clear()
    return None


async def run_open(job: Job) -> Recorder:
    rng = random.Random(job.seed)
    idle: list[Connection] = [
        await Connection.open(job.host, job.port) for _ in range(min(job.max_connections, 32))
    ]
    slots = asyncio.Semaphore(job.max_connections)
    recorder = Recorder(job, time.perf_counter())
    tasks: set[asyncio.Task[None]] = set()

    async def request(arrived: float) -> None:
        async with slots:
            connection = take_idle(idle, time.perf_counter())
            kept = await _one(job, recorder, arrived, connection)
            if kept is not None:
                idle.append(kept)

    due = recorder.started
    while recorder.sent < job.max_requests:
        due += rng.expovariate(job.rate)
        if due >= recorder.ends:
            break
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        recorder.sent += 1
        task = asyncio.create_task(request(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        # Replies still outstanding get at most timeout_s; whatever is left then counts as lost.
        _, pending = await asyncio.wait(set(tasks), timeout=job.timeout_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for connection in idle:
        connection.close()
    return recorder


def summarise(job: Job, recorder: Recorder) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for record in recorder.records:
        kept: dict[str, Any] = {}
        if job.keep and record.status == 200:
            try:
                reply = json.loads(record.body)
                kept = {k: reply.get(k) for k in job.keep}
            except ValueError:
                kept = {}
        results.append({"latency_ms": round(record.latency_ms, 4), "status": record.status, "fields": kept})
    # Open loop: requests arriving within the window; closed loop: the same, by send time.
    return {"window_s": job.duration_s, "results": results, "sent": recorder.sent}


async def run(job: Job) -> dict[str, Any]:
    recorder = await (run_closed(job) if job.mode == "closed" else run_open(job))
    return summarise(job, recorder)


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = asyncio.run(run(Job.parse(json.loads(line))))
        except Exception as error:  # the parent hears it and decides; this process goes on
            answer = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
