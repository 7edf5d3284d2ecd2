"""The exact solver's best plan so far (:class:`Incumbent`), and the plans it reads off its LPs.

The solve is anytime: every LP of its first step is rounded into a plan (:func:`rounded`: each
component's likeliest choice, a chosen block as if fully on, the fewest workers that hold them),
its spare room put to use (:func:`filled`), so that a plan exists from the first LP on and the
cheapest is the plan every MILP has to beat (exact's module docstring, "The deadline").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from modelless.scaling.deadline import Deadline
from modelless.scaling.exact_model import Model, Vector
from modelless.scaling.highs import Duals
from modelless.scaling.problem import EPS, ScalingProblem

FILL_CHECK_EVERY = 64  # moves between two looks at the clock


@dataclass
class Incumbent:
    """The best plan found so far, as a solution of a model, and the best lower bound."""

    model: Model | None = None
    x: Vector | None = None
    lower: float = -math.inf  # scaled units

    def offer(self, model: Model, x: Vector) -> None:
        """Keep ``x`` where it is cheaper than the plan kept (every model has the same scale)."""
        if self.model is None or self.x is None or float(model.c @ x) < float(self.model.c @ self.x):
            self.model, self.x = model, x


def offer_rounding(
    problem: ScalingProblem, model: Model, duals: Duals | None, incumbent: Incumbent, deadline: Deadline
) -> None:
    """The LP's rounding, filled, offered to the incumbent (where the LP answered and its
    rounding breaks no row)."""
    if duals is not None:
        plan = rounded(problem, model, duals.x)
        if plan is not None:
            incumbent.offer(model, filled(model, plan, deadline))


def rounded(problem: ScalingProblem, model: Model, lp_x: Vector) -> Vector | None:
    """A plan from the LP's solution: each component's likeliest choice (a pattern, or its block),
    and the workers that hold them (in aggregate: the plan's packing is checked later). None
    where it breaks a row (a pool over its limit, Lambda over its concurrency, ...). The first
    plan of the anytime solve, and a safety net for a MILP stopped early with a poor incumbent.

    A chosen block takes the LP's solution divided by its switch ``m[c]`` (the block as if fully
    on), instances rounded up: every row of the block still holds (its rows are homogeneous in
    ``m``, and more instances only loosen them; fractions of a need are capped at the whole)."""
    x = np.zeros_like(model.c)
    best: dict[int, tuple[float, int]] = {}
    choices = [(col, pattern.component) for col, pattern in model.pattern_cols.items()]
    choices += [(col, ci) for ci, col in model.m_cols.items()]
    for col, ci in choices:
        if ci not in best or lp_x[col] > best[ci][0]:
            best[ci] = (float(lp_x[col]), col)
    for _, col in best.values():
        x[col] = 1.0
    for ci in model.blocks:
        switch = model.m_cols.get(ci)
        on = 1.0 if switch is None else float(lp_x[switch])
        if switch is not None and (best[ci][1] != switch or on <= EPS):
            continue  # a pattern serves it: the block stays off
        # The block's columns (instances, fractions of needs, Lambda's), as if m were 1.
        for col in model.block_cols.get(ci, ()):
            value = max(float(lp_x[col]), 0.0) / on
            whole = bool(model.integrality[col])
            x[col] = math.ceil(value - 1e-9) if whole else min(value, float(model.upper[col]))
    return _with_workers(problem, model, x)


def _with_workers(problem: ScalingProblem, model: Model, x: Vector) -> Vector | None:
    """``x`` (its choices and instances set) with the fewest workers every row allows, its load
    columns set where they are free; None where a row then breaks."""
    matrix = model.matrix
    for vi, col in model.n_cols.items():  # instances loaded afresh, past those running
        s_col = model.s_cols.get(vi)
        if s_col is not None:
            x[s_col] = max(0.0, x[col] - problem.variants[vi].running)
    x[list(model.w_cols.values())] = 0.0
    usage = matrix @ x
    for pi, col in model.w_cols.items():
        entries = matrix[:, [col]].tocoo()
        need = float(problem.pools[pi].min_workers)
        for row, coefficient in zip(entries.row, entries.data, strict=True):
            if coefficient < 0 and np.isfinite(model.row_upper[row]):
                need = max(need, math.ceil((usage[row] - model.row_upper[row]) / -coefficient - 1e-9))
        if need > model.upper[col]:
            return None
        x[col] = need
    rows = matrix @ x
    if np.any(rows < model.row_lower - 1e-7) or np.any(rows > model.row_upper + 1e-7):
        return None  # e.g. two copies of a variant that one worker cannot hold
    if np.any(x < model.lower - 1e-9) or np.any(x > model.upper + 1e-9):
        return None
    return x


def filled(model: Model, x: Vector, deadline: Deadline | None = None) -> Vector:
    """``x`` with the room its workers leave put to use: a component moves to a cheaper pattern
    (more instances, less Lambda) wherever that breaks no row with the workers ``x`` already
    pays for, the largest saving first. A rounding pays for whole workers its LP used only part
    of; on the benchmark's 500 architectures this takes 0.5-1 point off its gap, in about 10 ms."""
    x = x.copy()
    columns = model.matrix.tocsc()
    starts, indices, values = columns.indptr, columns.indices, columns.data
    rows = model.matrix @ x
    lowest, highest = model.row_lower - 1e-9, model.row_upper + 1e-9
    chosen: dict[int, int] = {}
    for col, pattern in model.pattern_cols.items():
        if x[col] > 0.5:
            chosen[pattern.component] = col
    moves = sorted(
        (float(model.c[col] - model.c[chosen[pattern.component]]), col, pattern.component)
        for col, pattern in model.pattern_cols.items()
        if pattern.component in chosen and model.c[col] < model.c[chosen[pattern.component]] - EPS
    )
    for tried, (_, col, component) in enumerate(moves):
        if deadline is not None and tried % FILL_CHECK_EVERY == 0 and deadline.passed():
            break  # every move kept the plan valid: it is filled as far as the time allowed
        current = chosen[component]
        if model.c[col] >= model.c[current] - EPS:
            continue  # it has moved to a pattern at least as cheap already
        touched = np.concatenate(
            [indices[starts[col] : starts[col + 1]], indices[starts[current] : starts[current + 1]]]
        )
        change = np.concatenate(
            [values[starts[col] : starts[col + 1]], -values[starts[current] : starts[current + 1]]]
        )
        unique, position = np.unique(touched, return_inverse=True)
        moved = rows[unique] + np.bincount(position, weights=change, minlength=unique.size)
        if np.all(moved <= highest[unique]) and np.all(moved >= lowest[unique]):
            rows[unique] = moved
            x[current], x[col] = 0.0, 1.0
            chosen[component] = col
    return x
