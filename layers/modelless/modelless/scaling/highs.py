"""HiGHS (through ``scipy.optimize``) on the exact solver's models, within a time limit.

:func:`attempt` solves a model's MILP (with a cutoff where a proof round knows the best plan's
objective), :func:`lp_duals` its LP relaxation, with the duals and the Lagrangian bound they
prove. Every call runs in a thread of its own and is abandoned (:class:`OutOfTime`) when HiGHS
has not answered shortly after its limit (:func:`within_limit`): HiGHS does not read its clock in
every phase of its search.
"""

from __future__ import annotations

import atexit
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import vstack

from modelless.scaling.deadline import STOP_SLACK_S, OutOfTime
from modelless.scaling.exact_model import Model, Vector

# HiGHS status codes as scipy reports them.
OPTIMAL, LIMIT, INFEASIBLE = 0, 1, 2

# HiGHS checks its time limit in most of its phases, not all: at 500 architectures a MILP asked
# to stop after 0.35 s once ran 2.1 s, and one asked for 0.08 s commonly answers after 0.17 s
# (bench/scaler.py). A call runs in a thread of its own (HiGHS releases the GIL), and is abandoned
# when it has not answered this long after its limit: the solve goes on without it (OutOfTime),
# and the thread ends when HiGHS does (its answer unread). The grace is kept back from every
# deadline (``deadline.STOP_SLACK_S``), so that an abandoned call still ends the solve in time.
HIGHS_GRACE_S = STOP_SLACK_S
# An abandoned call still runs HiGHS: the process waits for it at exit (up to this long), since a
# daemon thread still inside HiGHS when Python finalises aborts the process ("terminate called
# without an active exception", exit 134) where a one-shot CLI or benchmark ends right after one.
ABANDONED_WAIT_S = 60.0
_abandoned: set[threading.Thread] = set()


@atexit.register
def _wait_for_abandoned_calls() -> None:
    deadline = time.monotonic() + ABANDONED_WAIT_S
    for thread in list(_abandoned):
        thread.join(max(0.0, deadline - time.monotonic()))


def within_limit(time_limit_s: float, call: Callable[[], Any]) -> Any:
    """``call()`` (a HiGHS call told ``time_limit_s``), or :class:`OutOfTime` where it has not
    answered ``HIGHS_GRACE_S`` after that limit; what it raises is raised here."""
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # handed to the caller's thread
            failure.append(error)

    worker = threading.Thread(target=run, name="highs", daemon=True)
    worker.start()
    worker.join(max(time_limit_s, 0.01) + HIGHS_GRACE_S)
    if worker.is_alive():
        _abandoned.add(worker)
        _abandoned.difference_update([thread for thread in _abandoned if not thread.is_alive()])
        raise OutOfTime
    if failure:
        raise failure[0]
    return outcome[0]


def solve_milp(
    model: Model,
    c: Vector,
    upper: Vector,
    time_limit_s: float,
    extra_row: tuple[Vector, float] | None = None,
    cutoff: float | None = None,
) -> Any:
    """HiGHS on the model. ``cutoff``: HiGHS's ``objective_bound``, so that it prunes every node
    that cannot beat it (a proof round knows the best plan's objective: it needs no solution
    that is not cheaper). What it returns above the cutoff only says that none is below it."""
    constraints = []
    if model.matrix.shape[0]:
        constraints.append(LinearConstraint(model.matrix, model.row_lower, model.row_upper))
    if extra_row is not None:
        coefficients, bound = extra_row
        constraints.append(LinearConstraint(coefficients.reshape(1, -1), -np.inf, bound))
    options: dict[str, Any] = {"time_limit": max(time_limit_s, 0.01), "disp": False}
    if cutoff is None:
        return within_limit(
            time_limit_s,
            lambda: milp(
                c,
                integrality=model.integrality,
                bounds=Bounds(model.lower, upper),
                constraints=constraints,
                options=options,
            ),
        )

    def bounded() -> Any:
        with warnings.catch_warnings():  # scipy passes the option to HiGHS, and warns that it does
            warnings.filterwarnings("ignore", message="Unrecognized options", category=RuntimeWarning)
            return milp(
                c,
                integrality=model.integrality,
                bounds=Bounds(model.lower, upper),
                constraints=constraints,
                options={**options, "objective_bound": cutoff},
            )

    return within_limit(time_limit_s, bounded)


@dataclass
class Attempt:
    """One MILP's outcome in scaled units: status, solution and HiGHS's dual bound."""

    status: int
    x: Vector | None
    value: float | None
    dual_bound: float | None
    message: str


def attempt(
    model: Model, time_limit_s: float, upper: Vector | None = None, cutoff: float | None = None
) -> Attempt:
    """One MILP. With a ``cutoff``, a solution above it (or none at all, once the search is
    done) proves only that nothing is cheaper than the cutoff: it comes back as no solution,
    with the cutoff as the bound."""
    result = solve_milp(model, model.c, model.upper if upper is None else upper, time_limit_s, cutoff=cutoff)
    x = None if result.x is None else np.asarray(result.x, dtype=np.float64)
    value = None if result.fun is None else float(result.fun)
    dual = getattr(result, "mip_dual_bound", None)
    if result.status == OPTIMAL and value is not None:
        dual = value if dual is None else min(float(dual), value)
    if cutoff is not None:
        done = result.status in (OPTIMAL, INFEASIBLE)
        if value is not None and value > cutoff:
            x = value = None
        if done and x is None:
            return Attempt(OPTIMAL, None, None, cutoff, str(result.message))
        if dual is not None:
            dual = min(float(dual), cutoff)
    return Attempt(result.status, x, value, None if dual is None else float(dual), str(result.message))


@dataclass
class Duals:
    """An LP relaxation's answer: its bound, the duals that price the pools' resources and the
    components' choices, its solution and reduced costs."""

    bound: float  # the LP's Lagrangian bound, scaled units
    capacity: dict[tuple[int, str], float]  # π >= 0 per (pool, resource) row
    choice: dict[int, float]  # per component, its choice row's dual
    x: Vector  # the LP's solution
    reduced: Vector  # its reduced costs
    scale: float  # the model's objective scale


def lp_duals(model: Model, time_limit_s: float) -> Duals | None:
    """The LP relaxation's duals, and the Lagrangian bound they prove (computed here from the
    duals and the column bounds, so that it holds whatever HiGHS's own tolerances)."""
    matrix = model.matrix
    equal = model.row_lower == model.row_upper
    upper_rows = np.isfinite(model.row_upper) & ~equal
    lower_rows = np.isfinite(model.row_lower) & ~equal
    a_ub = vstack([matrix[np.flatnonzero(upper_rows)], -matrix[np.flatnonzero(lower_rows)]]).tocsr()
    b_ub = np.concatenate([model.row_upper[upper_rows], -model.row_lower[lower_rows]])
    a_eq = matrix[np.flatnonzero(equal)]
    b_eq = model.row_lower[equal]
    result = within_limit(
        time_limit_s,
        lambda: linprog(
            model.c,
            A_ub=a_ub if a_ub.shape[0] else None,
            b_ub=b_ub if a_ub.shape[0] else None,
            A_eq=a_eq if a_eq.shape[0] else None,
            b_eq=b_eq if a_eq.shape[0] else None,
            bounds=np.column_stack([model.lower, model.upper]),
            method="highs",
            options={"time_limit": max(time_limit_s, 0.01)},
        ),
    )
    if result.status != 0:
        return None
    y_ub = np.zeros(0)
    if a_ub.shape[0]:  # a <= row's multiplier is never positive (rounding aside)
        y_ub = np.minimum(np.asarray(result.ineqlin.marginals, dtype=np.float64), 0.0)
    y_eq = np.asarray(result.eqlin.marginals, dtype=np.float64) if a_eq.shape[0] else np.zeros(0)
    reduced = model.c.copy()
    if a_ub.shape[0]:
        reduced -= a_ub.T @ y_ub
    if a_eq.shape[0]:
        reduced -= a_eq.T @ y_eq
    bound = float(b_ub @ y_ub + b_eq @ y_eq)
    bound += float(np.sum(np.where(reduced >= 0, reduced * model.lower, reduced * model.upper)))
    price = np.zeros(matrix.shape[0])
    price[np.flatnonzero(upper_rows)] = -y_ub[: int(upper_rows.sum())]
    price[np.flatnonzero(equal)] = y_eq
    return Duals(
        bound=bound,
        capacity={key: float(price[row]) for key, row in model.capacity_rows.items()},
        choice={ci: float(price[row]) for ci, row in model.choice_rows.items()},
        x=np.asarray(result.x, dtype=np.float64),
        reduced=reduced,
        scale=model.scale,
    )
