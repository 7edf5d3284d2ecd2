"""Live state, spilling and scaling with real load on real worker processes (issue 4).

- Instance states (INFaaS Figure 4) move with real load: a worker hammered by concurrent callers
  reports its instance Overloaded, and Active again once the load stops; noisy neighbours (busy
  processes on the same cores) make it Interfered, and Active again once they leave.
- A burst on a saturated worker spills to the Lambda tier instead of queueing, and every query
  is answered.
- The scaler, fed by the load the dispatcher counts, starts a second real worker, and after the
  hold stops it again, gracefully: queries in flight during the scale-down all get an answer.

Every wait is bounded; every process is stopped by its fixture. Timings are never asserted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from infra.local.lambda_container import local_lambda_tier
from modelless.catalog import DEFAULT_POOLS
from modelless.dispatch import Dispatcher, QueryResult
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker
from modelless.pools.lambda_local import LocalLambdaTier
from modelless.pools.local import LocalPoolProvider, LocalWorkerPool
from modelless.query_load import group_of
from modelless.repository.local import LocalModelRepository
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.selection import InfaasPolicy
from modelless.serving.monitoring import WINDOW_S
from modelless.types import InstanceState, QueryTargets, Tier, VariantProfile, WorkerState
from tests.functional.workers_kit import (
    APP,
    INVOKE_TIMEOUT_S,
    LOAD_LIMIT_S,
    MODEL,
    Load,
    invocation_of,
    make_variant,
    publish_linear_model,
    report_url_of,
    reported,
    sample_inputs,
    start_worker,
    worker_pool,
)
from tests.models import slow_model, wide_model
from tests.waiting import scaled, wait_for

WIDE_KEY = f"apps/{APP}/{MODEL}/variants/wide.onnx"
LONG_KEY = f"apps/{APP}/{MODEL}/variants/long.onnx"
# A state change shows in a report once the monitor's window has turned over.
STATE_WITHIN_S = WINDOW_S + 10.0


def wide_variant(pool: str = "cpu", p99_ms: float = 6.0) -> VariantProfile:
    # The wide model's run costs a few ms, all of it inference: a handful of callers saturate it.
    return replace(
        make_variant(pool=pool, artifact_key=WIDE_KEY),
        latency_p50_ms={1: p99_ms / 2, 2: p99_ms / 2, 4: p99_ms * 0.6, 8: p99_ms * 0.8},
        latency_p99_ms={1: p99_ms, 2: p99_ms, 4: p99_ms * 1.2, 8: p99_ms * 1.6},
    )


def long_model() -> bytes:
    """A run of several ms of compute (about 8 ms on one thread of the 2-core VM): several
    scheduler slices, so that busy neighbours on its core take turns inside every run. The wide
    model's run (under 2 ms) can fit in the one slice a waking thread gets: neighbours then
    delay its start, which is queueing, not interference, and leave its run time alone."""
    return slow_model(side=128, channels=16, layers=12)


def long_variant(p99_ms: float) -> VariantProfile:
    return replace(
        make_variant(artifact_key=LONG_KEY, suffix="-long"),
        latency_p50_ms={1: p99_ms / 2},
        latency_p99_ms={1: p99_ms},
    )


def long_inputs() -> np.ndarray:
    return sample_inputs(1).reshape(1, 1, 8, 8)  # the digit as the slow model's 8x8 image


def wide_logits(inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(wide_model(), providers=["CPUExecutionProvider"])
    logits: np.ndarray = session.run(None, {"input": inputs})[0]
    return logits


def instance_state(store: RedisMetadataStore, worker_id: str, variant_id: str) -> InstanceState | None:
    state = reported(store, worker_id)
    if state is None:
        return None
    return next((i.state for i in state.instances if i.variant_id == variant_id), None)


@pytest.fixture
def wide_repository(tmp_path: Path) -> str:
    repository = LocalModelRepository(tmp_path / "repo")
    repository.put(WIDE_KEY, wide_model())
    repository.put(LONG_KEY, long_model())
    return str(tmp_path / "repo")


@pytest.fixture
def one_slot_pool(
    wide_repository: str, redis_store: RedisMetadataStore, tmp_path: Path
) -> Iterator[LocalWorkerPool]:
    with worker_pool(wide_repository, report_url_of(redis_store), tmp_path, slots=1) as workers:
        yield workers


@pytest.fixture
def wide_tier(wide_repository: str, tmp_path: Path) -> Iterator[LocalLambdaTier]:
    tier = local_lambda_tier(
        wide_repository, log_dir=tmp_path / "lambda-logs", cache_dir=tmp_path / "lambda-cache", concurrency=2
    )
    try:
        yield tier
    finally:
        tier.close()


class Neighbours:
    """Busy processes on one of this machine's cores, beside a worker pinned to that core: noisy
    neighbours whatever the machine's size. They run at a higher priority where allowed (root,
    as in CI), so the scheduler's favour for a waking process cannot hide them from a worker
    that sleeps between light requests.

    The worker is pinned thread by thread (affinity is per thread on Linux), and a thread it
    starts while the pin is being applied (its batcher's, a connection's) can start from one
    not pinned yet and escape to a free core, where it runs unslowed: the pin is applied again
    every ``REPIN_S`` until the neighbours leave, so no thread stays out for long."""

    PER_CORE = 4
    NICE = -10
    REPIN_S = 0.2

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[bytes]] = []
        self._worker: tuple[int, set[int]] | None = None  # its pid and the cores it had
        self._core: set[int] = set()
        self._stopping = threading.Event()
        self._keeper: threading.Thread | None = None

    def start_beside(self, pid: int) -> None:
        cores = os.sched_getaffinity(pid)
        self._worker = (pid, cores)
        self._core = {min(cores)}
        self._set_worker_cores(pid, self._core)
        spin = f"import time\nend = time.time() + {scaled(LOAD_LIMIT_S)}\nwhile time.time() < end: pass"
        self._processes += [
            subprocess.Popen([sys.executable, "-c", spin], preexec_fn=lambda: self._pin_and_raise(self._core))
            for _ in range(self.PER_CORE)
        ]
        self._stopping.clear()
        self._keeper = threading.Thread(target=self._keep_pinned, args=(pid,), name="repin", daemon=True)
        self._keeper.start()

    def describe(self) -> str:
        """Where the worker's threads may run and how the neighbours are placed: what a test
        that waited in vain for interference shows, so that a failure says whether they met."""
        if self._worker is None:
            return "no neighbours started"
        pid = self._worker[0]
        threads: dict[str, list[int]] = {}
        for thread in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                threads[thread.name] = sorted(os.sched_getaffinity(int(thread.name)))
        neighbours = []
        for process in self._processes:
            with contextlib.suppress(OSError):
                neighbours.append(
                    f"{process.pid} nice {os.getpriority(os.PRIO_PROCESS, process.pid)} "
                    f"cores {sorted(os.sched_getaffinity(process.pid))} alive {process.poll() is None}"
                )
        return f"worker {pid} threads' cores {threads}; neighbours: {neighbours}"

    def _keep_pinned(self, pid: int) -> None:
        while not self._stopping.wait(self.REPIN_S):
            with contextlib.suppress(FileNotFoundError):  # the worker has ended
                self._set_worker_cores(pid, self._core)

    def _pin_and_raise(self, core: set[int]) -> None:
        os.sched_setaffinity(0, core)
        # Not root: plain-priority neighbours on the worker's own core still interfere.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, self.NICE)

    def stop(self) -> None:
        self._stopping.set()
        if self._keeper is not None:
            self._keeper.join()  # before the worker's cores are given back, never after
            self._keeper = None
        for process in self._processes:
            process.kill()
            process.wait()
        self._processes.clear()
        if self._worker is not None:
            # Every thread it has now: those started while pinned (one per connection) inherited the pin.
            self._set_worker_cores(*self._worker)
            self._worker = None

    @staticmethod
    def _set_worker_cores(pid: int, cores: set[int]) -> None:
        for thread in Path(f"/proc/{pid}/task").iterdir():  # affinity is per thread on Linux
            with contextlib.suppress(ProcessLookupError):  # that thread may have ended
                os.sched_setaffinity(int(thread.name), cores)


@pytest.fixture
def neighbours() -> Iterator[Neighbours]:
    busy = Neighbours()
    try:
        yield busy
    finally:
        busy.stop()


def queued_on(address: str) -> int:
    """Requests in flight on a worker now, from its own monitor (not its last report)."""
    state = WorkerState.from_json(httpx.get(f"{address}/stats", timeout=5.0).json()["state"])
    return sum(i.queue_length for i in state.instances)


# --- instance states ----------------------------------------------------------------------------


def test_saturating_load_makes_an_instance_overloaded_and_it_recovers_when_the_load_stops(
    one_slot_pool: LocalWorkerPool, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker
) -> None:
    variant = wide_variant()
    worker = start_worker(one_slot_pool, redis_store)
    inputs = sample_inputs(1)

    def state_of() -> InstanceState | None:
        return instance_state(redis_store, worker.worker_id, variant.variant_id)

    invoker.invoke(worker.address, invocation_of(variant, inputs), INVOKE_TIMEOUT_S)
    assert wait_for(state_of, 5.0, "the loaded instance") is InstanceState.ACTIVE

    # Saturating: more callers than two full batches (the batcher takes up to 8 rows a run), so
    # that requests queue behind the run in progress whatever the machine's speed; with only 8
    # callers one batch holds them all and the instance idles between round trips.
    callers = 24
    load = Load(
        callers, lambda: invoker.invoke(worker.address, invocation_of(variant, inputs), INVOKE_TIMEOUT_S)
    )
    try:
        wait_for(
            state_of,
            STATE_WITHIN_S,
            f"the instance to report Overloaded under {callers} closed-loop callers",
            until=lambda state: state is InstanceState.OVERLOADED,
        )
    finally:
        load.stop()
    assert load.errors == []
    assert load.results, "no query was answered under load"

    wait_for(
        state_of,
        STATE_WITHIN_S,
        "the instance to be Active again once the load stopped",
        until=lambda state: state is InstanceState.ACTIVE,
    )


def test_noisy_neighbours_make_an_instance_interfered_and_it_recovers_when_they_leave(
    one_slot_pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    neighbours: Neighbours,
) -> None:
    worker = start_worker(one_slot_pool, redis_store)
    inputs = long_inputs()
    # The profile is what this worker measures without the neighbours, at the light load used
    # below and for as long as the monitor's window: its p99 then holds whatever tail the
    # machine's other work gives it, so that the neighbours' leaving brings it back under.
    # The pause keeps the instance far from Overloaded (busy under 90 % of the window) even
    # when the neighbours make each run tens of times longer.
    pause_s = 0.1
    unprofiled = long_variant(50.0)
    alone: list[float] = []
    until = time.monotonic() + WINDOW_S
    while time.monotonic() < until or len(alone) < 40:
        answer = invoker.invoke(worker.address, invocation_of(unprofiled, inputs), INVOKE_TIMEOUT_S)
        alone.append(answer.inference_ms)
        time.sleep(pause_s)
    measured_p99 = float(np.percentile(alone[5:], 99))
    variant = long_variant(measured_p99)

    def state_of() -> InstanceState | None:
        return instance_state(redis_store, worker.worker_id, variant.variant_id)

    def light() -> object:
        return invoker.invoke(worker.address, invocation_of(variant, inputs), INVOKE_TIMEOUT_S)

    load = Load(1, light, pause_s=pause_s)  # light: far from saturating the instance
    try:
        neighbours.start_beside(one_slot_pool.workers()[worker.worker_id].process.pid)
        try:
            wait_for(
                state_of,
                STATE_WITHIN_S,
                "the instance to report Interfered next to busy neighbours "
                f"(profiled p99 {measured_p99:.2f} ms)",
                until=lambda state: state is InstanceState.INTERFERED,
            )
        except AssertionError as error:  # what the worker measured, and whether the neighbours met it
            raise AssertionError(
                f"{error}; last report: {reported(redis_store, worker.worker_id)}; {neighbours.describe()}"
            ) from error
        neighbours.stop()
        wait_for(
            state_of,
            2 * STATE_WITHIN_S,  # the window turns over once the last slow runs have left it
            "the instance to be Active again once the neighbours left",
            until=lambda state: state is InstanceState.ACTIVE,
        )
    finally:
        load.stop()
    assert load.errors == []


# --- a burst spills to the Lambda tier ---------------------------------------------------------


def test_a_burst_on_a_saturated_worker_spills_to_the_lambda_tier_and_every_query_is_answered(
    one_slot_pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    wide_tier: LocalLambdaTier,
) -> None:
    publish_linear_model(redis_store, wide_variant())
    # The same model on the Lambda tier: selection may spill there when the pool is saturated.
    store_lambda_variant(redis_store, wide_variant(pool="lambda-cpu"))
    start_worker(one_slot_pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, wide_tier, extra_workers=None)
    targets = QueryTargets(app_id=APP, min_accuracy=0.5, latency_ms=200.0)
    inputs = sample_inputs(1)
    expected = wide_logits(inputs)

    first = dispatcher.online_query(targets, inputs)  # loads the instance on the worker
    assert first.tier is Tier.WORKER

    burst = Load(10, lambda: dispatcher.online_query(targets, inputs))
    try:
        wait_for(
            lambda: any(isinstance(r, QueryResult) and r.tier is Tier.LAMBDA for r in list(burst.results)),
            STATE_WITHIN_S + 10,
            "a query of the burst to run on the Lambda tier once the worker reported Overloaded",
        )
    finally:
        burst.stop()

    assert burst.errors == [], burst.errors[:3]
    results = [r for r in burst.results if isinstance(r, QueryResult)]
    on_worker = sum(r.tier is Tier.WORKER for r in results)
    on_lambda = sum(r.tier is Tier.LAMBDA for r in results)
    assert on_worker > 0 and on_lambda > 0
    for result in results:
        np.testing.assert_allclose(result.outputs, expected, rtol=1e-4, atol=1e-4)


def test_a_tight_query_overlapping_a_warm_containers_run_loads_on_a_worker_instead_of_a_cold_start(
    one_slot_pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    wide_tier: LocalLambdaTier,
) -> None:
    on_worker, on_lambda = wide_variant(), wide_variant(pool="lambda-cpu")
    publish_linear_model(redis_store, on_worker)
    store_lambda_variant(redis_store, on_lambda)
    start_worker(one_slot_pool, redis_store)  # a free slot, nothing loaded
    # The tier's containers in view, as the local stack wires it (its tier_state is read too).
    dispatcher = Dispatcher(
        redis_store,
        InfaasPolicy(DEFAULT_POOLS),
        invoker,
        wide_tier,
        extra_workers=lambda: [wide_tier.state()],
    )
    wide_tier.invoke(invocation_of(on_lambda, sample_inputs(1)), INVOKE_TIMEOUT_S)  # one warm container
    assert wide_tier.cold_starts == 1
    expected_cold_ms = wide_tier.tier_state().cold_start_ms
    budget_ms = 100.0
    assert expected_cold_ms > budget_ms, "a container started faster than the test's tight budget"

    # A long query takes the warm container (the only Active instance: the worker holds none)...
    big = np.repeat(sample_inputs(1), 1024, axis=0)
    outcome: list[QueryResult] = []
    first = threading.Thread(
        target=lambda: outcome.append(
            dispatcher.online_query(QueryTargets(app_id=APP, min_accuracy=0.5), big)
        )
    )
    first.start()
    try:
        wait_for(
            lambda: wide_tier.state().instances[0].state is InstanceState.OVERLOADED,
            INVOKE_TIMEOUT_S,
            "the warm container to be running the long query",
        )
        # ...and a tight query overlapping it loads the variant on the worker (tens of ms)
        # rather than starting a second container (a cold start the budget cannot take).
        inputs = sample_inputs(1)
        tight = dispatcher.online_query(
            QueryTargets(app_id=APP, min_accuracy=0.5, latency_ms=budget_ms), inputs
        )
    finally:
        first.join(scaled(INVOKE_TIMEOUT_S * 2))
    assert not first.is_alive(), "the long query hung"

    assert tight.tier is Tier.WORKER and not tight.cold_start, tight.decision.reason
    np.testing.assert_allclose(tight.outputs, wide_logits(inputs), rtol=1e-4, atol=1e-4)
    [long] = outcome
    assert long.tier is Tier.LAMBDA and not long.cold_start
    np.testing.assert_allclose(long.outputs, wide_logits(big), rtol=1e-4, atol=1e-4)
    assert wide_tier.cold_starts == 1  # no second container was started


def store_lambda_variant(store: RedisMetadataStore, variant: VariantProfile) -> None:
    model = store.get_model(APP, MODEL)
    assert model is not None
    registration = store.get_registration(model.registration_id)
    assert registration is not None
    published = store.list_variants(APP, MODEL)
    registration.variant_ids = [v.variant_id for v in published] + [variant.variant_id]
    store.publish_variants(model, [*published, variant], registration)


# --- the scaler drives real workers -------------------------------------------------------------


def test_load_scales_the_pool_up_then_down_and_no_query_is_lost_while_a_worker_leaves(
    wide_repository: str, redis_store: RedisMetadataStore, invoker: HttpWorkerInvoker, tmp_path: Path
) -> None:
    # Profiled slow on purpose (one instance takes under 17 QPS within 100 ms, a worker two
    # instances): a load this machine can really send needs more than one worker.
    variant = wide_variant(p99_ms=60.0)
    publish_linear_model(redis_store, variant)
    with worker_pool(wide_repository, report_url_of(redis_store), tmp_path, slots=2) as workers:
        provider = LocalPoolProvider({"cpu": workers}, forget=redis_store.remove_worker)
        scaler = Scaler(
            redis_store,
            provider,
            DEFAULT_POOLS,
            # The mean and the hold (INFaaS), so that the pool shrinks within the test: the
            # arrival envelope would keep the burst for its 60 s history.
            ScalerConfig(
                window_s=5,
                slack=0.2,
                min_hold_s=3.0,
                min_workers={"cpu": 1},
                max_workers={"cpu": 3},
                provision_for_envelope=False,
            ),
        )
        dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, None, extra_workers=None)
        targets = QueryTargets(app_id=APP, min_accuracy=0.5, latency_ms=100.0)
        inputs = sample_inputs(1)
        expected = wide_logits(inputs)
        try:
            start_worker(workers, redis_store)
            assert dispatcher.online_query(targets, inputs).tier is Tier.WORKER

            # ~60 QPS for a few seconds, counted by the dispatcher and flushed to Redis.
            load = Load(4, lambda: dispatcher.online_query(targets, inputs), pause_s=0.06)
            time.sleep(5.0)  # let the load window fill with measured counts (pacing, not a measurement)
            up = scaler.tick()
            assert up.workers["cpu"] >= 2, str(up.summary())
            assert workers.size >= 2
            assert provider.assignments["cpu"], "the plan placed instances on the pool"
            planned = sum(provider.assignments["cpu"].values())
            wait_for(
                lambda: sum(len(w.instances) for w in redis_store.list_workers("cpu")),
                STATE_WITHIN_S,
                f"the workers to report the plan's {planned} instances loaded",
                until=lambda reported_instances: reported_instances >= planned,
            )
            load.stop()
            assert load.errors == [], load.errors[:3]

            # Load gone: the plan wants one worker, but only after the hold does the pool shrink,
            # and the worker that leaves finishes what it is serving.
            quiet = time.time() + 10.0  # a clock past the load window: no load measured
            held = scaler.tick(now=quiet)
            assert held.held.get("cpu") == (workers.size, 1), str(held.summary())
            trickle = Load(3, lambda: dispatcher.online_query(targets, inputs), pause_s=0.01)
            # Queries in flight on every worker when the scale-down starts.
            wait_for(lambda: trickle.count() >= 6, 5.0, "the trickle's first answers")
            # What the plan sees of the trickle on the test's clock: a load one instance takes (the
            # plan keeps the instance it uses; a plan without it would drain it, which the drain
            # tests cover). The gateway counts on the real clock, which the test moved past.
            for second in range(1, 5):
                redis_store.add_load({group_of(targets).key: 8}, int(quiet) + second)
            down = scaler.tick(now=quiet + 5.0)
            answered = trickle.count()
            wait_for(lambda: trickle.count() >= answered + 6, 5.0, "answers after the scale-down")
            trickle.stop()
            assert down.workers["cpu"] == 1, str(down.summary())
            assert workers.size == 1
            assert trickle.errors == [], trickle.errors[:3]
            assert trickle.results
            for result in trickle.results:
                assert isinstance(result, QueryResult)
                np.testing.assert_allclose(result.outputs, expected, rtol=1e-4, atol=1e-4)
            assert [w.worker_id for w in redis_store.list_workers("cpu")] == list(workers.workers())
        finally:
            provider.close()


# --- a worker killed mid-query -------------------------------------------------------------------


def test_a_worker_killed_mid_query_has_the_query_answered_on_the_lambda_tier(
    one_slot_pool: LocalWorkerPool,
    redis_store: RedisMetadataStore,
    invoker: HttpWorkerInvoker,
    wide_tier: LocalLambdaTier,
) -> None:
    publish_linear_model(redis_store, wide_variant())
    worker = start_worker(one_slot_pool, redis_store)
    dispatcher = Dispatcher(redis_store, InfaasPolicy(DEFAULT_POOLS), invoker, wide_tier, extra_workers=None)
    targets = QueryTargets(app_id=APP, min_accuracy=0.5)
    assert dispatcher.online_query(targets, sample_inputs(1)).tier is Tier.WORKER  # loaded and warm

    # A query big enough to be still running when its worker dies (hundreds of ms of inference).
    inputs = np.repeat(sample_inputs(1), 1024, axis=0)
    outcome: list[object] = []
    query = threading.Thread(target=lambda: outcome.append(dispatcher.online_query(targets, inputs)))
    query.start()
    wait_for(lambda: queued_on(worker.address) > 0, STATE_WITHIN_S, "the big query to be in flight")
    one_slot_pool.kill(worker.worker_id)
    query.join(scaled(INVOKE_TIMEOUT_S * 2))
    assert not query.is_alive(), "the query hung after its worker died"

    [result] = outcome
    assert isinstance(result, QueryResult)
    assert result.retried and result.tier is Tier.LAMBDA
    np.testing.assert_allclose(result.outputs, wide_logits(inputs), rtol=1e-4, atol=1e-4)
