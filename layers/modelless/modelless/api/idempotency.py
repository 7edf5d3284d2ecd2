"""``Idempotency-Key`` on the calls that create something (register_model, offline_query).

A client that retries a call whose reply it never got (a dropped connection, a timeout, a 503)
sends the same key again: the retry gets the first call's reply, and nothing is created twice. The
same key with a different request is a 409 that says so, as is a retry while the first call still
runs. Keys are per app and per operation, kept ``Settings.idempotency_ttl_s``; a call that fails
gives its key up (it created nothing, so running it again is safe). Records live in the metadata
store (``MetadataStore.claim_request``), so that every gateway sees them.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from modelless.api.services import Services
from modelless.exceptions import IdempotencyConflictError, InvalidInputError, ServiceUnavailableError
from modelless.metadata.base import IdempotentRequest, MetadataStore
from modelless.observability.metrics import logger

IDEMPOTENCY_HEADER = "Idempotency-Key"
# Set on a reply that is a repeat of the first call's.
REPLAYED_HEADER = "Idempotent-Replayed"
# A key is 1 to 255 visible ASCII characters (a UUID, as the client sends, or the caller's own).
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")
# A running call holds its key this long at most: a gateway that died mid-call leaves its key
# taken this long (retries are told the call is still running), not for the whole TTL.
CLAIM_TTL_S = 15 * 60.0


def fingerprint(request: Any) -> str:
    """The identity of a request, for telling a retry from another request under the same key:
    a hash of its JSON form (keys sorted, so that field order does not matter)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class IdempotentCall:
    """One call under an ``Idempotency-Key``. ``replay``: the first call's reply, to be answered
    as it is (this call does nothing); None: this call runs, then ``complete`` or ``release``."""

    store: MetadataStore
    app_id: str
    operation: str
    key: str
    pending: IdempotentRequest
    ttl_s: float
    replay: dict[str, Any] | None = None

    @classmethod
    def begin(
        cls,
        store: MetadataStore,
        key: str | None,
        app_id: str,
        operation: str,
        request_fingerprint: str,
        ttl_s: float,
    ) -> IdempotentCall | None:
        """The call's claim on ``key`` (None when the request carries no key: it simply runs).
        IdempotencyConflictError when the key was used for another request, or its first call
        still runs."""
        if key is None:
            return None
        if not KEY_PATTERN.fullmatch(key):
            raise InvalidInputError(
                f"{IDEMPOTENCY_HEADER} must be 1 to 255 visible ASCII characters (a UUID, say); "
                f"got {key[:40]!r}",
                header=IDEMPOTENCY_HEADER,
            )
        pending = IdempotentRequest(request_fingerprint, uuid.uuid4().hex)
        call = cls(store, app_id, operation, key, pending, ttl_s)
        held = store.claim_request(app_id, operation, key, pending, min(CLAIM_TTL_S, ttl_s))
        if held is None:
            return call
        if held.fingerprint != request_fingerprint:
            raise IdempotencyConflictError(
                f"{IDEMPOTENCY_HEADER} {key!r} was used by app {app_id!r} for a different "
                f"{operation} request; a retry must repeat the request exactly, and a new request "
                "needs a new key",
                idempotencyKey=key,
                reason="different_request",
            )
        if held.reply is None:
            raise IdempotencyConflictError(
                f"the {operation} request with {IDEMPOTENCY_HEADER} {key!r} is still running; "
                "retry shortly to get its reply",
                idempotencyKey=key,
                reason="in_progress",
            )
        call.replay = json.loads(held.reply)
        return call

    def complete(self, reply: dict[str, Any]) -> None:
        """The call succeeded: retries with its key get ``reply`` for ``ttl_s``. A store that
        does not answer now leaves the key taken until its claim expires (retries are told the
        call still runs meanwhile), never the call's own reply lost."""
        done = IdempotentRequest(self.pending.fingerprint, self.pending.claim, json.dumps(reply))
        try:
            self.store.complete_request(self.app_id, self.operation, self.key, done, self.ttl_s)
        except ServiceUnavailableError:
            logger.warning("idempotency key not recorded", extra={"operation": self.operation})

    def release(self) -> None:
        """The call failed and created nothing: a retry with its key may run it again (once the
        claim expires, where the store does not answer now: the call's own error is the one told)."""
        try:
            self.store.release_request(self.app_id, self.operation, self.key, self.pending)
        except ServiceUnavailableError:
            logger.warning("idempotency key not given up", extra={"operation": self.operation})


Reply = TypeVar("Reply", bound=BaseModel)


async def run_once(
    services: Services,
    key: str | None,
    response: Response,
    operation: str,
    app_id: str,
    request_fingerprint: str,
    reply_type: type[Reply],
    work: Callable[[], Awaitable[Reply]],
) -> Reply:
    """``work`` (the call itself) run at most once per ``Idempotency-Key`` (``key``, the header's
    value): the first reply again for a retry (``Idempotent-Replayed: true``), 409 for a clash;
    without a key, simply run."""
    call = await run_in_threadpool(
        IdempotentCall.begin,
        services.store,
        key,
        app_id,
        operation,
        request_fingerprint,
        services.settings.idempotency_ttl_s,
    )
    if call is None:
        return await work()
    if call.replay is not None:
        response.headers[REPLAYED_HEADER] = "true"
        return reply_type.model_validate(call.replay)
    try:
        reply = await work()
    except BaseException:
        await run_in_threadpool(call.release)
        raise
    await run_in_threadpool(call.complete, reply.model_dump(mode="json"))
    return reply
