"""Telling an emptied metadata store from a new one (docs/PERSISTENCE.md).

A Redis that restarts without persistence (or is flushed, or replaced) comes back empty: every
app, key and model is gone, and a gateway on it would answer as if none had ever been
registered. So the embedded stack writes a marker, an epoch id, into every store it uses, and
remembers it in its state directory. At the next start, a store without the marker the state
directory remembers was emptied: the stack refuses to start, naming the store and what was lost.
While it runs, ``/health/ready`` answers 503 ``store_emptied`` once the marker is gone
(``Settings.metadata_epoch``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from modelless.exceptions import StoreEmptiedError
from modelless.metadata.base import MetadataStore

EPOCH_FILE = "store-epoch.json"  # in the state directory
CREDENTIALS_FILE = "credentials.json"  # the apps' keys the command-line tool saved there


def check_store_epoch(store: MetadataStore, store_name: str, state_dir: Path) -> str:
    """The epoch ``store`` holds, once sure it still holds what this state directory knew of it:
    a store this state directory never used gets a new epoch (or keeps the one it has, written by
    another stack sharing it); a store it used must hold the same one, else StoreEmptiedError.
    ``store_name`` says which store it is (its URL, or the embedded Redis's data directory)."""
    path = state_dir / EPOCH_FILE
    known = _read_json(path)
    if known.get("store") == store_name and known.get("epoch"):
        held = store.epoch()
        if held != known["epoch"]:
            raise StoreEmptiedError(_lost_message(store_name, known, held, state_dir), store=store_name)
        return known["epoch"]
    epoch = store.set_epoch(uuid.uuid4().hex)
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    path.write_text(json.dumps({"store": store_name, "epoch": epoch, "since": since}, indent=2))
    os.chmod(path, 0o600)
    return epoch


def _lost_message(store_name: str, known: dict[str, str], held: str | None, state_dir: Path) -> str:
    apps = sorted(_read_json(state_dir / CREDENTIALS_FILE))
    named = f" (apps whose keys {state_dir / CREDENTIALS_FILE} holds: {', '.join(apps)})" if apps else ""
    holds = f"another epoch, {held!r}: it was replaced" if held else "no epoch: it came back empty"
    return (
        f"the metadata store {store_name} has lost everything registered in it since "
        f"{known.get('since', 'this state directory first used it')}: it should hold epoch "
        f"{known['epoch']!r} and holds {holds} (a Redis restarted without persistence, flushed, or "
        f"another server in its place). Every app, API key, model and offline job registered "
        f"there is gone{named}. Refusing to serve as if none had been registered: bring back the "
        f"store's data, or, to start afresh with an empty store, delete {state_dir / EPOCH_FILE} "
        f"and {state_dir / CREDENTIALS_FILE}"
    )


def _read_json(path: Path) -> dict[str, str]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
