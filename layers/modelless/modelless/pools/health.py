"""Health of the local stack's child processes (pool workers, Lambda containers): who watches
them, and the pure rule that judges them.

A child is judged on three signals (``judge``, a pure function over explicit state, tested on a
fake clock):

- **process exit**: the process is gone (killed, crashed): replaced at once;
- **heartbeat**: a ``GET /health`` probe every ``period_s``; a child that has not answered one for
  ``suspect_after_s`` leaves selection (a stopped or wedged process accepts connections into its
  backlog but answers nothing) and is taken back as soon as it answers again; one silent for
  ``replace_after_s`` is killed and replaced. Two steps, because a child on a machine that is
  briefly overloaded can miss a probe or two: leaving selection costs little and is undone, a
  replacement loses the variants the child had loaded;
- **inference deadline**: the child answers, but a request of its own has been running for longer
  than ``inference_deadline_s`` (a run wedged inside the runtime): replaced.

``ProcessWatch`` runs the probes from one thread and reports each verdict that is not HEALTHY to
its owner, which takes the child out of selection and starts another.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from aws_lambda_powertools import Logger

from modelless.pools.processes import ChildProcess

# The embedded stack's own logger (the gateway process runs the pools): a child of its config.
logger = Logger(service="gateway", child=True)


@dataclass(frozen=True)
class HealthPolicy:
    period_s: float = 0.25  # one probe per child per period
    probe_timeout_s: float = 0.5
    # No answer for this long: out of selection (within the 2 s the issue of record asks for,
    # the probe's own timeout and a period included).
    suspect_after_s: float = 1.0
    replace_after_s: float = 4.0  # no answer for this long: killed and replaced
    # A request running this long is wedged: longer than any query may wait (the dispatcher's
    # 30 s cap) plus a variant load on a slow repository.
    inference_deadline_s: float = 60.0


class Verdict(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"  # out of selection until it answers again
    DEAD = "dead"  # the process exited
    HUNG = "hung"  # silent past replace_after_s, or a request past the inference deadline

    @property
    def final(self) -> bool:
        """The child is to be replaced: reported once, never judged again."""
        return self in (Verdict.DEAD, Verdict.HUNG)


@dataclass
class ProbeRecord:
    """What the watch knows of one child: when it last answered a probe (monotonic), and the age
    of its oldest request in flight then."""

    last_answer: float
    oldest_in_flight_s: float = 0.0


def judge(record: ProbeRecord, alive: bool, now: float, policy: HealthPolicy) -> Verdict:
    if not alive:
        return Verdict.DEAD
    if record.oldest_in_flight_s > policy.inference_deadline_s:
        return Verdict.HUNG
    silent_s = now - record.last_answer
    if silent_s >= policy.replace_after_s:
        return Verdict.HUNG
    if silent_s >= policy.suspect_after_s:
        return Verdict.SUSPECT
    return Verdict.HEALTHY


def probe(address: str, timeout_s: float) -> float | None:
    """``GET /health`` on a child: the age of its oldest request in flight, or None when it did
    not answer within ``timeout_s``. A connection per probe: the child may have been replaced on
    the same port, and a probe must never wait behind another's half-read reply."""
    host, _, port = address.removeprefix("http://").rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        body = json.loads(response.read() or b"{}")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
    if response.status != 200:
        return None
    return float(body.get("oldest_in_flight_s", 0.0))


@dataclass
class _Watched:
    child: ChildProcess
    record: ProbeRecord
    verdict: Verdict = Verdict.HEALTHY


@dataclass
class ProcessWatch:
    """Probes the children ``children()`` names, every ``policy.period_s``, and calls
    ``on_verdict(name, verdict)`` for each child judged other than HEALTHY (every period while it
    stays SUSPECT, so that its owner can keep it out of selection), and ``on_recovered(name)`` once
    when a SUSPECT child answers again. A DEAD or HUNG child is reported once; its owner replaces it
    (a new process under the same name is watched afresh)."""

    children: Callable[[], Mapping[str, ChildProcess]]
    on_verdict: Callable[[str, Verdict], None]
    on_recovered: Callable[[str], None] = lambda name: None
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    clock: Callable[[], float] = time.monotonic
    _watched: dict[str, _Watched] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _probes: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="health-probe")
    )

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def check(self) -> None:
        """One round: probe every child (in parallel: a silent one must not delay the others by
        its timeout), judge each, report the verdicts."""
        children = dict(self.children())
        now = self.clock()
        for name in set(self._watched) - set(children):
            del self._watched[name]  # stopped or replaced by its owner
        for name, child in children.items():
            watched = self._watched.get(name)
            if watched is None or watched.child is not child:
                self._watched[name] = _Watched(child, ProbeRecord(now))
        futures = {
            name: self._probes.submit(probe, w.child.address, self.policy.probe_timeout_s)
            for name, w in self._watched.items()
            if w.child.alive() and not w.verdict.final
        }
        for name, future in futures.items():
            oldest = future.result()
            if oldest is not None:
                record = self._watched[name].record
                record.last_answer = self.clock()
                record.oldest_in_flight_s = oldest
        now = self.clock()
        for name, watched in self._watched.items():
            if watched.verdict.final:
                continue  # reported once; its owner replaces it
            verdict = judge(watched.record, watched.child.alive(), now, self.policy)
            previous, watched.verdict = watched.verdict, verdict
            if verdict is Verdict.HEALTHY:
                if previous is Verdict.SUSPECT:
                    logger.info("child answers again", extra={"child": name})
                    self.on_recovered(name)
                continue
            if verdict is not previous:
                silent_s = round(now - watched.record.last_answer, 2)
                logger.warning(
                    "child unhealthy", extra={"child": name, "verdict": verdict.value, "silent_s": silent_s}
                )
            self.on_verdict(name, verdict)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = self.clock()
            try:
                self.check()
            except Exception:  # the watch must outlive any one round's failure
                logger.exception("health check round failed")
            self._stop.wait(max(0.0, self.policy.period_s - (self.clock() - started)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._probes.shutdown(wait=False, cancel_futures=True)
