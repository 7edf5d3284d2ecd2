"""The Dispatcher: getVariant, then the worker or the Lambda tier, with per-stage timings."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.exceptions import (
    DeadlineExceededError,
    NotFoundError,
    NotReadyError,
    QueryFailedError,
    ServiceUnavailableError,
    TargetsUnreachableError,
    WorkerUnreachableError,
)
from modelless.load import LoadRecorder, group_of
from modelless.metadata.base import MetadataStore
from modelless.monitoring import OVERLOADED_QUEUE, saturated_queue
from modelless.pools.invokers import LambdaInvoker, WorkerInvoker
from modelless.runtime import decode_array, invocation_payload
from modelless.selection import (
    NO_LAMBDA_TIER,
    Candidates,
    LambdaTierState,
    SelectionPolicy,
    unreachable_error,
)
from modelless.types import (
    Decision,
    InstanceState,
    InstanceStats,
    ModelRecord,
    QueryTargets,
    Tier,
    WorkerState,
)

logger = Logger(service="gateway", child=True)

# How long a load this dispatcher made counts as Active before the worker's own report shows it.
RECENT_LOAD_S = 3.0

# How old the live state (workers' reports, the app's profiles version) a decision may use: the
# store is read at most once per this interval per app, in one round trip, and consecutive
# queries share the snapshot. Workers report every second anyway, and this dispatcher's own
# placements since are laid over the snapshot on every query. Kept under the quiet spell a
# stopping worker waits for (modelless/worker/http.py), so that queries sent from an old view
# still reach it. A miss (no variant meets the targets) is never answered from a snapshot. 0: read
# the store on every decision.
LIVE_STATE_TTL_S = 0.2

# Per-target candidate lists kept at most (targets carry arbitrary accuracies; each list holds
# references only): beyond it they start again from empty, the parsed profiles stay.
MAX_CACHED_TARGETS = 1024

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
# A worker that did not answer (dead, or hung) is left out of this dispatcher's decisions for this
# long: its last report stays fresh in the store for seconds after it died (WORKER_STALE_AFTER_S),
# and every query sent there meanwhile would pay a failed attempt (for a hung worker, a whole
# attempt's grace). After the hold it is tried again: a worker that is back serves at once.
FAILED_WORKER_HOLD_S = 2.0
# At most this many attempts per query: the first choice, another instance, the Lambda tier.
MAX_ATTEMPTS = 3
# This many of our own queries outstanding on one instance that does not batch: it is saturated
# now, before its next report says so (the worker's own threshold, ``saturated_queue``, which for
# a batching instance follows the batch size it reports). A burst is then spilled at once instead
# of queueing behind the instance for the second a report takes.
SATURATED_IN_FLIGHT = OVERLOADED_QUEUE


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
    variants: Candidates


@dataclass(frozen=True)
class _LiveState:
    read_at: float  # monotonic clock, taken before the read
    version: int  # the app's profiles version
    workers: list[WorkerState]  # as reported, least utilised first; never mutated


@dataclass(frozen=True)
class _QueryClock:
    """A query's time, on ``time.perf_counter()``'s clock: its latency budget and its deadline."""

    started: float
    budget_ms: float | None  # the latency target; None: the query named none
    deadline: float  # the budget + DEADLINE_GRACE_S; MAX_INVOKE_TIMEOUT_S without a budget

    @classmethod
    def start(cls, started: float, targets: QueryTargets) -> _QueryClock:
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
        time there is."""
        left = self.deadline - now
        if _on_lambda_tier(decision) or decision.state is InstanceState.INACTIVE:
            return left
        own_ms = max(self.budget_left_ms(now) or 0.0, decision.expected_latency_ms)
        return min(left, own_ms / 1000 + ATTEMPT_GRACE_S)

    def describe(self) -> str:
        if self.budget_ms is None:
            return f"no latency target: {MAX_INVOKE_TIMEOUT_S:g} s at most"
        return f"{self.budget_ms:g} ms budget + {DEADLINE_GRACE_S:g} s grace"


def _on_lambda_tier(decision: Decision) -> bool:
    return decision.tier is Tier.LAMBDA or decision.worker_address is None


def _where(decision: Decision) -> str:
    if _on_lambda_tier(decision):
        return f"{decision.variant.variant_id} on the Lambda tier"
    return f"{decision.variant.variant_id} on worker {decision.worker_id} ({decision.worker_address})"


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
    ) -> None:
        """``lambda_state``: the Lambda tier's idle containers and expected cold start, read on
        every decision; by default the tier's own ``tier_state`` where it has one (the local
        tier). Without it (AWS: nothing tells which containers are warm) the tier is taken as
        warm, which provisioned concurrency makes true."""
        self._store = store
        self._policy = policy
        self._workers = workers
        self._lambda = lambda_tier
        self._cache_ttl_s = cache_ttl_s
        self._live_state_ttl_s = live_state_ttl_s
        self._cache: dict[tuple[str, str | None, float], _CacheEntry] = {}
        self._profiles: dict[str, _CacheEntry] = {}  # app -> all its profiles, parsed once
        self._contracts: dict[tuple[str, str | None], tuple[float, ModelRecord]] = {}
        self._live: dict[str, _LiveState] = {}  # app -> its last read of the live state
        self._warming: set[str] = set()
        self._recent_loads: dict[tuple[str, str], float] = {}  # (worker, variant) -> when loaded
        self._recent_lock = threading.Lock()
        self._in_flight: dict[tuple[str, str], int] = {}  # our queries outstanding per (worker, variant)
        self._load = LoadRecorder()
        self._background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="warmup")
        # State not kept in the store, e.g. the local Lambda tier's warm containers.
        self._extra_workers = extra_workers
        if lambda_state is None:
            lambda_state = getattr(lambda_tier, "tier_state", None)
        self._lambda_state = lambda_state
        # Workers that failed a query lately -> until when (monotonic) decisions leave them out.
        self._held_out: dict[str, float] = {}

    def candidates(self, targets: QueryTargets, version: int) -> Candidates:
        """Static profiles meeting the accuracy target, cached until the app's profiles version
        changes (or the TTL passes, as a safety net), with the per-batch tables selection looks
        up (built on first use, kept with the list)."""
        key = (targets.app_id, targets.model_name, targets.min_accuracy)
        now = time.monotonic()
        entry = self._cache.get(key)
        if entry is None or entry.version != version or entry.expires_at < now:
            # Every target's list holds references into one parsed copy of the app's profiles
            # (parsing per target would multiply the objects the garbage collector walks), and
            # its tables are cut from the app's, already in order.
            app_profiles = self._app_profiles(targets.app_id, version, now)
            entry = _CacheEntry(
                version,
                now + self._cache_ttl_s,
                app_profiles.subset(targets.min_accuracy, targets.model_name),
            )
            if len(self._cache) >= MAX_CACHED_TARGETS:
                self._cache.clear()
            self._cache[key] = entry
        return entry.variants

    def _app_profiles(self, app_id: str, version: int, now: float) -> Candidates:
        entry = self._profiles.get(app_id)
        if entry is None or entry.version != version or entry.expires_at < now:
            entry = _CacheEntry(
                version, now + self._cache_ttl_s, Candidates(self._store.list_variants(app_id))
            )
            self._profiles[app_id] = entry
        return entry.variants

    def live_state(self, app_id: str, refresh: bool = False) -> tuple[int, list[WorkerState], bool]:
        """The app's profiles version and the workers as reported, from a snapshot at most
        ``live_state_ttl_s`` old (one store round trip when it is older), and whether this call
        read them. Without this dispatcher's recent loads: see ``live_workers``."""
        now = time.monotonic()
        state = self._live.get(app_id)
        if refresh or state is None or now - state.read_at >= self._live_state_ttl_s:
            version, reported = self._store.selection_state(app_id)
            state = _LiveState(now, version, reported)
            self._live[app_id] = state
            return state.version, state.workers, True
        return state.version, state.workers, False

    def forget_live_state(self) -> None:
        """Read the live state afresh on the next decision."""
        self._live.clear()

    def clear_caches(self) -> None:
        """Forget every cached read: the next decision is a new gateway's first (cold) one."""
        self._live.clear()
        self._cache.clear()
        self._profiles.clear()
        self._contracts.clear()

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
        """Workers as selection sees them: their reports (read now unless given), this
        dispatcher's own recent loads, and state kept outside the store (the local Lambda tier).
        Workers on hold after a failed query are listed: they are what the store says."""
        if reported is None:
            reported = self._store.list_workers()
        return list(self._overlay(reported, hold_out=False))

    def _overlay(self, reported: list[WorkerState], hold_out: bool = True) -> Sequence[WorkerState]:
        """The reports with this dispatcher's recent loads and the extra workers laid over them,
        without the workers on hold after a failure (for decisions: ``hold_out``); the reports
        themselves when there is nothing to change (the common case: no copy made)."""
        workers: Sequence[WorkerState] = reported
        if hold_out and self._held_out:
            held_out = self._held_out_now()
            if held_out:
                workers = [w for w in workers if w.worker_id not in held_out]
        if self._recent_loads:
            loaded = self._recent_loads_by_worker()
            if loaded:
                workers = [self._with_recent_loads(w, loaded.get(w.worker_id)) for w in workers]
        if self._in_flight:
            with self._recent_lock:
                in_flight = dict(self._in_flight)
            workers = [self._with_in_flight(w, in_flight) for w in workers]
        if self._extra_workers is not None:
            workers = [*workers, *self._extra_workers()]
        return workers

    def _held_out_now(self) -> set[str]:
        """The workers a failed query put on hold and whose hold has not ended; ended holds are
        forgotten."""
        now = time.monotonic()
        with self._recent_lock:
            for worker_id, until in list(self._held_out.items()):
                if until <= now:
                    del self._held_out[worker_id]
            return set(self._held_out)

    def _hold_out(self, worker_id: str) -> None:
        with self._recent_lock:
            self._held_out[worker_id] = time.monotonic() + FAILED_WORKER_HOLD_S

    def _recent_loads_by_worker(self) -> dict[str, list[str]]:
        """Variants this dispatcher loaded within RECENT_LOAD_S, per worker, in load order;
        older ones are forgotten."""
        now = time.monotonic()
        loaded: dict[str, list[str]] = {}
        with self._recent_lock:
            for key, loaded_at in list(self._recent_loads.items()):
                if now - loaded_at < RECENT_LOAD_S:
                    loaded.setdefault(key[0], []).append(key[1])
                else:
                    del self._recent_loads[key]
        return loaded

    @staticmethod
    def _with_recent_loads(worker: WorkerState, loaded: list[str] | None) -> WorkerState:
        """Add instances this dispatcher loaded since the worker last reported (reports come
        every second): without them, the next query would load a second copy elsewhere."""
        if not loaded:
            return worker
        reported = {i.variant_id for i in worker.instances}
        extra = [
            InstanceStats(variant_id, InstanceState.ACTIVE, 0.0, 0.0, 0.0, 0)
            for variant_id in loaded
            if variant_id not in reported
        ]
        if not extra:
            return worker
        return dataclasses.replace(
            worker,
            instances=(*worker.instances, *extra),
            free_slots=max(0, worker.free_slots - len(extra)),
        )

    @staticmethod
    def _with_in_flight(worker: WorkerState, in_flight: dict[tuple[str, str], int]) -> WorkerState:
        """Lay this gateway's queries in flight over the report's queue lengths (the report is up
        to a second old; these are now), so that selection spreads queries over equal instances
        instead of sending a second's worth to the one that was least loaded at the last report.
        An instance our own queries saturate is Overloaded at once."""
        changed = False
        instances = []
        for instance in worker.instances:
            own = in_flight.get((worker.worker_id, instance.variant_id), 0)
            if own > instance.queue_length:
                saturated = own >= saturated_queue(instance.batch_limit)
                state = InstanceState.OVERLOADED if saturated else instance.state
                instance = dataclasses.replace(instance, queue_length=own, state=state)
                changed = True
            instances.append(instance)
        return dataclasses.replace(worker, instances=tuple(instances)) if changed else worker

    def select(self, targets: QueryTargets) -> Decision:
        refresh = False
        while True:
            version, reported, fresh = self.live_state(targets.app_id, refresh)
            candidates = self.candidates(targets, version)
            workers = self._overlay(reported)
            if candidates:
                try:
                    return self._get_variant(targets, candidates, workers)
                except TargetsUnreachableError:
                    pass
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

    def _get_variant(
        self, targets: QueryTargets, candidates: Candidates, workers: Sequence[WorkerState]
    ) -> Decision:
        """The policy's decision, with the Lambda tier's containers when it can see them, and
        without a Lambda tier to spill to when there is none (``NO_LAMBDA_TIER``)."""
        if self._lambda_state is not None:
            return self._policy.get_variant(targets, candidates, workers, lambda_tier=self._lambda_state())
        if self._lambda is None:
            return self._policy.get_variant(targets, candidates, workers, lambda_tier=NO_LAMBDA_TIER)
        return self._policy.get_variant(targets, candidates, workers)

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
        body, served = self._serve(targets, inputs, query_id, decision, _QueryClock.start(started, targets))
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
            decision=served,
            tier=served.tier,
            worker_id=served.worker_id if served.tier is Tier.WORKER else None,
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            cold_start=bool(body.get("cold_start", False)),
            retried=served is not decision,
            query_id=query_id,
        )

    def _serve(
        self,
        targets: QueryTargets,
        inputs: np.ndarray,
        query_id: str,
        decision: Decision,
        clock: _QueryClock,
    ) -> tuple[dict[str, Any], Decision]:
        """Run the query where ``decision`` says; the reply, and the decision that served it.

        When a place fails in a way another place would not (the worker died, hung, or answered
        503), the query moves on: to a live instance of an eligible variant on another worker that
        meets what is left of the budget, else to the Lambda tier, else it fails with a 503 that
        names every attempt. Each attempt carries the budget left at its start and is bounded by
        the query's deadline (budget + DEADLINE_GRACE_S); once that has passed, a 503
        ``deadline_exceeded``. Other errors (a bad input, a missing artifact, a model that
        crashed) would fail anywhere: they are the reply.
        """
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
            payload = invocation_payload(decision.variant, inputs, query_id, clock.budget_left_ms(now))
            try:
                return self._run(decision, payload, timeout_s), decision
            except ServiceUnavailableError as error:
                if _on_lambda_tier(decision) and self._lambda is None:
                    raise  # selection found no room anywhere else: there is nowhere to retry
                failures.append(f"{_where(decision)} failed: {error.message}")
                if _on_lambda_tier(decision):
                    lambda_tried = True
                else:
                    worker = decision.worker_id or str(decision.worker_address)
                    failed_workers.add(worker)
                    if isinstance(error, WorkerUnreachableError):
                        # Dead or hung. One that answered 503 is alive: its state says the rest.
                        self._hold_out(worker)
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
        clock: _QueryClock,
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
        version, reported, _ = self.live_state(targets.app_id, refresh=True)
        workers = [w for w in self._overlay(reported) if w.worker_id not in failed_workers]
        try:
            choice: Decision | None = self._get_variant(
                dataclasses.replace(targets, latency_ms=budget_left_ms),
                self.candidates(targets, version),
                workers,
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
        key = (decision.worker_id or decision.worker_address, decision.variant.variant_id)
        self._count_in_flight(key, +1)
        try:
            body = self._workers.invoke(decision.worker_address, payload, timeout_s)
        finally:
            self._count_in_flight(key, -1)
        if decision.state is InstanceState.INACTIVE and decision.worker_id is not None:
            with self._recent_lock:
                self._recent_loads[(decision.worker_id, decision.variant.variant_id)] = time.monotonic()
        return body

    def _count_in_flight(self, key: tuple[str, str], change: int) -> None:
        with self._recent_lock:
            count = self._in_flight.get(key, 0) + change
            if count > 0:
                self._in_flight[key] = count
            else:
                self._in_flight.pop(key, None)

    def _invoke_lambda(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._lambda is None:
            raise ServiceUnavailableError("no Lambda tier is configured and no worker has room")
        return self._lambda.invoke(payload, timeout_s)
