"""Query inputs into the batch a model takes, from every body an online query may have.

A query's body is JSON (``inputs``: nested lists, or ``{inputName: nested lists}``), one ``.npy``
array, an ``.npz`` with one array per input name, or a PNG/JPEG image that the model's
preprocessing recipe turns into its input (``modelless.inputs.preprocessing``). Whatever the form, the
result is checked against the model's inputs (``ModelRecord.input_specs``) and comes out as the
batch every layer below carries (``modelless.inputs.tensors``): a plain array [batch, *shape] in the
input's dtype for a one-input model, a structured array [batch] for several inputs.

Each refusal is a 4xx domain error that says what was wrong (``InvalidInputError``, or
``UnsupportedMediaTypeError`` for a body of a type the query cannot take).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from itertools import chain
from typing import Any

import numpy as np

from modelless.exceptions import InvalidInputError, UnsupportedMediaTypeError, first_line
from modelless.inputs.archives import UNREADABLE, open_zip, read_npy, read_npz_member
from modelless.inputs.tensors import from_feeds, is_structured
from modelless.types import ModelRecord, TensorSpec


class BodyKind(StrEnum):
    """What a query's body holds, as its content type (or its first bytes) says."""

    JSON = "json"
    NPY = "npy"
    NPZ = "npz"
    IMAGE = "image"


JSON_TYPE = "application/json"
NPY_TYPE = "application/x-npy"
NPZ_TYPE = "application/x-npz"
OCTET_STREAM = "application/octet-stream"
CONTENT_TYPES: dict[str, BodyKind] = {
    JSON_TYPE: BodyKind.JSON,
    NPY_TYPE: BodyKind.NPY,
    NPZ_TYPE: BodyKind.NPZ,
    "application/zip": BodyKind.NPZ,  # what an .npz is; some clients name it so
    "image/jpeg": BodyKind.IMAGE,
    "image/png": BodyKind.IMAGE,
}
ACCEPTED_TYPES = (*CONTENT_TYPES, OCTET_STREAM)

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"


def body_kind(content_type: str | None, body: bytes) -> BodyKind:
    """The body's form from its ``Content-Type`` (parameters ignored); an ``octet-stream`` body is
    recognised by its first bytes. No content type at all is JSON, as the API always took it."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not media:
        return BodyKind.JSON
    kind = CONTENT_TYPES.get(media)
    if kind is not None:
        return kind
    if media.startswith("application/") and media.endswith("+json"):
        return BodyKind.JSON
    if media == OCTET_STREAM:
        sniffed = sniff(body)
        if sniffed is None:
            raise UnsupportedMediaTypeError(
                "an application/octet-stream body must be a PNG or JPEG image, an .npy array or an "
                ".npz archive (recognised by their first bytes); this one is none of them: send it "
                f"with its own content type ({', '.join(CONTENT_TYPES)})",
                accepted=list(ACCEPTED_TYPES),
            )
        return sniffed
    raise UnsupportedMediaTypeError(
        f"content type {media!r} is not accepted by online_query; send one of {', '.join(ACCEPTED_TYPES)}",
        accepted=list(ACCEPTED_TYPES),
    )


def sniff(body: bytes) -> BodyKind | None:
    if body.startswith(PNG_MAGIC) or body.startswith(JPEG_MAGIC):
        return BodyKind.IMAGE
    if body.startswith(NPY_MAGIC):
        return BodyKind.NPY
    if body.startswith(ZIP_MAGIC):
        return BodyKind.NPZ
    return None


def binary_inputs(kind: BodyKind, body: bytes, model: ModelRecord, max_batch: int) -> np.ndarray:
    """The batch a binary body (``.npy``, ``.npz`` or an image) holds for ``model``."""
    if kind is BodyKind.NPY:
        return npy_inputs(body, model, max_batch)
    if kind is BodyKind.NPZ:
        return npz_inputs(body, model, max_batch)
    if kind is BodyKind.IMAGE:
        return image_inputs(body, model, max_batch)
    raise ValueError(f"{kind} is not a binary body")


# --- each form --------------------------------------------------------------------------------


def query_inputs(raw: Any, model: ModelRecord, max_batch: int) -> np.ndarray:
    """A JSON query's ``inputs`` (nested lists; or an object of them by input name, which a model
    with several inputs needs) as the batch ``model`` takes."""
    specs = model.input_specs
    if isinstance(raw, Mapping):
        arrays = {str(name): _json_array(value, name) for name, value in raw.items()}
        return check_batch(arrays, model, max_batch)
    if len(specs) > 1:
        raise InvalidInputError(
            f"model {model.model_name!r} takes {len(specs)} inputs: give inputs as an object "
            f"{{{', '.join(repr(s.name) for s in specs)}: [...]}}",
            expected=[s.name for s in specs],
        )
    return check_batch(_json_array(raw, None, specs[0]), model, max_batch)


def npy_inputs(data: bytes, model: ModelRecord, max_batch: int) -> np.ndarray:
    """An ``.npy`` body: the batch of a one-input model (or, for several inputs, a structured
    array with one field per input, as ``modelless.inputs.tensors`` lays batches out)."""
    if data.startswith(ZIP_MAGIC):
        return npz_inputs(data, model, max_batch)
    loaded = read_npy(data, "body")
    specs = model.input_specs
    if is_structured(loaded):
        return check_batch({name: loaded[name] for name in loaded.dtype.names or ()}, model, max_batch)
    if len(specs) > 1:
        raise InvalidInputError(
            f"model {model.model_name!r} takes {len(specs)} inputs "
            f"({', '.join(s.name for s in specs)}): send an .npz with one array per input name "
            "(application/x-npz)",
            expected=[s.name for s in specs],
        )
    return check_batch(loaded, model, max_batch)


def npz_inputs(data: bytes, model: ModelRecord, max_batch: int) -> np.ndarray:
    """An ``.npz`` body: one array per input name (a one-input model also takes the archive's
    only array, or one named ``inputs``, whatever the input's name)."""
    specs = model.input_specs
    try:
        archive = open_zip(data, "the .npz body")
    except UNREADABLE as error:
        raise InvalidInputError(f"body is not a readable .npz archive: {first_line(error)}") from error
    with archive:
        members = {
            info.filename.removesuffix(".npy"): info for info in archive.infolist() if not info.is_dir()
        }
        if len(specs) == 1 and specs[0].name not in members:
            if len(members) == 1:
                members = {specs[0].name: next(iter(members.values()))}
            elif "inputs" in members:
                members[specs[0].name] = members.pop("inputs")
        unknown = sorted(set(members) - {spec.name for spec in specs})
        if unknown:  # refused before any member is read
            raise InvalidInputError(
                f".npz holds {unknown}, which model {model.model_name!r} does not take; its inputs "
                f"are {[s.name for s in specs]}",
                expected=[s.name for s in specs],
                got=sorted(members),
            )
        arrays: dict[str, np.ndarray] = {}
        for spec in specs:
            info = members.get(spec.name)
            if info is None:
                continue  # missing: check_batch says so, naming every input
            # The input's largest possible batch: a member that the archive (or its .npy header)
            # says is larger is refused before it is inflated (a small body can hold a huge
            # compressed array).
            limit = batch_bytes(spec, max_batch)
            arrays[spec.name] = read_npz_member(
                archive,
                info,
                limit,
                f".npz array {spec.name!r}",
                f"a batch of at most {max_batch} for input {spec.name!r} is at most {limit}",
            )
    return check_batch(arrays, model, max_batch)


def batch_bytes(spec: TensorSpec, max_batch: int) -> int:
    """The array data of the largest batch of ``spec`` a query may carry, at 8 bytes a value
    (float64 or int64, the widest a caller sends): the most an array file for it may declare."""
    return max_batch * 8 * math.prod(spec.shape)


def image_inputs(data: bytes, model: ModelRecord, max_batch: int) -> np.ndarray:
    """A PNG or JPEG decoded with the model's preprocessing recipe into its one float input."""
    from modelless.inputs.preprocessing import decode_image, parse_recipe

    if model.preprocessing is None:
        raise UnsupportedMediaTypeError(
            f"model {model.model_name!r} has no preprocessing recipe, so it takes no images: send "
            "its input tensor (application/x-npy, application/x-npz or JSON), or register it with "
            "a preprocessing recipe",
            model=model.model_name,
        )
    specs = model.input_specs
    if len(specs) != 1:
        raise UnsupportedMediaTypeError(
            f"model {model.model_name!r} takes {len(specs)} inputs; an image feeds a model of one",
            model=model.model_name,
        )
    recipe = parse_recipe(model.preprocessing, specs[0])
    return check_batch(decode_image(data, recipe), model, max_batch)


# --- checks -----------------------------------------------------------------------------------


def check_batch(
    inputs: np.ndarray | Mapping[str, np.ndarray], model: ModelRecord, max_batch: int
) -> np.ndarray:
    """``inputs`` (one array for a one-input model, or arrays by input name) checked against
    every input of ``model`` and cast to its dtype: the batch, one row per example (a single
    example without the batch dimension is taken as a batch of one)."""
    specs = model.input_specs
    if isinstance(inputs, np.ndarray):
        if is_structured(inputs):
            inputs = {name: inputs[name] for name in inputs.dtype.names or ()}
        elif len(specs) == 1:
            inputs = {specs[0].name: inputs}
        else:
            raise InvalidInputError(
                f"model {model.model_name!r} takes {len(specs)} inputs "
                f"({', '.join(s.name for s in specs)}); one array was given",
                expected=[s.name for s in specs],
            )
    names = [spec.name for spec in specs]
    missing = [name for name in names if name not in inputs]
    unknown = sorted(set(inputs) - set(names))
    if missing or unknown:
        raise InvalidInputError(
            f"model {model.model_name!r} takes inputs {names}; "
            + "; ".join(
                part
                for part in (
                    f"missing {missing}" if missing else "",
                    f"unknown {unknown}" if unknown else "",
                )
                if part
            ),
            expected=names,
            got=sorted(inputs),
        )
    arrays = {
        spec.name: check_input(inputs[spec.name], spec, model, max_batch, len(specs) > 1) for spec in specs
    }
    rows = {name: int(array.shape[0]) for name, array in arrays.items()}
    if len(set(rows.values())) > 1:
        raise InvalidInputError(f"inputs hold different batch sizes: {rows}", rows=rows)
    return from_feeds(arrays, specs)


def check_input(
    array: np.ndarray, spec: TensorSpec, model: ModelRecord, max_batch: int, named: bool = False
) -> np.ndarray:
    """One input's array [batch, *spec.shape] in ``spec.dtype``, or a clear refusal (``named``:
    messages name the input, as they must for a model with several)."""
    expected = list(spec.shape)
    dims = ", ".join(map(str, expected))
    which = f"input {spec.name!r} of model {model.model_name!r}" if named else f"model {model.model_name!r}"
    takes = f"{which} takes [{dims}] or [batch, {dims}] ({spec.dtype})"
    label = f"input {spec.name!r}" if named else "inputs"
    if array.ndim == 0:
        raise InvalidInputError(f"{label} have no shape (a single value); {takes}", expected=expected, got=[])
    if array.dtype.kind not in "fiub":
        # 'O' arrives for ragged lists and integers too large for any machine type.
        raise InvalidInputError(
            f"{label} must be a regular numeric array; got {array.dtype} "
            "(strings, ragged nesting or out-of-range integers)"
        )
    if list(array.shape) == expected:
        array = array[np.newaxis, ...]
    if list(array.shape[1:]) != expected or array.ndim != len(expected) + 1:
        raise InvalidInputError(
            f"{label} have shape {list(array.shape)}; {takes}", expected=expected, got=list(array.shape)
        )
    if array.shape[0] == 0:
        raise InvalidInputError(f"{label} hold an empty batch")
    if array.shape[0] > max_batch:
        raise InvalidInputError(
            f"batch of {array.shape[0]} exceeds the limit of {max_batch}", limit=max_batch
        )
    target = np.dtype(spec.dtype)
    if target.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(target, copy=False)
        # Checked after the cast: 1e39 is finite in float64 but reaches a float32 model as inf.
        if not np.isfinite(cast).all():
            raise InvalidInputError(
                f"{label} contain NaN or infinity, or values beyond {target.name}'s range"
            )
        return np.ascontiguousarray(cast)
    if target.kind in "iub":
        _check_integral(array, target, label)
        return np.ascontiguousarray(array.astype(target, copy=False))
    raise InvalidInputError(f"{which} takes {spec.dtype}, which queries cannot carry")


def _check_integral(array: np.ndarray, target: np.dtype, label: str) -> None:
    """Values that ``target`` (an integer or bool type) holds exactly: no fractions, none
    outside its range. A token id of 1.5 or 2**40 for int32 is refused, never truncated."""
    if target.kind == "b":
        low, high = 0, 1
    else:
        info = np.iinfo(target)
        low, high = int(info.min), int(info.max)
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            raise InvalidInputError(f"{label} must be integers ({target.name}); they contain NaN or infinity")
        if not (array == np.floor(array)).all():
            fraction = array[array != np.floor(array)].flat[0]
            raise InvalidInputError(
                f"{label} must be integers ({target.name}); got {float(fraction)!r}", dtype=target.name
            )
        # Compared as floats: ``high + 1`` is a power of two, exact in float64, where ``high``
        # itself (2**63 - 1) would round up and let 2**63 through.
        if array.min() < float(low) or array.max() >= float(high + 1):
            raise InvalidInputError(
                f"{label} must lie in [{low}, {high}] ({target.name}); got values from "
                f"{float(array.min())!r} to {float(array.max())!r}",
                dtype=target.name,
            )
        return
    if array.size and array.dtype.kind != "b" and (int(array.min()) < low or int(array.max()) > high):
        raise InvalidInputError(
            f"{label} must lie in [{low}, {high}] ({target.name}); got values from "
            f"{int(array.min())} to {int(array.max())}",
            dtype=target.name,
        )


def _json_array(raw: Any, name: object, spec: TensorSpec | None = None) -> np.ndarray:
    label = "inputs" if name is None else f"input {name!r}"
    if _holds_boolean(raw):
        # numpy reads true and false as 1 and 0, alone or among numbers: refused, as a string is.
        raise InvalidInputError(
            f"{label} must be numbers; got a JSON boolean (true/false), which is not a number",
            field="inputs" if name is None else str(name),
        )
    try:
        # No dtype forced here: strings must be refused, not silently parsed as numbers.
        return np.asarray(raw)
    except (ValueError, TypeError, OverflowError) as error:
        shape = "" if spec is None else ", ".join(map(str, spec.shape))
        wanted = f" of shape [{shape}] or [batch, {shape}]" if spec is not None else ""
        raise InvalidInputError(f"{label} must be a numeric array{wanted}: {first_line(error)}") from error


def _holds_boolean(raw: Any) -> bool:
    """Whether a JSON value (nested lists of numbers) holds ``true`` or ``false`` anywhere. One
    nesting level at a time, each in C: the types of a level's items gathered (``map(type,
    ...)``), the next level flattened (``chain.from_iterable``); it costs about what numpy's own
    reading of the lists does. A level that mixes lists and numbers is ragged: numpy refuses it."""
    level = [raw]
    while level:
        kinds = set(map(type, level))
        if bool in kinds:
            return True
        if kinds != {list}:
            return False
        level = list(chain.from_iterable(level))
    return False
