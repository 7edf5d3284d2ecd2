"""The invocation and its reply (modelless.serving.invocation): what crosses the gateway → worker → Lambda
boundary, through both of the wire's encodings, and what their decoders refuse."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from modelless.exceptions import InvalidInputError, ProtocolMismatchError
from modelless.serving.invocation import PROTOCOL_VERSION, Invocation, Reply, npy_bytes
from modelless.serving.wire import decode_frames, encode_frames, to_json_message
from tests.unit.dispatch_kit import make_variant

Transport = Callable[[dict[str, Any]], dict[str, Any]]


def over_frames(message: dict[str, Any]) -> dict[str, Any]:
    """The message as a pool worker reads it: raw frames."""
    return decode_frames(encode_frames(message))


def over_json(message: dict[str, Any]) -> dict[str, Any]:
    """The message as a Lambda function reads it: JSON text, its arrays as base64."""
    decoded: dict[str, Any] = json.loads(json.dumps(to_json_message(message)))
    return decoded


TRANSPORTS = pytest.mark.parametrize("transport", [over_frames, over_json], ids=["frames", "json"])


def invocation(**fields: Any) -> Invocation:
    images = np.random.default_rng(0).normal(size=(3, 1, 4, 4)).astype(np.float32)
    return dataclasses.replace(Invocation(make_variant("v1", pool="lambda-cpu"), images, "q-1"), **fields)


def a_reply(**fields: Any) -> Reply:
    logits = np.arange(30, dtype=np.float32).reshape(3, 10)
    reply = Reply(
        logits, batch=5, load_ms=12.0, queue_ms=0.5, inference_ms=3.25, cold_start=True, init_ms=250.0
    )
    return dataclasses.replace(reply, **fields)


def assert_same_invocation(got: Invocation, sent: Invocation) -> None:
    assert got.variant == sent.variant
    np.testing.assert_array_equal(got.inputs, sent.inputs)
    assert got.inputs.dtype == sent.inputs.dtype
    assert got.correlation_id == sent.correlation_id
    assert got.deadline_ms == sent.deadline_ms
    assert got.offline is sent.offline


def assert_same_reply(got: Reply, sent: Reply) -> None:
    np.testing.assert_array_equal(got.outputs, sent.outputs)
    assert got.outputs.dtype == sent.outputs.dtype
    assert (got.batch, got.load_ms, got.queue_ms, got.inference_ms) == (
        sent.batch,
        sent.load_ms,
        sent.queue_ms,
        sent.inference_ms,
    )
    assert got.cold_start is sent.cold_start
    assert got.init_ms == sent.init_ms


# --- round trips ------------------------------------------------------------------------------


@TRANSPORTS
@pytest.mark.parametrize(
    "sent",
    [
        invocation(),
        invocation(deadline_ms=42.5, offline=True),
        invocation(deadline_ms=0.0),
        # A model with several inputs: a structured array, its dtype kept end to end.
        invocation(inputs=np.zeros(2, dtype=[("ids", np.int64, (5,)), ("mask", np.float32, (5,))])),
        invocation(inputs=np.arange(12, dtype=np.int64).reshape(2, 6)),
    ],
    ids=["plain", "offline-with-deadline", "no-budget-left", "structured", "int64"],
)
def test_an_invocation_reads_back_field_by_field(transport: Transport, sent: Invocation) -> None:
    assert_same_invocation(Invocation.from_message(transport(sent.to_message())), sent)


@TRANSPORTS
@pytest.mark.parametrize(
    "sent",
    [a_reply(), a_reply(cold_start=False, init_ms=0.0, load_ms=0.0, batch=3)],
    ids=["cold", "warm"],
)
def test_a_reply_reads_back_field_by_field(transport: Transport, sent: Reply) -> None:
    got = Reply.from_message(transport(sent.to_message()))
    assert_same_reply(got, sent)
    assert got.total_ms == sent.total_ms


def test_the_message_says_its_version_and_what_the_lambda_tier_needs() -> None:
    sent = invocation(deadline_ms=5.0)
    message = sent.to_message()
    assert message["version"] == PROTOCOL_VERSION == 1
    assert message["variant_id"] == "v1"
    assert message["memory_mb"] == sent.variant.memory_mb  # picks the Lambda function
    assert message["inputs_npy"] == npy_bytes(sent.inputs)  # raw: the wire encodes it per transport
    # Absent rather than null: no budget named, and online.
    assert "deadline_ms" not in invocation().to_message() and "offline" not in message
    assert Reply.from_message(a_reply().to_message()).to_message()["version"] == PROTOCOL_VERSION


def test_what_an_invocation_leaves_out_reads_as_its_defaults() -> None:
    message = invocation().to_message()
    del message["correlation_id"]
    got = Invocation.from_message(message)
    assert (got.deadline_ms, got.offline, got.correlation_id) == (None, False, "")
    assert (got.variant_id, got.rows) == ("v1", 3)


def test_a_reply_s_time_is_everything_it_waited_for() -> None:
    reply = a_reply()
    assert reply.total_ms == 0.5 + 3.25 + 12.0 + 250.0
    minimal = Reply.from_message(
        {"version": PROTOCOL_VERSION, "outputs_npy": npy_bytes(reply.outputs), "batch": 3}
    )
    assert (minimal.load_ms, minimal.queue_ms, minimal.inference_ms, minimal.init_ms) == (0.0, 0.0, 0.0, 0.0)
    assert minimal.cold_start is False and minimal.total_ms == 0.0


# --- another protocol version -----------------------------------------------------------------


def versioned(message: dict[str, Any], version: object) -> dict[str, Any]:
    """``message`` with another version, or (``None``) without one: a process of another release."""
    changed = {k: v for k, v in message.items() if k != "version"}
    if version is not None:
        changed["version"] = version
    return changed


@TRANSPORTS
@pytest.mark.parametrize("version", [0, 2, None, "1"], ids=["older", "newer", "missing", "text"])
@pytest.mark.parametrize(
    ("decode", "make"),
    [
        (Invocation.from_message, lambda: invocation().to_message()),
        (Reply.from_message, lambda: a_reply().to_message()),
    ],
    ids=["invocation", "reply"],
)
def test_a_message_of_another_version_is_a_protocol_mismatch(
    transport: Transport,
    version: object,
    decode: Callable[[dict[str, Any]], object],
    make: Callable[[], dict[str, Any]],
) -> None:
    with pytest.raises(ProtocolMismatchError) as raised:
        decode(transport(versioned(make(), version)))
    error = raised.value
    assert error.status_code == 502
    assert error.code == "protocol_mismatch"
    assert error.details == {"received": version, "expected": PROTOCOL_VERSION}
    assert f"speaks version {PROTOCOL_VERSION}" in error.message


def test_a_protocol_mismatch_is_checked_before_any_field() -> None:
    """A message of another release may name its fields otherwise: it is refused for its version,
    never for a field it lacks."""
    with pytest.raises(ProtocolMismatchError):
        Invocation.from_message({"version": 2})
    with pytest.raises(ProtocolMismatchError):
        Reply.from_message({"outputs": [1, 2]})


# --- malformed fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deadline_ms",
    [True, False, float("nan"), float("inf"), float("-inf"), "soon", [5], {"ms": 5}],
    ids=["true", "false", "nan", "inf", "-inf", "text", "list", "object"],
)
def test_a_malformed_deadline_is_invalid_input(deadline_ms: object) -> None:
    with pytest.raises(InvalidInputError, match="deadline_ms"):
        Invocation.from_message({**invocation().to_message(), "deadline_ms": deadline_ms})


def test_a_negative_deadline_is_no_time_left() -> None:
    """A budget already spent (as the dispatcher never sends, but a clock may yield) is read as
    none left: the worker answers at once, late, rather than refusing the query."""
    got = Invocation.from_message({**invocation().to_message(), "deadline_ms": -3.0})
    assert got.deadline_ms == 0.0


@pytest.mark.parametrize("offline", [1, 0, "true", None, [True]], ids=["one", "zero", "text", "null", "list"])
def test_an_offline_flag_that_is_not_a_boolean_is_invalid_input(offline: object) -> None:
    with pytest.raises(InvalidInputError, match="offline"):
        Invocation.from_message({**invocation().to_message(), "offline": offline})


@pytest.mark.parametrize(
    "variant",
    [
        None,
        {"variant_id": "v1"},  # an object, not its JSON text
        "not json",
        "{}",
        "[1]",
        "null",
        json.dumps({"variant_id": "v1"}),  # a profile's fields missing
        json.dumps({**json.loads(make_variant("v1").to_json()), "surprise": 1}),  # one too many
        json.dumps({**json.loads(make_variant("v1").to_json()), "latency_p99_ms": {"one": 1.0}}),
        json.dumps({**json.loads(make_variant("v1").to_json()), "latency_p99_ms": [1.0]}),
        json.dumps({**json.loads(make_variant("v1").to_json()), "latency_p50_ms": None}),
    ],
    ids=[
        "missing",
        "object",
        "not-json",
        "empty",
        "list",
        "null",
        "fields-missing",
        "unknown-field",
        "batch-not-a-number",
        "table-a-list",
        "table-null",
    ],
)
def test_a_variant_that_is_not_a_profile_is_invalid_input(variant: object) -> None:
    message = invocation().to_message()
    if variant is None:
        del message["variant"]
    else:
        message["variant"] = variant
    with pytest.raises(InvalidInputError, match="variant"):
        Invocation.from_message(message)


def test_inputs_that_are_not_an_array_are_invalid_input() -> None:
    message = invocation().to_message()
    with pytest.raises(InvalidInputError, match=r"not a readable \.npy"):
        Invocation.from_message({**message, "inputs_npy": b"not an npy file"})
    del message["inputs_npy"]
    with pytest.raises(InvalidInputError, match="inputs_npy"):
        Invocation.from_message(message)


@TRANSPORTS
@pytest.mark.parametrize(
    "batch", [None, True, -1, 2.0, "3", [3]], ids=["missing", "bool", "negative", "float", "text", "list"]
)
def test_a_reply_with_a_bad_batch_is_invalid_input(transport: Transport, batch: object) -> None:
    message = a_reply().to_message()
    if batch is None:
        del message["batch"]
    else:
        message["batch"] = batch
    with pytest.raises(InvalidInputError, match="batch"):
        Reply.from_message(transport(message))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cold_start", 1),
        ("cold_start", "yes"),
        ("load_ms", True),
        ("queue_ms", float("nan")),
        ("inference_ms", "fast"),
        ("init_ms", float("inf")),
    ],
)
def test_a_reply_with_a_malformed_field_is_invalid_input(field: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=field):
        Reply.from_message({**a_reply().to_message(), field: value})


def test_a_reply_without_outputs_is_invalid_input() -> None:
    message = a_reply().to_message()
    del message["outputs_npy"]
    with pytest.raises(InvalidInputError, match="outputs_npy"):
        Reply.from_message(message)
