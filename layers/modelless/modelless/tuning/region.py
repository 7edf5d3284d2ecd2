"""RRL's region-based search (Qin et al., SC '19 §4.2), as a policy over explicit state.

RRL's observation is that similar configurations perform similarly, so one measurement says
something about every configuration in a region around it, and the search need not try them all.
Here that is used in two ways:

- **Search region.** Only the untried configurations within ``radius`` of the best configuration
  tried so far are candidates (a doubling of one knob is one step). When a better configuration is
  found, its own region opens up; when no candidate is left, the search has converged.
- **Regional estimate.** A candidate's score is estimated from the tried configurations within
  ``estimate_radius`` of it: a plane through the best tried configuration (the anchor) whose
  slopes are fitted, by ridge-regularised least squares, to how the other tried configurations
  differ from it. A direction no tried configuration moved along has no slope: the estimate
  there is the anchor's own score (unknown, so worth a try), never an average of configurations
  that differ in other ways. A candidate whose estimate is worse than the best tried by more
  than ``margin`` is skipped: its region already says it loses. The most promising candidate
  (lowest estimate) is tried next.
- **Confidence.** When no candidate is left, the best is measured again until it has
  ``confirmations`` windows of its own (one noisy window must not end the search on a fluke);
  if it still leads, the search has converged.

Scores come from live windows (``modelless.tuning.base.score``): a configuration tried again
keeps a running mean, so a best whose traffic got worse loses its place and the search resumes
from the new best (RRL's adaptivity to a changing system, without restarting).

The paper's neural-network estimate and Boltzmann exploration are replaced by this regional
plane and a deterministic choice: the spaces a worker tunes are small (tens of configurations),
and a deterministic search is one a test can pin down.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from modelless.tuning.base import GridTuner, LevelState, Observation, ParallelConfig, distance

DEFAULT_RADIUS = 1.0  # one doubling of one knob
DEFAULT_ESTIMATE_RADIUS = 2.0
DEFAULT_MARGIN = 0.01  # a point of violation rate: noise in a window of a few hundred queries
DEFAULT_CONFIRMATIONS = 2
RIDGE = 0.1


class RegionTuner(GridTuner[LevelState]):
    name = "region"

    def __init__(
        self,
        space: Sequence[ParallelConfig],
        start: ParallelConfig,
        *,
        radius: float = DEFAULT_RADIUS,
        estimate_radius: float = DEFAULT_ESTIMATE_RADIUS,
        margin: float = DEFAULT_MARGIN,
        confirmations: int = DEFAULT_CONFIRMATIONS,
    ) -> None:
        super().__init__(space, start)
        self.radius = radius
        self.estimate_radius = estimate_radius
        self.margin = margin
        self.confirmations = max(1, confirmations)

    def new_state(self) -> LevelState:
        return LevelState()

    def observe(self, level: int, config: ParallelConfig, observation: Observation) -> None:
        state = self._level(level)
        state.record(config, observation)
        state.converged = self._next_candidate(state) is None

    def propose(self, level: int) -> ParallelConfig:
        state = self._level(level)
        if not state.tried:
            return self.start
        candidate = self._next_candidate(state)
        if candidate is None:
            state.converged = True
            best = self.best(level)
            assert best is not None
            return best
        return candidate

    def estimate(self, level: int, config: ParallelConfig) -> float | None:
        """The config's score: its mean if tried, else the regional plane's value (None when no
        tried configuration is within ``estimate_radius``)."""
        state = self._level(level)
        if config in state.tried:
            return state.tried[config].mean
        return self._regional(state, config)

    def _regional(
        self, state: LevelState, config: ParallelConfig, anchor: ParallelConfig | None = None
    ) -> float | None:
        """The plane's value at ``config`` (see the module docstring); the anchor is the best
        tried configuration in its region unless given."""
        near = [c for c in state.tried if distance(c, config) <= self.estimate_radius]
        if anchor is None:
            if not near:
                return None
            anchor = min(near, key=lambda c: (state.tried[c].mean, distance(c, config), c))
        base = state.tried[anchor].mean
        others = [c for c in near if c != anchor]
        if not others:
            return base
        origin = np.array(anchor.coordinates())
        x = np.array([c.coordinates() for c in others]) - origin
        y = np.array([state.tried[c].mean for c in others]) - base
        # Ridge towards a flat plane: a direction the tried configurations never moved along keeps
        # a slope of 0, and a slope from one noisy window is damped.
        slopes = np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ y)
        return max(0.0, float(base + slopes @ (np.array(config.coordinates()) - origin)))

    def _next_candidate(self, state: LevelState) -> ParallelConfig | None:
        if not state.tried:
            return self.start
        best = state.best()
        assert best is not None
        best_score = state.tried[best].mean
        ranked: list[tuple[float, float, int, ParallelConfig]] = []
        for config in self.space:
            if config in state.tried or distance(config, best) > self.radius + 1e-9:
                continue
            estimate = self._regional(state, config, anchor=best)
            value = best_score if estimate is None else estimate
            if value > best_score + self.margin:
                continue  # its region says it loses: not worth a window
            ranked.append((value, distance(config, best), config.threads, config))
        if ranked:
            return min(ranked)[3]
        if state.tried[best].count < self.confirmations:
            return best  # measure the leader again before trusting it
        return None
