"""Inputs of offline jobs into the model's input: ``.npy``/``.npz`` arrays and PNG/JPEG images.

An input that cannot be decoded, or does not fit the model, raises ``OfflineInputError`` with a
message for the job's summary: it fails that input alone, never the job.
"""

from __future__ import annotations

import io
import warnings
from pathlib import PurePosixPath

import numpy as np

from modelless.exceptions import InvalidInputError, OfflineInputError, first_line
from modelless.inputs.archives import UNREADABLE, open_zip, read_npy, read_npz_member
from modelless.inputs.bodies import ZIP_MAGIC, batch_bytes, check_batch
from modelless.types import ModelRecord

ARRAY_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SUPPORTED_SUFFIXES = ARRAY_SUFFIXES + IMAGE_SUFFIXES
MAX_IMAGE_PIXELS = 64_000_000  # beyond this an image is refused, not decoded (decompression bombs)


def is_supported(key: str) -> bool:
    return PurePosixPath(key).suffix.lower() in SUPPORTED_SUFFIXES


def decode_input(key: str, data: bytes, model: ModelRecord, max_rows: int) -> np.ndarray:
    """``[rows, *model.input_shape]`` float32: an array file (one input or a batch of them), or
    an image converted to the model's channels, resized to its height and width, scaled to [0, 1]."""
    suffix = PurePosixPath(key).suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        array = _load_array(data, suffix, model, max_rows)
    elif suffix in IMAGE_SUFFIXES:
        array = decode_image(data, model.input_shape)
    else:
        raise OfflineInputError(
            f"unsupported input type {suffix or '(no extension)'!r}: use {', '.join(SUPPORTED_SUFFIXES)}"
        )
    try:
        return check_batch(array, model, max_rows)
    except InvalidInputError as error:
        raise OfflineInputError(error.message) from error


def _load_array(data: bytes, suffix: str, model: ModelRecord, max_rows: int) -> np.ndarray:
    """The array an ``.npy``, or an ``.npz``'s ``inputs`` (or only) array, holds: never more
    than its header declares and the bytes hold (``.npy``), nor more than ``max_rows`` rows of
    the model's inputs could fill (an ``.npz`` member, checked before it is inflated)."""
    try:
        if not data.startswith(ZIP_MAGIC):  # by content, as numpy tells them apart
            return read_npy(data, f"the {suffix} file")
        with open_zip(data, f"the {suffix} file") as archive:
            infos = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
            if "inputs" in infos:
                name = "inputs"
            elif len(infos) == 1:
                name = next(iter(infos))
            else:
                raise OfflineInputError(
                    f".npz holds {sorted(infos)}: name the array 'inputs' (or hold just one)"
                )
            limit = sum(batch_bytes(spec, max_rows) for spec in model.input_specs)
            return read_npz_member(
                archive,
                infos[name],
                limit,
                f".npz array {name!r}",
                f"{max_rows} rows of this model's inputs are at most {limit}",
            )
    except InvalidInputError as error:
        raise OfflineInputError(error.message) from error
    except UNREADABLE as error:
        raise OfflineInputError(f"not a readable {suffix} file: {first_line(error)}") from error


def image_layout(shape: list[int]) -> tuple[str, int, int, int]:
    """How an image maps onto a model input of ``shape`` (batch dimension excluded): the layout
    ("chw", "hwc" or "hw"), channels, height and width."""
    if len(shape) == 3 and shape[0] in (1, 3):
        return "chw", shape[0], shape[1], shape[2]
    if len(shape) == 3 and shape[2] in (1, 3):
        return "hwc", shape[2], shape[0], shape[1]
    if len(shape) == 2:
        return "hw", 1, shape[0], shape[1]
    raise OfflineInputError(
        f"the model takes inputs of shape {shape}, not images ([C,H,W] or [H,W,C] with 1 or 3 "
        "channels, or [H,W])"
    )


def decode_image(data: bytes, shape: list[int]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    layout, channels, height, width = image_layout(shape)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            if image.format not in {"PNG", "JPEG"}:
                raise OfflineInputError(f"image format {image.format} is not PNG or JPEG")
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise OfflineInputError(f"image of {image.width}x{image.height} pixels is too large")
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (width, height):
                # Shrinking averages each target pixel's area (what a camera image needs to keep
                # its content); enlarging interpolates.
                shrinking = image.width >= width and image.height >= height
                method = Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR
                image = image.resize((width, height), method)
            pixels = np.asarray(image, dtype=np.float32) / 255.0
    except OfflineInputError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise OfflineInputError(f"not a decodable image: {first_line(error)}") from error
    except Image.DecompressionBombWarning as error:
        raise OfflineInputError(f"image refused: {first_line(error)}") from error
    if layout == "hw":
        return pixels
    if channels == 1:
        pixels = pixels[..., np.newaxis]
    return np.transpose(pixels, (2, 0, 1)) if layout == "chw" else pixels
