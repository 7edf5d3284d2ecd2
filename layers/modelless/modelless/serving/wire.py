"""How an invocation travels: the gateway → worker hop in binary frames, Lambda events in JSON.

An invocation and its reply (``modelless.serving.invocation``: ``Invocation.to_message``,
``Reply.to_message``) are dicts whose arrays are ``.npy`` bytes (``inputs_npy``, ``outputs_npy``).
Two encodings carry them:

- **Frames**, between the gateway and a pool worker (media type ``FRAMES_MEDIA_TYPE``): a small
  JSON header with the dict's other fields and each bytes field's length, then the bytes
  themselves, raw. A ResNet-sized query (600 KB of float32) crosses the hop with no base64 and
  no JSON string to escape or parse: measured at ~7 ms of the gateway's and worker's CPU per
  query on a 2-core VM with JSON + base64 (docs/BENCHMARKS.md, "Serving overhead").
- **JSON**, where the transport admits nothing else (a Lambda event and its reply, or a person
  with curl): each bytes field ``name`` becomes ``name_b64``, its base64 text.

Both directions of both encodings read the same dict back, which ``Invocation.from_message`` and
``Reply.from_message`` decode, whichever way it came.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Mapping
from typing import Any

from modelless.exceptions import InvalidInputError

FRAMES_MEDIA_TYPE = "application/x-modelless-frames"
_MAGIC = b"MLF1"
_HEADER_LENGTH = struct.Struct(">I")
_B64_SUFFIX = "_b64"


def encode_frames(message: Mapping[str, Any]) -> bytes:
    """``message`` as one frame body: magic, header length, JSON header, then the bytes fields."""
    fields = {k: v for k, v in message.items() if not isinstance(v, bytes | bytearray | memoryview)}
    blobs = [(k, bytes(v)) for k, v in message.items() if isinstance(v, bytes | bytearray | memoryview)]
    header = json.dumps(
        {"fields": fields, "blobs": [[name, len(data)] for name, data in blobs]},
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    return b"".join([_MAGIC, _HEADER_LENGTH.pack(len(header)), header, *(data for _, data in blobs)])


def decode_frames(body: bytes) -> dict[str, Any]:
    """The dict a frame body carries; ``InvalidInputError`` for anything that is not one."""
    prefix = len(_MAGIC) + _HEADER_LENGTH.size
    if len(body) < prefix or body[: len(_MAGIC)] != _MAGIC:
        raise InvalidInputError(f"the body is not a {FRAMES_MEDIA_TYPE} message")
    (header_length,) = _HEADER_LENGTH.unpack_from(body, len(_MAGIC))
    try:
        header = json.loads(body[prefix : prefix + header_length])
        message: dict[str, Any] = dict(header["fields"])
        offset = prefix + header_length
        for name, length in header["blobs"]:
            if offset + int(length) > len(body):
                raise ValueError(f"field {name!r} runs past the end of the body")
            message[str(name)] = body[offset : offset + int(length)]
            offset += int(length)
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidInputError(f"malformed {FRAMES_MEDIA_TYPE} message: {error}") from error
    if offset != len(body):
        left_over = len(body) - offset
        raise InvalidInputError(f"malformed {FRAMES_MEDIA_TYPE} message: {left_over} bytes left over")
    return message


def to_json_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` with each bytes field ``name`` as ``name_b64`` (base64 text): JSON-safe."""
    return {
        (f"{k}{_B64_SUFFIX}" if isinstance(v, bytes | bytearray | memoryview) else k): (
            base64.b64encode(v).decode("ascii") if isinstance(v, bytes | bytearray | memoryview) else v
        )
        for k, v in message.items()
    }


def binary_field(message: Mapping[str, Any], name: str) -> bytes:
    """Field ``name``'s bytes, whichever encoding brought ``message``: raw from frames, or its
    ``name_b64`` text from JSON. ``InvalidInputError`` when it is missing or not base64."""
    raw = message.get(name)
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    encoded = message.get(f"{name}{_B64_SUFFIX}")
    if not isinstance(encoded, str):
        raise InvalidInputError(f"the message has no {name!r} (raw) or {name + _B64_SUFFIX!r} (base64) field")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidInputError(f"{name + _B64_SUFFIX!r} is not base64: {error}") from error
