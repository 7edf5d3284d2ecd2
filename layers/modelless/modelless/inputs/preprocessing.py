"""Image preprocessing recipes: how JPEG/PNG bytes sent to a model become its input tensor.

A recipe is stored with the model at registration (``ModelRecord.preprocessing``) and applied by
the gateway to every image query, so that a client sends the file it has (tens of KB) rather than
the decoded, normalised tensor (600 KB of float32 for 224x224x3) and every client preprocesses
identically. The recipe is the usual torchvision evaluation pipeline, spelled out::

    {"kind": "image", "size": [224, 224], "resize": 256, "mean": [0.485, 0.456, 0.406],
     "std": [0.229, 0.224, 0.225], "scale": 255, "layout": "NCHW", "channels": "RGB"}

decode, convert to ``channels``; resize the shorter side to ``resize`` (aspect kept; ``null``:
resize straight to ``size``); centre-crop to ``size`` [H, W]; to float32 and divide by ``scale``;
subtract ``mean`` and divide by ``std`` per channel; lay out as ``layout`` ([C, H, W] or [H, W, C]).
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelless.exceptions import InvalidInputError, first_line
from modelless.types import TensorSpec

RECIPE_KEYS = ("kind", "size", "resize", "mean", "std", "scale", "layout", "channels")
LAYOUTS = ("NCHW", "NHWC")
CHANNELS = {"RGB": 3, "L": 1}
IMAGE_FORMATS = ("PNG", "JPEG")
# Beyond this an image is refused before its pixels are decoded (a decompression bomb: a small
# PNG that expands to gigabytes). 64 Mpx is far above any camera image a classifier is sent.
MAX_IMAGE_PIXELS = 64_000_000
MAX_SIDE = 8192  # a recipe's size or resize beyond this is a mistake, not a model
MAX_RECIPE_NUMBER = 1e6  # a mean, std or scale beyond this (in either sign) is a mistake too


def parse_recipe(raw: Mapping[str, Any], spec: TensorSpec) -> dict[str, Any]:
    """``raw`` checked against the model's (single, float) input ``spec``, with every key filled
    in: the recipe as stored and as ``decode_image`` takes it. Raises ``InvalidInputError``."""
    if not isinstance(raw, Mapping):
        raise _invalid(f"must be a JSON object; got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(RECIPE_KEYS))
    if unknown:
        raise _invalid(f"has unknown keys {unknown}; it takes {list(RECIPE_KEYS)}")
    kind = raw.get("kind", "image")
    if kind != "image":
        raise _invalid(f"kind must be 'image' (the only kind there is); got {kind!r}")
    if np.dtype(spec.dtype).kind != "f":
        raise _invalid(
            f"applies to a float input; the model's input {spec.name!r} is {spec.dtype}",
        )
    layout = raw.get("layout", "NCHW")
    if layout not in LAYOUTS:
        raise _invalid(f"layout must be one of {list(LAYOUTS)}; got {layout!r}")
    channel_mode = raw.get("channels", "RGB")
    if channel_mode not in CHANNELS:
        raise _invalid(f"channels must be one of {list(CHANNELS)}; got {channel_mode!r}")
    channels = CHANNELS[channel_mode]
    shape = list(spec.shape)
    if len(shape) != 3:
        raise _invalid(
            f"needs an image input [C, H, W] or [H, W, C]; the model's input {spec.name!r} is {shape}"
        )
    model_channels, height, width = (
        (shape[0], shape[1], shape[2]) if layout == "NCHW" else (shape[2], shape[0], shape[1])
    )
    if model_channels != channels:
        raise _invalid(
            f"gives {channels} channel(s) ({channel_mode}) laid out {layout}; the model's input "
            f"{spec.name!r} is {shape}, which has {model_channels} there",
        )
    size = raw.get("size", [height, width])
    if (
        not isinstance(size, Sequence)
        or isinstance(size, str)
        or len(size) != 2
        or not all(_is_int(side) and 0 < side <= MAX_SIDE for side in size)
    ):
        raise _invalid(f"size must be [height, width], two positive integers; got {size!r}")
    if [int(size[0]), int(size[1])] != [height, width]:
        raise _invalid(
            f"size {list(size)} differs from the model's input {spec.name!r} {shape} ({layout}): "
            f"it takes [{height}, {width}] images"
        )
    resize = raw.get("resize")
    if resize is not None:
        if not _is_int(resize) or not 0 < resize <= MAX_SIDE:
            raise _invalid(f"resize must be a positive integer (the shorter side) or null; got {resize!r}")
        if resize < max(height, width):
            # The centre crop must fit in the resized image whichever side is the shorter.
            raise _invalid(
                f"resize {resize} is smaller than the crop [{height}, {width}]: the shorter side "
                f"must be resized to at least {max(height, width)}"
            )
    mean = _per_channel(raw.get("mean", [0.0] * channels), "mean", channels)
    std = _per_channel(raw.get("std", [1.0] * channels), "std", channels)
    if any(value <= 0 for value in std):
        raise _invalid(f"std must be positive for every channel; got {std}")
    scale = raw.get("scale", 255)
    if not _is_number(scale) or scale <= 0:
        raise _invalid(
            f"scale must be a positive number up to {MAX_RECIPE_NUMBER:.0f} (e.g. 255); got {scale!r}"[:300]
        )
    return {
        "kind": "image",
        "size": [height, width],
        "resize": None if resize is None else int(resize),
        "mean": mean,
        "std": std,
        "scale": float(scale),
        "layout": layout,
        "channels": channel_mode,
    }


def decode_image(data: bytes, recipe: Mapping[str, Any]) -> np.ndarray:
    """A PNG or JPEG as the model's input, ``[1, *shape]`` float32, per ``recipe`` (as
    ``parse_recipe`` returns it). A corrupt or oversized image raises ``InvalidInputError``."""
    from PIL import Image, UnidentifiedImageError

    height, width = (int(side) for side in recipe["size"])
    resize = recipe.get("resize")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            if image.format not in IMAGE_FORMATS:
                raise InvalidInputError(f"image format {image.format} is not PNG or JPEG")
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise InvalidInputError(
                    f"image of {image.width}x{image.height} pixels is too large "
                    f"(at most {MAX_IMAGE_PIXELS} pixels)"
                )
            image = image.convert(recipe["channels"])
            if resize is None:
                image = _resized(image, width, height)
            else:
                shorter = min(image.width, image.height)
                new_width = max(width, round(image.width * resize / shorter))
                new_height = max(height, round(image.height * resize / shorter))
                image = _resized(image, new_width, new_height)
                # torchvision's CenterCrop: the offset rounded, the crop inside the image.
                left = round((image.width - width) / 2.0)
                top = round((image.height - height) / 2.0)
                image = image.crop((left, top, left + width, top + height))
            pixels = np.asarray(image, dtype=np.float32)
    except InvalidInputError:
        raise
    # What Pillow's decoders raise on a damaged or crafted file: UnidentifiedImageError (an
    # OSError), a truncated stream (EOFError), a chunk whose length or fields lie (struct.error,
    # ValueError, SyntaxError), deflated data that does not inflate (zlib.error).
    except (
        UnidentifiedImageError,
        OSError,
        ValueError,
        SyntaxError,
        EOFError,
        struct.error,
        zlib.error,
        Image.DecompressionBombError,
    ) as error:
        raise InvalidInputError(f"not a decodable PNG or JPEG image: {first_line(error)}") from error
    except Image.DecompressionBombWarning as error:
        raise InvalidInputError(f"image refused: {first_line(error)}") from error
    if pixels.ndim == 2:  # "L": one channel, which Pillow leaves out
        pixels = pixels[..., np.newaxis]
    mean = np.asarray(recipe["mean"], dtype=np.float32)
    std = np.asarray(recipe["std"], dtype=np.float32)
    pixels = (pixels / np.float32(recipe["scale"]) - mean) / std
    if recipe["layout"] == "NCHW":
        pixels = np.transpose(pixels, (2, 0, 1))
    return np.ascontiguousarray(pixels[np.newaxis, ...], dtype=np.float32)


def _resized(image: Any, width: int, height: int) -> Any:
    if image.size == (width, height):
        return image
    from PIL import Image

    # Pillow's bilinear filter widens its support when shrinking (antialiased), as torchvision's
    # Resize does on PIL images: downscaling averages the area each pixel covers.
    return image.resize((width, height), Image.Resampling.BILINEAR)


def _per_channel(value: Any, name: str, channels: int) -> list[float]:
    if _is_number(value):
        value = [value] * channels
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != channels
        or not all(_is_number(v) for v in value)
    ):
        raise _invalid(
            f"{name} must be {channels} finite number(s) within +-{MAX_RECIPE_NUMBER:.0f}, one per "
            f"channel; got {value!r}"[:300]
        )
    return [float(v) for v in value]


def _is_number(value: Any) -> bool:
    """A JSON number (not a boolean) a recipe may hold: finite and within +-MAX_RECIPE_NUMBER
    (pixels are 0..255: past that a mean, std or scale is a mistake, and 10**400, an integer no
    float holds, would overflow the arithmetic)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return abs(value) <= MAX_RECIPE_NUMBER  # False for NaN; an integer is compared exactly


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(problem: str) -> InvalidInputError:
    return InvalidInputError(f"preprocessing recipe {problem}", field="preprocessing")
