"""The simpler baseline the region search is measured against: UCB1 over the configuration
grid, one arm per configuration, point by point (no region: a measurement says nothing about
any other configuration). Scores are minimised, so an arm's index is its mean minus the
exploration bonus ``c · sqrt(ln n / n_arm)``. Every arm is tried once first (in the grid's order,
from the start configuration); the search has converged once the same arm, the best by mean, has
been chosen ``patience`` times in a row."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from modelless.tuning.base import GridTuner, LevelState, Observation, ParallelConfig

DEFAULT_EXPLORATION = 0.05  # about the noise of a window's violation rate
DEFAULT_PATIENCE = 3


@dataclass
class _Level(LevelState):
    streak: tuple[ParallelConfig | None, int] = (None, 0)  # the arm chosen last, how often in a row


class UcbTuner(GridTuner[_Level]):
    name = "ucb"

    def __init__(
        self,
        space: Sequence[ParallelConfig],
        start: ParallelConfig,
        *,
        exploration: float = DEFAULT_EXPLORATION,
        patience: int = DEFAULT_PATIENCE,
    ) -> None:
        super().__init__(space, start)
        self.exploration = exploration
        self.patience = patience

    def new_state(self) -> _Level:
        return _Level()

    def observe(self, level: int, config: ParallelConfig, observation: Observation) -> None:
        state = self._level(level)
        state.record(config, observation)
        previous, count = state.streak
        state.streak = (config, count + 1 if config == previous else 1)
        best = self.best(level)
        state.converged = (
            all(c in state.tried for c in self.space) and config == best and state.streak[1] >= self.patience
        ) or state.converged

    def propose(self, level: int) -> ParallelConfig:
        state = self._level(level)
        if state.converged:
            best = self.best(level)
            assert best is not None
            return best
        if self.start not in state.tried:
            return self.start
        untried = [c for c in self.space if c not in state.tried]
        if untried:
            return untried[0]
        total = sum(t.count for t in state.tried.values())
        return min(
            self.space,
            key=lambda c: (
                state.tried[c].mean - self.exploration * math.sqrt(math.log(total) / state.tried[c].count),
                c.threads,
                c,
            ),
        )
