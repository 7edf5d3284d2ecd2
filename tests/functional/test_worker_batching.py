"""Adaptive batching in a real worker process (Clipper §4.3), hit concurrently over HTTP.

Each caller must get its own logits back (compared with a direct onnxruntime run), concurrent
callers must share batches, the AIMD limit must grow under load, and ``--no-batching`` must keep
one run per invocation. The last test measures throughput at a fixed latency budget with and
without batching and prints it (timings on a shared CI machine are not asserted).

Every wait is bounded; every worker and invoker is closed by its fixture.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from modelless.catalog import CPU_POOL
from modelless.exceptions import ModellessError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.invokers import HttpWorkerInvoker, raise_for_worker_error
from modelless.pools.local import LocalWorkerPool
from modelless.pools.processes import ChildProcess, spawn
from modelless.repository.local import LocalModelRepository
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.monitoring import WINDOW_S
from modelless.serving.wire import FRAMES_MEDIA_TYPE, decode_frames, encode_frames
from modelless.types import VariantProfile, WorkerState
from tests.functional.workers_kit import report_url_of, worker_pool
from tests.models import digits, linear_model, wide_model
from tests.waiting import scaled

APP = "batching-app"
LINEAR_KEY = f"apps/{APP}/linear/variants/fp32-basic.onnx"
WIDE_KEY = f"apps/{APP}/wide/variants/fp32-basic.onnx"
INVOKE_TIMEOUT_S = 20.0
THREADS = 16
CALLS_PER_THREAD = 15


def make_variant(model: str, artifact_key: str, p99_ms: dict[int, float]) -> VariantProfile:
    return VariantProfile(
        variant_id=f"{APP}/{model}/fp32-basic/cpu",
        app_id=APP,
        model_name=model,
        pool="cpu",
        precision="fp32",
        opt_level="basic",
        threads=1,
        artifact_key=artifact_key,
        size_bytes=1,
        load_latency_ms=20.0,
        latency_p50_ms={batch: ms / 2 for batch, ms in p99_ms.items()},
        latency_p99_ms=p99_ms,
        peak_memory_mb=1.0,
        accuracy=0.9,
        price_per_second=CPU_POOL.instance_price_per_second(1),
        request_price=0.0,
        hardware="test",
        measured_on_target=True,
        max_useful_batch=32,
    )


LINEAR = make_variant("linear", LINEAR_KEY, {1: 2.0, 2: 2.0, 4: 2.0, 8: 2.5, 16: 3.0, 32: 4.0})
WIDE = make_variant("wide", WIDE_KEY, {1: 5.0, 2: 5.0, 4: 5.5, 8: 7.0, 16: 9.0, 32: 15.0})


def invocation(variant: VariantProfile, inputs: np.ndarray, deadline_ms: float | None = None) -> Invocation:
    return Invocation(variant, inputs, "batching-test", deadline_ms)


def post_frames(address: str, message: dict[str, Any]) -> dict[str, Any]:
    """``message`` posted to the worker as it is, however malformed (the invoker sends only
    what an ``Invocation`` encodes); its reply's message, or the domain error it answered."""
    response = httpx.post(
        f"{address}/invoke",
        content=encode_frames(message),
        headers={"Content-Type": FRAMES_MEDIA_TYPE},
        timeout=INVOKE_TIMEOUT_S,
    )
    return raise_for_worker_error(response.status_code, decode_frames(response.content))


class Direct:
    """The model run directly in onnxruntime, in this process: what every reply must match."""

    def __init__(self, model: bytes) -> None:
        self._session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    def logits(self, inputs: np.ndarray) -> np.ndarray:
        logits: np.ndarray = self._session.run(None, {"input": inputs})[0]
        return logits


def stats(address: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{address}/stats", timeout=5.0).json()
    return body


# --- fixtures ---------------------------------------------------------------------------------


@dataclass
class Setup:
    repository_url: str
    tmp: Path
    report_url: str


@pytest.fixture
def setup(tmp_path: Path, redis_store: RedisMetadataStore) -> Setup:
    repository = LocalModelRepository(tmp_path / "repo")
    repository.put(LINEAR_KEY, linear_model())
    repository.put(WIDE_KEY, wide_model())
    return Setup(str(tmp_path / "repo"), tmp_path, report_url_of(redis_store))


@pytest.fixture
def pool(setup: Setup) -> Iterator[LocalWorkerPool]:
    with worker_pool(setup.repository_url, setup.report_url, setup.tmp) as workers:
        yield workers


def start_worker(pool: LocalWorkerPool) -> str:
    pool.scale_to(1)
    [child] = pool.workers().values()
    return child.address


def spawn_worker(setup: Setup, name: str, *extra: str) -> ChildProcess:
    """A worker started directly, for flags the pool provider does not pass (``--no-batching``)."""
    return spawn(
        name,
        "modelless.worker",
        [
            "--worker-id",
            name,
            "--pool",
            "cpu",
            "--repository",
            setup.repository_url,
            "--cache-dir",
            str(setup.tmp / "cache"),
            "--report-url",
            setup.report_url,
            *extra,
        ],
        setup.tmp / "logs",
        env={"OMP_NUM_THREADS": "1"},
    )


# --- concurrent callers -----------------------------------------------------------------------


@dataclass
class Answer:
    inputs: np.ndarray
    reply: Reply


def hammer(
    invoker: HttpWorkerInvoker,
    address: str,
    variant: VariantProfile,
    threads: int = THREADS,
    calls: int = CALLS_PER_THREAD,
    deadline_ms: float | None = 200.0,
) -> list[Answer]:
    """``threads`` callers at once, each sending ``calls`` invocations of its own digits (1 to 3
    rows each); every reply with the inputs it answers."""
    inputs, _ = digits()
    replies: list[Answer] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def caller(index: int) -> None:
        try:
            barrier.wait(INVOKE_TIMEOUT_S)
            for call in range(calls):
                start = (index * calls + call) * 3 % (len(inputs) - 3)
                mine = np.ascontiguousarray(inputs[start : start + 1 + (index + call) % 3])
                reply = invoker.invoke(address, invocation(variant, mine, deadline_ms), INVOKE_TIMEOUT_S)
                with lock:
                    replies.append(Answer(mine, reply))
        except BaseException as error:  # re-raised in the test thread below
            errors.append(error)

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(scaled(INVOKE_TIMEOUT_S * 2))
    assert not any(w.is_alive() for w in workers), "a caller hung"
    assert errors == []
    return replies


def test_concurrent_callers_share_batches_and_each_gets_its_own_logits(
    pool: LocalWorkerPool, invoker: HttpWorkerInvoker
) -> None:
    address = start_worker(pool)
    warm = invoker.invoke(address, invocation(LINEAR, digits()[0][:1]), INVOKE_TIMEOUT_S)
    assert warm.load_ms > 0

    replies = hammer(invoker, address, LINEAR)

    assert len(replies) == THREADS * CALLS_PER_THREAD
    direct = Direct(linear_model())
    for answer in replies:
        np.testing.assert_allclose(answer.reply.outputs, direct.logits(answer.inputs), rtol=1e-5, atol=1e-5)
        assert answer.reply.batch >= len(answer.inputs)  # the batch held at least its own rows
        assert answer.reply.load_ms == 0
        assert answer.reply.queue_ms >= 0 and answer.reply.inference_ms > 0
    shared = [a for a in replies if a.reply.batch > len(a.inputs)]
    assert shared, "no reply shared a batch with another caller under 16 concurrent callers"
    batching = stats(address)["batching"][LINEAR.variant_id]
    assert batching["largest_batch"] > 3
    assert batching["requests"] == len(replies) + 1
    assert batching["batches"] < batching["requests"]


def test_the_batch_limit_grows_under_load(pool: LocalWorkerPool, invoker: HttpWorkerInvoker) -> None:
    address = start_worker(pool)
    invoker.invoke(address, invocation(WIDE, digits()[0][:1]), INVOKE_TIMEOUT_S)
    before = stats(address)["batching"][WIDE.variant_id]
    assert before["limit"] <= 2  # AIMD starts at 1; the warm-up's full batch of one may add one

    started = time.monotonic()
    replies = hammer(invoker, address, WIDE, calls=8, deadline_ms=5000.0)
    elapsed_ms = (time.monotonic() - started) * 1000

    body = stats(address)
    after = body["batching"][WIDE.variant_id]
    assert after["limit"] > before["limit"]
    assert after["limit"] <= after["max_limit"] == WIDE.max_useful_batch
    assert max(a.reply.batch for a in replies) > 3
    # The monitor counts each batch's run once: one dispatch thread cannot be busy for longer
    # than the calls took (counting the run once per request would have it busy ~batch times that).
    state = WorkerState.from_json(body["state"])
    [instance] = state.instances
    assert instance.queue_length == 0  # every started request was finished
    busy_ms = state.utilisation * WINDOW_S * 1000 * (state.free_slots + len(state.instances))
    assert busy_ms <= elapsed_ms + 100, (busy_ms, elapsed_ms)
    direct = Direct(wide_model())
    for answer in replies:
        np.testing.assert_allclose(answer.reply.outputs, direct.logits(answer.inputs), rtol=1e-4, atol=1e-4)


def test_deadline_ms_is_read_and_a_bad_one_refused(pool: LocalWorkerPool, invoker: HttpWorkerInvoker) -> None:
    address = start_worker(pool)
    inputs = np.ascontiguousarray(digits()[0][:2])

    late = invoker.invoke(address, invocation(LINEAR, inputs, deadline_ms=0), INVOKE_TIMEOUT_S)
    np.testing.assert_allclose(
        late.outputs, Direct(linear_model()).logits(inputs), rtol=1e-5, atol=1e-5
    )  # no budget left: answered at once, late, never failed for it
    sent = invocation(LINEAR, inputs).to_message()
    assert Reply.from_message(post_frames(address, {**sent, "deadline_ms": 0})).batch == 2  # as sent
    for bad in ("soon", True, [5]):
        with pytest.raises(ModellessError) as raised:
            post_frames(address, {**sent, "deadline_ms": bad})
        assert raised.value.code == "invalid_input"
        assert raised.value.status_code == 400


def test_an_invocation_of_another_protocol_version_is_refused_with_a_502(
    pool: LocalWorkerPool, invoker: HttpWorkerInvoker
) -> None:
    """A gateway of another release (or of one from before versions): refused for its version,
    before any field is read, and the worker serves the next invocation as ever."""
    address = start_worker(pool)
    inputs = np.ascontiguousarray(digits()[0][:2])
    unversioned = {k: v for k, v in invocation(LINEAR, inputs).to_message().items() if k != "version"}
    for message in (unversioned, {**unversioned, "version": 0}, {**unversioned, "version": 2}):
        with pytest.raises(ModellessError) as mismatched:
            post_frames(address, message)
        assert mismatched.value.code == "protocol_mismatch"
        assert mismatched.value.status_code == 502
    served = invoker.invoke(address, invocation(LINEAR, inputs), INVOKE_TIMEOUT_S)
    np.testing.assert_allclose(served.outputs, Direct(linear_model()).logits(inputs), rtol=1e-5, atol=1e-5)


def test_no_batching_runs_each_invocation_on_its_own(
    setup: Setup, spawned: list[ChildProcess], invoker: HttpWorkerInvoker
) -> None:
    child = spawn_worker(setup, "cpu-nobatch", "--no-batching")
    spawned.append(child)

    replies = hammer(invoker, child.address, LINEAR, threads=8, calls=5)

    direct = Direct(linear_model())
    for answer in replies:
        assert answer.reply.batch == len(answer.inputs)
        np.testing.assert_allclose(answer.reply.outputs, direct.logits(answer.inputs), rtol=1e-5, atol=1e-5)
    assert stats(child.address)["batching"] == {}


# --- the gain, measured -----------------------------------------------------------------------


@dataclass
class Throughput:
    qps: float  # replies per second
    goodput: float  # replies within the budget per second
    p50_ms: float
    p99_ms: float
    mean_batch: float


def measure(
    invoker: HttpWorkerInvoker,
    address: str,
    variant: VariantProfile,
    budget_ms: float,
    threads: int,
    duration_s: float,
) -> Throughput:
    """Closed loop: ``threads`` callers send one-row queries with ``budget_ms`` as their deadline
    for ``duration_s``; latency is what the caller saw."""
    inputs = np.ascontiguousarray(digits()[0][:1])
    query = invocation(variant, inputs, deadline_ms=budget_ms)
    invoker.invoke(address, query, INVOKE_TIMEOUT_S)  # loaded and warm before the clock starts
    latencies: list[float] = []
    batches: list[int] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def caller() -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            reply = invoker.invoke(address, query, INVOKE_TIMEOUT_S)
            elapsed_ms = (time.perf_counter() - started) * 1000
            with lock:
                latencies.append(elapsed_ms)
                batches.append(reply.batch)

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(threads)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(duration_s + scaled(INVOKE_TIMEOUT_S))
    assert not any(t.is_alive() for t in callers), "a caller hung"
    ordered = sorted(latencies)
    return Throughput(
        qps=len(ordered) / duration_s,
        goodput=sum(ms <= budget_ms for ms in ordered) / duration_s,
        p50_ms=ordered[len(ordered) // 2],
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        mean_batch=sum(batches) / len(batches),
    )


@pytest.mark.parametrize(("variant", "budget_ms"), [(WIDE, 50.0), (LINEAR, 50.0)], ids=["wide", "linear"])
def test_throughput_at_a_fixed_budget_with_and_without_batching(
    setup: Setup,
    spawned: list[ChildProcess],
    invoker: HttpWorkerInvoker,
    variant: VariantProfile,
    budget_ms: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results: dict[str, Throughput] = {}
    for mode, flags in (("batching", ()), ("no-batching", ("--no-batching",))):
        child = spawn_worker(setup, f"bench-{variant.model_name}-{mode}", *flags)
        spawned.append(child)
        results[mode] = measure(invoker, child.address, variant, budget_ms, threads=THREADS, duration_s=1.5)
        child.stop()  # one worker at a time: they would share the machine's cores

    on, off = results["batching"], results["no-batching"]
    with capsys.disabled():
        print(f"\n{variant.model_name} model, {THREADS} closed-loop callers, {budget_ms:.0f} ms budget:")
        for mode, result in results.items():
            print(
                f"  {mode:12s} {result.qps:7.0f} q/s, {result.goodput:7.0f} q/s within budget, "
                f"p50 {result.p50_ms:6.2f} ms, p99 {result.p99_ms:6.2f} ms, "
                f"mean batch {result.mean_batch:5.2f}"
            )
        print(f"  gain at the budget: x{on.goodput / max(off.goodput, 1e-9):.2f}")
    assert on.qps > 0 and off.qps > 0
    assert off.mean_batch == 1.0  # one row per query and no batching: every run is one query
