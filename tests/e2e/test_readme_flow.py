"""The README's flow over HTTP against a real embedded stack: create an app, register models
with the CLI, query by targets, read the variants table, stop with Ctrl-C."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from infra.local.ports import free_port
from modelless.client import Client, ModellessClientError
from modelless.config import Settings
from tests.conftest import service_url
from tests.e2e.conftest import RunningStack, start_stack
from tests.models import digits, hidden_model, linear_model, valset_npz
from tests.waiting import wait_for


def cli(stack: RunningStack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelless.cli", *args],
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
    )


def write_models(directory: Path) -> None:
    (directory / "linear.onnx").write_bytes(linear_model())
    (directory / "hidden.onnx").write_bytes(hidden_model())
    (directory / "val.npz").write_bytes(valset_npz())
    images, _ = digits()
    np.save(directory / "sample.npy", images[3])


def query_until_active(client: Client, app: str, accuracy: float, latency: float) -> dict[str, Any]:
    """The first query with tight targets may miss while its variant loads; bounded retries."""

    def attempt() -> dict[str, Any] | None:
        try:
            return client.online_query(digits()[0][3], app, latency=latency, accuracy=accuracy)
        except ModellessClientError as error:
            if error.status != 422 or "warming" not in error.details:
                raise
            return None  # its variant is still loading: again

    return wait_for(attempt, 20.0, f"a query at {latency} ms / {accuracy} to find its variant warm", 0.3)


def run_flow(stack: RunningStack, workdir: Path) -> None:
    write_models(workdir)
    app = f"e2e{uuid.uuid4().hex[:6]}"
    created = cli(stack, "create-app", app)
    assert "API key" in created.stdout
    for name, file in (("linear", "linear.onnx"), ("hidden", "hidden.onnx")):
        done = cli(
            stack,
            "register",
            "--app",
            app,
            "--name",
            name,
            "--model",
            str(workdir / file),
            "--valset",
            str(workdir / "val.npz"),
        )
        outcome = rf"{name} ready: (\d+) variants servable \((\d+) pruned as dominated\)"
        registered = re.search(outcome, done.stdout)
        assert registered, done.stdout + done.stderr
        kept, pruned = map(int, registered.groups())
        # 10 artifacts (fp32, int8, static int8 at 3 levels, fp16) x 4 CPU placements.
        assert kept >= 2 and kept + pruned == 40  # at least one per pool survives

    table = cli(stack, "variants", "--app", app).stdout
    key = json.loads((stack.state_dir / "credentials.json").read_text())[app]
    assert table.count(f"{app}/") == len(Client(stack.url, api_key=key).variants())
    assert "accuracy" in table.splitlines()[0]
    # The same for scripts: only JSON on stdout.
    listed = json.loads(cli(stack, "--output", "json", "variants", "--app", app).stdout)["variants"]
    assert sorted(v["variant_id"] for v in listed) == sorted(
        v["variant_id"] for v in Client(stack.url, api_key=key).variants()
    )

    client = Client(stack.url, api_key=key)
    variants = client.variants()
    linear_accuracy = max(v["accuracy"] for v in variants if v["model_name"] == "linear")
    hidden_accuracy = max(v["accuracy"] for v in variants if v["model_name"] == "hidden")
    assert hidden_accuracy > linear_accuracy

    # High accuracy: only the hidden-layer model qualifies.
    accurate = query_until_active(client, app, accuracy=hidden_accuracy, latency=500.0)
    assert accurate["model"] == "hidden"
    assert accurate["predictions"] == [int(digits()[1][3])]
    assert set(accurate["timingsMs"]) >= {"selection_ms", "queue_ms", "inference_ms", "total_ms"}

    # Low accuracy and a budget only a loaded variant meets: the cheap linear one.
    fast_budget = 2 * min(v["latency_p99_ms"]["1"] for v in variants) + 0.05
    fast = query_until_active(client, app, accuracy=linear_accuracy - 0.01, latency=fast_budget)
    assert fast["variantState"] == "active"
    assert fast["model"] in {"linear", "hidden"}

    # The CLI query, and the impossible one naming the closest variant.
    shown = cli(stack, "query", "--app", app, "--inputs", str(workdir / "sample.npy"), "--model", "linear")
    assert "predictions:" in shown.stdout and f"{app}/linear/" in shown.stdout
    impossible = cli(
        stack,
        "query",
        "--app",
        app,
        "--inputs",
        str(workdir / "sample.npy"),
        "--accuracy",
        "1.0",
        "--latency",
        "0.001",
        check=False,
    )
    assert impossible.returncode == 1  # the service refused it (a 4xx): modelless.cli.ExitCode
    assert "targets_unreachable" in impossible.stderr and "closest" in impossible.stderr

    # Bad input over the wire: a clear 4xx. (json.dumps writes NaN, as many clients do.)
    body = json.dumps({"appID": app, "modelName": "linear", "inputs": [[[float("nan")] * 8] * 8]})
    response = httpx.post(
        f"{stack.url}/v1/online_query",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "NaN" in response.json()["error"]["message"]


def test_readme_flow_on_the_embedded_default(memory_stack: RunningStack, tmp_path: Path) -> None:
    run_flow(memory_stack, tmp_path)
    assert memory_stack.stop() == 0


def test_readme_flow_against_real_redis(tmp_path: Path) -> None:
    url = service_url("MODELLESS_TEST_REDIS_URL")
    prefix = f"e2e-{uuid.uuid4().hex[:8]}:"
    stack = start_stack(tmp_path / "state", f"{url}?prefix={prefix}")
    try:
        run_flow(stack, tmp_path)
        client = Client(stack.url, admin_key=stack.admin_key)
        workers = {w["worker_id"]: w for w in client.workers(admin=True)}  # every app's, addresses too
        # Workers report their state through Redis. Which of the two started is still there depends
        # on the scaler: an idle worker is let go once the plan has not wanted it for its hold.
        cpu_workers = [w for w in workers.values() if w["pool"] == "cpu"]
        assert cpu_workers, f"no cpu worker reported through Redis: {sorted(workers)}"
        assert any(w["instances"] for w in cpu_workers)
    finally:
        assert stack.stop() == 0
        from modelless.metadata.redis import RedisMetadataStore

        RedisMetadataStore.from_url(f"{url}?prefix={prefix}").flush_namespace()


def child_pids(parent: int) -> list[int]:
    """Direct children of ``parent``, read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def test_ctrl_c_stops_every_process(memory_stack: RunningStack) -> None:
    children = child_pids(memory_stack.process.pid)
    assert len(children) >= 2  # the worker processes
    assert memory_stack.stop() == 0
    wait_for(
        lambda: [pid for pid in children if Path(f"/proc/{pid}").exists()],
        10.0,
        "every child process to exit",
        interval_s=0.1,
        until=lambda alive: not alive,
    )


def test_uploads_over_the_size_limit_are_refused(memory_stack: RunningStack) -> None:
    stack = memory_stack
    admin = Client(stack.url, admin_key=stack.admin_key)
    key = admin.create_app("sizes")
    # 65 MiB was past the old 64 MiB limit: now it is taken, and checked (zeros are no model).
    huge = io.BytesIO(b"\0" * (65 * 1024 * 1024))
    response = httpx.post(
        f"{stack.url}/v1/register_model",
        headers={"Authorization": f"Bearer {key}"},
        data={"appID": "sizes", "modelName": "big"},
        files={"model": ("big.onnx", huge), "valSet": ("v.npz", valset_npz())},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "not a valid ONNX model" in response.json()["error"]["message"]
    # Past today's limit (the defaults: 1 GiB + 256 MiB), refused from the declared size alone.
    limit = Settings().register_body_limit
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(
            (
                f"POST /v1/register_model HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {limit + 1}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"payload_too_large" not in answer and (piece := connection.recv(65536)):
            answer += piece
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"MODELLESS_MAX_MODEL_BYTES + MODELLESS_MAX_VALSET_BYTES" in answer
    assert Client(stack.url, api_key=key).models() == []


def test_scripts_run_demo_registers_the_zoo_and_answers(tmp_path: Path) -> None:
    """The README's first command, to the end of its demo (trains the zoo here: ~1 min)."""
    port = free_port()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.local.demo",
            "--exit-after-demo",
            "--port",
            str(port),
            "--metadata",
            "memory://",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout
    assert completed.returncode == 0, output + completed.stderr
    for model in ("digits-tiny", "digits-linear", "digits-mlp", "digits-small-cnn", "digits-cnn"):
        assert re.search(rf"{model}: ready, \d+ variants \(\d+ dominated ones pruned\)", output)
    summary = re.search(r"in all: (\d+) variants; batch-1 p50 latency [\d.]+\.\.[\d.]+ ms \((\d+)x\)", output)
    assert summary and int(summary.group(1)) >= 40 and int(summary.group(2)) >= 10
    assert output.count("digits/digits-") >= 24  # the variants table
    table = output[output.index("query  ") :]
    # Different targets pick different models: the accurate query gets the CNN...
    accurate_row = next(line for line in table.splitlines() if line.startswith("the accurate targets again"))
    assert "digits-cnn" in accurate_row and "active" in accurate_row
    # ...and the fast one, once loaded, a cheaper and less accurate model.
    fast_row = next(line for line in table.splitlines() if line.startswith("the fast targets again"))
    assert "active" in fast_row and "digits-cnn" not in fast_row
    impossible_row = next(line for line in table.splitlines() if line.startswith("impossible"))
    assert "422 targets_unreachable" in impossible_row and "closest" in impossible_row
    assert "modelless: stopped" in output
