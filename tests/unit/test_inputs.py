"""Query inputs into the batch a model takes (modelless.inputs.bodies): JSON, .npy, .npz and images;
int64 and multi-input (structured) batches; every refusal a clear 4xx."""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any

import numpy as np
import pytest

from modelless.exceptions import InvalidInputError, UnsupportedMediaTypeError
from modelless.inputs.bodies import (
    BodyKind,
    binary_inputs,
    body_kind,
    check_batch,
    image_inputs,
    npy_inputs,
    npz_inputs,
    query_inputs,
)
from modelless.inputs.preprocessing import decode_image, parse_recipe
from modelless.inputs.tensors import batch_dtype
from modelless.types import ModelRecord, TensorSpec
from tests.input_models import (
    IMAGE_RECIPE,
    IMAGE_SPEC,
    TOKEN_SPECS,
    image_record,
    jpeg_bytes,
    npy_bytes,
    npz_bytes,
    picture,
    png_bytes,
    token_inputs,
    token_record,
)
from tests.models import digits


def digits_record(name: str = "digits") -> ModelRecord:
    return ModelRecord(
        app_id="app",
        model_name=name,
        input_name="input",
        input_shape=[1, 8, 8],
        input_dtype="float32",
        num_classes=10,
        registration_id="r",
        artifact_key="apps/app/digits/source.onnx",
        ready=True,
    )


def int64_record(shape: list[int] | None = None, dtype: str = "int64") -> ModelRecord:
    """A model of one integer input (token ids)."""
    shape = shape or [4]
    return ModelRecord(
        app_id="app",
        model_name="ids",
        input_name="ids",
        input_shape=shape,
        input_dtype=dtype,
        num_classes=2,
        registration_id="r",
        artifact_key="k",
        ready=True,
        inputs=[TensorSpec("ids", shape, dtype)],
    )


# --- query_inputs / check_batch ---------------------------------------------------------------


def test_query_inputs_single_input_gets_a_batch_dimension() -> None:
    image = digits()[0][0]  # [1, 8, 8]
    array = query_inputs(image.tolist(), digits_record(), max_batch=8)
    assert array.shape == (1, 1, 8, 8)
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array[0], image)


def test_query_inputs_batch_kept_as_is() -> None:
    batch = digits()[0][:5]
    array = query_inputs(batch.tolist(), digits_record(), max_batch=8)
    assert array.shape == (5, 1, 8, 8)
    np.testing.assert_array_equal(array, batch)


def test_query_inputs_integers_and_booleans_are_numbers() -> None:
    ints = np.ones((1, 8, 8), dtype=int).tolist()
    assert query_inputs(ints, digits_record(), 8).dtype == np.float32
    assert check_batch(np.ones((2, 1, 8, 8), dtype=bool), digits_record(), 8).shape == (2, 1, 8, 8)


@pytest.mark.parametrize(
    "raw",
    [
        [[[True] * 8] * 8],
        [[[1.0] * 7 + [True]] + [[0.0] * 8] * 7],  # numpy alone would read it as 1.0
        [[[0] * 8] * 7 + [[False] + [0] * 7]],  # ...and this as 0
        True,
    ],
    ids=["all-booleans", "a-boolean-among-floats", "a-boolean-among-integers", "a-lone-boolean"],
)
def test_query_inputs_refuse_json_booleans(raw: Any) -> None:
    with pytest.raises(InvalidInputError, match="inputs must be numbers; got a JSON boolean"):
        query_inputs(raw, digits_record(), 8)


def test_json_booleans_in_one_of_several_inputs_name_that_input() -> None:
    ids, mask = token_inputs(2)
    flagged = mask.tolist()
    flagged[1][3] = True
    with pytest.raises(InvalidInputError, match="input 'mask' must be numbers; got a JSON boolean"):
        query_inputs({"ids": ids.tolist(), "mask": flagged}, token_record(), 8)


@pytest.mark.parametrize(
    "raw",
    [
        np.zeros((8, 8)).tolist(),
        np.zeros((2, 8, 8)).tolist(),
        np.zeros((2, 1, 8, 9)).tolist(),
        np.zeros((2, 1, 1, 8, 8)).tolist(),
        [1.0, 2.0, 3.0],
        5.0,
    ],
    ids=["no-channel", "batch-no-channel", "wrong-width", "extra-dim", "flat", "scalar"],
)
def test_query_inputs_refuses_wrong_shapes(raw: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"takes \[1, 8, 8\] or \[batch, 1, 8, 8\]") as caught:
        query_inputs(raw, digits_record(), 8)
    assert caught.value.status_code == 400
    assert caught.value.details["expected"] == [1, 8, 8]


@pytest.mark.parametrize(
    "raw",
    [
        [[["a"] * 8] * 8],
        [[[1.0] * 7 + ["x"]] * 8],
        [[[1.0] * 8] * 7 + [[1.0] * 7]],  # ragged
        {"not": "an array"},
        [[[None] * 8] * 8],
    ],
    ids=["strings", "one-string", "ragged", "object", "nulls"],
)
def test_query_inputs_refuses_non_numeric(raw: Any) -> None:
    with pytest.raises(InvalidInputError) as caught:
        query_inputs(raw, digits_record(), 8)
    assert caught.value.status_code == 400


def test_check_batch_refuses_string_dtype() -> None:
    with pytest.raises(InvalidInputError, match="numeric array; got <U1"):
        check_batch(np.full((1, 1, 8, 8), "a"), digits_record(), 8)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_query_inputs_refuses_nan_and_infinity(bad: float) -> None:
    raw = np.zeros((2, 1, 8, 8))
    raw[1, 0, 4, 4] = bad
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        query_inputs(raw.tolist(), digits_record(), 8)


def test_query_inputs_refuses_an_empty_batch() -> None:
    with pytest.raises(InvalidInputError, match="empty batch"):
        check_batch(np.zeros((0, 1, 8, 8)), digits_record(), 8)
    with pytest.raises(InvalidInputError):
        query_inputs([], digits_record(), 8)


def test_query_inputs_refuses_a_batch_over_max_batch() -> None:
    assert query_inputs(np.zeros((8, 1, 8, 8)).tolist(), digits_record(), 8).shape[0] == 8
    with pytest.raises(InvalidInputError, match="batch of 9 exceeds the limit of 8") as caught:
        query_inputs(np.zeros((9, 1, 8, 8)).tolist(), digits_record(), 8)
    assert caught.value.details == {"limit": 8}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_query_inputs_refuses_values_that_overflow_float32() -> None:
    raw = np.zeros((1, 1, 8, 8))
    raw[0, 0, 0, 0] = 1e39
    with pytest.raises(InvalidInputError):
        query_inputs(raw.tolist(), digits_record(), 8)


def test_query_inputs_refuses_huge_integers() -> None:
    raw: list[Any] = np.zeros((1, 8, 8)).tolist()
    raw[0][0][0] = 10**400
    with pytest.raises(InvalidInputError):
        query_inputs(raw, digits_record(), 8)


def test_query_inputs_refuses_numeric_strings() -> None:
    with pytest.raises(InvalidInputError):
        query_inputs([[["0.5"] * 8] * 8], digits_record(), 8)


def test_query_inputs_by_name_for_a_one_input_model() -> None:
    batch = digits()[0][:2]
    array = query_inputs({"input": batch.tolist()}, digits_record(), 8)
    np.testing.assert_array_equal(array, batch)
    with pytest.raises(InvalidInputError, match=r"takes inputs \['input'\]; missing \['input'\]; unknown"):
        query_inputs({"pixels": batch.tolist()}, digits_record(), 8)


# --- integer inputs ---------------------------------------------------------------------------


def test_int64_inputs_keep_their_values_and_dtype() -> None:
    big = 2**53 + 1  # beyond float64's integers: must not go through a float anywhere
    array = query_inputs([[1, 2, 3, big]], int64_record(), 8)
    assert array.dtype == np.int64
    assert array.tolist() == [[1, 2, 3, big]]
    # Integral floats (what some JSON encoders write for integers) are taken.
    assert query_inputs([1.0, 2.0, 3.0, 4.0], int64_record(), 8).tolist() == [[1, 2, 3, 4]]


def test_int64_inputs_refuse_fractions_with_a_clear_400() -> None:
    with pytest.raises(InvalidInputError, match=r"must be integers \(int64\); got 1.5") as caught:
        query_inputs([[1, 1.5, 2, 3]], int64_record(), 8)
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("raw", "dtype"),
    [
        ([[0, 0, 0, 2.0**63]], "int64"),  # one past int64's largest, as a float
        ([[0, 0, 0, -(2.0**63) * 2]], "int64"),
        ([[0, 0, 0, 2**31]], "int32"),
        ([[0, 0, 0, -(2**31) - 1]], "int32"),
        ([[0, 0, 0, -1]], "uint8"),
    ],
)
def test_integer_inputs_refuse_values_outside_their_type(raw: Any, dtype: str) -> None:
    with pytest.raises(InvalidInputError, match=rf"must lie in \[.*\] \({dtype}\)"):
        query_inputs(raw, int64_record(dtype=dtype), 8)


def test_int32_inputs_take_their_whole_range() -> None:
    array = query_inputs([[-(2**31), 0, 1, 2**31 - 1]], int64_record(dtype="int32"), 8)
    assert array.dtype == np.int32
    assert array.tolist() == [[-(2**31), 0, 1, 2**31 - 1]]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_integer_inputs_refuse_nan_and_infinity(bad: float) -> None:
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        check_batch(np.array([[0.0, 1.0, 2.0, bad]]), int64_record(), 8)


def test_integer_inputs_take_another_integer_type_within_range() -> None:
    array = check_batch(np.array([[1, 2, 3, 4]], dtype=np.uint64), int64_record(), 8)
    assert array.dtype == np.int64
    with pytest.raises(InvalidInputError, match="must lie in"):
        check_batch(np.array([[1, 2, 3, 2**63]], dtype=np.uint64), int64_record(), 8)


# --- several inputs: structured batches -------------------------------------------------------


def test_several_inputs_from_json_become_a_structured_batch() -> None:
    ids, mask = token_inputs(3)

    batch = query_inputs({"ids": ids.tolist(), "mask": mask.tolist()}, token_record(), 8)

    assert batch.dtype == batch_dtype(TOKEN_SPECS)
    assert batch.shape == (3,)
    np.testing.assert_array_equal(batch["ids"], ids)
    np.testing.assert_array_equal(batch["mask"], mask)


def test_several_inputs_take_single_examples_without_the_batch_dimension() -> None:
    batch = query_inputs({"ids": [1, 2, 3, 4], "mask": [1, 1, 0, 0]}, token_record(), 8)
    assert batch.shape == (1,)
    assert batch["ids"].tolist() == [[1, 2, 3, 4]]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([[1, 2, 3, 4]], r"takes 2 inputs: give inputs as an object \{'ids', 'mask'"),
        ({"ids": [[1, 2, 3, 4]]}, r"missing \['mask'\]"),
        ({"ids": [[1, 2, 3, 4]], "mask": [[1, 1, 1, 1]], "extra": [1]}, r"unknown \['extra'\]"),
        ({"ids": [[1, 2, 3, 4]] * 2, "mask": [[1, 1, 1, 1]]}, "different batch sizes"),
        ({"ids": [[1, 2, 3]], "mask": [[1, 1, 1, 1]]}, r"input 'ids' have shape \[1, 3\]"),
        ({"ids": [[1, 2, 3, 4]], "mask": [[1, 0.5, 1, 1]]}, r"input 'mask' must be integers"),
    ],
    ids=["plain-list", "missing", "unknown", "batch-sizes", "shape", "fraction"],
)
def test_several_inputs_refusals_name_the_input(raw: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        query_inputs(raw, token_record(), 8)


def test_several_inputs_share_the_batch_limit() -> None:
    ids, mask = token_inputs(9)
    with pytest.raises(InvalidInputError, match="batch of 9 exceeds the limit of 8"):
        query_inputs({"ids": ids.tolist(), "mask": mask.tolist()}, token_record(), 8)


# --- .npy and .npz bodies ---------------------------------------------------------------------


def test_npy_body_keeps_its_values() -> None:
    batch = digits()[0][:3]
    array = npy_inputs(npy_bytes(batch), digits_record(), 8)
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, batch)
    # One example without the batch dimension, float64 cast to the model's float32.
    single = npy_inputs(npy_bytes(batch[0].astype(np.float64)), digits_record(), 8)
    assert single.shape == (1, 1, 8, 8) and single.dtype == np.float32


def test_npy_body_of_int64_stays_int64() -> None:
    ids = np.array([[5, 2**40, 7, 1]], dtype=np.int64)
    array = npy_inputs(npy_bytes(ids), int64_record(), 8)
    assert array.dtype == np.int64
    np.testing.assert_array_equal(array, ids)


def test_npy_body_refusals() -> None:
    with pytest.raises(InvalidInputError, match=r"not a readable \.npy array"):
        npy_inputs(b"\x93NUMPY garbage", digits_record(), 8)
    objects = io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInputError, match=r"not a readable \.npy array"):  # never unpickled
        npy_inputs(objects.getvalue(), digits_record(), 8)
    with pytest.raises(InvalidInputError, match=r"takes 2 inputs \(ids, mask\): send an .npz"):
        npy_inputs(npy_bytes(np.zeros((1, 4), dtype=np.int64)), token_record(), 8)
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        npy_inputs(npy_bytes(np.full((1, 1, 8, 8), np.nan, dtype=np.float32)), digits_record(), 8)


def test_npy_body_may_be_a_structured_batch_for_several_inputs() -> None:
    ids, mask = token_inputs(2)
    structured = np.empty(2, dtype=batch_dtype(TOKEN_SPECS))
    structured["ids"], structured["mask"] = ids, mask

    batch = npy_inputs(npy_bytes(structured), token_record(), 8)

    np.testing.assert_array_equal(batch["ids"], ids)
    np.testing.assert_array_equal(batch["mask"], mask)


def test_npz_body_with_one_array_per_input_name() -> None:
    ids, mask = token_inputs(4)

    batch = npz_inputs(npz_bytes(ids=ids, mask=mask), token_record(), 8)

    assert batch.dtype == batch_dtype(TOKEN_SPECS)
    np.testing.assert_array_equal(batch["ids"], ids)
    np.testing.assert_array_equal(batch["mask"], mask)
    # Arrays of another integer type are cast, within range.
    narrow = npz_inputs(npz_bytes(ids=ids.astype(np.int32), mask=mask.astype(np.uint8)), token_record(), 8)
    np.testing.assert_array_equal(narrow["ids"], ids)


def test_npz_body_for_one_input_takes_its_name_inputs_or_its_only_array() -> None:
    batch = digits()[0][:2]
    for archive in (npz_bytes(input=batch), npz_bytes(inputs=batch), npz_bytes(arr_0=batch)):
        np.testing.assert_array_equal(npz_inputs(archive, digits_record(), 8), batch)
    # Every array must be an input: a validation set's 'labels' is not one.
    with pytest.raises(InvalidInputError, match=r"holds \['labels'\]"):
        npz_inputs(npz_bytes(inputs=batch, labels=np.array([0, 1])), digits_record(), 8)


def test_npz_body_refusals() -> None:
    ids, mask = token_inputs(2)
    with pytest.raises(InvalidInputError, match=r"missing \['mask'\]"):
        npz_inputs(npz_bytes(ids=ids), token_record(), 8)
    with pytest.raises(InvalidInputError, match=r"holds \['other'\], which model 'tokens' does not take"):
        npz_inputs(npz_bytes(ids=ids, mask=mask, other=ids), token_record(), 8)
    with pytest.raises(InvalidInputError, match=r"not a readable \.npz archive"):
        npz_inputs(b"PK\x03\x04 not really a zip", token_record(), 8)
    with pytest.raises(InvalidInputError, match="must be integers"):
        npz_inputs(npz_bytes(ids=ids + 0.5, mask=mask), token_record(), 8)


def test_npz_member_larger_than_any_allowed_batch_is_refused_before_it_is_inflated() -> None:
    # 4 MB of zeros compresses to a few KB: its declared size gives it away.
    buffer = io.BytesIO()
    np.savez_compressed(buffer, input=np.zeros((8000, 1, 8, 8)))
    assert len(buffer.getvalue()) < 64 * 1024
    with pytest.raises(InvalidInputError, match=r"unpacked; a batch of at most 8"):
        npz_inputs(buffer.getvalue(), digits_record(), 8)


def test_npz_member_that_is_not_npy_data_is_refused() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("input.npy", b"plain text, not an array")
    with pytest.raises(InvalidInputError, match=r"\.npz array 'input' is not a readable \.npy array"):
        npz_inputs(buffer.getvalue(), digits_record(), 8)


def lying_npy(shape: tuple[int, ...]) -> bytes:
    """An .npy header declaring ``shape`` float64, followed by 8 bytes of data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + b"\x00" * 8


def test_an_npy_declaring_more_data_than_it_holds_is_refused_before_any_allocation() -> None:
    # 8 TB declared: numpy would try to allocate it all before reading a byte.
    with pytest.raises(InvalidInputError, match=r"body declares 8000000000000 bytes .* it holds 8"):
        npy_inputs(lying_npy((10**12,)), digits_record(), 8)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("input.npy", lying_npy((10**12,)))
    with pytest.raises(InvalidInputError, match=r"\.npz array 'input' declares 8000000000000 bytes"):
        npz_inputs(buffer.getvalue(), digits_record(), 8)


# --- content types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        (None, BodyKind.JSON),
        ("application/json", BodyKind.JSON),
        ("application/json; charset=utf-8", BodyKind.JSON),
        ("application/vnd.api+json", BodyKind.JSON),
        ("application/x-npy", BodyKind.NPY),
        ("application/x-npz", BodyKind.NPZ),
        ("application/zip", BodyKind.NPZ),
        ("image/jpeg", BodyKind.IMAGE),
        ("IMAGE/PNG", BodyKind.IMAGE),
    ],
)
def test_body_kind_from_the_content_type(content_type: str | None, kind: BodyKind) -> None:
    assert body_kind(content_type, b"") is kind


def test_octet_stream_is_recognised_by_its_first_bytes() -> None:
    stream = "application/octet-stream"
    assert body_kind(stream, png_bytes(picture())) is BodyKind.IMAGE
    assert body_kind(stream, jpeg_bytes(picture())) is BodyKind.IMAGE
    assert body_kind(stream, npy_bytes(np.zeros(2))) is BodyKind.NPY
    assert body_kind(stream, npz_bytes(a=np.zeros(2))) is BodyKind.NPZ
    with pytest.raises(UnsupportedMediaTypeError, match="none of them") as caught:
        body_kind(stream, b"GIF89a...")
    assert caught.value.status_code == 415


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x", "image/gif"])
def test_unknown_content_types_are_415(content_type: str) -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="is not accepted by online_query") as caught:
        body_kind(content_type, b"{}")
    assert caught.value.status_code == 415
    assert caught.value.code == "unsupported_media_type"
    assert "application/x-npy" in caught.value.details["accepted"]


# --- images -----------------------------------------------------------------------------------


def test_image_body_is_decoded_with_the_models_recipe() -> None:
    pixels = picture(9, 12)
    model = image_record(preprocessing=IMAGE_RECIPE)

    batch = image_inputs(png_bytes(pixels), model, 8)

    expected = decode_image(png_bytes(pixels), parse_recipe(IMAGE_RECIPE, IMAGE_SPEC))
    assert batch.shape == (1, 3, 4, 4) and batch.dtype == np.float32
    np.testing.assert_array_equal(batch, expected)
    np.testing.assert_array_equal(binary_inputs(BodyKind.IMAGE, png_bytes(pixels), model, 8), expected)
    assert image_inputs(jpeg_bytes(pixels), model, 8).shape == (1, 3, 4, 4)


def test_image_for_a_model_without_a_recipe_is_415_saying_so() -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="has no preprocessing recipe") as caught:
        image_inputs(png_bytes(picture()), image_record(preprocessing=None), 8)
    assert caught.value.status_code == 415


def test_image_for_a_model_of_several_inputs_is_refused() -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="takes 2 inputs"):
        image_inputs(png_bytes(picture()), token_record(preprocessing=IMAGE_RECIPE), 8)


def test_corrupt_image_is_400() -> None:
    broken = png_bytes(picture())[:40]
    with pytest.raises(InvalidInputError, match="not a decodable PNG or JPEG image"):
        image_inputs(broken, image_record(preprocessing=IMAGE_RECIPE), 8)
