"""What the parallelism tuner works on (RRL, Qin et al. SC '19): a variant instance's
configuration, what one observation window of live traffic measured under it, the objective, and
the small Protocol every tuning policy implements.

Pure: no clock, no threads, no onnxruntime. The worker feeds observations in and applies what a
policy proposes (``modelless.tuning.live``); the policies are tested tick by tick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

# The objective is "fewest SLO violations, then least CPU": a query's violation counts fully, and
# CPU only as a tie-breaker between configurations whose violation rates are within a few percent
# of each other (its term is at most COST_WEIGHT).
COST_WEIGHT = 0.05


@dataclass(frozen=True, order=True)
class ParallelConfig:
    """How one variant instance runs: RRL's (request, inter-op, intra-op) parallelism.

    - ``intra``: onnxruntime's intra-op threads (one operator's work split across cores);
    - ``inter``: inter-op threads; above 1 the session runs independent operators in parallel
      (onnxruntime's parallel execution mode), at 1 sequentially;
    - ``concurrency``: batches of the instance that may run at once (the batcher's dispatch
      threads over one thread-safe session): RRL's request-level parallelism.
    """

    intra: int = 1
    inter: int = 1
    concurrency: int = 1

    def __post_init__(self) -> None:
        for name in ("intra", "inter", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")

    @property
    def threads(self) -> int:
        """CPU threads the configuration may keep busy at once: its cost per unit of run time."""
        return self.intra * self.inter * self.concurrency

    def coordinates(self) -> tuple[float, float, float]:
        """Where it sits in the space the regions are drawn in: log2 of each knob, so that one
        doubling is one step whatever the knob (RRL's Euclidean distance between configurations)."""
        return (math.log2(self.intra), math.log2(self.inter), math.log2(self.concurrency))

    def label(self) -> str:
        return f"intra={self.intra},inter={self.inter},conc={self.concurrency}"

    def to_dict(self) -> dict[str, int]:
        return {"intra": self.intra, "inter": self.inter, "concurrency": self.concurrency}

    @classmethod
    def from_dict(cls, raw: object) -> ParallelConfig:
        if not isinstance(raw, dict):
            raise ValueError(f"a configuration is an object with intra, inter and concurrency, not {raw!r}")
        unknown = set(raw) - {"intra", "inter", "concurrency"}
        if unknown:
            raise ValueError(f"unknown configuration fields: {', '.join(sorted(map(str, unknown)))}")
        return cls(
            intra=raw.get("intra", 1),
            inter=raw.get("inter", 1),
            concurrency=raw.get("concurrency", 1),
        )


def distance(a: ParallelConfig, b: ParallelConfig) -> float:
    return math.dist(a.coordinates(), b.coordinates())


def _doublings(limit: int) -> list[int]:
    values, value = [], 1
    while value <= limit:
        values.append(value)
        value *= 2
    if values[-1] != limit:
        values.append(limit)  # the host's own count is always a choice (e.g. 6 cores: 1, 2, 4, 6)
    return values


def config_space(cores: int, max_concurrency: int | None = None) -> list[ParallelConfig]:
    """The configurations worth trying on a host of ``cores``: intra-op threads and concurrent
    batches by doublings up to the cores, inter-op 1 (sequential) or 2 (parallel), and no
    configuration that keeps more threads busy than twice the cores (it would only time-slice)."""
    cores = max(1, cores)
    concurrency = _doublings(max_concurrency if max_concurrency is not None else cores)
    inter = [1, 2] if cores >= 2 else [1]
    return sorted(
        ParallelConfig(i, e, c)
        for i in _doublings(cores)
        for e in inter
        for c in concurrency
        if i * e * c <= 2 * cores
    )


@dataclass(frozen=True)
class Observation:
    """One window of live traffic on one configuration."""

    queries: int
    violations: int  # queries answered after their deadline (their budget on the worker)
    p99_ms: float  # of the queries' latency on the worker (queue + run)
    cpu_ms_per_query: float  # run time x the configuration's threads, per query
    budget_ms: float  # the median budget of the window's queries: what cost is measured against

    @property
    def violation_rate(self) -> float:
        return self.violations / self.queries if self.queries else 0.0


def score(observation: Observation) -> float:
    """The objective, lower is better: the violation rate, then the CPU a query costs, as a share
    of its budget (capped at 1, weighted by COST_WEIGHT so that it only breaks near-ties)."""
    if observation.budget_ms > 0:
        cost_share = min(1.0, observation.cpu_ms_per_query / observation.budget_ms)
    else:
        cost_share = 1.0
    return observation.violation_rate + COST_WEIGHT * cost_share


def observe_window(
    latencies_ms: Sequence[float],
    budgets_ms: Sequence[float],
    run_ms: float,
    config: ParallelConfig,
) -> Observation:
    """An Observation from a window's queries (their latency and budget, paired) and the total run
    time of the batches that served them."""
    if len(latencies_ms) != len(budgets_ms):
        raise ValueError("every query needs both its latency and its budget")
    queries = len(latencies_ms)
    violations = sum(1 for latency, budget in zip(latencies_ms, budgets_ms, strict=True) if latency > budget)
    ordered = sorted(latencies_ms)
    p99 = ordered[min(queries - 1, int(0.99 * queries))] if queries else 0.0
    budgets = sorted(budgets_ms)
    return Observation(
        queries=queries,
        violations=violations,
        p99_ms=p99,
        cpu_ms_per_query=run_ms * config.threads / queries if queries else 0.0,
        budget_ms=budgets[queries // 2] if queries else 0.0,
    )


# Load levels: the state RRL learns a configuration for. Arrival rates within a factor of two of
# each other share a level; a rate must move a quarter past a level's edge to change it, so that
# Poisson noise around an edge does not restart the search every window.
LEVEL_HYSTERESIS = 0.25


def load_level(qps: float, previous: int | None = None) -> int:
    """The load level of an arrival rate: floor(log2(qps)) (0 under 1 QPS), kept at
    ``previous`` while the rate stays within LEVEL_HYSTERESIS of that level's range."""
    level = 0 if qps < 1.0 else math.floor(math.log2(qps))
    if previous is None or level == previous:
        return level
    low, high = 2.0**previous, 2.0 ** (previous + 1)
    if low * (1 - LEVEL_HYSTERESIS) <= qps < high * (1 + LEVEL_HYSTERESIS) or (previous == 0 and qps < 1.25):
        return previous
    return level


class TunerPolicy(Protocol):
    """A tuning policy over a fixed configuration space, per load level. The worker reports what
    each window measured (``observe``), asks what to run next (``propose``), and stops exploring
    once the policy says it has ``converged`` (it then keeps proposing its best)."""

    name: str

    def observe(self, level: int, config: ParallelConfig, observation: Observation) -> None: ...

    def propose(self, level: int) -> ParallelConfig: ...

    def best(self, level: int) -> ParallelConfig | None: ...

    def converged(self, level: int) -> bool: ...

    def trials(self, level: int) -> int: ...


@dataclass
class Tried:
    """The running mean of one configuration's score at one level."""

    count: int = 0
    mean: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.mean += (value - self.mean) / self.count


@dataclass
class LevelState:
    """What a grid policy knows at one load level: every configuration tried and its running
    score, the windows observed before the search converged, and whether it has."""

    tried: dict[ParallelConfig, Tried] = field(default_factory=dict)
    trials: int = 0
    converged: bool = False

    def record(self, config: ParallelConfig, observation: Observation) -> None:
        self.tried.setdefault(config, Tried()).add(score(observation))
        if not self.converged:
            self.trials += 1

    def best(self) -> ParallelConfig | None:
        """The best configuration tried (least score; fewer threads, then the grid's order, on a tie)."""
        if not self.tried:
            return None
        return min(self.tried, key=lambda c: (self.tried[c].mean, c.threads, c))


State = TypeVar("State", bound=LevelState)


class GridTuner(Generic[State]):
    """What every ``TunerPolicy`` over a configuration grid shares: the space, where it starts,
    and one ``State`` per load level (``new_state`` makes one)."""

    name = "grid"

    def __init__(self, space: Sequence[ParallelConfig], start: ParallelConfig) -> None:
        if not space:
            raise ValueError("the configuration space is empty")
        self.space = sorted(set(space))
        self.start = start if start in self.space else self.space[0]
        self._levels: dict[int, State] = {}

    def new_state(self) -> State:
        raise NotImplementedError

    def _level(self, level: int) -> State:
        state = self._levels.get(level)
        if state is None:
            state = self._levels[level] = self.new_state()
        return state

    def best(self, level: int) -> ParallelConfig | None:
        return self._level(level).best()

    def converged(self, level: int) -> bool:
        return self._level(level).converged

    def trials(self, level: int) -> int:
        return self._level(level).trials
