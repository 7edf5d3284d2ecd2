"""Where an offline job's next batch runs, and running it.

The variant comes from the same selection policy online queries use (INFaaS ``getVariant``,
with no latency target), among the variants of provisioned pools: offline work runs on the
spare capacity of workers, never on the Lambda tier, whose capacity is bought per request for
online bursts. It is chosen once per job (every result of a job comes from one variant) and each
batch then goes to a worker running it that the throttle lets offline work use, or to a worker
with a free slot to load it into. When no worker qualifies, the job waits.

A worker whose run failed (dead, hung, unreachable) is left out of the next decisions for a while
(``FAILED_WORKER_HOLD_S``, as online queries do): its last report stays fresh in the store for
seconds after it died, and the retry of the batch goes to another worker (or to the one its pool
started in its place) instead of to the dead one again.

Batches are sent as offline invocations (``Invocation.offline``): the worker runs them in its
instances' idle moments, never batched with online queries, and records them apart from online
traffic.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from modelless.catalog import PoolKind, PoolSpec
from modelless.dispatch.live_view import FAILED_WORKER_HOLD_S
from modelless.exceptions import ModellessError, NotFoundError, NotReadyError, TargetsUnreachableError
from modelless.metadata.base import ModelStore
from modelless.offline.throttle import RUNNING, ThrottleConfig, ThrottleState, next_state
from modelless.pools.invokers import WorkerInvoker
from modelless.selection import InfaasPolicy, unreachable_error
from modelless.serving.invocation import Invocation
from modelless.types import Decision, OfflineJob, QueryTargets, Tier, VariantProfile, WorkerState

# An offline run waits in the worker for an idle moment (up to the batcher's own bound, 25 s).
OFFLINE_INVOKE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Paused:
    """No worker may take offline work now, and why."""

    reason: str


@dataclass(frozen=True)
class RunResult:
    outputs: np.ndarray
    worker_id: str | None
    inference_ms: float


class Compute(Protocol):
    def choose_variant(self, job: OfflineJob) -> VariantProfile:
        """The variant that serves every input of the job (raises when none can)."""

    def acquire(self, variant: VariantProfile, rows: int) -> Decision | Paused:
        """Where ``rows`` inputs of ``variant`` may run now, or why nowhere."""

    def run(self, decision: Decision, inputs: np.ndarray, correlation_id: str) -> RunResult:
        """Run one batch where ``decision`` says (raises the worker's error)."""


def offline_candidates(
    store: ModelStore,
    pools: Mapping[str, PoolSpec],
    app_id: str,
    min_accuracy: float,
    model_name: str | None,
) -> list[VariantProfile]:
    """The variants an offline job may use: accurate enough, of a provisioned pool."""
    return [
        v
        for v in store.candidate_variants(app_id, min_accuracy, model_name)
        if (spec := pools.get(v.pool)) is not None and spec.kind is PoolKind.PROVISIONED
    ]


def explain_no_candidates(
    store: ModelStore, app_id: str, min_accuracy: float, model_name: str | None
) -> Exception:
    """Why an offline job has no variant: an unknown or unready model, or an accuracy no
    variant of a provisioned pool reaches (naming the closest, as online queries do)."""
    if model_name is not None:
        model = store.get_model(app_id, model_name)
        if model is None:
            return NotFoundError(
                f"model {model_name!r} is not registered in app {app_id!r}", model=model_name
            )
        if not model.ready:
            return NotReadyError(
                f"model {model_name!r} is still being profiled", registration=model.registration_id
            )
    everything = store.list_variants(app_id, model_name)
    if not everything:
        if not store.list_models(app_id):
            return NotFoundError(f"app {app_id!r} has no registered models", app=app_id)
        return NotReadyError(f"the models of app {app_id!r} are still being profiled")
    error: TargetsUnreachableError = unreachable_error(
        QueryTargets(app_id, None, min_accuracy, model_name), everything
    )
    error.message = f"offline jobs run on provisioned workers: {error.message}"
    return error


def batch_rows(variant: VariantProfile, max_rows: int, run_ms: float) -> int:
    """Rows per offline run: the largest profiled batch size up to ``max_rows`` whose profiled
    latency stays within ``run_ms`` (an online query may have to wait for one run), at least 1."""
    sizes = sorted(b for b in variant.latency_p99_ms if b <= max_rows) or [1]
    fitting = [b for b in sizes if variant.latency_ms(b) <= run_ms]
    return max(fitting) if fitting else min(sizes)


class WorkerCompute:
    def __init__(
        self,
        store: ModelStore,
        pools: Mapping[str, PoolSpec],
        live_workers: Callable[[], Sequence[WorkerState]],
        invoker: WorkerInvoker,
        throttle: ThrottleConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._pools = pools
        self._live_workers = live_workers
        self._invoker = invoker
        self._config = throttle or ThrottleConfig()
        self._clock = clock
        self._policy = InfaasPolicy(pools)
        self._throttle: dict[str, ThrottleState] = {}
        # The worker the last batch ran on: kept while the throttle allows, so that a variant
        # loaded for this job is used again before the worker's next report shows it loaded.
        self._sticky: Decision | None = None
        # Workers whose run failed lately -> until when (this clock) decisions leave them out.
        self._held_out: dict[str, float] = {}

    def throttle_states(self) -> dict[str, ThrottleState]:
        return dict(self._throttle)

    def choose_variant(self, job: OfflineJob) -> VariantProfile:
        candidates = offline_candidates(
            self._store, self._pools, job.app_id, job.min_accuracy, job.model_name
        )
        if not candidates:
            raise explain_no_candidates(self._store, job.app_id, job.min_accuracy, job.model_name)
        targets = QueryTargets(job.app_id, None, job.min_accuracy, job.model_name)
        return self._policy.get_variant(targets, candidates, self._provisioned()).variant

    def acquire(self, variant: VariantProfile, rows: int) -> Decision | Paused:
        now = self._clock()
        workers = [w for w in self._provisioned() if w.pool == variant.pool]
        states = {
            w.worker_id: next_state(self._throttle.get(w.worker_id, RUNNING), w, now, self._config)
            for w in workers
        }
        self._throttle = states  # workers that stopped reporting are forgotten
        self._held_out = {w: until for w, until in self._held_out.items() if until > now}
        open_workers = [
            w for w in workers if not states[w.worker_id].paused and w.worker_id not in self._held_out
        ]
        sticky = self._sticky
        if (
            sticky is not None
            and sticky.variant.variant_id == variant.variant_id
            and any(w.worker_id == sticky.worker_id for w in open_workers)
        ):
            return sticky
        targets = QueryTargets(
            variant.app_id, None, 0.0, variant.model_name, batch=min(rows, variant.max_batch)
        )
        try:
            decision = self._policy.get_variant(targets, [variant], open_workers)
        except TargetsUnreachableError as error:
            return Paused(error.message)
        if decision.tier is Tier.WORKER and decision.worker_address:
            return decision
        if not workers:
            return Paused(f"no worker of pool {variant.pool!r} is running")
        paused = [s.reason for s in states.values() if s.paused]
        paused += [
            f"{w.worker_id}: its last offline run failed (left out for {FAILED_WORKER_HOLD_S:g} s)"
            for w in workers
            if w.worker_id in self._held_out
        ]
        if paused:
            return Paused("; ".join(paused[:3]))
        return Paused(
            f"no worker of pool {variant.pool!r} runs {variant.variant_id} or has a free slot for it"
        )

    def run(self, decision: Decision, inputs: np.ndarray, correlation_id: str) -> RunResult:
        assert decision.worker_address is not None
        invocation = Invocation(decision.variant, inputs, correlation_id, offline=True)
        try:
            reply = self._invoker.invoke(decision.worker_address, invocation, OFFLINE_INVOKE_TIMEOUT_S)
        except Exception as error:
            self._sticky = None
            refused = isinstance(error, ModellessError) and 400 <= error.status_code < 500
            if not refused and decision.worker_id is not None:  # a bad input is no fault of the worker
                self._held_out[decision.worker_id] = self._clock() + FAILED_WORKER_HOLD_S
            raise
        self._sticky = dataclasses.replace(decision, reason="the worker the job's last batch ran on")
        return RunResult(reply.outputs, decision.worker_id, reply.inference_ms)

    def _provisioned(self) -> list[WorkerState]:
        return [
            w
            for w in self._live_workers()
            if (spec := self._pools.get(w.pool)) is not None and spec.kind is PoolKind.PROVISIONED
        ]
