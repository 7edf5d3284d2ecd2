"""Checks on names, model files, validation sets, query inputs and targets."""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelless.exceptions import InvalidInputError, InvalidModelError, PayloadTooLargeError
from modelless.types import ModelRecord
from modelless.validation import (
    ModelSignature,
    check_batch,
    check_name,
    check_targets,
    inspect_model,
    load_valset,
    query_inputs,
)
from tests.models import digits, hidden_model, linear_model, valset_npz

LIMIT = 10 * 1024 * 1024
DIGITS_SIGNATURE = ModelSignature("input", [1, 8, 8], "float32", 10)


# --- helpers ----------------------------------------------------------------------------------


def onnx_bytes(
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    nodes: Sequence[onnx.NodeProto],
) -> bytes:
    """A checked ONNX model from hand-written graph parts."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized


def tensor(name: str, shape: Sequence[int | str], elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def npz(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


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


UNPICKLED: list[str] = []


def _record_unpickle(tag: str) -> str:
    UNPICKLED.append(tag)
    return tag


class Canary:
    """Unpickling this object leaves a trace in UNPICKLED."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_record_unpickle, ("unpickled",))


# --- check_name -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "digits", "Digits-CNN_v2.1", "0model", "a" * 64])
def test_check_name_accepts(name: str) -> None:
    assert check_name("modelName", name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 65,
        "-leading-dash",
        ".hidden",
        "_under",
        "../escape",
        "a/b",
        "has space",
        "tab\t",
        "ok\n",
        "é",
    ],
)
def test_check_name_refuses(name: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_name("modelName", name)
    assert caught.value.status_code == 400
    assert caught.value.details == {"field": "modelName"}
    assert "modelName" in caught.value.message


# --- inspect_model ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", [linear_model, hidden_model])
def test_inspect_model_reads_the_signature(model: Any) -> None:
    assert inspect_model(model(), LIMIT) == DIGITS_SIGNATURE


def test_inspect_model_flat_input() -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 64])],
        [tensor("y", ["n", 64])],
        [helper.make_node("Relu", ["x"], ["y"])],
    )
    assert inspect_model(data, LIMIT) == ModelSignature("x", [64], "float32", 64)


@pytest.mark.parametrize(
    "data",
    [b"this is not an onnx model", b"\x00\x01\x02\x03", linear_model()[:50], bytes(range(256))],
    ids=["text", "binary", "truncated", "all-bytes"],
)
def test_inspect_model_refuses_corrupt_bytes(data: bytes) -> None:
    with pytest.raises(InvalidModelError) as caught:
        inspect_model(data, LIMIT)
    assert caught.value.status_code == 400
    assert "not a valid ONNX model" in caught.value.message


def test_inspect_model_refuses_a_protobuf_that_is_not_a_checked_model() -> None:
    # Parses as a ModelProto, but has no graph/opset: the checker refuses it.
    with pytest.raises(InvalidModelError, match="not a valid ONNX model"):
        inspect_model(onnx.ModelProto(ir_version=8).SerializeToString() + b"\x12\x00", LIMIT)


def test_inspect_model_refuses_empty() -> None:
    with pytest.raises(InvalidModelError, match="empty"):
        inspect_model(b"", LIMIT)


def test_inspect_model_refuses_oversized_before_parsing() -> None:
    data = linear_model()
    with pytest.raises(PayloadTooLargeError) as caught:
        inspect_model(data, len(data) - 1)
    assert caught.value.status_code == 413
    assert caught.value.details == {"limit": len(data) - 1}
    assert inspect_model(data, len(data)) == DIGITS_SIGNATURE  # the limit itself is allowed


def test_inspect_model_refuses_two_inputs() -> None:
    data = onnx_bytes(
        [tensor("a", ["n", 4]), tensor("b", ["n", 4])],
        [tensor("y", ["n", 4])],
        [helper.make_node("Add", ["a", "b"], ["y"])],
    )
    with pytest.raises(InvalidModelError, match="exactly one input and one output; it has 2 and 1"):
        inspect_model(data, LIMIT)


def test_inspect_model_refuses_two_outputs() -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 4])],
        [tensor("y", ["n", 4]), tensor("z", ["n", 4])],
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
    )
    with pytest.raises(InvalidModelError, match="it has 1 and 2"):
        inspect_model(data, LIMIT)


def test_inspect_model_refuses_an_int64_input() -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 4], TensorProto.INT64)],
        [tensor("y", ["n", 4])],
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
    )
    with pytest.raises(InvalidModelError, match="float32; it is INT64"):
        inspect_model(data, LIMIT)


@pytest.mark.parametrize(
    ("in_shape", "node", "out_shape"),
    [
        (["n", 1, 8, 8], helper.make_node("Identity", ["x"], ["y"]), ["n", 1, 8, 8]),
        (["n", 10], helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0), ["n"]),
        (["n", 10], helper.make_node("Identity", ["x"], ["y"]), ["n", "classes"]),
    ],
    ids=["rank-4", "rank-1", "symbolic-classes"],
)
def test_inspect_model_refuses_a_wrong_output_shape(
    in_shape: list[int | str], node: onnx.NodeProto, out_shape: list[int | str]
) -> None:
    data = onnx_bytes([tensor("x", in_shape)], [tensor("y", out_shape)], [node])
    with pytest.raises(InvalidModelError, match=r"output must be \[batch, classes\]"):
        inspect_model(data, LIMIT)


@pytest.mark.parametrize(
    "in_shape", [["n"], ["n", "features"], ["n", 0]], ids=["rank-1", "symbolic-dim", "zero-dim"]
)
def test_inspect_model_refuses_an_input_without_fixed_feature_dims(in_shape: list[int | str]) -> None:
    data = onnx_bytes(
        [tensor("x", in_shape)],
        [tensor("y", ["n", 10])],
        [helper.make_node("Identity", ["x"], ["y"])],
    )
    with pytest.raises(InvalidModelError, match=r"input must be \[batch, fixed dims"):
        inspect_model(data, LIMIT)


# --- load_valset ------------------------------------------------------------------------------


def test_load_valset_reads_inputs_and_labels() -> None:
    inputs, labels = load_valset(valset_npz(50), DIGITS_SIGNATURE, LIMIT)
    expected_inputs, expected_labels = digits()
    assert inputs.dtype == np.float32 and inputs.shape == (50, 1, 8, 8)
    assert labels.dtype == np.int64 and labels.shape == (50,)
    np.testing.assert_array_equal(inputs, expected_inputs[-50:])
    np.testing.assert_array_equal(labels, expected_labels[-50:])


def test_load_valset_accepts_integer_inputs_and_casts() -> None:
    inputs, labels = load_valset(
        npz(inputs=np.ones((3, 1, 8, 8), dtype=np.int32), labels=np.array([0, 1, 9], dtype=np.uint8)),
        DIGITS_SIGNATURE,
        LIMIT,
    )
    assert inputs.dtype == np.float32 and labels.dtype == np.int64
    assert labels.tolist() == [0, 1, 9]


def good_inputs(n: int = 4) -> np.ndarray:
    return np.zeros((n, 1, 8, 8), dtype=np.float32)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"inputs": good_inputs()}, r"lacks \['labels'\]"),
        ({"labels": np.zeros(4, dtype=np.int64)}, r"lacks \['inputs'\]"),
        ({"x": good_inputs(), "y": np.zeros(4, dtype=np.int64)}, r"lacks \['inputs', 'labels'\]"),
        ({"inputs": np.zeros((4, 64), np.float32), "labels": np.zeros(4, np.int64)}, r"shape \[4, 64\]"),
        ({"inputs": np.zeros((4, 1, 8, 9), np.float32), "labels": np.zeros(4, np.int64)}, r"\[N, 1, 8, 8\]"),
        ({"inputs": good_inputs(), "labels": np.zeros(3, np.int64)}, r"labels have shape \[3\]"),
        ({"inputs": good_inputs(), "labels": np.zeros((4, 1), np.int64)}, r"labels have shape \[4, 1\]"),
        ({"inputs": good_inputs(), "labels": np.array([0, 1, 2, 10])}, r"labels must lie in \[0, 10\)"),
        ({"inputs": good_inputs(), "labels": np.array([0, -1, 2, 3])}, r"labels must lie in \[0, 10\)"),
        ({"inputs": good_inputs(), "labels": np.array([0.0, 1.0, 2.0, 3.0])}, "labels integers"),
        ({"inputs": np.array(["a"] * 4), "labels": np.zeros(4, np.int64)}, "numeric"),
        ({"inputs": good_inputs(0), "labels": np.zeros(0, np.int64)}, "empty"),
    ],
    ids=[
        "no-labels",
        "no-inputs",
        "other-keys",
        "flat-inputs",
        "wrong-dim",
        "labels-short",
        "labels-2d",
        "label-too-big",
        "label-negative",
        "float-labels",
        "string-inputs",
        "empty",
    ],
)
def test_load_valset_refuses(arrays: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidModelError, match=message) as caught:
        load_valset(npz(**arrays), DIGITS_SIGNATURE, LIMIT)
    assert caught.value.status_code == 400


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_load_valset_refuses_non_finite_inputs(bad: float) -> None:
    inputs = good_inputs()
    inputs[2, 0, 3, 3] = bad
    with pytest.raises(InvalidModelError, match="NaN or infinity"):
        load_valset(npz(inputs=inputs, labels=np.zeros(4, np.int64)), DIGITS_SIGNATURE, LIMIT)


@pytest.mark.parametrize(
    "data",
    [b"definitely not an npz", b"", b"PK\x03\x04 truncated zip"],
    ids=["text", "empty-bytes", "truncated-zip"],
)
def test_load_valset_refuses_unreadable_bytes(data: bytes) -> None:
    with pytest.raises(InvalidModelError, match="validation set"):
        load_valset(data, DIGITS_SIGNATURE, LIMIT)


def test_load_valset_refuses_a_zip_with_a_truncated_npy_member() -> None:
    member = io.BytesIO()
    np.save(member, good_inputs())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("inputs.npy", member.getvalue()[:100])  # header intact, data cut short
        archive.writestr("labels.npy", member.getvalue()[:100])
    with pytest.raises(InvalidModelError, match=r"not a readable \.npz"):
        load_valset(buffer.getvalue(), DIGITS_SIGNATURE, LIMIT)


def test_load_valset_refuses_a_zip_whose_members_are_not_npy() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("inputs.npy", b"garbage")
        archive.writestr("labels.npy", b"garbage")
    with pytest.raises(InvalidModelError):
        load_valset(buffer.getvalue(), DIGITS_SIGNATURE, LIMIT)


def test_load_valset_refuses_oversized() -> None:
    data = valset_npz(50)
    with pytest.raises(PayloadTooLargeError) as caught:
        load_valset(data, DIGITS_SIGNATURE, len(data) - 1)
    assert caught.value.status_code == 413


@pytest.mark.parametrize("member", ["inputs", "labels"])
def test_load_valset_refuses_pickled_object_arrays_without_unpickling(member: str) -> None:
    UNPICKLED.clear()
    arrays: dict[str, np.ndarray] = {"inputs": good_inputs(1), "labels": np.zeros(1, np.int64)}
    arrays[member] = np.array([Canary()], dtype=object)
    data = npz(**arrays)
    # The archive really holds a pickle that would leave a trace if loaded unsafely:
    with np.load(io.BytesIO(data), allow_pickle=True) as archive:
        archive[member]
    assert UNPICKLED == ["unpickled"]
    UNPICKLED.clear()

    with pytest.raises(InvalidModelError, match=r"not a readable \.npz"):
        load_valset(data, DIGITS_SIGNATURE, LIMIT)
    assert UNPICKLED == []


def test_load_valset_refuses_a_raw_pickle_without_unpickling() -> None:
    UNPICKLED.clear()
    data = pickle.dumps({"inputs": Canary(), "labels": Canary()})
    with pytest.raises(InvalidModelError):
        load_valset(data, DIGITS_SIGNATURE, LIMIT)
    assert UNPICKLED == []


def test_load_valset_refuses_a_plain_npy_file() -> None:
    buffer = io.BytesIO()
    np.save(buffer, good_inputs())
    with pytest.raises(InvalidModelError, match=r"\.npz"):
        load_valset(buffer.getvalue(), DIGITS_SIGNATURE, LIMIT)


def test_load_valset_refuses_scalar_inputs() -> None:
    data = npz(inputs=np.float32(1.0), labels=np.array([1]))
    with pytest.raises(InvalidModelError):
        load_valset(data, DIGITS_SIGNATURE, LIMIT)


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


# --- check_targets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("latency", "accuracy"), [(None, None), (0.001, None), (5.0, 0.0), (None, 1.0), (1e6, 0.5)]
)
def test_check_targets_accepts(latency: float | None, accuracy: float | None) -> None:
    check_targets(latency, accuracy)


@pytest.mark.parametrize(
    ("latency", "accuracy", "message"),
    [
        (0.0, None, "latency"),
        (-1.0, None, "latency"),
        (math.inf, None, "latency"),
        (math.nan, None, "latency"),
        (None, 1.01, "accuracy"),
        (None, -0.1, "accuracy"),
        (None, math.nan, "accuracy"),
        (None, math.inf, "accuracy"),
    ],
)
def test_check_targets_refuses(latency: float | None, accuracy: float | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as caught:
        check_targets(latency, accuracy)
    assert caught.value.status_code == 400
