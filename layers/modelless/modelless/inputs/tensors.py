"""Batches of model inputs as one numpy array, whatever the number of inputs.

A model with one input takes a plain array [batch, *shape]. A model with several (a BERT's token
ids and attention mask) takes a structured array [batch] with one field per input, so that every
layer between the gateway and onnxruntime (batching, .npy transport, slicing rows back out) keeps
handling one array: ``np.concatenate``, slicing and ``np.save(allow_pickle=False)`` all work on
structured arrays. Only the session boundary splits it into onnxruntime's feed dictionary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from modelless.types import TensorSpec


def batch_dtype(specs: Sequence[TensorSpec]) -> np.dtype:
    """The dtype of one batch row: the input's own for one input, a structured dtype for several."""
    if len(specs) == 1:
        return np.dtype(specs[0].dtype)
    return np.dtype([(spec.name, np.dtype(spec.dtype), tuple(spec.shape)) for spec in specs])


def is_structured(batch: np.ndarray) -> bool:
    return batch.dtype.names is not None


def to_feeds(batch: np.ndarray, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """onnxruntime's feed dictionary for ``batch`` (``input_names``: the session's inputs, in order)."""
    if not is_structured(batch):
        if len(input_names) != 1:
            raise ValueError(f"a plain array feeds one input; the model takes {list(input_names)}")
        return {input_names[0]: batch}
    fields = batch.dtype.names or ()
    missing = [name for name in input_names if name not in fields]
    if missing:
        raise ValueError(f"the batch lacks inputs {missing}; it holds {list(fields)}")
    return {name: np.ascontiguousarray(batch[name]) for name in input_names}


def from_feeds(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> np.ndarray:
    """One batch from per-input arrays [batch, *shape] (cast to each input's dtype)."""
    if len(specs) == 1:
        return np.asarray(arrays[specs[0].name]).astype(specs[0].dtype, copy=False)
    rows = {len(arrays[spec.name]) for spec in specs}
    if len(rows) != 1:
        raise ValueError(f"inputs hold different batch sizes: {sorted(rows)}")
    batch = np.empty(rows.pop(), dtype=batch_dtype(specs))
    for spec in specs:
        batch[spec.name] = arrays[spec.name]
    return batch


def example_batch(specs: Sequence[TensorSpec], rows: int, seed: int = 0) -> np.ndarray:
    """A batch of ``rows`` synthetic inputs (profiling, test runs): floats in [0, 1), integers 0/1."""
    generator = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = (rows, *spec.shape)
        if np.dtype(spec.dtype).kind == "f":
            arrays[spec.name] = generator.random(shape).astype(spec.dtype)
        else:
            arrays[spec.name] = generator.integers(0, 2, size=shape).astype(spec.dtype)
    return from_feeds(arrays, specs)
