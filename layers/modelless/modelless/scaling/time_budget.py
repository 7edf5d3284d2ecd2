"""How the exact solver spends one call's time limit: :class:`TimeBudget`.

A call of :func:`~modelless.scaling.exact.solve_exact` (or ``solve_compact``) has one deadline
for the whole call (:mod:`modelless.scaling.deadline`), and its steps each take a share of the
time limit: the LPs, the plan's MILP, the search, the proof, the reading of the plan. The shares
are the constants below; a call makes one :class:`TimeBudget` from them when it starts and hands
it to every step, so that each step asks the budget what it may take instead of working it out
from the clock and the constants itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from modelless.scaling.deadline import STOP_SLACK_S, Deadline, holding_reserve_s
from modelless.scaling.problem import ScalingProblem

LP_SHARE = 0.25  # of the time limit, at most, for each of step 1's LPs
PLAN_SHARE = 0.6  # of the time limit, at most, for step 2 (the plan)
RESERVE_SHARE = 0.1  # of the time limit, kept for reading the plan (packing, bridge)
# Reading the best plan into a ScalingPlan (its packing, its bridge) comes after the search has
# stopped, at the deadline: the search stops this long before it, measured as a share of the
# time the scan of the variants took in the same call, so that a slower or busier machine keeps
# back more. Measured on a 2-core Intel Xeon VM: the reading took 0.17-0.38 of the scan at 50
# to 500 architectures (its fixed few ms are more at 10, within the deadline's slack); with no
# reserve for it, 1 s calls at 500 took up to 1.15 s there.
FINISH_PER_SCAN = 0.4
EXTEND_SHARE = 0.2  # of the time limit, at least, left for another round of the proof
# Of what is left for a proof's MILP, what HiGHS is told it may take: it reads the clock between
# the phases of its search, and one phase can take a few tenths of a second on 500 architectures.
# (So is the plan's MILP: it has the best rounding, so one abandoned is a plan the worse, no more.)
HIGHS_SHARE = 0.6
PROOF_COST = 4.0  # a proof round's model and LP, over the first model's and LP's time
FALLBACK_SHARE = 0.15  # of the time limit, at most, for the greedy's improvement passes
CERTIFY_SHARE = 0.25  # of the time limit, kept from the search for the proof (``bounds.certify``)
# What reading the variants and building the program take per variant (about 15 µs on the
# benchmark machine, ``bench/scaler.py``); where that would be over this share of the time limit,
# the greedy answers instead (what the exact solver would return is the holding plan).
PREPARE_S_PER_VARIANT = 15e-6
PREPARE_SHARE = 0.5


@dataclass(frozen=True)
class TimeBudget:
    """One call's time: when it started, its limit, its deadline (the holding plan's time kept
    back) and the shares of the limit its steps may take. Made once per call
    (:meth:`starting`); the one change, once the variants have been scanned, is a deadline kept
    earlier by the time reading the plan will take (:meth:`after_scan`)."""

    started: float  # time.perf_counter() when the call began
    time_limit_s: float
    deadline: Deadline
    lp_share: float = LP_SHARE
    plan_share: float = PLAN_SHARE
    reserve_share: float = RESERVE_SHARE
    finish_per_scan: float = FINISH_PER_SCAN
    extend_share: float = EXTEND_SHARE
    highs_share: float = HIGHS_SHARE
    proof_cost: float = PROOF_COST
    fallback_share: float = FALLBACK_SHARE
    certify_share: float = CERTIFY_SHARE
    prepare_s_per_variant: float = PREPARE_S_PER_VARIANT
    prepare_share: float = PREPARE_SHARE

    @classmethod
    def starting(cls, problem: ScalingProblem, time_limit_s: float, started: float) -> TimeBudget:
        """The budget of a call that began at ``started``: its deadline keeps back the time the
        holding plan takes, so that the call can still return that plan by the limit."""
        return cls(started, time_limit_s, Deadline(started + time_limit_s - holding_reserve_s(problem)))

    @property
    def at(self) -> float:
        """The deadline, on ``time.perf_counter``'s clock."""
        return self.deadline.at

    def after_scan(self, problem: ScalingProblem, scanning: float) -> TimeBudget:
        """This budget with its deadline earlier by the time reading the plan will take: a share
        of the scan of the variants that began at ``scanning`` (less the holding plan's time, kept
        back already), so that a slower or busier machine keeps back more."""
        already = holding_reserve_s(problem) - STOP_SLACK_S
        return replace(self, deadline=self.deadline.keeping_back(self.finish_per_scan, scanning, already))

    def too_large(self, variants: int) -> bool:
        """Whether reading ``variants`` variants and building their program would take more than
        its share of the limit: the greedy then answers at once."""
        return self.prepare_s_per_variant * variants > self.prepare_share * self.time_limit_s

    def step_s(self) -> float:
        """What one step may take: what is left before the deadline, less the reading reserve."""
        return max(0.01, self.at - self.reserve_share * self.time_limit_s - time.perf_counter())

    def lp_s(self) -> float:
        """What one LP may take: the step's time, at most its share of the limit."""
        return min(self.step_s(), self.lp_share * self.time_limit_s)

    def highs_s(self, seconds: float) -> float:
        """Of ``seconds`` left for a MILP, what HiGHS is told it may take (it overruns a little)."""
        return self.highs_share * seconds

    def search_end(self) -> float:
        """When steps 2 and 3 (the plan and the search for a cheaper one) stop: the proof (step 4)
        and the reading of the plan keep their shares."""
        return self.at - (self.reserve_share + self.certify_share) * self.time_limit_s

    def search_left_s(self) -> float:
        """What is left of the search's time (negative once it is over)."""
        return self.search_end() - time.perf_counter()

    def search_s(self) -> float:
        """What one step of the search may take: what is left of its time, at least 10 ms."""
        return max(0.01, self.search_end() - time.perf_counter())

    def plan_s(self, with_rounding: bool) -> float:
        """What the plan's MILP (step 2) may take: the search's time, at most its share of the
        limit; HiGHS's share of that where a rounding is in hand (one abandoned costs no plan)."""
        seconds = min(self.search_s(), self.plan_share * self.time_limit_s)
        return self.highs_s(seconds) if with_rounding else seconds

    def half_gone(self) -> bool:
        """Whether less than half the limit is left: step 1 then stops growing patterns."""
        return self.at - time.perf_counter() < self.time_limit_s / 2

    def proof_round_s(self, since: float) -> float:
        """What a proof round costs at least: its model (several times the first one) and its
        LP, from the time the first model and LP took since ``since``."""
        return self.proof_cost * (time.perf_counter() - since)

    def extending_pays(self) -> bool:
        """Whether enough of the search's time is left to extend the patterns and solve again."""
        return self.search_left_s() >= self.extend_share * self.time_limit_s

    def only_reserve_left(self) -> bool:
        """Whether no more than the reading reserve is left before the deadline."""
        return self.at - time.perf_counter() < self.reserve_share * self.time_limit_s

    def fallback_improve_s(self) -> float:
        """What the greedy's improvement passes may take when it answers instead: what is left
        before the deadline, at most their share of the limit."""
        return min(max(0.0, self.at - time.perf_counter()), self.fallback_share * self.time_limit_s)
