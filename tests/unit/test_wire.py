"""The invocation's two encodings (modelless.serving.wire): binary frames and JSON with base64 fields."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from modelless.exceptions import InvalidInputError
from modelless.serving.invocation import Invocation, Reply
from modelless.serving.wire import binary_field, decode_frames, encode_frames, to_json_message
from tests.unit.dispatch_kit import make_variant


def message() -> dict[str, Any]:
    """An invocation's message, with one more bytes field than an invocation has: the wire
    carries whatever bytes fields a message holds."""
    images = np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32)
    sent = Invocation(make_variant("v1"), images, "q-1", deadline_ms=12.5).to_message()
    return {**sent, "extra": b"\x00\xff"}


def test_frames_carry_every_field_and_the_bytes_raw() -> None:
    sent = message()
    body = encode_frames(sent)
    # The tensor is in the body as itself, not as base64 text.
    tensor = sent["inputs_npy"]
    assert isinstance(tensor, bytes) and tensor in body
    assert decode_frames(body) == sent


def test_frames_and_json_read_back_to_the_same_arrays() -> None:
    sent = message()
    over_json = json.loads(json.dumps(to_json_message(sent)))
    assert "inputs_npy" not in over_json and isinstance(over_json["inputs_npy_b64"], str)
    over_frames = decode_frames(encode_frames(sent))
    np.testing.assert_array_equal(
        Invocation.from_message(over_json).inputs, Invocation.from_message(over_frames).inputs
    )
    assert binary_field(over_json, "extra") == binary_field(over_frames, "extra") == b"\x00\xff"


def test_a_reply_s_outputs_read_from_either_encoding() -> None:
    logits = np.arange(20, dtype=np.float32).reshape(2, 10)
    reply = Reply(outputs=logits, batch=2, inference_ms=1.0).to_message()
    np.testing.assert_array_equal(Reply.from_message(decode_frames(encode_frames(reply))).outputs, logits)
    np.testing.assert_array_equal(Reply.from_message(to_json_message(reply)).outputs, logits)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b"MLF1",
        b"MLF1\x00\x00\x00\x05{}",  # header longer than the body
        encode_frames(message())[:-1],  # a field cut short
        encode_frames(message()) + b"x",  # bytes left over
        b"MLF1\x00\x00\x00\x02[]",  # a header that is not an object
    ],
)
def test_a_malformed_frame_body_is_invalid_input(body: bytes) -> None:
    with pytest.raises(InvalidInputError):
        decode_frames(body)


def test_a_missing_or_non_base64_field_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="inputs_npy"):
        binary_field({"variant_id": "v1"}, "inputs_npy")
    with pytest.raises(InvalidInputError, match="base64"):
        binary_field({"inputs_npy_b64": "not base64!"}, "inputs_npy")
    with pytest.raises(InvalidInputError, match=r"not a readable \.npy"):
        Invocation.from_message({**message(), "inputs_npy": b"not an npy file"})
