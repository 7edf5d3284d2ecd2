"""Image preprocessing recipes (modelless.inputs.preprocessing): parsing against the model's input,
and decoding PNG/JPEG files made here with Pillow into exactly the tensor the recipe says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import modelless.inputs.preprocessing as preprocessing
from modelless.exceptions import InvalidInputError
from modelless.inputs.preprocessing import decode_image, parse_recipe
from modelless.types import TensorSpec
from tests.input_models import IMAGE_RECIPE, IMAGE_SPEC, jpeg_bytes, picture, png_bytes

RGB_2X2 = TensorSpec("input", [3, 2, 2], "float32")


# --- parse_recipe -----------------------------------------------------------------------------


def test_parse_recipe_fills_every_key() -> None:
    assert parse_recipe({"kind": "image"}, RGB_2X2) == {
        "kind": "image",
        "size": [2, 2],
        "resize": None,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        "scale": 255.0,
        "layout": "NCHW",
        "channels": "RGB",
    }


def test_parse_recipe_keeps_a_full_recipe() -> None:
    parsed = parse_recipe(IMAGE_RECIPE, IMAGE_SPEC)
    assert parsed == {**IMAGE_RECIPE, "scale": 255.0}


def test_parse_recipe_nhwc_and_grey() -> None:
    spec = TensorSpec("input", [8, 8, 1], "float32")
    parsed = parse_recipe({"layout": "NHWC", "channels": "L", "mean": 0.5, "std": 0.25, "scale": 1}, spec)
    assert parsed["size"] == [8, 8]
    assert parsed["mean"] == [0.5] and parsed["std"] == [0.25] and parsed["scale"] == 1.0


@pytest.mark.parametrize(
    ("raw", "spec", "message"),
    [
        ([1, 2], RGB_2X2, "must be a JSON object"),
        ({"kind": "audio"}, RGB_2X2, "kind must be 'image'"),
        ({"bogus": 1}, RGB_2X2, r"unknown keys \['bogus'\]"),
        ({}, TensorSpec("ids", [3, 2, 2], "int64"), "applies to a float input; .* is int64"),
        ({}, TensorSpec("input", [12], "float32"), r"needs an image input \[C, H, W\] or \[H, W, C\]"),
        ({"layout": "CHW"}, RGB_2X2, "layout must be one of"),
        ({"channels": "RGBA"}, RGB_2X2, "channels must be one of"),
        ({"channels": "L"}, RGB_2X2, r"gives 1 channel\(s\) \(L\) laid out NCHW"),
        ({"layout": "NHWC"}, RGB_2X2, "laid out NHWC"),
        ({"size": [3, 3]}, RGB_2X2, r"size \[3, 3\] differs from the model's input"),
        ({"size": [2]}, RGB_2X2, r"size must be \[height, width\]"),
        ({"size": [2.0, 2.0]}, RGB_2X2, r"size must be \[height, width\]"),
        ({"resize": 0}, RGB_2X2, "resize must be a positive integer"),
        ({"resize": 1}, RGB_2X2, r"resize 1 is smaller than the crop \[2, 2\]"),
        ({"mean": [0.5, 0.5]}, RGB_2X2, r"mean must be 3 finite number\(s\)"),
        ({"mean": [0.5, 0.5, float("nan")]}, RGB_2X2, "mean must be 3 finite"),
        ({"std": [1.0, 0.0, 1.0]}, RGB_2X2, "std must be positive"),
        ({"scale": 0}, RGB_2X2, "scale must be a positive number"),
        ({"scale": True}, RGB_2X2, "scale must be a positive number"),
        ({"scale": 10**400}, RGB_2X2, "scale must be a positive number up to 1000000"),  # no float holds it
        ({"scale": 1e300}, RGB_2X2, "scale must be a positive number up to 1000000"),
        ({"std": [1.0, 1.0, 1e300]}, RGB_2X2, r"std must be 3 finite number\(s\) within"),
        ({"mean": [0.5, 0.5, -(10**400)]}, RGB_2X2, "mean must be 3 finite"),
    ],
)
def test_parse_recipe_refusals(raw: Any, spec: TensorSpec, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as caught:
        parse_recipe(raw, spec)
    assert caught.value.status_code == 400
    assert caught.value.message.startswith("preprocessing recipe ")


# --- decode_image -----------------------------------------------------------------------------


def test_decode_png_gives_exactly_the_normalised_pixels() -> None:
    pixels = np.array([[[0, 51, 255], [255, 0, 102]], [[10, 20, 30], [128, 128, 128]]], dtype=np.uint8)
    recipe = parse_recipe({"mean": [0.5, 0.25, 0.0], "std": [0.5, 0.25, 2.0]}, RGB_2X2)

    tensor = decode_image(png_bytes(pixels), recipe)

    expected = (pixels.astype(np.float32) / 255 - np.array([0.5, 0.25, 0.0], np.float32)) / np.array(
        [0.5, 0.25, 2.0], np.float32
    )
    assert tensor.shape == (1, 3, 2, 2) and tensor.dtype == np.float32
    np.testing.assert_allclose(tensor[0], expected.transpose(2, 0, 1), rtol=1e-6)
    # The red channel of the top-left pixel: (0 / 255 - 0.5) / 0.5.
    assert tensor[0, 0, 0, 0] == pytest.approx(-1.0)
    assert tensor[0, 2, 0, 0] == pytest.approx(0.5)  # blue: 255 / 255 / 2


def test_decode_nhwc_layout_keeps_channels_last() -> None:
    pixels = picture(2, 2)
    spec = TensorSpec("input", [2, 2, 3], "float32")
    tensor = decode_image(png_bytes(pixels), parse_recipe({"layout": "NHWC", "scale": 1}, spec))
    assert tensor.shape == (1, 2, 2, 3)
    np.testing.assert_array_equal(tensor[0], pixels.astype(np.float32))


def test_decode_converts_to_grey() -> None:
    pixels = np.full((2, 2, 3), (200, 100, 50), dtype=np.uint8)
    spec = TensorSpec("input", [1, 2, 2], "float32")
    tensor = decode_image(png_bytes(pixels), parse_recipe({"channels": "L", "scale": 1}, spec))
    # Pillow's ITU-R 601-2 luma: L = R * 299/1000 + G * 587/1000 + B * 114/1000.
    assert tensor.shape == (1, 1, 2, 2)
    assert tensor[0, 0, 0, 0] == pytest.approx(round(200 * 0.299 + 100 * 0.587 + 50 * 0.114), abs=1)


def test_decode_centre_crops_after_resizing_the_shorter_side() -> None:
    # 4 rows x 6 columns, each column its own value; the shorter side is already 4 (no resize),
    # and a centre crop of 4x4 keeps columns 1..4.
    columns = np.arange(6, dtype=np.uint8) * 40
    pixels = np.repeat(np.broadcast_to(columns[np.newaxis, :, np.newaxis], (4, 6, 1)), 3, axis=2)
    spec = TensorSpec("input", [3, 4, 4], "float32")

    tensor = decode_image(
        png_bytes(np.ascontiguousarray(pixels)), parse_recipe({"resize": 4, "scale": 1}, spec)
    )

    assert tensor.shape == (1, 3, 4, 4)
    np.testing.assert_array_equal(tensor[0, 0, 0], [40, 80, 120, 160])


def test_decode_resizes_the_shorter_side_keeping_the_aspect() -> None:
    # A uniform 20x40 image resized to shorter side 4 (4x8) and cropped to 4x4 stays uniform.
    pixels = np.full((20, 40, 3), 90, dtype=np.uint8)
    spec = TensorSpec("input", [3, 4, 4], "float32")
    tensor = decode_image(png_bytes(pixels), parse_recipe({"resize": 4, "scale": 1}, spec))
    np.testing.assert_array_equal(tensor, np.full((1, 3, 4, 4), 90, dtype=np.float32))


def test_decode_without_resize_stretches_to_the_size() -> None:
    pixels = picture(10, 30)
    tensor = decode_image(png_bytes(pixels), parse_recipe({}, RGB_2X2))
    assert tensor.shape == (1, 3, 2, 2)
    assert np.isfinite(tensor).all()


def test_decode_jpeg_is_close_to_its_pixels() -> None:
    pixels = np.full((8, 8, 3), (200, 40, 120), dtype=np.uint8)
    spec = TensorSpec("input", [3, 8, 8], "float32")
    tensor = decode_image(jpeg_bytes(pixels), parse_recipe({"scale": 1}, spec))
    # JPEG is lossy: a flat colour comes back within a few levels.
    np.testing.assert_allclose(tensor[0, :, 4, 4], [200, 40, 120], atol=4)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", png_bytes(picture())[:30], b"\xff\xd8\xff\xe0 truncated jpeg"],
    ids=["empty", "text", "truncated-png", "truncated-jpeg"],
)
def test_corrupt_images_are_invalid_input(data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="image") as caught:
        decode_image(data, parse_recipe({}, RGB_2X2))
    assert caught.value.status_code == 400


def test_other_image_formats_are_refused() -> None:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture()).save(buffer, format="GIF")
    with pytest.raises(InvalidInputError, match="GIF is not PNG or JPEG"):
        decode_image(buffer.getvalue(), parse_recipe({}, RGB_2X2))


def test_images_over_the_pixel_limit_are_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preprocessing, "MAX_IMAGE_PIXELS", 47)
    with pytest.raises(InvalidInputError, match="6x8 pixels is too large"):
        decode_image(png_bytes(picture(8, 6)), parse_recipe({}, RGB_2X2))
