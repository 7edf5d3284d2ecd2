"""Checks on names, model files, validation sets and targets (query inputs: test_inputs.py)."""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelless.exceptions import InvalidInputError, InvalidModelError, PayloadTooLargeError
from modelless.types import TensorSpec
from modelless.validation import (
    ModelSignature,
    check_name,
    check_targets,
    inspect_model,
    load_valset,
    read_valset,
)
from tests.models import digits, hidden_model, linear_model, valset_npz

LIMIT = 10 * 1024 * 1024
DIGITS_SIGNATURE = ModelSignature((TensorSpec("input", [1, 8, 8], "float32"),), 10)


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
    assert inspect_model(data, LIMIT) == ModelSignature((TensorSpec("x", [64], "float32"),), 64)


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
    assert caught.value.details == {"limit": len(data) - 1, "setting": "MODELLESS_MAX_MODEL_BYTES"}
    assert f"model file exceeds {len(data) - 1} bytes (MODELLESS_MAX_MODEL_BYTES)" in caught.value.message
    assert inspect_model(data, len(data)) == DIGITS_SIGNATURE  # the limit itself is allowed


def test_inspect_model_reads_every_input_with_its_dtype() -> None:
    data = onnx_bytes(
        [tensor("ids", ["n", 6], TensorProto.INT64), tensor("mask", ["n", 6], TensorProto.INT32)],
        [tensor("y", ["n", 6])],
        [
            helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["ids_f", "mask_f"], ["y"]),
        ],
    )
    signature = inspect_model(data, LIMIT)
    assert signature.inputs == (TensorSpec("ids", [6], "int64"), TensorSpec("mask", [6], "int32"))
    assert (signature.num_classes, signature.input_name, signature.input_dtype) == (6, "ids", "int64")


def test_inspect_model_reads_a_float16_input() -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 4], TensorProto.FLOAT16)],
        [tensor("y", ["n", 4])],
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
    )
    assert inspect_model(data, LIMIT).inputs == (TensorSpec("x", [4], "float16"),)


def test_inspect_model_refuses_two_outputs() -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 4])],
        [tensor("y", ["n", 4]), tensor("z", ["n", 4])],
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
    )
    with pytest.raises(InvalidModelError, match=r"exactly one output .*it has 1 inputs and 2 outputs"):
        inspect_model(data, LIMIT)


@pytest.mark.parametrize(("elem_type", "name"), [(TensorProto.BOOL, "BOOL"), (TensorProto.DOUBLE, "DOUBLE")])
def test_inspect_model_refuses_an_input_of_another_type(elem_type: int, name: str) -> None:
    data = onnx_bytes(
        [tensor("x", ["n", 4], elem_type)],
        [tensor("y", ["n", 4])],
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
    )
    with pytest.raises(InvalidModelError, match=f"'x' is {name}; inputs must be float32, float16, int64"):
        inspect_model(data, LIMIT)


def test_inspect_model_refuses_a_batch_fixed_on_some_inputs_only() -> None:
    data = onnx_bytes(
        [tensor("a", [1, 4]), tensor("b", ["n", 4])],
        [tensor("y", ["n", 4])],
        [helper.make_node("Add", ["a", "b"], ["y"])],
    )
    with pytest.raises(
        InvalidModelError, match="'a' fixes the batch dimension at 1; re-export with dynamic_axes"
    ):
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
    with pytest.raises(InvalidModelError, match=r"'x' must be \[batch, fixed dims"):
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
        ({"inputs": good_inputs(), "labels": np.array([0.0, 1.0, 2.0, 3.0])}, "labels must be integers"),
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


def test_a_deflated_valset_past_its_unpacked_limit_is_413_naming_the_setting_before_inflating() -> None:
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer, inputs=np.zeros((40_000, 1, 8, 8), np.float32), labels=np.zeros(40_000, np.int64)
    )
    data = buffer.getvalue()  # ~10 MB of arrays in ~30 KB
    assert len(data) < 100_000

    with pytest.raises(PayloadTooLargeError) as refused:
        load_valset(data, DIGITS_SIGNATURE, 200_000)  # unpacked: 4 x 200 KB by default

    assert refused.value.details == {"limit": 800_000, "setting": "MODELLESS_MAX_VALSET_UNPACKED_BYTES"}
    assert "validation array 'inputs' is 10240128 bytes unpacked" in refused.value.message
    # The limit is the caller's to set: the same set within a larger one is read.
    inputs, labels = load_valset(data, DIGITS_SIGNATURE, 200_000, max_unpacked_bytes=11_000_000)
    assert inputs.shape == (40_000, 1, 8, 8) and labels.shape == (40_000,)


def test_the_unpacked_limit_counts_every_array_of_the_set() -> None:
    data = npz(inputs=np.zeros((1000, 1, 8, 8), np.float32), labels=np.zeros(1000, np.int64))
    with pytest.raises(PayloadTooLargeError, match="validation array 'labels'"):
        load_valset(data, DIGITS_SIGNATURE, LIMIT, max_unpacked_bytes=256_000 + 4_000)  # inputs fit


def test_a_valset_array_whose_header_lies_is_refused_before_anything_is_allocated() -> None:
    header = io.BytesIO()
    # 8 TB declared; numpy's loader would try to allocate all of it before reading a byte.
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 1, 8, 8)}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("inputs.npy", header.getvalue() + b"\0" * 64)
        archive.writestr("labels.npy", npy_of(np.zeros(1, np.int64)))
    with pytest.raises(PayloadTooLargeError, match=r"declares 256000000000000 bytes of array data"):
        load_valset(buffer.getvalue(), DIGITS_SIGNATURE, LIMIT)


def test_a_valset_whose_zip_directory_lists_too_much_is_refused_unread() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index in range(2000):
            archive.writestr(f"padding-{index:06d}.npy", b"")
    with pytest.raises(InvalidModelError, match="bytes of members in its directory"):
        load_valset(buffer.getvalue(), DIGITS_SIGNATURE, LIMIT)


def npy_of(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


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


# --- validation sets of models with several inputs, or other dtypes ---------------------------

TWO_INPUTS = ModelSignature((TensorSpec("ids", [6], "int64"), TensorSpec("mask", [6], "int32")), 3)


def token_arrays(n: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "ids": rng.integers(0, 50, (n, 6)),
        "mask": np.ones((n, 6), dtype=np.int64),
        "labels": np.arange(n) % 3,
    }


def test_load_valset_of_two_inputs_gives_a_structured_batch_in_their_dtypes() -> None:
    arrays = token_arrays()
    batch, labels = load_valset(npz(**arrays), TWO_INPUTS, LIMIT)

    assert batch.dtype.names == ("ids", "mask") and batch.shape == (4,)
    assert batch["ids"].dtype == np.int64 and batch["mask"].dtype == np.int32
    np.testing.assert_array_equal(batch["ids"], arrays["ids"])
    np.testing.assert_array_equal(batch["mask"], arrays["mask"])
    assert labels.tolist() == [0, 1, 2, 0]


def test_valset_of_one_input_may_name_it() -> None:
    inputs, labels = load_valset(
        npz(input=good_inputs(), labels=np.zeros(4, np.int64)), DIGITS_SIGNATURE, LIMIT
    )
    assert inputs.shape == (4, 1, 8, 8) and labels.shape == (4,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask": None}, r"lacks \['mask'\]"),
        ({"ids": np.full((4, 6), 1.5)}, r"'ids' must be integers \(int64 for input 'ids'\); got float64"),
        ({"mask": np.ones((4, 7), np.int64)}, r"'mask' has shape \[4, 7\]; input 'mask' takes \[N, 6\]"),
        ({"mask": np.ones((3, 6), np.int64)}, "different numbers of examples"),
        ({"mask": np.full((4, 6), 2**40)}, "beyond int32's range"),
        ({"labels": np.array([0, 1, 2, 3])}, r"labels must lie in \[0, 3\)"),
    ],
    ids=["missing-input", "float-token-ids", "wrong-shape", "row-counts", "overflow", "label-range"],
)
def test_load_valset_of_two_inputs_refuses(change: dict[str, Any], message: str) -> None:
    arrays = {**token_arrays(), **change}
    data = npz(**{name: array for name, array in arrays.items() if array is not None})
    with pytest.raises(InvalidModelError, match=message):
        load_valset(data, TWO_INPUTS, LIMIT)


def test_load_valset_refuses_values_a_float16_input_cannot_hold() -> None:
    signature = ModelSignature((TensorSpec("x", [2], "float16"),), 2)
    ok, _ = load_valset(npz(inputs=np.ones((2, 2)), labels=np.array([0, 1])), signature, LIMIT)
    assert ok.dtype == np.float16
    with pytest.raises(InvalidModelError, match="beyond float16's range"):
        load_valset(npz(inputs=np.full((2, 2), 1e6), labels=np.array([0, 1])), signature, LIMIT)


def test_a_valset_is_rewritten_in_its_canonical_form_only_when_it_is_not_in_it(tmp_path: Path) -> None:
    canonical = read_valset(valset_npz(20), DIGITS_SIGNATURE, LIMIT)
    named = read_valset(npz(input=good_inputs(), labels=np.zeros(4, np.int64)), DIGITS_SIGNATURE, LIMIT)
    tokens = read_valset(npz(**token_arrays()), TWO_INPUTS, LIMIT)  # mask sent as int64, not int32
    assert canonical.canonical and not named.canonical and not tokens.canonical

    tokens.save(tmp_path / "tokens.npz", TWO_INPUTS)
    again = read_valset(tmp_path / "tokens.npz", TWO_INPUTS, LIMIT)
    assert again.canonical
    with np.load(tmp_path / "tokens.npz") as saved:
        assert sorted(saved.files) == ["ids", "labels", "mask"] and saved["mask"].dtype == np.int32


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
