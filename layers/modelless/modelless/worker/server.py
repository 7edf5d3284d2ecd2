"""A pool worker: a real OS process that loads variants on demand, serves invocations over HTTP
and reports its live state to the metadata store every second.

    python -m modelless.worker --worker-id cpu-0 --pool cpu --slots 2 \
        --repository .modelless/repo --report-url redis://127.0.0.1:6379/0

On an EC2 instance it binds every interface on a fixed port and reports the instance's private
address: ``--host 0.0.0.0 --port 8500 --advertise-host 10.0.1.23``.

Concurrent invocations of one variant are batched adaptively (``modelless.serving.batching``, Clipper
§4.3) within each query's remaining budget, the payload's ``deadline_ms``; ``--no-batching`` runs
each invocation on its own, as it arrives.

``POST /unload`` drains the instance, whether or not it is busy (the scaler's plan moved its slot
elsewhere): it leaves the worker's reports at once (a report goes out straight away, so that
selection stops choosing it), new queries for it are answered with a retryable 503
``instance_draining`` (the dispatcher retries them on another instance or the Lambda tier), the
queries it already holds finish, and then its slot is freed. When the slot is freed for another
variant (``reserve``), a query for the drained one is still refused for a few seconds rather than
loading it again on demand: a gateway's view of the workers may be that old, and a reload would
take back the slot the plan freed. Without ``reserve`` (nothing waits for the slot) such a query
loads it again, as any query for a variant no worker holds does.

``--tune region`` (or ``ucb``) tunes each loaded variant's parallelism (intra-op threads, inter-op
threads, concurrent batches) under its live traffic, to fewest SLO violations and then least CPU
(``modelless.tuning``, RRL; docs/TUNING.md). ``POST /configure`` sets one by hand. A switch builds
the new session beside the old one and swaps them: runs in flight finish on the old one, queued
queries run on the new one, none is dropped.
"""

from __future__ import annotations

import argparse
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.exceptions import (
    BatcherClosedError,
    InstanceDrainingError,
    InvalidInputError,
    NoFreeSlotError,
    NotFoundError,
    first_line,
)
from modelless.outages import RepeatedFailures
from modelless.repository import open_repository
from modelless.serving.batching import (
    DEFAULT_MAX_DELAY_S,
    AimdController,
    BatchResult,
    ModelFn,
    VariantBatcher,
    max_limit_for,
    profile_estimate,
)
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.monitoring import WorkerMonitor
from modelless.serving.runtime import LoadedVariant, VariantRuntime, run_session
from modelless.tuning import POLICIES, make_policy
from modelless.tuning.base import ParallelConfig, config_space
from modelless.tuning.live import DEFAULT_MIN_QUERIES, DEFAULT_WINDOW_S, LiveTuner
from modelless.types import VariantProfile
from modelless.worker import DRAINED_REFUSAL_S, REPORT_TOKEN_ENV
from modelless.worker.http import announce_ready, make_server, stop_gracefully_on_sigterm
from modelless.worker.reporting import StateSink, make_state_sink

logger = Logger(service="modelless-worker")

REPORT_PERIOD_S = 1.0
LISTEN_BACKLOG = 1024  # pending connections the kernel holds for us (the OS caps it at somaxconn)
# A query that names no budget (no latency target) is still batched, within this much.
DEFAULT_DEADLINE_MS = 1000.0
# The longest ``POST /unload`` waits for a drain to finish before it answers ``draining``.
MAX_DRAIN_WAIT_S = 10.0


@dataclass(frozen=True)
class BatchingConfig:
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    default_deadline_ms: float = DEFAULT_DEADLINE_MS


DEFAULT_BATCHING = BatchingConfig()
# A query that meets a batcher closed under it (a switch of configuration, an unload) is submitted
# again to the instance's current batcher; more tries than this and it fails.
SUBMIT_TRIES = 3
TUNE_TICK_S = 0.25
# How long a stopping worker waits for its report loop's last report before withdrawing it.
WITHDRAW_WAIT_S = 1.0


@dataclass(frozen=True)
class TuningConfig:
    """``--tune``: which policy tunes each instance, over what windows, on how many cores."""

    policy: str = "region"
    window_s: float = DEFAULT_WINDOW_S
    min_queries: int = DEFAULT_MIN_QUERIES
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)


class Worker:
    def __init__(
        self,
        worker_id: str,
        pool: str,
        slots: int,
        repository_url: str,
        cache_dir: Path,
        batching: BatchingConfig | None = DEFAULT_BATCHING,
        tuning: TuningConfig | None = None,
    ) -> None:
        self.monitor = WorkerMonitor(worker_id, pool, address="", slots=slots)
        self.runtime = VariantRuntime(open_repository(repository_url), cache_dir)
        self.batching = batching
        # Tuning needs the batcher: it is what runs an instance's concurrent batches.
        self.tuning = tuning if batching is not None else None
        self._tuners: dict[str, LiveTuner] = {}  # variant -> its tuner (guarded by _batchers_lock)
        self._reconfigure_lock = threading.Lock()  # one switch of configuration at a time
        # Each batcher is bound to the loaded instance it runs on (see _batcher).
        self._batchers: dict[str, tuple[LoadedVariant, VariantBatcher]] = {}
        self._batchers_lock = threading.Lock()
        # Orders "an instance is loaded, so the monitor shows it" against unloads: a request that
        # finishes after its variant was unloaded must not bring the instance back. It also guards
        # the drain bookkeeping below; ``_instances_changed`` wakes an unload waiting for a drain.
        self._instances_lock = threading.Lock()
        self._instances_changed = threading.Condition(self._instances_lock)
        self._admitted: dict[str, int] = {}  # variant -> requests admitted and not yet answered
        # Variants being unloaded once their requests are done -> whether their slot is reserved.
        self._draining: dict[str, bool] = {}
        self._refused_until: dict[str, float] = {}  # drained variant -> end of its refusal (monotonic)
        # Set when the instances change (a load, a drain): the report loop reports at once.
        self.state_changed = threading.Event()

    def _ensure_loaded(self, variant: VariantProfile) -> tuple[LoadedVariant, float]:
        """Load the variant if it is not loaded (on demand) and make sure the monitor shows the
        instance. Only a variant that really loaded counts as an instance: a failed load raises
        before the monitor hears of it, so it neither appears Active to selection nor takes a slot.
        """
        loaded, load_ms = self.runtime.ensure_loaded(variant)
        self._show_if_loaded(variant)
        return loaded, load_ms

    def _show_if_loaded(self, variant: VariantProfile) -> None:
        with self._instances_lock:
            # Unloaded again since (unload holds this lock), or draining: the monitor must not show it.
            if variant.variant_id in self.runtime.loaded_ids and variant.variant_id not in self._draining:
                self.monitor.loaded(variant)

    def _admit(self, variant_id: str) -> None:
        """Count a request in for ``variant_id``, or refuse it (503) while the instance drains or
        shortly after a drain that reserved its slot (see DRAINED_REFUSAL_S)."""
        with self._instances_lock:
            if variant_id in self._draining:
                raise InstanceDrainingError(
                    f"worker {self.monitor.worker_id} is unloading {variant_id}: try another instance"
                )
            refused_until = self._refused_until.get(variant_id)
            if refused_until is not None:
                if time.monotonic() < refused_until and variant_id not in self.runtime.loaded_ids:
                    raise InstanceDrainingError(
                        f"worker {self.monitor.worker_id} has just unloaded {variant_id}: "
                        "try another instance"
                    )
                del self._refused_until[variant_id]
            self._admitted[variant_id] = self._admitted.get(variant_id, 0) + 1

    def _leave(self, variant_id: str) -> None:
        """An admitted request is done; the last one out of a draining instance unloads it."""
        with self._instances_lock:
            left = self._admitted.get(variant_id, 0) - 1
            if left > 0:
                self._admitted[variant_id] = left
                return
            self._admitted.pop(variant_id, None)
            if variant_id in self._draining:
                self._finish_drain_locked(variant_id)

    def _finish_drain_locked(self, variant_id: str) -> None:
        """Unload a drained instance: its slot is free (``_instances_lock`` held)."""
        if self._draining.pop(variant_id, False):
            self._refused_until[variant_id] = time.monotonic() + DRAINED_REFUSAL_S
        self.monitor.unloaded(variant_id)
        self.runtime.unload(variant_id)
        with self._batchers_lock:
            bound = self._batchers.pop(variant_id, None)
            self._tuners.pop(variant_id, None)  # a later load starts the search afresh
        if bound is not None:
            bound[1].close(timeout_s=0.0)  # nothing is queued: every request it held has left
        self._instances_changed.notify_all()
        self.state_changed.set()

    def invoke(self, message: dict[str, Any]) -> dict[str, Any]:
        """``POST /invoke``: the message decoded into its ``Invocation``, served, and its
        ``Reply`` encoded back (``modelless.serving.invocation``)."""
        # The budget runs from the moment the request arrived: a load it waits for counts too.
        arrived = time.monotonic()
        return self.serve(Invocation.from_message(message), arrived).to_message()

    def serve(self, invocation: Invocation, arrived: float) -> Reply:
        """Serve one invocation, admitted to its instance for as long as it runs. How it runs is
        the worker's strategy, chosen once: on the runtime directly, or through the instance's
        batcher (``_run_directly`` / ``_run_batched``)."""
        variant_id = invocation.variant_id
        self._admit(variant_id)
        try:
            if invocation.offline:
                return self._serve_offline(invocation)
            return self._serve_online(invocation, arrived)
        finally:
            self._leave(variant_id)

    def _serve_online(self, invocation: Invocation, arrived: float) -> Reply:
        self.monitor.started(invocation.variant_id)
        try:
            reply, monitored = self._run(invocation, arrived)
        except Exception:
            self.monitor.abandoned(invocation.variant_id)
            raise
        self.monitor.finished(invocation.variant_id, time.time(), reply.batch, *monitored)
        return reply

    def _serve_offline(self, invocation: Invocation) -> Reply:
        """Offline batch work (docs/ARCHITECTURE.md §6): it runs in the instance's idle moments (the batcher's
        background lane: never batched with online queries, never ahead of one that is queued),
        and is recorded apart from them, so that the instance's online QPS, latency and state,
        and what selection and the offline throttle read, stay about online traffic."""
        if self.batching is None:
            reply = self.runtime.serve(invocation)  # under the instance's lock, as online runs are
            self._show_if_loaded(invocation.variant)
        else:
            reply = self._run_in_background(invocation, self.batching)
        self.monitor.finished_offline(time.time(), reply.inference_ms)
        return reply

    def _run(self, invocation: Invocation, arrived: float) -> tuple[Reply, tuple[float, float]]:
        """The reply, and the (queue_ms, inference_ms) pair the monitor is to record for it."""
        if self.batching is None:
            return self._run_directly(invocation)
        return self._run_batched(invocation, arrived, self.batching)

    def _run_directly(self, invocation: Invocation) -> tuple[Reply, tuple[float, float]]:
        reply = self.runtime.serve(invocation)  # loads on demand
        self._show_if_loaded(invocation.variant)
        return reply, (reply.queue_ms, reply.inference_ms)

    def _run_in_background(self, invocation: Invocation, config: BatchingConfig) -> Reply:
        loaded, load_ms = self._ensure_loaded(invocation.variant)
        try:
            ran = self._batcher(loaded, config).submit_background(invocation.inputs)
        except BatcherClosedError:
            loaded, reload_ms = self._ensure_loaded(invocation.variant)
            load_ms += reload_ms
            ran = self._batcher(loaded, config).submit_background(invocation.inputs)
        return Reply(ran.outputs, invocation.rows, load_ms, ran.queue_ms, ran.inference_ms)

    def _run_batched(
        self, invocation: Invocation, arrived: float, config: BatchingConfig
    ) -> tuple[Reply, tuple[float, float]]:
        """Through the variant's batcher, within what is left of the query's budget."""
        budget_ms = config.default_deadline_ms if invocation.deadline_ms is None else invocation.deadline_ms
        deadline = arrived + budget_ms / 1000.0
        # Loading happens here, in the caller's thread: a failed load fails this request alone,
        # never a batch, and its load time is reported to the request that paid it.
        loaded, load_ms = self._ensure_loaded(invocation.variant)
        arriving = self._tuner(loaded)
        if arriving is not None:
            arriving.record_arrival()  # the load level the tuner learns for
        for tries_left in range(SUBMIT_TRIES - 1, -1, -1):
            loaded, batcher = self._bound(loaded, config)
            try:
                batched = batcher.submit(invocation.inputs, deadline)
                break
            except BatcherClosedError:
                # Unloaded, or switched to another configuration, between our lookup and our
                # submit: to the instance's current batcher (loading again on demand, as ever).
                if tries_left == 0:
                    raise
                loaded, reload_ms = self._ensure_loaded(invocation.variant)
                load_ms += reload_ms
        self.monitor.batching(invocation.variant_id, batcher.current_limit)
        self._record_for_tuning(loaded, batched, arrived, deadline)
        reply = Reply(batched.outputs, batched.batch, load_ms, batched.queue_ms, batched.inference_ms)
        # The monitor adds every request's inference time to the instance's busy time, so a
        # batch's run is attributed to its first request only; the others report it as waiting
        # (queue + inference is still each request's latency). Busy time stays true, and the
        # first requests keep the real inference/profile ratio that Interfered is judged on.
        if batched.position == 0:
            return reply, (batched.queue_ms, batched.inference_ms)
        return reply, (batched.queue_ms + batched.inference_ms, 0.0)

    def _record_for_tuning(
        self, loaded: LoadedVariant, batched: BatchResult, arrived: float, deadline: float
    ) -> None:
        tuner = self._tuner(loaded)
        if tuner is not None:
            budget_ms = (deadline - arrived) * 1000.0
            tuner.record_query(loaded.config, (time.monotonic() - arrived) * 1000.0, budget_ms)
            if batched.position == 0:
                tuner.record_run(loaded.config, batched.batch, batched.inference_ms)

    def _batcher(self, loaded: LoadedVariant, config: BatchingConfig) -> VariantBatcher:
        return self._bound(loaded, config)[1]

    def _bound(self, loaded: LoadedVariant, config: BatchingConfig) -> tuple[LoadedVariant, VariantBatcher]:
        """The instance's batcher and the session it runs on: ``loaded``'s, or, when ``loaded``
        was replaced by a new configuration's session since the caller looked it up, the
        current one's (the query runs on what the instance runs now)."""
        variant_id = loaded.variant.variant_id
        stale: VariantBatcher | None = None
        with self._batchers_lock:
            bound = self._batchers.get(variant_id)
            if bound is not None and (bound[0] is loaded or bound[0] is self.runtime.current(variant_id)):
                return bound
            initial = 1
            if bound is not None:
                # The variant was unloaded and loaded again, or switched to another configuration,
                # since this batcher was made: it would keep the old session alive and in use.
                # Its queue is still served, then it ends; the new one starts at its batch limit.
                stale = bound[1]
                initial = stale.controller.limit
            max_limit = max_limit_for(loaded.variant)
            batcher = VariantBatcher(
                variant_id,
                _session_runner(loaded),
                profile_estimate(loaded.variant),
                max_limit,
                max_delay_s=config.max_delay_s,
                controller=AimdController(max_limit, initial=initial),
                runners=loaded.config.concurrency,
            )
            self._batchers[variant_id] = (loaded, batcher)
        if stale is not None:
            stale.close(timeout_s=0.0)
        return loaded, batcher

    def _tuner(self, loaded: LoadedVariant) -> LiveTuner | None:
        """The instance's tuner (made on its first online query), or None when not tuning."""
        if self.tuning is None:
            return None
        variant_id = loaded.variant.variant_id
        with self._batchers_lock:
            tuner = self._tuners.get(variant_id)
            if tuner is None and variant_id in self.runtime.loaded_ids:
                # The profiled configuration is where the search starts, in the space or not.
                space = sorted({*config_space(self.tuning.cores), loaded.config})
                policy = make_policy(self.tuning.policy, space, loaded.config)
                estimate = _median_estimate(loaded.variant)
                tuner = LiveTuner(
                    policy,
                    loaded.config,
                    time.monotonic(),
                    expected_ms=estimate,
                    window_s=self.tuning.window_s,
                    min_queries=self.tuning.min_queries,
                )
                self._tuners[variant_id] = tuner
            return tuner

    def tune_once(self, now: float) -> None:
        """One tick of every instance's tuner: a window that ended is observed, and a proposed
        configuration applied; the monitor hears what each instance runs now."""
        with self._batchers_lock:
            tuners = dict(self._tuners)
        for variant_id, tuner in tuners.items():
            proposed = tuner.tick(now)
            if proposed is not None:
                try:
                    self.reconfigure({"variant_id": variant_id, "config": proposed.to_dict()})
                except Exception as error:  # a failed switch leaves the instance as it was
                    logger.warning(
                        "could not switch configuration",
                        extra={"variant_id": variant_id, "config": proposed.label(), "error": str(error)},
                    )
            current = tuner.current
            self.monitor.tuned(
                variant_id, current.intra, current.inter, current.concurrency, tuner.latency_scale
            )

    def reconfigure(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /configure``: run a loaded instance with another parallelism configuration
        (``{"variant_id": ..., "config": {"intra": 2, "inter": 1, "concurrency": 1}}``). The new
        session is built beside the old one and swapped in; queries queued move to it, runs in
        flight finish on the old one; no query is dropped."""
        variant_id = body.get("variant_id")
        if not isinstance(variant_id, str):
            raise InvalidInputError(f"variant_id must be a string, not {variant_id!r}")
        try:
            config = ParallelConfig.from_dict(body.get("config"))
        except (TypeError, ValueError) as error:
            raise InvalidInputError(f"bad configuration: {error}") from error
        if self.batching is None:
            raise InvalidInputError("this worker runs without batching: its instances cannot be reconfigured")
        missing = NotFoundError(f"worker {self.monitor.worker_id} has no instance of {variant_id}")
        with self._reconfigure_lock:
            current = self.runtime.current(variant_id)
            if current is None:
                raise missing
            switched = current.config != config
            if switched:
                fresh = self.runtime.build(current, config)  # the old session serves meanwhile
                # Swapped under the instances' lock, so that a drain finishing meanwhile cannot
                # leave the new session (or its batcher) behind an unloaded instance.
                with self._instances_lock:
                    if variant_id in self._draining or not self.runtime.swap(current, fresh):
                        raise missing
                    self._bound(fresh, self.batching)  # the old batcher is closed: its queue moves over
            elif variant_id in self.monitor.draining_ids:
                raise missing
            with self._batchers_lock:
                tuner = self._tuners.get(variant_id)
            if tuner is not None:
                tuner.switched(config, time.monotonic())
                self.monitor.tuned(
                    variant_id, config.intra, config.inter, config.concurrency, tuner.latency_scale
                )
            else:
                self.monitor.tuned(variant_id, config.intra, config.inter, config.concurrency, 0.0)
        self.state_changed.set()
        return {"variant_id": variant_id, "config": config.to_dict(), "switched": switched}

    def stats(self, _: dict[str, Any]) -> dict[str, Any]:
        state = self.monitor.snapshot(time.time())
        with self._batchers_lock:
            batchers = {variant_id: bound[1] for variant_id, bound in self._batchers.items()}
        batching = {variant_id: batcher.stats() for variant_id, batcher in batchers.items()}
        with self._batchers_lock:
            tuners = dict(self._tuners)
        configs = {variant_id: bound[0].config.to_dict() for variant_id, bound in self._bound_items()}
        return {
            "configs": configs,
            "tuning": {variant_id: tuner.report() for variant_id, tuner in tuners.items()},
            "worker_id": state.worker_id,
            "state": state.to_json(),
            "loaded": self.runtime.loaded_ids,
            "draining": self.monitor.draining_ids,
            "batching": batching,
        }

    def _bound_items(self) -> list[tuple[str, tuple[LoadedVariant, VariantBatcher]]]:
        with self._batchers_lock:
            return list(self._batchers.items())

    def load(self, body: dict[str, Any]) -> dict[str, Any]:
        """Load a variant ahead of its queries (the scaler's plan), into a free slot. A variant
        being drained is kept instead (the plan wants it again); a refusal after a drain ends."""
        variant = VariantProfile.from_json(body["variant"])
        with self._instances_lock:
            self._refused_until.pop(variant.variant_id, None)
            if self._draining.pop(variant.variant_id, None) is not None:
                self.monitor.loaded(variant)
                self._instances_changed.notify_all()  # an unload waiting on the drain: it is off
        if variant.variant_id not in self.runtime.loaded_ids:
            free = self.monitor.snapshot(time.time()).free_slots
            if free <= 0:
                raise NoFreeSlotError(
                    f"worker {self.monitor.worker_id} has no free slot for {variant.variant_id}"
                )
        _, load_ms = self._ensure_loaded(variant)
        self.state_changed.set()
        return {"loaded": variant.variant_id, "load_ms": load_ms}

    def unload(self, body: dict[str, Any]) -> dict[str, Any]:
        """Drain the instance and free its slot (see the module's docstring). Waits up to
        ``wait_s`` (0 by default) for the requests it holds; ``unloaded`` says whether the slot is
        free now, ``draining`` that it is freed once they are done. ``reserve``: the slot is for
        another variant (a ``POST /load`` to come), not for this one's on-demand reload."""
        variant_id = str(body["variant_id"])
        wait_s = _wait_s(body.get("wait_s", 0.0))
        reserve = body.get("reserve", False)
        if not isinstance(reserve, bool):
            raise InvalidInputError(f"reserve must be true or false, not {reserve!r}")
        with self._instances_lock:
            if variant_id not in self.runtime.loaded_ids:
                self.monitor.unloaded(variant_id)  # whatever it showed, it holds nothing now
                return {"unloaded": False, "draining": False}
            if variant_id in self._draining:
                self._draining[variant_id] = self._draining[variant_id] or reserve
            else:
                self._draining[variant_id] = reserve
                self.monitor.draining(variant_id)
                self.state_changed.set()  # out of the reports at once
                if self._admitted.get(variant_id, 0) == 0:
                    self._finish_drain_locked(variant_id)
                    return {"unloaded": True, "draining": False}
            deadline = time.monotonic() + wait_s
            while variant_id in self._draining:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"unloaded": False, "draining": True}
                self._instances_changed.wait(left)
            return {"unloaded": variant_id not in self.runtime.loaded_ids, "draining": False}


def _wait_s(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        raise InvalidInputError(f"wait_s must be a non-negative number of seconds, not {raw!r}")
    return min(float(raw), MAX_DRAIN_WAIT_S)


def _session_runner(loaded: LoadedVariant) -> ModelFn:
    """The batcher's model: one onnxruntime run on this instance, under its lock (the instance's
    threads are all it may use; the lock also serialises against any other caller)."""

    def run(inputs: np.ndarray) -> np.ndarray:
        with loaded.lock:
            return run_session(loaded, inputs)

    return run


def _median_estimate(variant: VariantProfile) -> Callable[[int], float]:
    """The profile's median run time at a batch size (its largest profiled one beyond it): what
    a tuned instance's measured runs are compared with."""

    def estimate(rows: int) -> float:
        return variant.median_ms(min(max(1, rows), variant.max_batch))

    return estimate


WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


def advertise_host_for(bind_host: str, advertise_host: str | None) -> str:
    """The host the worker reports as its address: the one given, else the bound one. A wildcard
    bind (every interface) names no address another machine can use, and guessing one (the
    first interface, a resolver's answer) could advertise an address the gateway cannot reach."""
    if advertise_host is not None:
        if advertise_host.strip() in WILDCARD_HOSTS:
            raise ValueError(f"--advertise-host {advertise_host!r} is not an address others can reach")
        return advertise_host.strip()
    if bind_host in WILDCARD_HOSTS:
        raise ValueError(
            f"--host {bind_host!r} binds every interface: give --advertise-host with the address "
            "the gateway reaches this worker at (e.g. the instance's private IP)"
        )
    return bind_host


def http_address(host: str, port: int) -> str:
    """``http://host:port``, with an IPv6 literal in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def command_line() -> argparse.ArgumentParser:
    """The worker's command line (``WorkerLaunch.argv`` writes it)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--pool", default="cpu")
    parser.add_argument("--slots", type=int, default=2, help="variant instances this worker can hold")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="address the gateway reaches this worker at, as reported to the metadata store "
        "(default: --host; required when --host binds every interface, e.g. the instance's private IP)",
    )
    parser.add_argument("--port", type=_port, default=0, help="port to listen on (0: one the OS picks)")
    parser.add_argument("--repository", required=True)
    parser.add_argument("--cache-dir", default="/tmp/modelless-cache")
    parser.add_argument("--report-url", required=True, help="redis://… or the gateway's http://… URL")
    parser.add_argument(
        "--no-batching", action="store_true", help="run each invocation on its own, as it arrives"
    )
    parser.add_argument(
        "--batch-delay-ms",
        type=float,
        default=DEFAULT_MAX_DELAY_S * 1000,
        help="longest wait for more queries to fill a batch (never past a query's deadline)",
    )
    parser.add_argument(
        "--tune",
        choices=("off", *POLICIES),
        default="off",
        help="tune each instance's parallelism under its live traffic (docs/TUNING.md): region "
        "(RRL's region-based search) or ucb (a UCB1 bandit); off: run each as profiled",
    )
    parser.add_argument(
        "--tune-window-s", type=float, default=DEFAULT_WINDOW_S, help="length of one tuning window"
    )
    parser.add_argument(
        "--tune-min-queries",
        type=int,
        default=DEFAULT_MIN_QUERIES,
        help="queries a window needs before it is judged",
    )
    return parser


def worker_from(args: argparse.Namespace) -> Worker:
    batching = None if args.no_batching else BatchingConfig(max_delay_s=args.batch_delay_ms / 1000)
    tuning = (
        None
        if args.tune == "off"
        else TuningConfig(args.tune, window_s=args.tune_window_s, min_queries=args.tune_min_queries)
    )
    return Worker(
        args.worker_id,
        args.pool,
        args.slots,
        args.repository,
        Path(args.cache_dir),
        batching=batching,
        tuning=tuning,
    )


class Reporter:
    """The worker's state reports: one at once, then every REPORT_PERIOD_S and at every change
    of its instances (a load, a drain); a failed report (the gateway not up yet, a store
    outage) is logged and retried next period, never fatal. ``stop`` ends them and withdraws the
    last one, so that no record of this worker outlives it."""

    def __init__(self, worker: Worker, sink: StateSink) -> None:
        self._worker = worker
        self._sink = sink
        self.stopped = threading.Event()
        self._failures = RepeatedFailures(
            logger, "state report failed; retrying every period", "state reports resumed"
        )
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._worker.state_changed.clear()
            try:
                self._sink.report(self._worker.monitor.snapshot(time.time()))
                self._failures.succeeded()
            except Exception as error:  # a store outage included: reporting resumes after it
                self._failures.failed(error)
            self._worker.state_changed.wait(REPORT_PERIOD_S)
            if self.stopped.is_set():
                return

    def stop(self) -> None:
        """Stop the reports and withdraw the last one (the loop has sent its last first). Best
        effort: a store that does not answer lets the record go stale (WORKER_STALE_AFTER_S)."""
        self.stopped.set()
        self._worker.state_changed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(WITHDRAW_WAIT_S)
        try:
            self._sink.withdraw(self._worker.monitor.worker_id)
        except Exception as error:  # an outage: the record goes stale by itself
            logger.warning("could not withdraw the worker's report", extra={"error": first_line(error)})


def start_tuning(worker: Worker, stopped: threading.Event) -> None:
    """Tune the worker's instances every TUNE_TICK_S until ``stopped`` (where it tunes at all)."""
    if worker.tuning is None:
        return

    def tune_loop() -> None:
        while not stopped.wait(TUNE_TICK_S):
            try:
                worker.tune_once(time.monotonic())
            except Exception:  # tuning must never take the worker down
                logger.exception("tuning tick failed")

    threading.Thread(target=tune_loop, name="tuner", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = command_line()
    args = parser.parse_args(argv)
    if args.tune != "off" and args.no_batching:
        parser.error("--tune needs batching: it is the batcher that runs an instance's concurrent batches")
    if args.tune_window_s <= 0 or args.tune_min_queries < 1:
        parser.error("--tune-window-s must be positive and --tune-min-queries at least 1")
    try:
        advertised_host = advertise_host_for(args.host, args.advertise_host)
    except ValueError as error:
        parser.error(str(error))
    worker = worker_from(args)
    server = make_server(
        args.host,
        args.port,
        {
            ("POST", "/invoke"): worker.invoke,
            ("GET", "/stats"): worker.stats,
            ("POST", "/load"): worker.load,
            ("POST", "/unload"): worker.unload,
            ("POST", "/configure"): worker.reconfigure,
        },
    )
    # socketserver listens with a backlog of 5: a burst of concurrent callers opening their
    # connections at once (what batching is for) overflows it and some see "connection reset".
    # Listening again on the bound socket only raises the backlog.
    server.socket.listen(LISTEN_BACKLOG)
    worker.monitor.address = http_address(advertised_host, server.server_address[1])
    reporter = Reporter(worker, make_state_sink(args.report_url, os.environ.get(REPORT_TOKEN_ENV, "")))
    reporter.start()
    start_tuning(worker, reporter.stopped)
    # A scale-down: stop reporting (so selection forgets us once the pool provider removes our
    # last report), finish what is in flight, then exit.
    stop_gracefully_on_sigterm(server, before_drain=reporter.stop)
    announce_ready(server)
    logger.info("worker ready", extra={"worker_id": args.worker_id, "address": worker.monitor.address})
    try:
        server.serve_forever()
    finally:
        if not reporter.stopped.is_set():
            reporter.stop()


if __name__ == "__main__":
    main()
