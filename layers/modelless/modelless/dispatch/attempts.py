"""A query's attempts: its clock (budget, deadline, graces), the attempt on the chosen place, the
retries elsewhere when that place fails, and the errors that say why a query could not be served.

Everything a change to retry behaviour touches is here. Where a retry goes is decided by the
policy as any query is (the ``Redecide`` the dispatcher hands in), on what is left of the budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from modelless.dispatch.live_view import LiveView
from modelless.exceptions import (
    DeadlineExceededError,
    QueryFailedError,
    ServiceUnavailableError,
    TargetsUnreachableError,
    WorkerUnreachableError,
)
from modelless.pools.invokers import LambdaInvoker, WorkerInvoker
from modelless.serving.invocation import Invocation, Reply
from modelless.types import Decision, InstanceState, QueryTargets, Tier

# Never wait on compute for longer than this, whatever the budget: a query fails, it never hangs.
# It is the whole deadline of a query that names no latency target.
MAX_INVOKE_TIMEOUT_S = 30.0
# A query with a latency target is answered or fails with a clear 503 at most this long after its
# budget has passed. The budget is a target (INFaaS §4.1: compared with profiled p99s, which leave
# cold starts out) and a late answer is still an answer — a retry after a failed worker, a burst
# spilled onto Lambda containers still starting (a cold start: 0.6-0.9 s for a local container
# on an idle 2-core VM, seconds under load; 1-3 s is common for a Python Lambda with onnxruntime)
# — but nothing may hold a query indefinitely, nor for the 30 s a client's own timeout would
# take to say so. Dead and hung workers cost far less: see ATTEMPT_GRACE_S.
DEADLINE_GRACE_S = 5.0
# One attempt on a worker may run this long past the remaining budget (or its expected latency,
# when that is longer) before the worker is taken for hung and the query moves on to another
# instance or the Lambda tier. Under the deadline's grace, so that a retry has time left to run.
ATTEMPT_GRACE_S = 1.0
# At most this many attempts per query: the first choice, another instance, the Lambda tier.
MAX_ATTEMPTS = 3
# What the attempts leave of the deadline for what follows the last of them: its failure handled
# (a Lambda container that hung dropped, the live view told), the 503 written and sent. The
# attempts end this long before the deadline, so that the thread's own answer, which names every
# attempt, comes by the deadline and not after it (a kill under load measured 40-100 ms of it).
REPLY_WRAP_UP_S = 0.25

# The policy's decision for ``targets`` (the budget: what is left of the query's) on a fresh read
# of the live state, leaving out the given workers; raises TargetsUnreachableError.
Redecide = Callable[[QueryTargets, set[str]], Decision]


@dataclass(frozen=True)
class QueryClock:
    """A query's time, on ``time.perf_counter()``'s clock: its latency budget and its deadline."""

    started: float
    budget_ms: float | None  # the latency target; None: the query named none
    deadline: float  # the budget + DEADLINE_GRACE_S; MAX_INVOKE_TIMEOUT_S without a budget

    @classmethod
    def start(cls, started: float, targets: QueryTargets) -> QueryClock:
        if targets.latency_ms is None:
            return cls(started, None, started + MAX_INVOKE_TIMEOUT_S)
        return cls(started, targets.latency_ms, started + targets.latency_ms / 1000 + DEADLINE_GRACE_S)

    def budget_left_ms(self, now: float) -> float | None:
        """What is left of the latency budget (never below 0); None without a budget."""
        if self.budget_ms is None:
            return None
        return max(0.0, self.budget_ms - (now - self.started) * 1000)

    def attempt_timeout_s(self, decision: Decision, now: float) -> float:
        """How long an attempt starting now may take: until the deadline, and on a worker's live
        instance no longer than the budget left (or the decision's expected latency, when longer)
        plus ATTEMPT_GRACE_S, so that a hung worker leaves time to retry elsewhere. The Lambda
        tier (the last resort, which may be starting a container) and a load (whose time varies
        with the repository and the machine, and which serves the next queries too) get all the
        time there is, less REPLY_WRAP_UP_S for the answer."""
        left = self.deadline - REPLY_WRAP_UP_S - now
        if on_lambda_tier(decision) or decision.state is InstanceState.INACTIVE:
            return left
        own_ms = max(self.budget_left_ms(now) or 0.0, decision.expected_latency_ms)
        return min(left, own_ms / 1000 + ATTEMPT_GRACE_S)

    def describe(self) -> str:
        if self.budget_ms is None:
            return f"no latency target: {MAX_INVOKE_TIMEOUT_S:g} s at most"
        return f"{self.budget_ms:g} ms budget + {DEADLINE_GRACE_S:g} s grace"


def on_lambda_tier(decision: Decision) -> bool:
    return decision.tier is Tier.LAMBDA or decision.worker_address is None


def _where(decision: Decision) -> str:
    if on_lambda_tier(decision):
        return f"{decision.variant.variant_id} on the Lambda tier"
    return f"{decision.variant.variant_id} on worker {decision.worker_id} ({decision.worker_address})"


class Attempts:
    def __init__(
        self,
        workers: WorkerInvoker,
        lambda_tier: LambdaInvoker | None,
        live_view: LiveView,
        redecide: Redecide,
    ) -> None:
        self._workers = workers
        self._lambda = lambda_tier
        self._live_view = live_view
        self._redecide = redecide

    def serve(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        query_id: str,
        decision: Decision,
        started: float,
    ) -> tuple[Reply, Decision]:
        """Run the query where ``decision`` says; the reply, and the decision that served it.
        ``started``: when the query arrived (``time.perf_counter()``), where its budget starts.

        When a place fails in a way another place would not (the worker died, hung, or answered
        503), the query moves on: to a live instance of an eligible variant on another worker that
        meets what is left of the budget, else to the Lambda tier, else it fails with a 503 that
        names every attempt. Each attempt carries the budget left at its start and is bounded by
        the query's deadline (budget + DEADLINE_GRACE_S); once that has passed, a 503
        ``deadline_exceeded``. Other errors (a bad input, a missing artifact, a model that
        crashed) would fail anywhere: they are the reply.
        """
        clock = QueryClock.start(started, targets)
        failures: list[str] = []
        failed_workers: set[str] = set()
        lambda_tried = False
        while True:
            now = time.perf_counter()
            timeout_s = clock.attempt_timeout_s(decision, now)
            if timeout_s <= 0:
                raise DeadlineExceededError(
                    f"query {query_id} passed its deadline ({clock.describe()}) after "
                    + "; ".join(failures)
                    + ": no time left to try elsewhere",
                    attempts=failures,
                )
            invocation = Invocation(decision.variant, inputs, query_id, clock.budget_left_ms(now))
            try:
                return self.run(decision, invocation, timeout_s), decision
            except ServiceUnavailableError as error:
                if on_lambda_tier(decision) and self._lambda is None:
                    raise  # selection found no room anywhere else: there is nowhere to retry
                failures.append(f"{_where(decision)} failed: {error.message}")
                if on_lambda_tier(decision):
                    # A container that died or hung under the query is not the tier: another
                    # container may serve it (MAX_ATTEMPTS bounds how often). A tier that said
                    # no (at its limit, out of time) would say it again.
                    lambda_tried = lambda_tried or not isinstance(error, WorkerUnreachableError)
                else:
                    worker = decision.worker_id or str(decision.worker_address)
                    failed_workers.add(worker)
                    if isinstance(error, WorkerUnreachableError):
                        # Dead or hung. One that answered 503 is alive: its state says the rest.
                        self._live_view.hold_out(worker)
                fallback = None
                if len(failures) < MAX_ATTEMPTS:
                    fallback = self._fallback(targets, decision, failed_workers, lambda_tried, clock)
                if fallback is None:
                    if len(failures) >= MAX_ATTEMPTS:
                        why = f"{MAX_ATTEMPTS} attempts made"
                    else:
                        why = "no other live instance meets what is left of its budget"
                        if self._lambda is None:
                            why += " and no Lambda tier is configured"
                    raise QueryFailedError(
                        f"query {query_id} could not be served: " + "; ".join(failures) + f"; {why}",
                        attempts=failures,
                    ) from error
                decision = dataclasses.replace(
                    fallback, reason=f"{fallback.reason}; retried after {'; '.join(failures)}"
                )

    def _fallback(
        self,
        targets: QueryTargets,
        failed: Decision,
        failed_workers: set[str],
        lambda_tried: bool,
        clock: QueryClock,
    ) -> Decision | None:
        """Where a query goes after ``failed``: a live (Active) instance of an eligible variant on
        a worker that has not failed it, meeting what is left of the budget (once the budget is
        spent, answering before the deadline: the query is late whatever happens, and a loaded
        instance is the quickest answer); else the Lambda tier, with the failed decision's
        variant; else None. Decided on a fresh read of the live state (not the snapshot that
        named the failed worker)."""
        now = time.perf_counter()
        budget_left_ms = clock.budget_left_ms(now)
        if budget_left_ms is not None and budget_left_ms <= 0:
            budget_left_ms = (clock.deadline - now) * 1000
        try:
            choice: Decision | None = self._redecide(
                dataclasses.replace(targets, latency_ms=budget_left_ms), failed_workers
            )
        except TargetsUnreachableError:
            choice = None
        # A live instance only: loading a new one is what the scaler and later queries are for.
        if (
            choice is not None
            and choice.state is InstanceState.ACTIVE
            and (choice.tier is Tier.WORKER or not lambda_tried)
        ):
            return choice
        if lambda_tried or self._lambda is None:
            return None
        return Decision(
            failed.variant,
            Tier.LAMBDA,
            None,
            failed.state,
            failed.expected_latency_ms,
            "no other live instance meets what is left of the budget: the Lambda tier",
        )

    def run(self, decision: Decision, invocation: Invocation, timeout_s: float) -> Reply:
        """One attempt: ``invocation`` where ``decision`` says, within ``timeout_s``; counted as
        in flight on the worker's instance meanwhile, and a variant it loaded remembered."""
        address = decision.worker_address
        if decision.tier is Tier.LAMBDA or address is None:
            return self._invoke_lambda(invocation, timeout_s)
        with self._live_view.in_flight(decision.worker_id or address, decision.variant.variant_id):
            reply = self._workers.invoke(address, invocation, timeout_s)
        if decision.state is InstanceState.INACTIVE and decision.worker_id is not None:
            self._live_view.loaded(decision.worker_id, decision.variant.variant_id)
        return reply

    def _invoke_lambda(self, invocation: Invocation, timeout_s: float) -> Reply:
        if self._lambda is None:
            raise ServiceUnavailableError("no Lambda tier is configured and no worker has room")
        return self._lambda.invoke(invocation, timeout_s)
