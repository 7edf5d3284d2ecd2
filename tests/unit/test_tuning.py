"""The parallelism tuner (modelless.tuning, RRL): configurations, the objective, the region-based
search and the UCB1 baseline, the live windows on a fake clock, and what the scaler plans with
once an instance is tuned. Pure: no worker, no onnxruntime; the "system" is a synthetic latency
function of the configuration."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from modelless.catalog import DEFAULT_POOLS
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.scaling.controller import Scaler, ScalerConfig
from modelless.tuning import make_policy
from modelless.tuning.bandit import UcbTuner
from modelless.tuning.base import (
    COST_WEIGHT,
    Observation,
    ParallelConfig,
    TunerPolicy,
    config_space,
    load_level,
    observe_window,
    score,
)
from modelless.tuning.capacity import TunedCapacity, reported_tuning, tuned_profile
from modelless.tuning.live import IDLE_WINDOWS, LiveTuner
from modelless.tuning.region import RegionTuner
from modelless.types import InstanceState, InstanceStats, WorkerState
from tests.unit.test_scaler import GROUP, FakeProvider, load, profile
from tests.unit.test_scaler import store as store

BUDGET_MS = 100.0


def observation(violation_rate: float, cpu_ms: float = 10.0, queries: int = 1000) -> Observation:
    return Observation(
        queries=queries,
        violations=round(violation_rate * queries),
        p99_ms=50.0,
        cpu_ms_per_query=cpu_ms,
        budget_ms=BUDGET_MS,
    )


# --- configurations and the objective ---------------------------------------------------------


def test_the_space_follows_the_cores_and_never_oversubscribes_past_twice() -> None:
    two = config_space(2)
    assert ParallelConfig(1, 1, 1) in two and ParallelConfig(2, 1, 2) in two
    assert ParallelConfig(2, 2, 2) not in two  # 8 threads on 2 cores
    assert all(c.threads <= 4 for c in two) and len(two) == 7
    eight = config_space(8)
    assert {c.intra for c in eight} == {1, 2, 4, 8} and {c.concurrency for c in eight} == {1, 2, 4, 8}
    assert all(c.threads <= 16 for c in eight)
    assert {c.intra for c in config_space(6)} == {1, 2, 4, 6}
    assert config_space(1) == [ParallelConfig(1, 1, 1)]


def test_a_configuration_is_validated_and_round_trips() -> None:
    config = ParallelConfig(2, 1, 2)
    assert ParallelConfig.from_dict(config.to_dict()) == config
    assert config.threads == 4
    for bad in ({"intra": 0}, {"intra": "2"}, {"intra": True}, {"threads": 2}, [1, 1, 1]):
        with pytest.raises(ValueError):
            ParallelConfig.from_dict(bad)


def test_fewer_violations_beat_less_cpu_and_cpu_breaks_ties() -> None:
    cheap_but_late = observation(0.06, cpu_ms=1.0)
    dear_but_on_time = observation(0.0, cpu_ms=400.0)  # cost share capped at 1: COST_WEIGHT
    assert score(dear_but_on_time) < score(cheap_but_late)
    assert score(observation(0.0, cpu_ms=5.0)) < score(observation(0.0, cpu_ms=20.0))
    assert score(dear_but_on_time) == pytest.approx(COST_WEIGHT)


def test_a_window_counts_violations_tail_and_cpu() -> None:
    latencies = [10.0] * 97 + [150.0, 200.0, 300.0]
    budgets = [BUDGET_MS] * 100
    seen = observe_window(latencies, budgets, run_ms=500.0, config=ParallelConfig(2, 1, 2))
    assert seen.queries == 100 and seen.violations == 3 and seen.violation_rate == pytest.approx(0.03)
    assert seen.p99_ms == 300.0
    assert seen.cpu_ms_per_query == pytest.approx(500.0 * 4 / 100)
    assert seen.budget_ms == BUDGET_MS
    with pytest.raises(ValueError):
        observe_window([1.0], [], 1.0, ParallelConfig())


def test_load_levels_are_doublings_with_hysteresis() -> None:
    assert load_level(0.3) == 0 and load_level(20.0) == 4 and load_level(40.0) == 5
    assert load_level(34.0, previous=4) == 4  # just past the edge: kept
    assert load_level(41.0, previous=4) == 5
    assert load_level(14.0, previous=4) == 4 and load_level(11.0, previous=4) == 3


# --- the policies on a synthetic system --------------------------------------------------------


def bowl(best: ParallelConfig) -> Callable[[ParallelConfig], float]:
    """A violation rate smooth in the configuration (RRL's Fig. 6): least at ``best``."""
    bx = best.coordinates()

    def rate(config: ParallelConfig) -> float:
        x = config.coordinates()
        return min(1.0, 0.04 * ((x[0] - bx[0]) ** 2 + 2 * (x[1] - bx[1]) ** 2 + (x[2] - bx[2]) ** 2))

    return rate


def run_policy(
    policy: TunerPolicy, rate: Callable[[ParallelConfig], float], noise: float, seed: int, limit: int = 200
) -> ParallelConfig:
    rng = random.Random(seed)
    for _ in range(limit):
        config = policy.propose(0)
        noisy = max(0.0, rate(config) + rng.gauss(0.0, noise))
        policy.observe(0, config, observation(noisy, cpu_ms=config.threads))
        if policy.converged(0):
            break
    best = policy.best(0)
    assert best is not None
    return best


@pytest.mark.parametrize("name", ["region", "ucb"])
def test_both_policies_find_the_best_configuration_when_measurements_are_exact(name: str) -> None:
    space = config_space(8)
    target = ParallelConfig(4, 1, 2)
    policy = make_policy(name, space, ParallelConfig(1, 1, 1))
    assert run_policy(policy, bowl(target), noise=0.0, seed=0) == target
    assert policy.converged(0)
    assert policy.propose(0) == target  # converged: it keeps running the best


def test_the_region_search_needs_far_fewer_trials_than_the_bandit() -> None:
    space = config_space(8)
    region_trials, ucb_trials, misses = [], [], 0
    for seed, target in enumerate(space[:: max(1, len(space) // 8)]):
        rate = bowl(target)
        region = RegionTuner(space, ParallelConfig(1, 1, 1))
        ucb = UcbTuner(space, ParallelConfig(1, 1, 1))
        found_region = run_policy(region, rate, noise=0.005, seed=seed)
        found_ucb = run_policy(ucb, rate, noise=0.005, seed=seed)
        # Within a point of violation rate of the true best: what the noise lets either resolve.
        misses += rate(found_region) > rate(target) + 0.01
        assert rate(found_ucb) <= rate(target) + 0.02
        region_trials.append(region.trials(0))
        ucb_trials.append(ucb.trials(0))
    assert misses == 0
    assert all(t >= len(space) for t in ucb_trials)  # point by point: every arm once at least
    assert sum(region_trials) * 2 < sum(ucb_trials)


def test_the_regional_estimate_extrapolates_the_trend_of_its_neighbours() -> None:
    region = RegionTuner(config_space(8), ParallelConfig(1, 1, 1))
    region.observe(0, ParallelConfig(1, 1, 1), observation(0.30))
    region.observe(0, ParallelConfig(2, 1, 1), observation(0.20))
    more_threads = region.estimate(0, ParallelConfig(4, 1, 1))
    assert more_threads is not None and more_threads < 0.2  # the trend goes on
    assert region.estimate(0, ParallelConfig(8, 2, 8)) is None  # nothing tried in its region
    assert region.estimate(0, ParallelConfig(2, 1, 1)) == pytest.approx(0.2 + COST_WEIGHT * 0.1)


def test_a_neighbour_whose_region_says_it_loses_is_never_tried() -> None:
    space = [ParallelConfig(i, 1, 1) for i in (1, 2, 4, 8)]
    region = RegionTuner(space, ParallelConfig(2, 1, 1))
    region.observe(0, ParallelConfig(2, 1, 1), observation(0.05))
    assert region.propose(0) == ParallelConfig(1, 1, 1)  # both neighbours unknown: the cheaper
    region.observe(0, ParallelConfig(1, 1, 1), observation(0.30))
    # The plane through (1: 0.30) and (2: 0.05) says 4 threads are better: tried next.
    assert region.propose(0) == ParallelConfig(4, 1, 1)
    region.observe(0, ParallelConfig(4, 1, 1), observation(0.30))
    # 2 is the best and both its neighbours are tried: 8 is not in its region. The leader is
    # measured once more before the search trusts it...
    assert region.propose(0) == ParallelConfig(2, 1, 1) and not region.converged(0)
    region.observe(0, ParallelConfig(2, 1, 1), observation(0.06))
    # ...and it still leads: converged, 8 never tried.
    assert region.propose(0) == ParallelConfig(2, 1, 1) and region.converged(0)
    assert region.trials(0) == 4


def test_a_best_that_gets_worse_reopens_the_search() -> None:
    space = [ParallelConfig(1, 1, c) for c in (1, 2, 4)]
    region = RegionTuner(space, ParallelConfig(1, 1, 1))
    for config, rate in ((ParallelConfig(1, 1, 1), 0.0), (ParallelConfig(1, 1, 2), 0.2)):
        region.observe(0, config, observation(rate))
    region.observe(0, ParallelConfig(1, 1, 1), observation(0.0))  # the leader, confirmed
    assert region.converged(0) and region.propose(0) == ParallelConfig(1, 1, 1)
    for _ in range(4):  # the load grew: one at a time now misses
        region.observe(0, ParallelConfig(1, 1, 1), observation(0.5))
    assert region.best(0) == ParallelConfig(1, 1, 2)
    assert not region.converged(0) and region.propose(0) == ParallelConfig(1, 1, 4)


def test_a_lucky_first_window_does_not_end_the_search() -> None:
    space = [ParallelConfig(1, 1, c) for c in (1, 2)]
    region = RegionTuner(space, ParallelConfig(1, 1, 1))
    region.observe(0, ParallelConfig(1, 1, 1), observation(0.0))  # a quiet moment on the machine
    region.observe(0, ParallelConfig(1, 1, 2), observation(0.1))
    assert region.propose(0) == ParallelConfig(1, 1, 1) and not region.converged(0)
    region.observe(0, ParallelConfig(1, 1, 1), observation(0.4))  # its real rate shows
    assert region.best(0) == ParallelConfig(1, 1, 2)
    assert region.propose(0) == ParallelConfig(1, 1, 2) and not region.converged(0)
    region.observe(0, ParallelConfig(1, 1, 2), observation(0.1))
    assert region.converged(0) and region.propose(0) == ParallelConfig(1, 1, 2)


def test_levels_are_learnt_apart() -> None:
    region = RegionTuner(config_space(2), ParallelConfig(1, 1, 1))
    region.observe(3, ParallelConfig(1, 1, 1), observation(0.0))
    assert region.trials(3) == 1 and region.trials(5) == 0
    assert region.propose(5) == ParallelConfig(1, 1, 1) and region.best(5) is None


def test_unknown_policy_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown tuning policy"):
        make_policy("genetic", config_space(2), ParallelConfig())


# --- the live windows, on a fake clock ---------------------------------------------------------


def serve(
    tuner: LiveTuner, now: float, seconds: float, qps: float, mean_ms: Callable[[ParallelConfig], float]
) -> float:
    """Queries at ``qps`` for ``seconds`` on whatever the tuner runs, their latencies exponential
    around ``mean_ms`` of the configuration, ticking the tuner as a worker does (and applying its
    proposals at once); returns the clock at the end."""
    rng = random.Random(int(now))
    step = 1.0 / qps
    end = now + seconds
    while now < end:
        config = tuner.current
        tuner.record_arrival()
        tuner.record_query(config, rng.expovariate(1.0 / mean_ms(config)), BUDGET_MS)
        tuner.record_run(config, 1, mean_ms(config) / 2)
        now += step
        proposed = tuner.tick(now)
        if proposed is not None:
            tuner.switched(proposed, now)
    return now


def test_the_live_tuner_converges_on_the_configuration_with_fewest_violations() -> None:
    space = config_space(2)

    def mean_ms(config: ParallelConfig) -> float:
        # More intra-op threads and more concurrent batches both cut the latency; inter-op
        # parallelism costs a little (this graph has no independent branches).
        speedup: float = (config.intra * config.concurrency) ** 0.8
        return 80.0 / speedup * (1.1 if config.inter > 1 else 1.0)

    tuner = LiveTuner(
        RegionTuner(space, ParallelConfig(1, 1, 1)),
        ParallelConfig(1, 1, 1),
        0.0,
        expected_ms=lambda rows: mean_ms(ParallelConfig(2, 1, 2)) / 2,
        window_s=2.0,
        min_queries=20,
    )
    now = serve(tuner, 0.0, 60.0, 100.0, mean_ms)
    report = tuner.report()
    assert tuner.current == ParallelConfig(2, 1, 2) and report["converged"]
    assert report["level"] == 6 and report["switches"] >= 2
    assert 2 <= report["trials"] < len(space)  # it never had to try them all
    assert tuner.latency_scale == pytest.approx(1.0)  # its runs take what the "profile" says
    # Converged: it stays there.
    serve(tuner, now, 20.0, 100.0, mean_ms)
    assert tuner.current == ParallelConfig(2, 1, 2)


def test_a_quiet_window_stays_open_and_an_idle_one_is_dropped() -> None:
    tuner = LiveTuner(
        UcbTuner(config_space(2), ParallelConfig()), ParallelConfig(), 0.0, window_s=1.0, min_queries=10
    )
    for _ in range(5):
        tuner.record_query(ParallelConfig(), 10.0, BUDGET_MS)
    assert tuner.tick(1.5) is None and tuner.history == []  # 5 queries: not judged yet
    tuner.record_query(ParallelConfig(2, 1, 1), 10.0, BUDGET_MS)  # another configuration's
    assert tuner.tick(IDLE_WINDOWS * 1.0) is None  # idle long enough: dropped
    for _ in range(40):  # 40 arrive; 10 are answered within the window (the rest queue)
        tuner.record_arrival()
    for _ in range(10):
        tuner.record_query(ParallelConfig(), 10.0, BUDGET_MS)
    assert tuner.tick(IDLE_WINDOWS + 0.5) is None  # a fresh window: not due yet
    assert tuner.tick(IDLE_WINDOWS + 1.0) is not None  # judged: UCB tries the next arm
    assert tuner.history[0].observation.queries == 10
    assert tuner.level == 5  # 40 arrivals a second, not 10 answers: the load, not the backlog


# --- what the scaler plans with ----------------------------------------------------------------


def instance(variant_id: str, config: ParallelConfig, scale: float) -> InstanceStats:
    return InstanceStats(
        variant_id=variant_id, state=InstanceState.ACTIVE, qps=10.0, latency_p50_ms=1.0,
        latency_p99_ms=2.0, queue_length=0, intra_threads=config.intra, inter_threads=config.inter,
        concurrency=config.concurrency, latency_scale=scale,
    )  # fmt: skip


def worker(worker_id: str, *instances: InstanceStats) -> WorkerState:
    return WorkerState(worker_id, "cpu", "http://w", 0.1, 1, time.time(), instances)


def test_reported_tuning_averages_the_instances_that_measured() -> None:
    config = ParallelConfig(2, 1, 2)
    workers = [
        worker("a", instance("v", config, 0.5), instance("untuned", ParallelConfig(1, 1, 1), 0.0)),
        worker("b", instance("v", config, 0.7)),
    ]
    tuned = reported_tuning(workers)
    assert set(tuned) == {"v"} and tuned["v"].config == config
    assert tuned["v"].latency_scale == pytest.approx(0.6)
    wild = reported_tuning([worker("c", instance("v", config, 500.0))])
    assert wild["v"].latency_scale == 10.0  # bounded: one bad window must not swing the plan


def test_a_tuned_profile_scales_latency_throughput_and_threads() -> None:
    base = profile("fast", "cpu", 2.0)
    tuned = tuned_profile(base, TunedCapacity(ParallelConfig(2, 1, 2), 0.5))
    assert tuned.latency_p99_ms[1] == pytest.approx(1.0) and tuned.median_ms(8) == pytest.approx(4.0)
    assert tuned.threads == 4
    assert tuned.saturation_qps == pytest.approx(base.saturation_qps * 4)


def test_the_scaler_plans_a_tuned_variant_with_its_tuned_capacity(store: InMemoryMetadataStore) -> None:
    scaler = Scaler(
        store,
        FakeProvider({"cpu": 1}),
        DEFAULT_POOLS,
        ScalerConfig(window_s=10, slack=0.0, max_workers={"cpu": 8}, provision_for_envelope=False),
    )
    load(store, 1000, start=int(time.time()) - 20, seconds=20)
    now = time.time()
    [before] = [v for v in scaler.build_problem(now).problem.variants if v.pool == "cpu"]
    variant_id = before.id
    store.put_worker_state(worker("w", instance(variant_id, ParallelConfig(2, 1, 2), 0.8)))
    snapshot = scaler.build_problem(now)
    [after] = [v for v in snapshot.problem.variants if v.id == variant_id]
    # Its runs are 0.8x the profile's and two run at once: a tuned instance takes more load...
    assert after.saturation_qps[GROUP.key] > 2 * before.saturation_qps[GROUP.key]
    # ...and costs the threads its configuration keeps busy.
    assert after.demand["vcpu"] == 4.0 and before.demand["vcpu"] == 1.0
    assert snapshot.profiles[variant_id].threads == 4


def test_the_monitor_reports_an_instances_tuned_configuration() -> None:
    from modelless.serving.monitoring import WorkerMonitor

    monitor = WorkerMonitor("w", "cpu", "http://w", slots=2)
    variant = profile("fast", "cpu", 2.0)
    monitor.tuned(variant.variant_id, 2, 1, 2, 0.8)  # not loaded: ignored
    monitor.loaded(variant)
    [untuned] = monitor.snapshot(time.time()).instances
    assert (untuned.intra_threads, untuned.latency_scale) == (0, 0.0)
    monitor.tuned(variant.variant_id, 2, 1, 2, 0.8)
    [tuned] = monitor.snapshot(time.time()).instances
    assert (tuned.intra_threads, tuned.inter_threads, tuned.concurrency, tuned.latency_scale) == (
        2,
        1,
        2,
        0.8,
    )
    assert WorkerState.from_json(monitor.snapshot(time.time()).to_json()).instances[0] == tuned
    monitor.unloaded(variant.variant_id)
    monitor.loaded(variant)
    assert monitor.snapshot(time.time()).instances[0].intra_threads == 0  # a new instance: untuned
