"""Local files the commands read: query inputs, registration sources, JSON documents. A file
that cannot be used is a usage error (exit code 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from modelless.cli.core import UsageProblem


def load_inputs(path: Path) -> Any:
    """A query's inputs from a file, as ``Client.online_query`` sends them: ``.npy`` the array;
    ``.npz`` its ``inputs`` array (a validation set's), else its arrays by name (one per input of
    a model with several); ``.json`` the value (nested lists, or an object of them by input name);
    ``.png``/``.jpg``/``.jpeg`` the file's bytes (the server decodes them with the model's
    preprocessing recipe)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return json.loads(path.read_text())
    if suffix in {".png", ".jpg", ".jpeg"}:
        return path.read_bytes()
    if suffix not in {".npy", ".npz"}:
        raise UsageProblem(f"--inputs {path}: use a .npy, .npz, .json, .png or .jpg file")
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded as archive:
            if "inputs" in archive.files:
                return archive["inputs"]
            return {name: archive[name] for name in archive.files}
    return loaded


def file_or_uri(value: str, option: str) -> Path | str:
    """A registration file: an s3:// URI the server reads itself, or a local file streamed to it."""
    if value.startswith("s3://"):
        return value
    path = Path(value)
    if not path.is_file():
        raise UsageProblem(f"{option} {value}: no such file")
    return path


def read_json_file(value: str, option: str) -> Any:
    """The JSON document in a file; a usage error naming ``option`` when it cannot be read."""
    try:
        return json.loads(Path(value).read_text())
    except (OSError, ValueError) as error:
        raise UsageProblem(f"{option} {value}: {error}") from None


def recipe(value: str | None) -> dict[str, Any] | None:
    """The preprocessing recipe in a JSON file (docs/REGISTRATION.md), None when not given."""
    if value is None:
        return None
    loaded = read_json_file(value, "--preprocessing")
    if not isinstance(loaded, dict):
        raise UsageProblem(f"--preprocessing {value}: must hold a JSON object")
    return loaded
