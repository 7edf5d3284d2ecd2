"""The validation examples a child process works on, as one batch whatever the number of inputs.

The registered validation set (checked at registration by ``modelless.validation.load_valset``)
is an ``.npz`` with ``labels`` and, for a one-input model, ``inputs`` (or the input's own name);
for several inputs, one array per input name. Here it becomes the batch a session is fed through
``modelless.inputs.tensors.to_feeds``: a plain array for one input, a structured array for several.
The same reading order as ``load_valset``, without its checks of content (done once, at
registration) and with the inputs as the artifact's session names and types them; its size
limits are kept (``modelless.inputs.archives``), so that no archive is inflated past them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from modelless.config import get_settings
from modelless.inputs.archives import open_zip, read_npz_members
from modelless.inputs.tensors import from_feeds
from modelless.types import TensorSpec

if TYPE_CHECKING:
    import onnxruntime as ort

# onnxruntime's input type names -> numpy dtype names.
ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def session_specs(session: ort.InferenceSession) -> list[TensorSpec]:
    """The session's inputs as specs (shape without the batch dimension; symbolic dims as -1)."""
    specs = []
    for tensor in session.get_inputs():
        dtype = ORT_TYPES.get(tensor.type)
        if dtype is None:
            raise ValueError(f"input {tensor.name!r} has type {tensor.type}, which profiling cannot feed")
        shape = [d if isinstance(d, int) and d > 0 else -1 for d in tensor.shape[1:]]
        specs.append(TensorSpec(tensor.name, shape, dtype))
    return specs


def read_examples(
    valset: Path, specs: list[TensorSpec], max_unpacked_bytes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(batch, labels) of every validation example, each input cast to its dtype. The arrays are
    read within ``max_unpacked_bytes`` in all (default: the deployment's validation set limit,
    ``MODELLESS_MAX_VALSET_UNPACKED_BYTES``), each checked before it is inflated, as
    registration read them (``modelless.inputs.archives``)."""
    limit = get_settings().valset_unpacked_limit if max_unpacked_bytes is None else max_unpacked_bytes
    with open_zip(valset, "the validation set") as archive:
        infos = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        members = {"labels": "labels"}
        for spec in specs:
            if len(specs) == 1 and "inputs" in infos:
                members[spec.name] = "inputs"
            elif spec.name in infos:
                members[spec.name] = spec.name
            else:
                raise ValueError(
                    f"the validation set has no array for input {spec.name!r}: it holds {sorted(infos)}"
                )
        loaded = read_npz_members(
            archive,
            {member: infos[member] for member in members.values()},
            limit,
            lambda member: f"validation array {member!r}",
            f"the validation set may unpack to at most {limit} bytes",
        )
    labels = loaded["labels"].astype(np.int64)
    arrays = {spec.name: loaded[members[spec.name]] for spec in specs}
    fixed = [TensorSpec(s.name, list(arrays[s.name].shape[1:]), s.dtype) for s in specs]
    return from_feeds(arrays, fixed), labels


def rows(batch: np.ndarray, count: int) -> np.ndarray:
    """``count`` rows taken from ``batch`` (cycling through it when it holds fewer): a profile
    runs real examples, not zeros, which some models (attention masks, ReLU sparsity) notice."""
    return batch[np.arange(count) % len(batch)]
