"""Per-app API keys. Only a SHA-256 of each key is stored; a key opens exactly one app."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from modelless.exceptions import ForbiddenError, UnauthorizedError
from modelless.metadata.base import MetadataStore

KEY_PREFIX = "mlk_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def app_for_key(store: MetadataStore, key: str | None) -> str:
    if not key:
        raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>' or 'X-Api-Key'")
    app_id = store.app_for_key(hash_key(key))
    if app_id is None:
        raise UnauthorizedError("unknown API key")
    return app_id


def authorize_app(store: MetadataStore, key: str | None, app_id: str) -> str:
    """The caller's key must belong to ``app_id``: one app's key never opens another app."""
    owner = app_for_key(store, key)
    if owner != app_id:
        raise ForbiddenError(f"this API key belongs to app {owner!r}, not {app_id!r}", app=app_id)
    return app_id


def check_admin(admin_key: str, presented: str | None) -> None:
    if not admin_key:
        raise ForbiddenError("no admin key is configured on this deployment (MODELLESS_ADMIN_KEY)")
    if not presented or not hmac.compare_digest(admin_key.encode(), presented.encode()):
        raise UnauthorizedError("this call needs the admin key")
