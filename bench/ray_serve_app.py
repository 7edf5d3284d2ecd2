"""Ray Serve serving the same ONNX file as the project, for ``bench/serving.py`` to compare.

``ray[serve]`` is no dependency of the project: this module runs under a separate virtual
environment's interpreter (``.venv-ray``, made by the benchmark) and imports ray only when run.

    .venv-ray/bin/python -m bench.ray_serve_app --model variant.onnx --threads 1 --port 8000 \
        --max-batch 32 --batch-wait-ms 0.5 --temp-dir /tmp/rayb

It starts a local Ray instance (no dashboard, a small object store) and two Serve applications on
one HTTP proxy bound to 127.0.0.1:

- ``/plain``: one replica; each request runs alone (the model-serving example of Ray's docs:
  parse the JSON body, run the model, return JSON);
- ``/batched``: one replica; requests are batched by ``@serve.batch`` with ``--max-batch`` and
  ``--batch-wait-ms`` (set by the benchmark to the project's batch limit and fill delay).

Each replica runs the model with onnxruntime exactly as the project's workers do
(``modelless.serving.runtime.make_session``: ``--threads`` intra-op threads, one inter-op thread,
sequential execution, no further graph optimisation since the artifact is already optimised).
Per-request access logs are off, as the project's gateway logs no line per query at the
benchmark's log level. A request body is the project's own: a binary ``.npy`` array
(``application/x-npy``, one input or a batch of them), or the JSON ``online_query`` body, of
which only ``inputs`` is read; the reply carries the logits and predictions, as JSON.

The process prints ``READY <port>`` once both applications answer, serves until its stdin closes
or it gets SIGTERM/SIGINT, then shuts Serve and Ray down (their processes included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def make_session(model_path: str, threads: int) -> Any:
    """The project's worker session options (``modelless.serving.runtime.make_session``), CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])


class OnnxModel:
    """One replica's model: a session and the rank of one input (without the batch axis)."""

    def __init__(self, model_path: str, threads: int) -> None:
        self.session = make_session(model_path, threads)
        declared = self.session.get_inputs()[0]
        self.input_name: str = declared.name
        self.input_rank = len(declared.shape) - 1

    def inputs_of(self, body: bytes, content_type: str) -> np.ndarray:
        import io

        import numpy as np

        inputs: np.ndarray
        if content_type.startswith("application/x-npy"):
            inputs = np.load(io.BytesIO(body), allow_pickle=False)
        else:
            inputs = np.asarray(json.loads(body)["inputs"], dtype=np.float32)
        return inputs[None] if inputs.ndim == self.input_rank else inputs

    def run(self, inputs: np.ndarray) -> np.ndarray:
        outputs: np.ndarray = self.session.run(None, {self.input_name: inputs})[0]
        return outputs


def reply(outputs: np.ndarray) -> dict[str, Any]:
    return {"outputs": outputs.round(6).tolist(), "predictions": outputs.argmax(axis=1).tolist()}


def build_apps(
    model_path: str, threads: int, max_batch: int, batch_wait_s: float, max_ongoing: int
) -> tuple[Any, Any]:
    """The two Serve applications (``plain``, ``batched``), bound and ready for ``serve.run``."""
    from ray import serve

    options = {"num_cpus": 0}  # one replica each; Ray's CPU accounting is not what limits them

    @serve.deployment(num_replicas=1, ray_actor_options=options, max_ongoing_requests=max_ongoing)
    class Plain:
        def __init__(self) -> None:
            self.model = OnnxModel(model_path, threads)

        async def __call__(self, request: Any) -> dict[str, Any]:
            inputs = self.model.inputs_of(await request.body(), request.headers.get("content-type", ""))
            return reply(self.model.run(inputs))

    # A replica must hold at least a batch's worth of requests for the batch to fill.
    @serve.deployment(
        num_replicas=1, ray_actor_options=options, max_ongoing_requests=max(max_ongoing, 2 * max_batch)
    )
    class Batched:
        def __init__(self) -> None:
            self.model = OnnxModel(model_path, threads)

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_s)  # type: ignore[misc, untyped-decorator]
        async def infer(self, batch: list[np.ndarray]) -> list[np.ndarray]:
            import numpy as np

            outputs = self.model.run(np.concatenate(batch) if len(batch) > 1 else batch[0])
            split, start = [], 0
            for inputs in batch:
                split.append(outputs[start : start + len(inputs)])
                start += len(inputs)
            return split

        async def __call__(self, request: Any) -> dict[str, Any]:
            inputs = self.model.inputs_of(await request.body(), request.headers.get("content-type", ""))
            return reply(await self.infer(inputs))

    return Plain.bind(), Batched.bind()  # type: ignore[attr-defined]


def wait_answering(url: str, body: bytes, content_type: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            request = urllib.request.Request(url, body, {"Content-Type": content_type})
            with urllib.request.urlopen(request, timeout=5) as response:
                json.loads(response.read())
                return
        except Exception as error:  # not up yet (connection refused, 503 while deploying)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s: {error}") from error
            time.sleep(0.25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="the ONNX file (the project's variant artifact)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=0.5)
    parser.add_argument(
        "--max-ongoing",
        type=int,
        default=256,
        help="requests a replica takes at once (Ray's default, 5, makes its router back off up to 0.5 s)",
    )
    parser.add_argument("--sample", required=True, help="a request body to check the apps with")
    parser.add_argument("--sample-type", default="application/json", help="the sample's content type")
    parser.add_argument("--temp-dir", default="", help="Ray's session directory (short: socket paths)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--start-timeout-s", type=float, default=180.0)
    args = parser.parse_args(argv)

    import ray
    from ray import serve

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ray.init(
        num_cpus=args.cpus,
        include_dashboard=False,
        object_store_memory=128 * 1024 * 1024,
        _node_ip_address="127.0.0.1",
        _temp_dir=args.temp_dir or None,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": args.port},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        plain, batched = build_apps(
            args.model, args.threads, args.max_batch, args.batch_wait_ms / 1000, args.max_ongoing
        )
        serve.run(plain, name="plain", route_prefix="/plain")
        serve.run(batched, name="batched", route_prefix="/batched")
        sample = open(args.sample, "rb").read()  # noqa: SIM115 (read once, at start-up)
        for route in ("plain", "batched"):
            wait_answering(
                f"http://127.0.0.1:{args.port}/{route}", sample, args.sample_type, args.start_timeout_s
            )
        sys.stdout.write(f"READY {args.port}\n")
        sys.stdout.flush()

        def watch_stdin() -> None:  # the parent closing our stdin (or dying) stops us too
            sys.stdin.read()
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
        while not stop.wait(0.5):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
