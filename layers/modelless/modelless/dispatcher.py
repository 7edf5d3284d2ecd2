"""The Dispatcher: getVariant, then the worker or the Lambda tier, with per-stage timings."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.exceptions import (
    NotFoundError,
    NotReadyError,
    ServiceUnavailableError,
    TargetsUnreachableError,
)
from modelless.load import LoadRecorder, group_of
from modelless.metadata.base import MetadataStore
from modelless.pools.invokers import LambdaInvoker, WorkerInvoker, WorkerUnreachableError
from modelless.runtime import decode_array, invocation_payload
from modelless.selection import SelectionPolicy, unreachable_error
from modelless.types import (
    Decision,
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Tier,
    VariantProfile,
    WorkerState,
)

logger = Logger(service="gateway", child=True)

# How long a load this dispatcher made counts as Active before the worker's own report shows it.
RECENT_LOAD_S = 3.0

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
    version: int
    expires_at: float
    variants: list[VariantProfile] = field(default_factory=list)


class Dispatcher:
    def __init__(
        self,
        store: MetadataStore,
        policy: SelectionPolicy,
        workers: WorkerInvoker,
        lambda_tier: LambdaInvoker | None,
        cache_ttl_s: float = 60.0,
        extra_workers: Callable[[], list[WorkerState]] | None = None,
    ) -> None:
        self._store = store
        self._policy = policy
        self._workers = workers
        self._lambda = lambda_tier
        self._cache_ttl_s = cache_ttl_s
        self._cache: dict[tuple[str, str | None, float], _CacheEntry] = {}
        self._profiles: dict[str, _CacheEntry] = {}  # app -> all its profiles, parsed once
        self._contracts: dict[tuple[str, str | None], tuple[float, ModelRecord]] = {}
        self._warming: set[str] = set()
        self._recent_loads: dict[tuple[str, str], float] = {}  # (worker, variant) -> when loaded
        self._load = LoadRecorder()
        self._background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="warmup")
        # State not kept in the store, e.g. the local Lambda tier's warm containers.
        self._extra_workers = extra_workers

    def candidates(self, targets: QueryTargets, version: int) -> list[VariantProfile]:
        """Static profiles meeting the accuracy target, cached until the app's profiles version
        changes (or the TTL passes, as a safety net): a selection then costs one store round trip,
        the one that reads the live state and the version together."""
        key = (targets.app_id, targets.model_name, targets.min_accuracy)
        now = time.monotonic()
        entry = self._cache.get(key)
        if entry is None or entry.version != version or entry.expires_at < now:
            # Every target's list holds references into one parsed copy of the app's profiles:
            # parsing per target would multiply the objects the garbage collector walks.
            app_profiles = self._app_profiles(targets.app_id, version, now)
            variants = [
                v
                for v in app_profiles
                if v.accuracy >= targets.min_accuracy
                and (targets.model_name is None or v.model_name == targets.model_name)
            ]
            entry = _CacheEntry(version, now + self._cache_ttl_s, variants)
            self._cache[key] = entry
        return entry.variants

    def _app_profiles(self, app_id: str, version: int, now: float) -> list[VariantProfile]:
        entry = self._profiles.get(app_id)
        if entry is None or entry.version != version or entry.expires_at < now:
            entry = _CacheEntry(version, now + self._cache_ttl_s, self._store.list_variants(app_id))
            self._profiles[app_id] = entry
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

    def live_workers(self, reported: list[WorkerState] | None = None) -> list[WorkerState]:
        """Workers as selection sees them: their reports, this dispatcher's own recent loads,
        and state kept outside the store (the local Lambda tier)."""
        if reported is None:
            reported = self._store.list_workers()
        workers = [self._with_recent_loads(w) for w in reported]
        if self._extra_workers is not None:
            workers.extend(self._extra_workers())
        return workers

    def _with_recent_loads(self, worker: WorkerState) -> WorkerState:
        """Add instances this dispatcher loaded since the worker last reported (reports come
        every second): without them, the next query would load a second copy elsewhere."""
        now = time.monotonic()
        reported = {i.variant_id for i in worker.instances}
        extra = [
            InstanceStats(variant_id, InstanceState.ACTIVE, 0.0, 0.0, 0.0, 0)
            for (worker_id, variant_id), loaded_at in list(self._recent_loads.items())
            if worker_id == worker.worker_id
            and variant_id not in reported
            and now - loaded_at < RECENT_LOAD_S
        ]
        if not extra:
            return worker
        return dataclasses.replace(
            worker,
            instances=(*worker.instances, *extra),
            free_slots=max(0, worker.free_slots - len(extra)),
        )

    def select(self, targets: QueryTargets) -> Decision:
        version, reported = self._store.selection_state(targets.app_id)
        candidates = self.candidates(targets, version)
        if not candidates:
            self._explain_no_candidates(targets)
        workers = self.live_workers(reported)
        try:
            return self._policy.get_variant(targets, candidates, workers)
        except TargetsUnreachableError:
            # The candidates met the accuracy but not the latency: name the closest of them all.
            everything = self._store.list_variants(targets.app_id, targets.model_name)
            error = unreachable_error(targets, everything)
        warm = self._policy.warmup(targets, candidates, workers)
        if warm is not None:
            # Only the load time was in the way: load it now so the next such query is served.
            self._start_warmup(warm)
            error.details["warming"] = {
                "variant": warm.variant.variant_id,
                "tier": warm.tier.value,
                "worker": warm.worker_id,
                "retry_after_ms": round(warm.variant.load_latency_ms, 1),
            }
            error.message += f"; {warm.variant.variant_id} meets them once loaded and is being loaded now"
        raise error

    def _start_warmup(self, decision: Decision) -> None:
        variant = decision.variant
        if variant.variant_id in self._warming:
            return
        self._warming.add(variant.variant_id)
        contract = self.input_contract(variant.app_id, variant.model_name)
        zeros = np.zeros((1, *contract.input_shape), dtype=np.float32)
        payload = invocation_payload(variant, zeros, f"warmup-{uuid.uuid4().hex}")

        def load() -> None:
            try:
                self._run(decision, payload, MAX_INVOKE_TIMEOUT_S)
            except Exception:
                logger.exception("warm-up failed", extra={"variant": variant.variant_id})
            finally:
                self._warming.discard(variant.variant_id)

        self._background.submit(load)

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
        self._record_load(targets)
        remaining_ms = None
        if targets.latency_ms is not None:
            remaining_ms = max(0.0, targets.latency_ms - (selected - started) * 1000)
        payload = invocation_payload(decision.variant, inputs, query_id, remaining_ms)
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

    def _record_load(self, targets: QueryTargets) -> None:
        """Count the query for its group; about once a second, hand the counts to the store (one
        write per gateway per second, whatever the query rate)."""
        self._load.record(group_of(targets))
        now = time.time()
        if self._load.due(now):
            try:
                self._store.add_load(self._load.take(now), int(now))
            except Exception:  # load accounting must never fail a query
                logger.exception("could not record query load")

    def _run(self, decision: Decision, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if decision.tier is Tier.LAMBDA or decision.worker_address is None:
            return self._invoke_lambda(payload, timeout_s)
        body = self._workers.invoke(decision.worker_address, payload, timeout_s)
        if decision.state is InstanceState.INACTIVE and decision.worker_id is not None:
            self._recent_loads[(decision.worker_id, decision.variant.variant_id)] = time.monotonic()
        return body

    def _invoke_lambda(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._lambda is None:
            raise ServiceUnavailableError("no Lambda tier is configured and no worker has room")
        return self._lambda.invoke(payload, timeout_s)
