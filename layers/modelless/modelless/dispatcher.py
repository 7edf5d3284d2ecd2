"""The Dispatcher: getVariant, then the worker or the Lambda tier, with per-stage timings."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelless.exceptions import (
    NotFoundError,
    NotReadyError,
    ServiceUnavailableError,
    TargetsUnreachableError,
)
from modelless.metadata.base import MetadataStore
from modelless.pools.invokers import LambdaInvoker, WorkerInvoker, WorkerUnreachableError
from modelless.runtime import decode_array, encode_array
from modelless.selection import SelectionPolicy, unreachable_error
from modelless.types import Decision, ModelRecord, QueryTargets, Tier, VariantProfile, WorkerState

# Never wait on compute for longer than this, whatever the budget: a query fails, it never hangs.
MAX_INVOKE_TIMEOUT_S = 30.0


@dataclass
class QueryResult:
    outputs: np.ndarray
    decision: Decision
    tier: Tier
    worker_id: str | None
    timings_ms: dict[str, float]
    cold_start: bool
    retried: bool
    query_id: str


@dataclass
class _CacheEntry:
    expires_at: float
    variants: list[VariantProfile] = field(default_factory=list)


class Dispatcher:
    def __init__(
        self,
        store: MetadataStore,
        policy: SelectionPolicy,
        workers: WorkerInvoker,
        lambda_tier: LambdaInvoker | None,
        cache_ttl_s: float = 2.0,
        extra_workers: Callable[[], list[WorkerState]] | None = None,
    ) -> None:
        self._store = store
        self._policy = policy
        self._workers = workers
        self._lambda = lambda_tier
        self._cache_ttl_s = cache_ttl_s
        self._cache: dict[tuple[str, str | None, float], _CacheEntry] = {}
        self._contracts: dict[tuple[str, str | None], tuple[float, ModelRecord]] = {}
        # State not kept in the store, e.g. the local Lambda tier's warm containers.
        self._extra_workers = extra_workers

    def candidates(self, targets: QueryTargets) -> list[VariantProfile]:
        """Static profiles meeting the accuracy target, cached briefly: selection then costs at
        most one store round trip (the live worker state)."""
        key = (targets.app_id, targets.model_name, targets.min_accuracy)
        now = time.monotonic()
        entry = self._cache.get(key)
        if entry is None or entry.expires_at < now:
            variants = self._store.candidate_variants(
                targets.app_id, targets.min_accuracy, targets.model_name
            )
            entry = _CacheEntry(now + self._cache_ttl_s, variants)
            self._cache[key] = entry
        return entry.variants

    def input_contract(self, app_id: str, model_name: str | None) -> ModelRecord:
        """The input shape the query must have: the named model's, or the app's (an app's models
        share one input shape, which registration enforces). Cached like the profiles."""
        key = (app_id, model_name)
        now = time.monotonic()
        cached = self._contracts.get(key)
        if cached is not None and cached[0] >= now:
            return cached[1]
        if model_name is not None:
            model = self._store.get_model(app_id, model_name)
            if model is None:
                raise NotFoundError(
                    f"model {model_name!r} is not registered in app {app_id!r}", model=model_name
                )
        else:
            models = self._store.list_models(app_id)
            if not models:
                raise NotFoundError(f"app {app_id!r} has no registered models", app=app_id)
            model = models[0]
        self._contracts[key] = (now + self._cache_ttl_s, model)
        return model

    def live_workers(self) -> list[WorkerState]:
        workers = self._store.list_workers()
        if self._extra_workers is not None:
            workers.extend(self._extra_workers())
        return workers

    def select(self, targets: QueryTargets) -> Decision:
        candidates = self.candidates(targets)
        if not candidates:
            self._explain_no_candidates(targets)
        try:
            return self._policy.get_variant(targets, candidates, self.live_workers())
        except TargetsUnreachableError:
            # The candidates met the accuracy but not the latency: name the closest of them all.
            everything = self._store.list_variants(targets.app_id, targets.model_name)
            raise unreachable_error(targets, everything) from None

    def _explain_no_candidates(self, targets: QueryTargets) -> None:
        """Off the hot path: say why nothing qualified (unknown model, not ready, too accurate)."""
        if targets.model_name is not None:
            model = self._store.get_model(targets.app_id, targets.model_name)
            if model is None:
                raise NotFoundError(
                    f"model {targets.model_name!r} is not registered in app {targets.app_id!r}",
                    model=targets.model_name,
                )
            if not model.ready:
                raise NotReadyError(
                    f"model {targets.model_name!r} is still being profiled",
                    registration=model.registration_id,
                )
        everything = self._store.list_variants(targets.app_id, targets.model_name)
        if not everything:
            if not self._store.list_models(targets.app_id):
                raise NotFoundError(f"app {targets.app_id!r} has no registered models", app=targets.app_id)
            raise NotReadyError(f"the models of app {targets.app_id!r} are still being profiled")
        raise unreachable_error(targets, everything)

    def online_query(
        self, targets: QueryTargets, inputs: np.ndarray, correlation_id: str = ""
    ) -> QueryResult:
        query_id = correlation_id or uuid.uuid4().hex
        started = time.perf_counter()
        decision = self.select(targets)
        selected = time.perf_counter()
        payload: dict[str, Any] = {
            "variant_id": decision.variant.variant_id,
            "variant": decision.variant.to_json(),
            "inputs_npy_b64": encode_array(inputs),
            "correlation_id": query_id,
        }
        timeout_s = MAX_INVOKE_TIMEOUT_S
        tier, retried = decision.tier, False
        try:
            body = self._run(decision, payload, timeout_s)
        except WorkerUnreachableError:
            # The worker died or vanished mid-query: retry once on the Lambda tier.
            if self._lambda is None or tier is Tier.LAMBDA:
                raise
            tier, retried = Tier.LAMBDA, True
            body = self._invoke_lambda(payload, timeout_s)
        finished = time.perf_counter()
        total_ms = (finished - started) * 1000
        compute_ms = (
            float(body["queue_ms"])
            + float(body["inference_ms"])
            + float(body["load_ms"])
            + float(body.get("init_ms", 0.0))
        )
        timings = {
            "selection_ms": (selected - started) * 1000,
            "queue_ms": float(body["queue_ms"]),
            "load_ms": float(body["load_ms"]),
            "cold_start_ms": float(body.get("init_ms", 0.0)),
            "inference_ms": float(body["inference_ms"]),
            "transport_ms": max(0.0, (finished - selected) * 1000 - compute_ms),
            "total_ms": total_ms,
        }
        return QueryResult(
            outputs=decode_array(body["outputs_npy_b64"]),
            decision=decision,
            tier=tier,
            worker_id=decision.worker_id if tier is Tier.WORKER else None,
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            cold_start=bool(body.get("cold_start", False)),
            retried=retried,
            query_id=query_id,
        )

    def _run(self, decision: Decision, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if decision.tier is Tier.LAMBDA or decision.worker_address is None:
            return self._invoke_lambda(payload, timeout_s)
        return self._workers.invoke(decision.worker_address, payload, timeout_s)

    def _invoke_lambda(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._lambda is None:
            raise ServiceUnavailableError("no Lambda tier is configured and no worker has room")
        return self._lambda.invoke(payload, timeout_s)
