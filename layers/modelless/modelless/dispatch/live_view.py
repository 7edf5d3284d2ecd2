"""The live view of the workers, as this gateway's decisions see them.

The workers' reports, from a snapshot of the store (``MetadataStore.selection_state``) at most
``LIVE_STATE_TTL_S`` old, with what this gateway knows sooner than the reports say laid over
them: the variants it loaded lately, its own queries in flight, state kept outside the store
(the local Lambda tier's containers), and the workers it holds out after they failed a query.
The pure overlays (``with_recent_loads``, ``with_in_flight``) are functions of explicit state,
run by the simulator on its own.

"Load" here is a variant's load onto a worker, never query traffic (``query_load``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from modelless.config import STALE_CACHE_MAX_AGE_S
from modelless.exceptions import StoreUnavailableError
from modelless.metadata.base import LiveStateStore
from modelless.serving.monitoring import OVERLOADED_QUEUE, saturated_queue
from modelless.types import InstanceState, InstanceStats, WorkerState

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

# A worker that did not answer (dead, or hung) is left out of this dispatcher's decisions for this
# long: its last report stays fresh in the store for seconds after it died (WORKER_STALE_AFTER_S),
# and every query sent there meanwhile would pay a failed attempt (for a hung worker, a whole
# attempt's grace). After the hold it is tried again: a worker that is back serves at once.
FAILED_WORKER_HOLD_S = 2.0

# This many of our own queries outstanding on one instance that does not batch: it is saturated
# now, before its next report says so (the worker's own threshold, ``saturated_queue``, which for
# a batching instance follows the batch size it reports). A burst is then spilled at once instead
# of queueing behind the instance for the second a report takes.
SATURATED_IN_FLIGHT = OVERLOADED_QUEUE


@dataclass(frozen=True)
class _Snapshot:
    read_at: float  # monotonic clock, taken before the read
    version: int  # the app's profiles version
    workers: list[WorkerState]  # as reported, least utilised first; never mutated


class LiveView:
    def __init__(
        self,
        store: LiveStateStore,
        ttl_s: float = LIVE_STATE_TTL_S,
        extra_workers: Callable[[], list[WorkerState]] | None = None,
        stale_max_age_s: float = STALE_CACHE_MAX_AGE_S,
    ) -> None:
        """``extra_workers``: state not kept in the store, e.g. the local Lambda tier's warm
        containers, read on every decision. ``stale_max_age_s``: how old a snapshot may be to
        stand in for the store while it is unreachable."""
        self._store = store
        self._ttl_s = ttl_s
        self._stale_max_age_s = stale_max_age_s
        self._extra_workers = extra_workers
        self._snapshots: dict[str, _Snapshot] = {}  # app -> its last read of the live state
        # One lock over this gateway's own state laid over the reports.
        self._lock = threading.Lock()
        self._recent_loads: dict[tuple[str, str], float] = {}  # (worker, variant) -> when loaded
        self._in_flight: dict[tuple[str, str], int] = {}  # our queries outstanding per (worker, variant)
        # Workers that failed a query lately -> until when (monotonic) decisions leave them out.
        self._held_out: dict[str, float] = {}

    def view(self, app_id: str, refresh: bool = False) -> tuple[int, Sequence[WorkerState], bool]:
        """What a decision sees: the app's profiles version and the workers, from a snapshot at
        most ``ttl_s`` old (one store round trip when it is older, or on ``refresh``) with this
        gateway's overlays and without the workers on hold; and whether this call read the
        store (or tried to: while the store is unreachable, the last snapshot stands in for it
        up to ``stale_max_age_s`` old, and nothing fresher is to be had)."""
        now = time.monotonic()
        state = self._snapshots.get(app_id)
        fresh = refresh or state is None or now - state.read_at >= self._ttl_s
        if fresh or state is None:
            try:
                version, reported = self._store.selection_state(app_id)
            except StoreUnavailableError:
                if state is None or now - state.read_at > self._stale_max_age_s:
                    raise
                # The workers keep serving while the store is down: decide on their last reports.
                return state.version, self._overlay(state.workers), True
            state = self._snapshots[app_id] = _Snapshot(now, version, reported)
        return state.version, self._overlay(state.workers), fresh

    def forget_snapshots(self) -> None:
        """Read the live state afresh on the next decision."""
        self._snapshots.clear()

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
                workers = [with_recent_loads(w, loaded.get(w.worker_id)) for w in workers]
        if self._in_flight:
            with self._lock:
                in_flight = dict(self._in_flight)
            workers = [with_in_flight(w, in_flight) for w in workers]
        if self._extra_workers is not None:
            workers = [*workers, *self._extra_workers()]
        return workers

    # --- hold-outs ---------------------------------------------------------------------------

    def hold_out(self, worker_id: str) -> None:
        """Leave ``worker_id`` out of decisions for FAILED_WORKER_HOLD_S (it did not answer)."""
        with self._lock:
            self._held_out[worker_id] = time.monotonic() + FAILED_WORKER_HOLD_S

    def _held_out_now(self) -> set[str]:
        """The workers a failed query put on hold and whose hold has not ended; ended holds are
        forgotten."""
        now = time.monotonic()
        with self._lock:
            for worker_id, until in list(self._held_out.items()):
                if until <= now:
                    del self._held_out[worker_id]
            return set(self._held_out)

    # --- this gateway's variant loads ----------------------------------------------------------

    def loaded(self, worker_id: str, variant_id: str) -> None:
        """This gateway's query just loaded ``variant_id`` on ``worker_id``: it counts as Active
        there until the worker's report shows it (RECENT_LOAD_S at most)."""
        with self._lock:
            self._recent_loads[(worker_id, variant_id)] = time.monotonic()

    def _recent_loads_by_worker(self) -> dict[str, list[str]]:
        """Variants this dispatcher loaded within RECENT_LOAD_S, per worker, in load order;
        older ones are forgotten."""
        now = time.monotonic()
        loaded: dict[str, list[str]] = {}
        with self._lock:
            for key, loaded_at in list(self._recent_loads.items()):
                if now - loaded_at < RECENT_LOAD_S:
                    loaded.setdefault(key[0], []).append(key[1])
                else:
                    del self._recent_loads[key]
        return loaded

    # --- this gateway's queries in flight ------------------------------------------------------

    @contextmanager
    def in_flight(self, worker: str, variant_id: str) -> Iterator[None]:
        """Count a query of ours outstanding on ``worker``'s instance of ``variant_id`` while
        the block runs."""
        key = (worker, variant_id)
        self._count_in_flight(key, +1)
        try:
            yield
        finally:
            self._count_in_flight(key, -1)

    def _count_in_flight(self, key: tuple[str, str], change: int) -> None:
        with self._lock:
            count = self._in_flight.get(key, 0) + change
            if count > 0:
                self._in_flight[key] = count
            else:
                self._in_flight.pop(key, None)


def with_recent_loads(worker: WorkerState, loaded: list[str] | None) -> WorkerState:
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


def with_in_flight(worker: WorkerState, in_flight: dict[tuple[str, str], int]) -> WorkerState:
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
