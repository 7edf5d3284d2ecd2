"""The Lambda warm pool over a Lambda tier's invoker (``modelless.scaling.warm_pool``).

Each scaler tick names, per Lambda variant, the containers of its memory size that should hold it
warm. Nothing tells which containers of a Lambda function are warm (AWS does not say; an idle one
is kept for minutes, then recycled), so the pool keeps them warm the way Lambda users do:
``count`` concurrent warm-up invocations of the variant (one row of zeros,
``runtime.warmup_invocation``), which Lambda spreads over ``count`` containers, starting those it
lacks. The variants of one memory size take turns, each round once the last has answered: the
next round's invocations then find the same containers idle (Lambda hands the warmest idle
container first) and load their variant beside the last, so that every container holds them all.
A variant is warmed again every ``refresh_s`` (well within the time an idle container is kept)
and at once when a tick asks for more. The rounds run in the background: a tick never waits for
them. On Lambda the scaler's container is frozen between invocations, and a thread frozen
mid-round would send its warm-ups only once thawed (a minute later, or never): the scaling function
waits for the rounds in flight (``settle``) before it returns. Provisioned concurrency, where a
deployment pays for it, keeps the containers warm without them.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait

from aws_lambda_powertools import Logger

from modelless.metadata.base import ModelStore
from modelless.pools.invokers import LambdaInvoker
from modelless.scaling.warm_pool import within
from modelless.serving.invocation import Invocation
from modelless.serving.runtime import warmup_invocation
from modelless.types import VariantProfile

logger = Logger(service="scaler", child=True)

# Lambda keeps an idle container for 5 to 15 minutes (not documented, widely measured): every
# container is invoked again well before the shortest of them.
KEEP_WARM_REFRESH_S = 240.0
WARMUP_TIMEOUT_S = 60.0  # a cold start and the variant's load
MAX_CONCURRENT_WARMUPS = 64  # warm-up invocations in flight at once, all memory sizes together


class InvokingWarmPool:
    """``LambdaWarmPool`` by concurrent warm-up invocations through ``invoker``; ``store`` gives
    each variant's model record (its input shape). ``capacity``: the most containers the tier
    runs at once (the local tier's concurrency), which the pool never asks more of in all: more
    warm-ups would only wait for containers that queries need. ``clock``: monotonic seconds (a
    fake one in tests)."""

    def __init__(
        self,
        invoker: LambdaInvoker,
        store: ModelStore,
        refresh_s: float = KEEP_WARM_REFRESH_S,
        timeout_s: float = WARMUP_TIMEOUT_S,
        capacity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._invoker = invoker
        self._store = store
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._capacity = capacity
        self._clock = clock
        self._warmed: dict[str, tuple[float, int]] = {}  # variant -> (when, containers) last warmed
        self._rounds = ThreadPoolExecutor(4, thread_name_prefix="keep-warm-rounds")
        self._in_flight: set[Future[None]] = set()  # rounds submitted and not yet answered
        self._invocations = ThreadPoolExecutor(MAX_CONCURRENT_WARMUPS, thread_name_prefix="keep-warm")

    def keep_warm(self, containers: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        now = self._clock()
        for variant_id in list(self._warmed):
            if variant_id not in containers:
                del self._warmed[variant_id]  # no longer needed: Lambda recycles them in time
        sizes: dict[int, int] = {}  # memory size -> containers (each holding its variants)
        for variant_id, count in containers.items():
            memory = profiles[variant_id].memory_mb
            sizes[memory] = max(sizes.get(memory, 0), count)
        sizes = within(sizes, self._capacity)
        rounds: dict[int, list[tuple[str, Invocation]]] = {}
        for variant_id in sorted(containers):
            variant = profiles[variant_id]
            count = min(containers[variant_id], sizes[variant.memory_mb])
            last = self._warmed.get(variant_id)
            if count <= 0 or (last is not None and last[1] >= count and now - last[0] < self._refresh_s):
                continue
            record = self._store.get_model(variant.app_id, variant.model_name)
            if record is None:
                continue  # deleted since the tick read its profiles
            self._warmed[variant_id] = (now, count)
            rounds.setdefault(variant.memory_mb, []).append((variant_id, warmup_invocation(variant, record)))
        self._in_flight = {round_ for round_ in self._in_flight if not round_.done()}
        for memory, due in rounds.items():
            self._in_flight.add(self._rounds.submit(self._warm_in_turn, due, sizes[memory]))

    def settle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the rounds in flight to be answered; returns how many
        still are not (0: all answered). A round left behind sends the rest of its warm-ups when
        the container next runs; a variant whose warm-up fails is warmed again next tick."""
        _, pending = wait(set(self._in_flight), timeout=max(0.0, timeout_s))
        self._in_flight = set(pending)
        return len(pending)

    def _warm_in_turn(self, due: list[tuple[str, Invocation]], count: int) -> None:
        """One memory size's variants, one round each: ``count`` invocations at once, the next
        round once they have answered."""
        for variant_id, invocation in due:
            # Submitted together, they overlap; each under a correlation id of its own.
            copies = [
                dataclasses.replace(invocation, correlation_id=f"warmup-{uuid.uuid4().hex}")
                for _ in range(count)
            ]
            wait([self._invocations.submit(self._warm, variant_id, copy) for copy in copies])

    def _warm(self, variant_id: str, invocation: Invocation) -> None:
        try:
            self._invoker.invoke(invocation, self._timeout_s)
        except Exception as error:  # a failed warm-up costs a cold start later, nothing more
            logger.warning("keep-warm invocation failed", extra={"variant": variant_id, "error": str(error)})
            self._warmed.pop(variant_id, None)  # try again next tick

    def close(self) -> None:
        self._rounds.shutdown(wait=False, cancel_futures=True)
        self._invocations.shutdown(wait=False, cancel_futures=True)
