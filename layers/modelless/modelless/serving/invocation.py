"""The invocation and its reply: the only shapes that cross the gateway → worker → Lambda boundary.

An ``Invocation`` (a variant, its inputs, the query's correlation id and what is left of its
budget; an offline batch says so) goes from the dispatcher or an offline runner to a pool worker
or a Lambda container; a ``Reply`` (the outputs and where the time went) comes back. Each has one
encoder (``to_message``) and one decoder (``from_message``) to the message ``modelless.serving.wire``
carries: a dict whose arrays are ``.npy`` bytes, sent as raw frames to a worker or as base64 in a
Lambda event. Every reader uses the fields; nothing else reads the message.

Both carry ``PROTOCOL_VERSION``. A side that gets a message of another version (or of none: a
process from before versions) refuses it with ``ProtocolMismatchError``, a 502 that says which
versions met, so that during a rolling deploy an old worker and a new gateway refuse each other
clearly instead of misreading a field.

Arrays are read with ``allow_pickle=False`` semantics (``modelless.inputs.archives.read_npy``): nothing
is ever unpickled. A batch keeps its dtype end to end; a model with several inputs gets a
structured array (``modelless.inputs.tensors``).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelless.exceptions import InvalidInputError, ProtocolMismatchError
from modelless.inputs.archives import read_npy
from modelless.serving.wire import binary_field
from modelless.types import VariantProfile

# Raised by one each time either message's fields change meaning.
PROTOCOL_VERSION = 1


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _check_version(message: Mapping[str, Any], what: str) -> None:
    version = message.get("version")
    if version != PROTOCOL_VERSION:
        sent = (
            "no protocol version (a process from before versions)"
            if version is None
            else f"version {version!r}"
        )
        raise ProtocolMismatchError(
            f"{what} carries {sent}; this process speaks version {PROTOCOL_VERSION}: the gateway and "
            "its workers are of different releases (a rolling deploy in progress?)",
            received=version,
            expected=PROTOCOL_VERSION,
        )


def _milliseconds(message: Mapping[str, Any], name: str, default: float | None = 0.0) -> float | None:
    """A non-negative, finite number of milliseconds (never a boolean), or ``default`` when absent."""
    raw = message.get(name)
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise InvalidInputError(f"{name} must be a finite number of milliseconds, not {raw!r}")
    return max(0.0, float(raw))


@dataclass(frozen=True)
class Invocation:
    """One run of ``variant`` on ``inputs`` (a batch: [rows, *shape], or a structured array)."""

    variant: VariantProfile
    inputs: np.ndarray
    correlation_id: str
    # What is left of the query's latency budget: a batching worker never holds it longer. None:
    # the query named none (the worker's default applies).
    deadline_ms: float | None = None
    # Offline batch work: run in the instance's idle moments and recorded apart from online queries.
    offline: bool = False

    @property
    def variant_id(self) -> str:
        return self.variant.variant_id

    @property
    def rows(self) -> int:
        return int(self.inputs.shape[0])

    def to_message(self) -> dict[str, Any]:
        """The message (a fresh dict each call: the caller may add transport fields)."""
        return dict(self._message)

    @functools.cached_property
    def _message(self) -> dict[str, Any]:
        # Encoded once per invocation: a retry, a warm-up round or a load generator sends the
        # same invocation again without paying for its profile's JSON and its inputs' .npy again.
        message: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "variant_id": self.variant.variant_id,
            "variant": self.variant.to_json(),
            "memory_mb": self.variant.memory_mb,  # picks the Lambda function (memory size) to run it
            "inputs_npy": npy_bytes(self.inputs),  # raw: modelless.serving.wire encodes it per transport
            "correlation_id": self.correlation_id,
        }
        if self.deadline_ms is not None:
            message["deadline_ms"] = self.deadline_ms
        if self.offline:
            message["offline"] = True
        return message

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Invocation:
        """The invocation ``message`` carries; InvalidInputError for one that is malformed,
        ProtocolMismatchError for one of another version."""
        _check_version(message, "the invocation")
        raw_variant = message.get("variant")
        if not isinstance(raw_variant, str):
            raise InvalidInputError("the invocation has no variant (its profile as JSON text)")
        try:
            variant = VariantProfile.from_json(raw_variant)
        # AttributeError: a latency table that is not an object (a list, null) has no .items().
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise InvalidInputError(f"the invocation's variant is not a profile: {error}") from error
        offline = message.get("offline", False)
        if not isinstance(offline, bool):
            raise InvalidInputError(f"offline must be true or false, not {offline!r}")
        return cls(
            variant=variant,
            inputs=read_npy(binary_field(message, "inputs_npy"), "inputs"),
            correlation_id=str(message.get("correlation_id") or ""),
            deadline_ms=_milliseconds(message, "deadline_ms", None),
            offline=offline,
        )


@dataclass(frozen=True)
class Reply:
    """What one invocation produced, and where its time went (milliseconds)."""

    outputs: np.ndarray
    batch: int  # the rows of the run it was part of (a batched run may hold other queries' rows)
    load_ms: float = 0.0  # the variant's load this invocation waited for (0: it was loaded)
    queue_ms: float = 0.0  # waiting for the instance (its lock, or its batcher)
    inference_ms: float = 0.0  # the run itself
    cold_start: bool = False  # the Lambda tier started a container for it
    init_ms: float = 0.0  # that container's start

    @property
    def total_ms(self) -> float:
        """The invocation's time on the compute side: everything above, summed."""
        return self.queue_ms + self.inference_ms + self.load_ms + self.init_ms

    def to_message(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION,
            "outputs_npy": npy_bytes(self.outputs),
            "batch": self.batch,
            "load_ms": self.load_ms,
            "queue_ms": self.queue_ms,
            "inference_ms": self.inference_ms,
            "cold_start": self.cold_start,
            "init_ms": self.init_ms,
        }

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Reply:
        _check_version(message, "the worker's reply")
        batch = message.get("batch")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise InvalidInputError(f"the reply's batch must be a row count, not {batch!r}")
        cold_start = message.get("cold_start", False)
        if not isinstance(cold_start, bool):
            raise InvalidInputError(f"cold_start must be true or false, not {cold_start!r}")
        return cls(
            outputs=read_npy(binary_field(message, "outputs_npy"), "outputs"),
            batch=batch,
            load_ms=_milliseconds(message, "load_ms") or 0.0,
            queue_ms=_milliseconds(message, "queue_ms") or 0.0,
            inference_ms=_milliseconds(message, "inference_ms") or 0.0,
            cold_start=cold_start,
            init_ms=_milliseconds(message, "init_ms") or 0.0,
        )
