"""The tuner as a worker runs it: windows of live traffic on one variant instance, fed to a
policy, and the configuration to switch to when the policy wants another.

Pure over an explicit clock (``now``: any monotonic clock, seconds): the worker records each
query and each batch run with the configuration it ran on and calls ``tick`` every so often;
tests drive it with a fake clock and a synthetic latency function. Thread-safe: request threads
record while the tuning thread ticks.

A window ends once ``window_s`` has passed and at least ``min_queries`` queries ran on the
current configuration; a quieter window is kept open (a handful of queries says little about a
tail), and one that stays open for ``IDLE_WINDOWS`` windows is discarded (the instance is idle:
nothing to tune). Queries and runs on any other configuration (those in flight across a switch)
are left out of its observation. The load level is the window's arrival rate (``record_arrival``,
whatever configuration serves them): completions would read an overloaded configuration's own
slowness as a lighter load, and move the search to another level.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelless.tuning.base import Observation, ParallelConfig, TunerPolicy, load_level, observe_window, score

DEFAULT_WINDOW_S = 3.0
DEFAULT_MIN_QUERIES = 30
IDLE_WINDOWS = 5
HISTORY = 32  # the last observations kept for the stats


@dataclass(frozen=True)
class Trial:
    """One finished window: what ran, at what load, what it measured."""

    config: ParallelConfig
    level: int
    qps: float
    observation: Observation

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "level": self.level,
            "qps": round(self.qps, 2),
            "queries": self.observation.queries,
            "violation_rate": round(self.observation.violation_rate, 4),
            "p99_ms": round(self.observation.p99_ms, 3),
            "cpu_ms_per_query": round(self.observation.cpu_ms_per_query, 3),
            "score": round(score(self.observation), 5),
        }


@dataclass
class _Window:
    started: float
    latencies_ms: list[float] = field(default_factory=list)
    budgets_ms: list[float] = field(default_factory=list)
    run_ms: float = 0.0
    slowdowns: list[float] = field(default_factory=list)  # run time over the profile's, per run
    arrivals: int = 0  # queries that arrived, on any configuration


class LiveTuner:
    """One variant instance's tuner (see the module docstring)."""

    def __init__(
        self,
        policy: TunerPolicy,
        current: ParallelConfig,
        now: float,
        *,
        expected_ms: Callable[[int], float] | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        min_queries: int = DEFAULT_MIN_QUERIES,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        self.policy = policy
        self.current = current
        self.window_s = window_s
        self.min_queries = max(1, min_queries)
        self._expected_ms = expected_ms
        self._window = _Window(now)
        self._level: int | None = None
        self._lock = threading.Lock()
        self.history: list[Trial] = []
        self.switches = 0
        # Measured run time under the current configuration over the profile's (median of the last
        # window's runs): what the scaler's profile of the instance is scaled by. 0: not measured.
        self.latency_scale = 0.0
        self._scales: dict[ParallelConfig, float] = {}

    def record_arrival(self) -> None:
        with self._lock:
            self._window.arrivals += 1

    def record_query(self, config: ParallelConfig, latency_ms: float, budget_ms: float) -> None:
        with self._lock:
            if config == self.current:
                self._window.latencies_ms.append(latency_ms)
                self._window.budgets_ms.append(budget_ms)

    def record_run(self, config: ParallelConfig, rows: int, run_ms: float) -> None:
        with self._lock:
            if config != self.current:
                return
            self._window.run_ms += run_ms
            if self._expected_ms is not None:
                expected = self._expected_ms(rows)
                if expected > 0:
                    self._window.slowdowns.append(run_ms / expected)

    def tick(self, now: float) -> ParallelConfig | None:
        """End the window if it is due; returns the configuration to switch to, if another."""
        with self._lock:
            window = self._window
            elapsed = now - window.started
            if elapsed < self.window_s:
                return None
            queries = len(window.latencies_ms)
            if queries < self.min_queries:
                if elapsed >= IDLE_WINDOWS * self.window_s:
                    self._window = _Window(now)  # idle: start afresh
                return None
            qps = window.arrivals / elapsed
            self._level = load_level(qps, self._level)
            observation = observe_window(window.latencies_ms, window.budgets_ms, window.run_ms, self.current)
            if window.slowdowns:
                self._scales[self.current] = statistics.median(window.slowdowns)
            self.latency_scale = self._scales.get(self.current, 0.0)
            self.history = [*self.history, Trial(self.current, self._level, qps, observation)][-HISTORY:]
            self.policy.observe(self._level, self.current, observation)
            proposed = self.policy.propose(self._level)
            self._window = _Window(now)
            if proposed == self.current:
                return None
            return proposed

    def switched(self, config: ParallelConfig, now: float) -> None:
        """The instance runs ``config`` from now on (the worker applied a proposal, or was told)."""
        with self._lock:
            if config != self.current:
                self.switches += 1
            self.current = config
            self.latency_scale = self._scales.get(config, 0.0)
            self._window = _Window(now)

    @property
    def level(self) -> int | None:
        return self._level

    def report(self) -> dict[str, Any]:
        with self._lock:
            level = self._level
            best = None if level is None else self.policy.best(level)
            return {
                "policy": self.policy.name,
                "config": self.current.to_dict(),
                "level": level,
                "trials": 0 if level is None else self.policy.trials(level),
                "converged": False if level is None else self.policy.converged(level),
                "best": None if best is None else best.to_dict(),
                "switches": self.switches,
                "latency_scale": round(self.latency_scale, 4),
                "history": [trial.to_json() for trial in self.history],
            }
