"""The app-level selection step of the query path, and feedback's matching and learning.

A query that names no model goes by its app's policy (``Policy``):

- INFaaS (the default): the dispatcher's getVariant, as before.
- Exp3: the bandit picks the model among those that can meet the query's targets (a variant
  whose profiled latency at the batch size meets the budget, at the accuracy asked); getVariant
  then picks that model's variant, worker and tier.
- Exp4: the query goes to several such models at once (the ``ensemble_size`` heaviest); their
  answers are combined by weighted vote. The reply is due at the query's deadline (its latency
  target less ``STRAGGLER_MARGIN``): members that have not answered by then are left out and
  named (``missing``). When none has answered by then, the first to answer is the reply, as a
  single model's would be; when all fail, the first member's error.

Every answered query is recorded (what each model answered) for ``QUERY_RECORD_TTL_S``, so that
feedback on it (a label per row, or a reward) can be matched: per model, the outcome is counted
(its live accuracy), and the policy that answered the query learns from it. Recording never
fails a query: an unreachable store costs the query its feedback, not its answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
from aws_lambda_powertools import Logger

from modelless.dispatch.attempts import MAX_INVOKE_TIMEOUT_S
from modelless.dispatch.router import Dispatcher, QueryResult
from modelless.exceptions import (
    ConflictError,
    InvalidInputError,
    ModellessError,
    NotFoundError,
    StoreUnavailableError,
    TargetsUnreachableError,
)
from modelless.feedback.policy import (
    DEFAULT_PARAMS,
    BanditParams,
    Policy,
    combine,
    ensemble_members,
    exp3_choose,
    exp3_probabilities,
    exp3_update,
    exp4_update,
    loss_of,
    shares,
)
from modelless.feedback.store import QUERY_RECORD_TTL_S, FeedbackStore, ModelOutcomes, QueryRecord
from modelless.types import QueryTargets

logger = Logger(service="gateway", child=True)

# An ensemble's reply is due this share of its latency target after its arrival: the rest is
# left for combining the answers and sending the reply.
STRAGGLER_MARGIN = 0.1
# How long a gateway trusts its read of an app's policy (a change made through another gateway
# takes effect within it; through this one, at once).
SELECTION_CACHE_TTL_S = 1.0


@dataclass(frozen=True)
class Ensemble:
    """What an Exp4 reply says of its ensemble: the members that answered, those that did not
    (late or failed), each answering member's weight share, and per row the confidence (the
    weight share that voted for the winning class)."""

    members: list[str]
    missing: list[str]
    weights: dict[str, float]
    confidence: list[float]


@dataclass(frozen=True)
class Answer:
    """A query's answer under its app's policy. ``result``: the dispatcher's (for an ensemble,
    its heaviest answering member's, with the ensemble's total time); ``outputs``: the model's
    outputs, or for an ensemble the weighted vote share of every class per row."""

    result: QueryResult
    policy: Policy
    outputs: np.ndarray
    predictions: list[int]
    ensemble: Ensemble | None = None
    probability: float | None = None  # Exp3: the chosen model's probability
    answers: dict[str, list[int]] | None = None  # Exp4: each answering member's classes
    considered: list[str] | None = None  # Exp3, Exp4: the eligible models chosen among
    members: list[QueryResult] | None = None  # Exp4: every answering member's own result

    @property
    def served(self) -> list[QueryResult]:
        """Every model's result that went into the answer (one but for an ensemble)."""
        return self.members if self.members is not None else [self.result]


@dataclass(frozen=True)
class Receipt:
    """What feedback did: per model, the reward it was counted with; ``duplicate``: the same
    feedback was given before, and nothing changed."""

    query_id: str
    policy: Policy
    rewards: dict[str, float]
    duplicate: bool


@dataclass(frozen=True)
class GivenFeedback:
    """A label per row (one label for every row is spread over them), or a reward in [0, 1]."""

    labels: list[int] | None = None
    reward: float | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


class FeedbackService:
    def __init__(
        self,
        store: FeedbackStore,
        dispatcher: Dispatcher,
        params: BanditParams = DEFAULT_PARAMS,
        record_ttl_s: float = QUERY_RECORD_TTL_S,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self._dispatcher = dispatcher
        self.params = params
        self._record_ttl_s = record_ttl_s
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._policies: dict[str, tuple[Policy, float]] = {}
        # Ensemble members run here; a late member's thread finishes on its own clock.
        self._members = ThreadPoolExecutor(max_workers=64, thread_name_prefix="ensemble")

    def close(self) -> None:
        self._members.shutdown(wait=False, cancel_futures=True)

    # --- the app's policy -----------------------------------------------------------------------
    def selection(self, app_id: str) -> Policy:
        cached = self._policies.get(app_id)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            policy = self.store.selection(app_id)
        except StoreUnavailableError:
            # The store is down: the policy last read (else INFaaS's, which the dispatcher can
            # serve from its own last-good caches) rather than a failed query.
            return Policy.INFAAS if cached is None else cached[0]
        self._policies[app_id] = (policy, time.monotonic() + SELECTION_CACHE_TTL_S)
        return policy

    def set_selection(self, app_id: str, policy: Policy) -> None:
        self.store.set_selection(app_id, policy)
        self._policies[app_id] = (policy, time.monotonic() + SELECTION_CACHE_TTL_S)

    # --- the query path -------------------------------------------------------------------------
    def answer(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        correlation_id: str = "",
        decode_ms: float | None = None,
        received: float | None = None,
    ) -> Answer:
        """Serve a query by its app's policy and record it for feedback."""
        received = time.perf_counter() if received is None else received
        policy = Policy.INFAAS if targets.model_name is not None else self.selection(targets.app_id)
        answer: Answer | None = None
        if policy is not Policy.INFAAS:
            # The store's word on the policy (the cached one may be a second old) and its weights.
            try:
                policy, weights = self.store.selection_state(targets.app_id)
                eligible = self.eligible_models(targets)
            except StoreUnavailableError:
                policy, eligible = Policy.INFAAS, []  # no weights to go by: getVariant's choice
            if len(eligible) > 0 and policy is Policy.EXP3:
                answer = self._exp3(targets, inputs, correlation_id, decode_ms, received, weights, eligible)
            elif len(eligible) > 0 and policy is Policy.EXP4:
                answer = self._exp4(targets, inputs, correlation_id, decode_ms, received, weights, eligible)
        if answer is None:  # INFaaS, or no model meets the targets: getVariant says why
            result = self._dispatcher.online_query(targets, inputs, correlation_id, decode_ms, received)
            answer = _single(result, Policy.INFAAS)
        self._record(targets.app_id, answer)
        return answer

    def eligible_models(self, targets: QueryTargets) -> list[str]:
        """The app's models with a variant that can meet the query's targets: its accuracy,
        and a profiled latency at the batch size within the budget."""
        version, _, _ = self._dispatcher.live_view.view(targets.app_id)
        candidates = self._dispatcher.profiles.candidates(targets, version)
        budget = math.inf if targets.latency_ms is None else targets.latency_ms
        return sorted(
            {
                v.model_name
                for v in candidates
                if v.max_batch >= targets.batch and v.latency_ms(targets.batch) <= budget
            }
        )

    def _exp3(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        correlation_id: str,
        decode_ms: float | None,
        received: float,
        weights: dict[str, float],
        eligible: list[str],
    ) -> Answer | None:
        probabilities = exp3_probabilities(weights, eligible, self.params.gamma)
        with self._rng_lock:
            model = exp3_choose(probabilities, self._rng)
        chosen = dataclasses.replace(targets, model_name=model)
        try:
            result = self._dispatcher.online_query(chosen, inputs, correlation_id, decode_ms, received)
        except TargetsUnreachableError:
            return None  # its variants cannot be placed in time now: getVariant's own choice
        return dataclasses.replace(
            _single(result, Policy.EXP3), probability=probabilities[model], considered=eligible
        )

    def _exp4(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        correlation_id: str,
        decode_ms: float | None,
        received: float,
        weights: dict[str, float],
        eligible: list[str],
    ) -> Answer:
        members = ensemble_members(weights, eligible, self.params.ensemble_size)
        futures: dict[Future[QueryResult], str] = {
            self._members.submit(
                self._dispatcher.online_query,
                dataclasses.replace(targets, model_name=member),
                inputs,
                correlation_id,
                decode_ms,
                received,
            ): member
            for member in members
        }
        budget_s = MAX_INVOKE_TIMEOUT_S if targets.latency_ms is None else targets.latency_ms / 1000
        due = received + budget_s * (1 - STRAGGLER_MARGIN)
        done, pending = wait(futures, timeout=max(0.0, due - time.perf_counter()))
        answered = {futures[f]: f.result() for f in done if f.exception() is None}
        while not answered and pending:
            # Nobody in time: the first to answer, as a single model's query would be answered.
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            answered = {futures[f]: f.result() for f in done if f.exception() is None}
        if not answered:
            first = next(f for f in futures if futures[f] == members[0])
            error = first.exception()
            raise error if error is not None else ModellessError("no ensemble member answered")
        share = shares(weights, sorted(answered))
        outputs = {member: result.outputs for member, result in answered.items()}
        classes = max(o.shape[1] for o in outputs.values())
        combined = combine({m: _classes(o) for m, o in outputs.items()}, share, classes)
        lead = max(answered, key=lambda m: (share[m], m))
        result = answered[lead]
        timings = {**result.timings_ms, "total_ms": round((time.perf_counter() - received) * 1000, 3)}
        ensemble = Ensemble(
            members=[m for m in members if m in answered],
            missing=[m for m in members if m not in answered],
            weights={m: round(share[m], 6) for m in sorted(answered)},
            confidence=[round(c, 6) for c in combined.confidence],
        )
        return Answer(
            result=dataclasses.replace(result, timings_ms=timings),
            policy=Policy.EXP4,
            outputs=combined.votes,
            predictions=combined.predictions,
            ensemble=ensemble,
            answers={m: _classes(o) for m, o in outputs.items()},
            considered=eligible,
            members=[answered[m] for m in members if m in answered],
        )

    def _record(self, app_id: str, answer: Answer) -> None:
        record = QueryRecord(
            query_id=answer.result.query_id,
            app_id=app_id,
            policy=answer.policy,
            answers=answer.answers or {answer.result.decision.variant.model_name: answer.predictions},
            predictions=answer.predictions,
            classes=int(answer.outputs.shape[1]),
            probability=answer.probability,
            considered=answer.considered or [],
        )
        try:
            self.store.put_query(record, self._record_ttl_s)
        except Exception:  # feedback bookkeeping never fails a query that was answered
            logger.exception("query not recorded for feedback", extra={"query_id": record.query_id})

    # --- feedback -------------------------------------------------------------------------------
    def feedback(self, app_id: str, query_id: str, given: GivenFeedback) -> Receipt:
        """Match feedback to the app's query, count each model's outcome, and let the policy that
        answered learn from it. Given again (the same): the first receipt, nothing changes;
        different feedback for a query that has some: ConflictError."""
        record = self.store.get_query(app_id, query_id)
        if record is None:
            raise NotFoundError(
                f"query {query_id!r} is unknown in app {app_id!r} (or older than "
                f"{self._record_ttl_s:g} s: feedback must come within that)",
                queryId=query_id,
            )
        rewards = rewards_of(record, given)
        previous = self.store.claim_feedback(app_id, query_id, given.to_json(), self._record_ttl_s)
        if previous is not None:
            if previous != given.to_json():
                raise ConflictError(
                    f"query {query_id!r} has feedback already, different from this one",
                    queryId=query_id,
                    given=json.loads(previous),
                )
            return Receipt(query_id, record.policy, rewards, duplicate=True)
        self.store.add_outcomes(app_id, rewards)
        if record.policy is Policy.EXP3 and record.probability is not None:
            [(model, reward)] = rewards.items()
            probability, considered = record.probability, record.considered
            self.store.update_weights(
                app_id,
                Policy.EXP3,
                lambda w: exp3_update(w, model, 1 - reward, probability, self.params, considered),
            )
        elif record.policy is Policy.EXP4:
            losses = {model: 1 - reward for model, reward in rewards.items()}
            self.store.update_weights(
                app_id, Policy.EXP4, lambda w: exp4_update(w, losses, self.params, record.considered)
            )
        return Receipt(query_id, record.policy, rewards, duplicate=False)

    def outcomes(self, app_id: str) -> dict[str, ModelOutcomes]:
        return self.store.outcomes(app_id)


def rewards_of(record: QueryRecord, given: GivenFeedback) -> dict[str, float]:
    """Per model that answered the query, its reward: the fraction of rows it classed as the
    labels say; with a reward instead, that reward for every model whose answer was the reply's
    (a reward says nothing of a member that answered otherwise: it is left out)."""
    if given.labels is not None:
        labels = given.labels * record.rows if len(given.labels) == 1 else given.labels
        if len(labels) != record.rows:
            raise InvalidInputError(
                f"{len(given.labels)} labels for a query of {record.rows} rows: one per row, or one for all",
                rows=record.rows,
            )
        if any(not 0 <= label < record.classes for label in labels):
            raise InvalidInputError(
                f"labels are classes in [0, {record.classes}), got {sorted(set(labels))[:10]}",
                classes=record.classes,
            )
        return {
            model: round(1 - loss_of(predicted, labels), 6) for model, predicted in record.answers.items()
        }
    if given.reward is None:
        raise InvalidInputError("give a label (or one per row) or a reward")
    return {
        model: given.reward for model, predicted in record.answers.items() if predicted == record.predictions
    }


def _single(result: QueryResult, policy: Policy) -> Answer:
    return Answer(result=result, policy=policy, outputs=result.outputs, predictions=_classes(result.outputs))


def _classes(outputs: np.ndarray) -> list[int]:
    return [int(c) for c in np.argmax(outputs, axis=1)]
