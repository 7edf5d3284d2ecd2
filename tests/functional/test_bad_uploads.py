"""Bad uploads over real HTTP against the embedded stack (``python -m infra.local.stack``):
oversized bodies are refused with 413 as they arrive, broken models and validation sets with a
400 that says what is wrong, and none of them leaves a model or an object behind."""

from __future__ import annotations

import io
import json
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from modelless.client import Client, ModellessClientError
from modelless.config import Settings
from tests.e2e.conftest import RunningStack, start_stack
from tests.models import digits, hidden_model, valset_npz

APP = "uploads"
BOUNDARY = "modelless-test-boundary"
TWO_GB = 2 * 1024**3
MiB = 1024 * 1024
# The stack runs with smaller limits than the defaults (1 GiB models, 256 MiB validation sets):
# the chunked upload below streams until it passes the limit, and 96 MiB makes the point as well
# as 1.25 GiB would.
STACK_LIMITS: dict[str, Any] = {"max_model_bytes": 64 * MiB, "max_valset_bytes": 32 * MiB}
REGISTER_LIMIT = Settings(**STACK_LIMITS).register_body_limit
ANSWER_WITHIN_S = 5.0


@dataclass
class Stack:
    running: RunningStack
    key: str
    client: Client

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.running.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    @property
    def repository(self) -> Path:
        return self.running.state_dir / "repo"

    def assert_nothing_left(self, model_name: str) -> None:
        assert self.client.models() == []
        assert self.client.registrations() == []
        assert self.client.variants() == []
        model_dir = self.repository / "apps" / APP / model_name
        assert not model_dir.exists() or not [p for p in model_dir.rglob("*") if p.is_file()]
        assert [p for p in self.repository.rglob("*") if p.is_file()] == []
        assert self.client.health()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in STACK_LIMITS.items():
            patch.setenv(f"MODELLESS_{name.upper()}", str(value))
        running = start_stack(tmp_path_factory.mktemp("bad-uploads") / "state", "memory://", workers=1)
    client: Client | None = None
    try:
        key = Client(running.url, admin_key=running.admin_key).create_app(APP)
        client = Client(running.url, api_key=key, timeout_s=30)
        yield Stack(running, key, client)
    finally:
        if client is not None:
            client.close()
        running.stop()


# --- raw HTTP/1.1, so that the test decides what is sent and when ----------------------------


def request_head(stack: Stack, length_header: str) -> bytes:
    host, port = stack.address
    return (
        "POST /v1/register_model HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        f"Authorization: Bearer {stack.key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"{length_header}\r\n"
        "\r\n"
    ).encode()


def multipart_preamble(model_name: str) -> bytes:
    """The form fields, then the start of the model file part: its bytes follow."""
    fields = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in (("appID", APP), ("modelName", model_name))
    )
    return (
        fields + f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="model"; filename="huge.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


def read_response(sock: socket.socket, deadline: float) -> RawResponse:
    """One response; socket.timeout (a test failure) past the deadline."""
    data = b""
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        received = sock.recv(65536)
        assert received, f"the server closed the connection without answering: {data!r}"
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (h.split(":", 1) for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        received = sock.recv(65536)
        assert received, "the server closed the connection in the middle of its answer"
        body += received
    return RawResponse(int(status_line.split(" ", 2)[1]), headers, body[:length])


# --- 413: refused as the body arrives --------------------------------------------------------


def test_a_declared_2gb_upload_is_refused_before_its_body_is_sent(stack: Stack) -> None:
    started = time.monotonic()
    with socket.create_connection(stack.address, timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(request_head(stack, f"Content-Length: {TWO_GB}"))
        # The first bytes of the body, as a client that does not wait would send them; the other
        # 2 GB never leave this process.
        sock.sendall(multipart_preamble("two-gb") + b"\0" * (64 * 1024))
        response = read_response(sock, started + ANSWER_WITHIN_S)
    elapsed = time.monotonic() - started

    assert response.status == 413, response.body
    error = response.error()
    assert error["code"] == "payload_too_large"
    assert f"request body of {TWO_GB} bytes exceeds the limit" in error["message"]
    assert 0 < error["details"]["limit"] < TWO_GB
    assert elapsed < ANSWER_WITHIN_S
    print(f"\n2 GB declared: 413 after {elapsed * 1000:.1f} ms")
    stack.assert_nothing_left("two-gb")


class ServerKeptReading(Exception):
    pass


def test_a_2gb_upload_from_a_streaming_client_is_cut_short(stack: Stack) -> None:
    produced = 0
    piece = b"\0" * MiB
    give_up_after = 256 * MiB  # far more than the socket buffers between client and server hold

    def two_gigabytes() -> Iterator[bytes]:
        nonlocal produced
        yield multipart_preamble("streamed-two-gb")
        while produced < TWO_GB:
            if produced >= give_up_after:
                raise ServerKeptReading(f"the server accepted {produced // MiB} MiB after refusing")
            produced += len(piece)
            yield piece

    started = time.monotonic()
    response: httpx.Response | None = None
    try:
        response = httpx.post(
            f"{stack.running.url}/v1/register_model",
            content=two_gigabytes(),
            headers={
                "Authorization": f"Bearer {stack.key}",
                "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
                "Content-Length": str(TWO_GB),
            },
            timeout=ANSWER_WITHIN_S,
        )
    except httpx.TransportError:
        response = None  # the server cut the connection: refused too, if it did so early
    elapsed = time.monotonic() - started

    if response is not None:
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "payload_too_large"
    assert produced < give_up_after
    assert elapsed < ANSWER_WITHIN_S
    stack.assert_nothing_left("streamed-two-gb")


def test_a_chunked_upload_is_cut_with_413_once_it_passes_the_limit(stack: Stack) -> None:
    piece = chunk(b"\0" * MiB)
    sent = 0
    reset = False
    response = None
    started = time.monotonic()
    deadline = started + 60
    with socket.create_connection(stack.address, timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(request_head(stack, "Transfer-Encoding: chunked"))
        sock.sendall(chunk(multipart_preamble("chunked")))
        # Stream until the server answers; bounded in bytes and in time.
        try:
            while sent < 4 * 1024 * MiB and time.monotonic() < deadline:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                sock.sendall(piece)
                sent += MiB
        except (BrokenPipeError, ConnectionResetError):
            reset = True  # the server answered and closed while we were still sending
        try:
            response = read_response(sock, time.monotonic() + ANSWER_WITHIN_S)
        except (ConnectionResetError, BrokenPipeError):
            # The 413 raced our next write and the reset discarded it: the upload was still cut.
            assert reset
    elapsed = time.monotonic() - started

    limit = REGISTER_LIMIT
    assert limit <= sent + len(multipart_preamble("chunked")), "refused before the limit was passed"
    assert sent <= limit + 64 * MiB, "not cut soon after the limit (socket buffers in between)"
    if response is not None:
        assert response.status == 413, response.body
        error = response.error()
        assert error["code"] == "payload_too_large"
        assert "request body exceeds the limit" in error["message"]
        assert error["details"]["limit"] == limit
    print(f"\nchunked: {sent // MiB} MiB sent, limit {limit / MiB:.1f} MiB, cut after {elapsed:.2f} s")
    stack.assert_nothing_left("chunked")


# --- 400: what is wrong, said plainly ---------------------------------------------------------


def npz(inputs: np.ndarray, labels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, inputs=inputs, labels=labels)
    return buffer.getvalue()


def digits_valset(count: int = 200) -> tuple[np.ndarray, np.ndarray]:
    inputs, labels = digits()
    return inputs[-count:], labels[-count:]


def corrupt_model() -> bytes:
    return b"this is not an ONNX model" + bytes(range(256)) * 4


def truncated_model() -> bytes:
    return hidden_model()[: len(hidden_model()) // 3]


def wrong_shape_valset() -> bytes:
    inputs, labels = digits_valset()
    return npz(inputs[:, :, :7, :7], labels)


def wrong_length_labels() -> bytes:
    inputs, labels = digits_valset()
    return npz(inputs, labels[:-1])


def empty_valset() -> bytes:
    return npz(np.zeros((0, 1, 8, 8), dtype=np.float32), np.zeros((0,), dtype=np.int64))


@pytest.mark.parametrize(
    ("name", "model", "valset", "message"),
    [
        ("corrupt", corrupt_model, valset_npz, "model file is not a valid ONNX model"),
        ("truncated", truncated_model, valset_npz, "model file is not a valid ONNX model"),
        (
            "shape",
            hidden_model,
            wrong_shape_valset,
            "validation inputs have shape [200, 1, 7, 7]; the model takes [N, 1, 8, 8]",
        ),
        (
            "labels",
            hidden_model,
            wrong_length_labels,
            "labels have shape [199]; expected [200], one per input",
        ),
        ("empty", hidden_model, empty_valset, "validation set is empty"),
    ],
    ids=["corrupt-onnx", "truncated-onnx", "input-shape", "label-count", "empty-valset"],
)
def test_a_bad_model_or_validation_set_is_a_400_that_says_why(
    stack: Stack, name: str, model: Any, valset: Any, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ModellessClientError) as refused:
        stack.client.register_model(name, model(), valset(), app_id=APP)

    assert refused.value.status == 400
    assert refused.value.code == "invalid_model"
    assert message in refused.value.message
    assert time.monotonic() - started < ANSWER_WITHIN_S
    stack.assert_nothing_left(name)
