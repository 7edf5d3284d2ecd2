"""The Dispatcher: getVariant, then the worker or the Lambda tier, with per-stage timings.

One query: ``select`` asks the policy (``modelless.selection``, a pure function) for a decision
over the candidates of the profile cache (``profiles``) and the workers of the live view
(``live_view``); the query is counted for its group (``query_load``); the attempt loop
(``attempts``) runs it there, and elsewhere when that place fails. A miss that only a variant's
load stood in the way of starts that load (a warm-up) so that the next such query is served.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from aws_lambda_powertools import Logger

from modelless.cache.predictions import CachedPredictions
from modelless.config import STALE_CACHE_MAX_AGE_S
from modelless.dispatch.attempts import MAX_INVOKE_TIMEOUT_S, Attempts
from modelless.dispatch.cached import Answered, Pending, QueryCache
from modelless.dispatch.live_view import LIVE_STATE_TTL_S, LiveView
from modelless.dispatch.profiles import ProfileCache
from modelless.exceptions import NotFoundError, NotReadyError, StoreUnavailableError, TargetsUnreachableError
from modelless.metadata.base import MetadataStore
from modelless.pools.invokers import LambdaInvoker, WorkerInvoker
from modelless.query_load import QueryLoadCounter, group_of
from modelless.selection import (
    NO_LAMBDA_TIER,
    Candidates,
    SelectionPolicy,
    needs_warming,
    unreachable_error,
)
from modelless.serving.runtime import warmup_invocation
from modelless.tracing import APP, CACHE_HIT, COLD_START, MODEL, RETRIED, TIER, VARIANT, WORKER, enabled, span
from modelless.types import (
    Decision,
    InstanceState,
    LambdaTierState,
    QueryTargets,
    Tier,
    VariantProfile,
    WorkerState,
)

logger = Logger(service="gateway", child=True)

# The stages a cache hit skips: reported as 0 ms, so that every reply has the same timings.
CACHE_HIT_SKIPPED = ("selection_ms", "queue_ms", "load_ms", "cold_start_ms", "inference_ms", "transport_ms")


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
    cached: bool = False  # answered from the prediction cache: no selection, no inference


class Dispatcher:
    def __init__(
        self,
        store: MetadataStore,
        policy: SelectionPolicy,
        workers: WorkerInvoker,
        lambda_tier: LambdaInvoker | None,
        cache_ttl_s: float = 60.0,
        extra_workers: Callable[[], list[WorkerState]] | None = None,
        live_state_ttl_s: float = LIVE_STATE_TTL_S,
        lambda_state: Callable[[], LambdaTierState] | None = None,
        stale_max_age_s: float = STALE_CACHE_MAX_AGE_S,
        predictions: CachedPredictions | None = None,
    ) -> None:
        """``lambda_state``: the Lambda tier's idle containers and expected cold start, read on
        every decision; by default the tier's own ``tier_state`` where it has one (the local
        tier). Without it (AWS: nothing tells which containers are warm) the tier is taken as
        warm, which provisioned concurrency makes true. ``extra_workers``: state not kept in the
        store, e.g. the local Lambda tier's warm containers. ``stale_max_age_s``: how long after
        a good read the profiles and the live state may answer for the store while it is
        unreachable (``Settings.stale_cache_max_age_s``). ``predictions``: the prediction cache
        queries are looked up in before selection (``dispatch.cached``); None: no cache."""
        self._store = store
        self._policy = policy
        self._has_lambda_tier = lambda_tier is not None
        if lambda_state is None:
            lambda_state = getattr(lambda_tier, "tier_state", None)
        self._lambda_state = lambda_state
        self.profiles = ProfileCache(store, cache_ttl_s, stale_max_age_s)
        self.live_view = LiveView(store, live_state_ttl_s, extra_workers, stale_max_age_s)
        self.attempts = Attempts(workers, lambda_tier, self.live_view, self._redecide)
        self.cache = None if predictions is None else QueryCache(predictions, self.profiles, self.live_view)
        self._query_load = QueryLoadCounter()
        self._warming: set[str] = set()
        self._background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="warmup")

    def clear_caches(self) -> None:
        """Forget every cached read: the next decision is a new gateway's first (cold) one."""
        self.live_view.forget_snapshots()
        self.profiles.clear()

    def select(self, targets: QueryTargets) -> Decision:
        refresh = False
        while True:
            version, workers, fresh = self.live_view.view(targets.app_id, refresh)
            candidates = self.profiles.candidates(targets, version)
            if candidates:
                try:
                    decision = self._get_variant(targets, candidates, workers)
                except TargetsUnreachableError:
                    pass
                else:
                    if needs_warming(decision, targets):
                        self._warm_ahead(targets, candidates, workers)
                    return decision
            if fresh:
                break
            # A miss from a snapshot: decide again on what the store says now (a model published
            # or a worker started since the snapshot must not be refused or missed).
            refresh = True
        if not candidates:
            self._explain_no_candidates(targets)
        # The candidates met the accuracy but not the latency: name the closest of them all.
        everything = self._store.list_variants(targets.app_id, targets.model_name)
        error = unreachable_error(targets, everything)
        warm = self._warm_ahead(targets, candidates, workers)
        if warm is not None:
            # Only the load time was in the way: it is being loaded for the next such query.
            error.details["warming"] = {
                "variant": warm.variant.variant_id,
                "tier": warm.tier.value,
                "worker": warm.worker_id,
                "retry_after_ms": round(warm.variant.load_latency_ms, 1),
            }
            error.message += f"; {warm.variant.variant_id} meets them once loaded and is being loaded now"
        raise error

    def _redecide(self, targets: QueryTargets, leave_out: set[str]) -> Decision:
        """A retry's decision (``attempts.Redecide``): on a fresh read of the live state, without
        the workers in ``leave_out``. ``targets`` carry what is left of the budget; the candidates
        are the query's own (a list is cut by app, model and accuracy only)."""
        version, workers, _ = self.live_view.view(targets.app_id, refresh=True)
        workers = [w for w in workers if w.worker_id not in leave_out]
        return self._get_variant(targets, self.profiles.candidates(targets, version), workers)

    def _get_variant(
        self, targets: QueryTargets, candidates: Candidates, workers: Sequence[WorkerState]
    ) -> Decision:
        """The policy's decision, with the Lambda tier's containers when it can see them, and
        without a Lambda tier to spill to when there is none (``NO_LAMBDA_TIER``)."""
        if self._lambda_state is not None:
            return self._policy.get_variant(targets, candidates, workers, lambda_tier=self._lambda_state())
        if not self._has_lambda_tier:
            return self._policy.get_variant(targets, candidates, workers, lambda_tier=NO_LAMBDA_TIER)
        return self._policy.get_variant(targets, candidates, workers)

    def _warm_ahead(
        self, targets: QueryTargets, candidates: Sequence[VariantProfile], workers: Sequence[WorkerState]
    ) -> Decision | None:
        """Load, in the background, what would meet ``targets`` once loaded (the policy's
        ``warmup``), so that the next such query is served in time; what it loads, or None."""
        warm = self._policy.warmup(targets, candidates, workers)
        if warm is None or (warm.tier is Tier.LAMBDA and not self._has_lambda_tier):
            return None  # nowhere to load it: no worker has room and there is no Lambda tier
        self._start_warmup(warm)
        return warm

    def _start_warmup(self, decision: Decision) -> None:
        variant = decision.variant
        if variant.variant_id in self._warming:
            return
        self._warming.add(variant.variant_id)
        invocation = warmup_invocation(
            variant, self.profiles.input_contract(variant.app_id, variant.model_name)
        )

        def load() -> None:
            try:
                self.attempts.run(decision, invocation, MAX_INVOKE_TIMEOUT_S)
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

    def _traced_selection(self, targets: QueryTargets) -> Decision:
        with span("modelless.selection", {APP: targets.app_id}) as selection:
            decision = self.select(targets)
            if enabled():  # the attributes are gathered only where a span records them
                selection.set_attributes(
                    {
                        MODEL: decision.variant.model_name,
                        VARIANT: decision.variant.variant_id,
                        TIER: decision.tier.value,
                    }
                )
        return decision

    def online_query(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        correlation_id: str = "",
        decode_ms: float | None = None,
        received: float | None = None,
    ) -> QueryResult:
        """Serve one query. ``received``: when the gateway received it (``time.perf_counter()``),
        where its clock starts — its budget and its deadline count the time spent reading,
        decoding and waiting for a thread too; now when not given. ``decode_ms``: what the caller
        spent reading and decoding the query's body into ``inputs``, reported as ``decode_ms``;
        ``total_ms`` covers the query from ``received`` to its answer."""
        query_id = correlation_id or uuid.uuid4().hex
        looking = time.perf_counter()
        started = looking if received is None else received
        # The prediction cache first (Clipper §4.2): a hit skips selection and inference.
        cached = None
        if self.cache is not None:
            with span("modelless.cache", {APP: targets.app_id}) as lookup:
                cached = self.cache.look_up(targets, inputs)
                lookup.set_attribute(CACHE_HIT, isinstance(cached, Answered))
        selecting = time.perf_counter()
        cache_ms = {} if self.cache is None else {"cache_ms": (selecting - looking) * 1000}
        if isinstance(cached, Answered):
            return self._cached_result(cached, query_id, cache_ms["cache_ms"], started, decode_ms, received)
        decision = self._traced_selection(targets)
        selected = time.perf_counter()
        self._count_query(targets)
        with span("modelless.dispatch", {APP: targets.app_id}) as dispatch:
            reply, served = self.attempts.serve(targets, inputs, query_id, decision, started)
            if enabled():  # where it ran (a retry may have moved it), and the worker's own times
                dispatch.set_attributes(
                    {
                        MODEL: served.variant.model_name,
                        VARIANT: served.variant.variant_id,
                        TIER: served.tier.value,
                        WORKER: served.worker_id or "",
                        RETRIED: served is not decision,
                        COLD_START: reply.cold_start,
                        "modelless.queue_ms": reply.queue_ms,
                        "modelless.load_ms": reply.load_ms,
                        "modelless.inference_ms": reply.inference_ms,
                    }
                )
        finished = time.perf_counter()
        outputs = reply.outputs
        if self.cache is not None and isinstance(cached, Pending):
            self.cache.remember(cached, served.variant, outputs)
        timings = {
            **cache_ms,
            "selection_ms": (selected - selecting) * 1000,
            "queue_ms": reply.queue_ms,
            "load_ms": reply.load_ms,
            "cold_start_ms": reply.init_ms,
            "inference_ms": reply.inference_ms,
            "transport_ms": max(0.0, (finished - selected) * 1000 - reply.total_ms),
            "total_ms": (finished - started) * 1000,
        }
        if decode_ms is not None:
            timings = {"decode_ms": decode_ms, **timings}
            if received is None:  # the caller decoded before our clock started: count it too
                timings["total_ms"] += decode_ms
        return QueryResult(
            outputs=outputs,
            decision=served,
            tier=served.tier,
            worker_id=served.worker_id if served.tier is Tier.WORKER else None,
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            cold_start=reply.cold_start,
            retried=served is not decision,
            query_id=query_id,
        )

    def _cached_result(
        self,
        cached: Answered,
        query_id: str,
        cache_ms: float,
        started: float,
        decode_ms: float | None,
        received: float | None,
    ) -> QueryResult:
        """A query answered from the cache: its stages other than the lookup took no time. Not
        counted in the query load: it needs no capacity."""
        timings = {
            "cache_ms": cache_ms,
            **dict.fromkeys(CACHE_HIT_SKIPPED, 0.0),
            "total_ms": (time.perf_counter() - started) * 1000,
        }
        if decode_ms is not None:
            timings = {"decode_ms": decode_ms, **timings}
            if received is None:
                timings["total_ms"] += decode_ms
        computed_by = ", ".join(dict.fromkeys(cached.hit.variant_ids))
        decision = Decision(
            variant=cached.variant,
            tier=Tier.CACHE,
            worker_id=None,
            state=InstanceState.ACTIVE,
            expected_latency_ms=0.0,
            reason=f"answered from the prediction cache (computed by {computed_by})",
        )
        return QueryResult(
            outputs=cached.hit.outputs,
            decision=decision,
            tier=Tier.CACHE,
            worker_id=None,
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            cold_start=False,
            retried=False,
            query_id=query_id,
            cached=True,
        )

    def _count_query(self, targets: QueryTargets) -> None:
        """Count the query for its group's query load; about once a second, hand the counts to
        the store (one write per gateway per second, whatever the query rate)."""
        now = time.time()
        self._query_load.record(group_of(targets), now)
        if self._query_load.due(now):
            try:
                taken = self._query_load.take(now)
                self._store.add_load(taken.counts, int(now), taken.peaks)
            except StoreUnavailableError as error:  # the store logs the outage itself, once
                logger.debug("query load not recorded", extra={"error": error.message})
            except Exception:  # query-load accounting must never fail a query
                logger.exception("could not record query load")
