"""Per-app API keys. Only a SHA-256 of each key is stored; a key opens exactly one app."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict

from modelless.exceptions import (
    ForbiddenError,
    StoreEmptiedError,
    StoreUnavailableError,
    UnauthorizedError,
)
from modelless.metadata.base import MetadataStore

KEY_PREFIX = "mlk_"
# Keys remembered for a store outage, at most (the least recently used go first): one entry is a
# hash and an app id, so this bounds the memory at a few MB whatever callers send.
MAX_REMEMBERED_KEYS = 10_000


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeys:
    """The gateway's lookups of API keys: the store's answer; during a store outage, the last good
    one for a key looked up within ``max_age_s`` (so that the apps already known go on being
    served). A key not seen lately gets the store's 503 then, never a 401: whether it is valid
    cannot be told.

    ``expected_epoch``: the marker the store must hold (``Settings.metadata_epoch``); a key the
    store does not know while the marker is gone is answered 503 ``store_emptied`` rather than
    401: the store lost every key, not just this one."""

    def __init__(
        self,
        store: MetadataStore,
        max_age_s: float,
        expected_epoch: str = "",
        max_entries: int = MAX_REMEMBERED_KEYS,
    ) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._expected_epoch = expected_epoch
        self._max_entries = max_entries
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()  # hash -> (app, read at)
        self._lock = threading.Lock()

    def app_for_key(self, key: str | None) -> str:
        """The app the key opens."""
        if not key:
            raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>' or 'X-Api-Key'")
        key_hash = hash_key(key)
        try:
            app_id = self._store.app_for_key(key_hash)
        except StoreUnavailableError:
            remembered = self._remembered(key_hash)
            if remembered is None:
                raise
            return remembered
        if app_id is None:
            self._check_epoch()
            raise UnauthorizedError("unknown API key")
        with self._lock:
            self._known[key_hash] = (app_id, time.monotonic())
            self._known.move_to_end(key_hash)
            while len(self._known) > self._max_entries:
                self._known.popitem(last=False)
        return app_id

    def authorize(self, key: str | None, app_id: str) -> str:
        """The caller's key must belong to ``app_id``: one app's key never opens another app."""
        owner = self.app_for_key(key)
        if owner != app_id:
            raise ForbiddenError(f"this API key belongs to app {owner!r}, not {app_id!r}", app=app_id)
        return app_id

    def _remembered(self, key_hash: str) -> str | None:
        with self._lock:
            entry = self._known.get(key_hash)
        if entry is None or time.monotonic() - entry[1] > self._max_age_s:
            return None
        return entry[0]

    def _check_epoch(self) -> None:
        if self._expected_epoch and self._store.epoch() != self._expected_epoch:
            raise StoreEmptiedError(
                "the metadata store has lost every app and key registered in it (it came back "
                "empty): this key cannot be checked; see /health/ready",
                expected_epoch=self._expected_epoch,
            )


def check_admin(admin_key: str, presented: str | None) -> None:
    if not admin_key:
        raise ForbiddenError("no admin key is configured on this deployment (MODELLESS_ADMIN_KEY)")
    if not presented or not hmac.compare_digest(admin_key.encode(), presented.encode()):
        raise UnauthorizedError("this call needs the admin key")
