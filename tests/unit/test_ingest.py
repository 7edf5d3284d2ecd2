"""modelless.registration.ingest: what exporters produce (external data, archives, fixed batch dimensions,
integer and several inputs) made into one self-contained, test-run ONNX file, or refused with
what to send instead. Tiny hand-built models; onnxruntime runs them for real."""

from __future__ import annotations

import io
import tarfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelless.exceptions import InvalidInputError, InvalidModelError, PayloadTooLargeError
from modelless.registration.ingest import (
    IN_PROCESS_MAX_BYTES,
    MAX_ARCHIVE_MEMBERS,
    IngestedModel,
    IngestRequest,
    Limits,
    S3Uri,
    detect_format,
    fix_batch_dimension,
    ingest,
    ingest_in_child,
    needs_child,
    trial_run,
    unpack,
)
from modelless.types import TensorSpec
from modelless.validation import ModelSignature, load_model

LIMITS = Limits(64 * 1024 * 1024, 16 * 1024 * 1024)
CLASSES = 3


# --- tiny models ------------------------------------------------------------------------------


def make_model(
    inputs: Sequence[onnx.ValueInfoProto],
    output: onnx.ValueInfoProto,
    nodes: Sequence[onnx.NodeProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), [output], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def linear(batch: int | str = "batch", features: int = 8) -> onnx.ModelProto:
    """x [batch, features] @ w [features, 3]: its weight is big enough to be kept outside."""
    weights = np.random.default_rng(0).normal(size=(features, CLASSES)).astype(np.float32)
    return make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES]),
        [helper.make_node("MatMul", ["x", "w"], ["logits"])],
        [numpy_helper.from_array(weights, "w")],
    )


def baked_batch_of_one() -> onnx.ModelProto:
    """A fixed-batch export whose Reshape bakes the batch size (1) into a constant."""
    weights = np.ones((8, CLASSES), np.float32)
    return make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES]),
        [
            helper.make_node("Reshape", ["x", "shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        [numpy_helper.from_array(np.array([1, 8], np.int64), "shape"), numpy_helper.from_array(weights, "w")],
    )


def token_classifier(vocabulary: int = 20, length: int = 6) -> onnx.ModelProto:
    """A BERT-shaped toy: int64 token ids and an int64 attention mask, [batch, classes] out."""
    table = np.random.default_rng(1).normal(size=(vocabulary, CLASSES)).astype(np.float32)
    return make_model(
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", length]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", length]),
        ],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
        [
            helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),  # [b, len, 3]
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"]),
            helper.make_node("Mul", ["embedded", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis1"], ["logits"], keepdims=0),
        ],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        ],
    )


def half_input() -> onnx.ModelProto:
    weights = np.ones((4, CLASSES), np.float32)
    return make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
        [
            helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["x32", "w"], ["logits"]),
        ],
        [numpy_helper.from_array(weights, "w")],
    )


def save(model: onnx.ModelProto, path: Path, external: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if external is None:
        onnx.save_model(model, str(path))
    else:
        onnx.save_model(model, str(path), save_as_external_data=True, location=external, size_threshold=0)
    return path


def valset(path: Path, rows: int = 6, **arrays: np.ndarray) -> Path:
    if not arrays:
        arrays = {"inputs": np.random.default_rng(2).random((rows, 8)).astype(np.float32)}
    save_arrays: Any = np.savez  # typed with keyword arguments that member names are not
    save_arrays(path, labels=np.arange(rows) % CLASSES, **arrays)
    return path


def request(tmp_path: Path, model: Path, val: Path | None = None, **kwargs: object) -> IngestRequest:
    return IngestRequest(model, val or valset(tmp_path / "val.npz"), tmp_path / "work", LIMITS, **kwargs)  # type: ignore[arg-type]


def outputs_of(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, feeds)[0]
    return result


# --- a model as it is: kept byte for byte ------------------------------------------------------


def test_a_self_contained_dynamic_model_is_kept_as_it_is(tmp_path: Path) -> None:
    source = save(linear(), tmp_path / "m.onnx")

    ingested = ingest(request(tmp_path, source))

    assert ingested.model == source  # no rewrite: the upload itself is stored
    assert ingested.signature.inputs == (TensorSpec("x", [8], "float32"),)
    assert (ingested.signature.num_classes, ingested.examples, ingested.tested) == (CLASSES, 6, True)
    assert ingested.notes == ()


# --- external data -------------------------------------------------------------------------------


def test_a_bare_onnx_whose_external_data_is_missing_says_what_to_send(tmp_path: Path) -> None:
    source = save(linear(), tmp_path / "export" / "m.onnx", external="m.onnx.data")
    (tmp_path / "export" / "m.onnx.data").unlink()

    with pytest.raises(InvalidModelError) as refused:
        ingest(request(tmp_path, source))

    message = refused.value.message
    assert "external data ('m.onnx.data') that was not sent" in message
    assert "zip or tar" in message and "'modelData'" in message and "--model-data m.onnx.data" in message
    assert refused.value.details["missing"] == ["m.onnx.data"]


def test_external_data_sent_as_model_data_is_merged_into_one_file(tmp_path: Path) -> None:
    export = tmp_path / "export"
    source = save(linear(), export / "m.onnx", external="m.onnx.data")
    uploaded_data = (export / "m.onnx.data").rename(tmp_path / "upload-part")  # named as uploads are

    ingested = ingest(request(tmp_path, source, model_data=uploaded_data))

    assert ingested.model == tmp_path / "work" / "model.onnx"
    merged = onnx.load(str(ingested.model), load_external_data=False)
    assert all(t.data_location == TensorProto.DEFAULT for t in merged.graph.initializer)
    assert any("merged into one self-contained file" in note for note in ingested.notes)
    x = np.ones((2, 8), np.float32)
    expected = x @ numpy_helper.to_array(linear().graph.initializer[0])
    np.testing.assert_allclose(outputs_of(ingested.model, {"x": x}), expected, rtol=1e-5)


def test_model_data_for_a_model_without_external_data_is_refused(tmp_path: Path) -> None:
    source = save(linear(), tmp_path / "m.onnx")
    stray = tmp_path / "stray"
    stray.write_bytes(b"\0" * 96)
    with pytest.raises(InvalidModelError, match="references no external data"):
        ingest(request(tmp_path, source, model_data=stray))


def archive_of(kind: str, folder: Path, target: Path) -> Path:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if kind == "zip":
        with zipfile.ZipFile(target, "w") as bundle:
            for path in files:
                bundle.write(path, f"export/{path.relative_to(folder)}")
    else:
        with tarfile.open(target, "w:gz" if kind == "tar.gz" else "w") as bundle:
            for path in files:
                bundle.add(path, f"export/{path.relative_to(folder)}")
    return target


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz"])
def test_an_archive_with_the_onnx_and_its_data_is_unpacked_and_merged(tmp_path: Path, kind: str) -> None:
    export = tmp_path / "export"
    (export / "weights").mkdir(parents=True)
    save(linear(batch=1), export / "m.onnx", external="weights/m.onnx.data")
    bundle = archive_of(kind, export, tmp_path / f"model.{kind}")
    assert detect_format(bundle) == ("zip" if kind == "zip" else "tar")

    ingested = ingest(request(tmp_path, bundle))

    assert ingested.tested
    notes = " / ".join(ingested.notes)
    assert "unpacked m.onnx" in notes and "external data ['weights/m.onnx.data'] merged" in notes
    assert "fixed at 1 was made dynamic" in notes
    assert outputs_of(ingested.model, {"x": np.ones((3, 8), np.float32)}).shape == (3, CLASSES)


def test_an_archive_without_the_data_its_model_names_is_refused(tmp_path: Path) -> None:
    export = tmp_path / "export"
    save(linear(), export / "m.onnx", external="m.onnx.data")
    (export / "m.onnx.data").unlink()
    bundle = archive_of("zip", export, tmp_path / "model.zip")

    with pytest.raises(InvalidModelError, match=r"external data \('m.onnx.data'\) that was not sent"):
        ingest(request(tmp_path, bundle))


def test_an_archive_must_hold_exactly_one_onnx_file(tmp_path: Path) -> None:
    export = tmp_path / "export"
    save(linear(), export / "a.onnx")
    save(linear(), export / "b.onnx")
    with pytest.raises(InvalidModelError, match=r"exactly one .onnx file .*2 .onnx files"):
        ingest(request(tmp_path, archive_of("zip", export, tmp_path / "two.zip")))


def test_an_archive_member_outside_the_archive_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "evil.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("../../escaped.onnx", linear().SerializeToString())
    with pytest.raises(InvalidModelError, match="a path outside the archive"):
        unpack(bundle, tmp_path / "out", LIMITS.model_bytes)
    assert not (tmp_path.parent / "escaped.onnx").exists()


def test_a_tar_link_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "links.tar"
    with tarfile.open(bundle, "w") as archive:
        link = tarfile.TarInfo("export/m.onnx.data")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        archive.addfile(link)
    with pytest.raises(InvalidModelError, match="not a regular file"):
        unpack(bundle, tmp_path / "out", LIMITS.model_bytes)


def test_an_archive_that_unpacks_past_the_limit_is_413_naming_the_setting(tmp_path: Path) -> None:
    bundle = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bundle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("export/m.onnx.data", b"\0" * 4_000_000)  # a few KB compressed
    assert bundle.stat().st_size < 100_000
    with pytest.raises(PayloadTooLargeError) as refused:
        unpack(bundle, tmp_path / "out", 1_000_000)
    assert "exceeds 1000000 bytes (MODELLESS_MAX_MODEL_BYTES)" in refused.value.message


def test_a_zip_that_declares_more_than_the_limit_is_refused_before_anything_is_extracted(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bundle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("export/m.onnx", b"\0" * 10)
        archive.writestr("export/m.onnx.data", b"\0" * 4_000_000)
    with pytest.raises(PayloadTooLargeError, match=r"contents exceeds 1000000 bytes .* it is 4000010 bytes"):
        unpack(bundle, tmp_path / "out", 1_000_000)
    assert not any(p.is_file() for p in (tmp_path / "out").rglob("*"))  # nothing was written


def test_an_archive_of_too_many_files_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "many.tar.gz"
    with tarfile.open(bundle, "w:gz") as archive:
        for index in range(MAX_ARCHIVE_MEMBERS + 1):
            archive.addfile(tarfile.TarInfo(f"export/{index}.bin"), io.BytesIO(b""))
    with pytest.raises(InvalidModelError, match=f"more than {MAX_ARCHIVE_MEMBERS} files"):
        unpack(bundle, tmp_path / "out", LIMITS.model_bytes)


def test_a_zip_whose_directory_lists_too_much_is_refused_before_it_is_read(tmp_path: Path) -> None:
    bundle = tmp_path / "listed.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        for index in range(40_000):  # ~4.5 MB of directory entries, no data
            archive.writestr(f"export/{index:08d}-{'x' * 40}.bin", b"")
    with pytest.raises(InvalidModelError, match="bytes of members in its directory"):
        unpack(bundle, tmp_path / "out", LIMITS.model_bytes)


# --- the batch dimension ------------------------------------------------------------------------


def test_a_batch_fixed_on_every_input_and_output_is_made_dynamic(tmp_path: Path) -> None:
    source = save(linear(batch=1), tmp_path / "m.onnx")

    ingested = ingest(request(tmp_path, source))

    model = onnx.load(str(ingested.model))
    dims = [v.type.tensor_type.shape.dim[0] for v in [*model.graph.input, *model.graph.output]]
    assert all(d.dim_param == "batch" and not d.HasField("dim_value") for d in dims)
    assert ingested.notes == ("the batch dimension every input and output fixed at 1 was made dynamic",)
    assert outputs_of(ingested.model, {"x": np.ones((5, 8), np.float32)}).shape == (5, CLASSES)


def test_a_batch_fixed_on_some_inputs_only_is_left_alone() -> None:
    model = make_model(
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3]),
        ],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
        [helper.make_node("Add", ["a", "b"], ["y"])],
    )
    assert fix_batch_dimension(model) is None
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_a_graph_that_bakes_in_the_batch_size_is_refused_with_how_to_re_export(tmp_path: Path) -> None:
    source = save(baked_batch_of_one(), tmp_path / "m.onnx")
    val = valset(tmp_path / "val.npz", inputs=np.zeros((6, 2, 4), np.float32))

    with pytest.raises(InvalidModelError) as refused:
        ingest(request(tmp_path, source, val))

    message = refused.value.message
    assert message.startswith("the graph fixes the batch size at 1 (onnxruntime at batch 2:")
    assert "re-export with dynamic_axes={'x': {0: 'batch'}} or dynamic_shapes" in message


def test_a_model_that_loads_but_cannot_run_is_refused(tmp_path: Path) -> None:
    # Declares [batch, 8] but reshapes to 5 columns: checked fine, fails on any input.
    model = make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("MatMul", ["r", "w"], ["logits"]),
        ],
        [
            numpy_helper.from_array(np.array([-1, 5], np.int64), "shape"),
            numpy_helper.from_array(np.ones((5, CLASSES), np.float32), "w"),
        ],
    )
    with pytest.raises(InvalidModelError, match="does not run on the first validation example"):
        ingest(request(tmp_path, save(model, tmp_path / "m.onnx")))


def test_a_model_that_runs_on_synthetic_inputs_but_not_on_its_validation_set_is_refused(
    tmp_path: Path,
) -> None:
    # Its embedding table holds 2 tokens: the ids 0 and 1 of a synthetic batch run, the
    # validation set's (up to 19) do not. onnx's checker cannot know; only a run on real rows can.
    source = save(token_classifier(vocabulary=2), tmp_path / "m.onnx")
    rng = np.random.default_rng(5)
    val = valset(
        tmp_path / "val.npz", input_ids=rng.integers(2, 20, (6, 6)), attention_mask=np.ones((6, 6), np.int64)
    )

    with pytest.raises(InvalidModelError) as refused:
        ingest(request(tmp_path, source, val))

    message = refused.value.message
    assert message.startswith("the model loads but does not run on the first validation example:")
    assert "Gather" in message or "indices" in message


def endless_loop() -> onnx.ModelProto:
    """x [batch, 4] through a Loop of 10**15 iterations (its body passes x on), then @ w."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["v_in"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
        ],
    )
    return make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
        [
            helper.make_node("Loop", ["trips", "go", "x"], ["v"], body=body),
            helper.make_node("MatMul", ["v", "w"], ["logits"]),
        ],
        [
            numpy_helper.from_array(np.array(10**15, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "go"),
            numpy_helper.from_array(np.ones((4, CLASSES), np.float32), "w"),
        ],
    )


def test_a_test_run_that_does_not_end_is_stopped_and_refused(tmp_path: Path) -> None:
    source = save(endless_loop(), tmp_path / "m.onnx")
    signature = ModelSignature((TensorSpec("x", [4], "float32"),), CLASSES)
    started = time.monotonic()

    with pytest.raises(
        InvalidModelError, match=r"test run on 1 validation example\(s\) took longer than 0.5 s"
    ):
        trial_run(source, signature, np.ones((3, 4), np.float32), timeout_s=0.5)

    assert time.monotonic() - started < 30  # stopped, not run to its end (which never comes)


def memory_hog(columns: int) -> onnx.ModelProto:
    """x [batch, 1] tiled to [batch, columns] floats (4 * columns bytes a row), summed, @ w."""
    return make_model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES]),
        [
            helper.make_node("Tile", ["x", "repeats"], ["wide"]),
            helper.make_node("ReduceSum", ["wide", "axis1"], ["sum"], keepdims=1),
            helper.make_node("MatMul", ["sum", "w"], ["logits"]),
        ],
        [
            numpy_helper.from_array(np.array([1, columns], np.int64), "repeats"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.ones((1, CLASSES), np.float32), "w"),
        ],
    )


def test_a_test_run_past_the_childs_memory_is_refused_not_granted(tmp_path: Path) -> None:
    # 1 GiB for one row: past the 768 MiB allowance by itself, whatever the child's own address
    # space (with 512 MiB a row, batch 1 sometimes fit beside it and batch 2 was refused instead).
    source = save(memory_hog(columns=2**28), tmp_path / "m.onnx")
    val = valset(tmp_path / "val.npz", rows=2, inputs=np.ones((2, 1), np.float32))
    limits = Limits(LIMITS.model_bytes, LIMITS.valset_bytes, memory_bytes=768 * 1024 * 1024)

    with pytest.raises(InvalidModelError) as refused:
        ingest_in_child(IngestRequest(source, val, tmp_path / "work", limits))

    assert "does not run on the first validation example" in refused.value.message
    # The same model within a larger allowance runs: the refusal was the limit's doing.
    roomy = Limits(LIMITS.model_bytes, LIMITS.valset_bytes, memory_bytes=5 * 1024**3)
    assert ingest_in_child(IngestRequest(source, val, tmp_path / "roomy", roomy)).tested


def test_every_model_that_is_test_run_is_ingested_in_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = request(tmp_path, save(linear(), tmp_path / "m.onnx"))
    assert needs_child(small)
    monkeypatch.setattr("modelless.registration.ingest.onnxruntime_available", lambda: False)
    assert not needs_child(small)  # only parsed and checked: small enough for this process


def test_a_validation_set_that_unpacks_large_is_ingested_in_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("modelless.registration.ingest.onnxruntime_available", lambda: False)
    val = tmp_path / "val.npz"
    np.savez_compressed(val, inputs=np.zeros((600_000, 8), np.float32), labels=np.zeros(600_000, np.int64))
    assert val.stat().st_size < IN_PROCESS_MAX_BYTES  # a small file...
    assert needs_child(request(tmp_path, save(linear(), tmp_path / "m.onnx"), val))  # ...unpacking large


def test_without_onnxruntime_the_test_run_is_left_to_the_registrar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("modelless.registration.ingest.onnxruntime_available", lambda: False)
    source = save(baked_batch_of_one(), tmp_path / "m.onnx")
    val = valset(tmp_path / "val.npz", inputs=np.zeros((6, 2, 4), np.float32))

    ingested = ingest(request(tmp_path, source, val))  # accepted here; the registrar refuses it

    assert not ingested.tested


# --- inputs of other dtypes, and several ----------------------------------------------------------


def test_two_int64_inputs_are_read_tested_and_their_valset_kept(tmp_path: Path) -> None:
    source = save(token_classifier(), tmp_path / "m.onnx")
    rng = np.random.default_rng(3)
    val = valset(
        tmp_path / "val.npz",
        input_ids=rng.integers(0, 20, (6, 6)),
        attention_mask=np.ones((6, 6), np.int64),
    )

    ingested = ingest(request(tmp_path, source, val))

    assert ingested.signature.inputs == (
        TensorSpec("input_ids", [6], "int64"),
        TensorSpec("attention_mask", [6], "int64"),
    )
    assert ingested.tested and ingested.valset == val  # already canonical: stored as sent


def test_a_float16_input_is_test_run_and_its_valset_cast(tmp_path: Path) -> None:
    source = save(half_input(), tmp_path / "m.onnx")
    val = valset(tmp_path / "val.npz", inputs=np.random.default_rng(4).random((6, 4)))  # float64

    ingested = ingest(request(tmp_path, source, val))

    assert ingested.signature.inputs == (TensorSpec("x", [4], "float16"),)
    assert ingested.valset == tmp_path / "work" / "valset.npz"  # rewritten in float16
    with np.load(ingested.valset) as stored:
        assert stored["inputs"].dtype == np.float16 and sorted(stored.files) == ["inputs", "labels"]


def test_a_valset_that_does_not_fit_the_model_is_refused(tmp_path: Path) -> None:
    source = save(token_classifier(), tmp_path / "m.onnx")
    val = valset(tmp_path / "val.npz", input_ids=np.zeros((6, 6), np.int64))
    with pytest.raises(InvalidModelError, match=r"lacks \['attention_mask'\]"):
        ingest(request(tmp_path, source, val))


# --- limits, and a child process for large models -------------------------------------------------


def test_a_model_over_the_limit_is_413_naming_the_setting(tmp_path: Path) -> None:
    source = save(linear(), tmp_path / "m.onnx")
    small = IngestRequest(source, valset(tmp_path / "v.npz"), tmp_path / "w", Limits(100, 10_000))
    with pytest.raises(PayloadTooLargeError) as refused:
        ingest(small)
    assert refused.value.message.startswith("model file exceeds 100 bytes (MODELLESS_MAX_MODEL_BYTES)")
    assert refused.value.details == {"limit": 100, "setting": "MODELLESS_MAX_MODEL_BYTES"}


def test_ingesting_in_a_child_process_gives_the_same_answer_and_the_same_errors(tmp_path: Path) -> None:
    source = save(linear(batch=1), tmp_path / "m.onnx")
    here = ingest(IngestRequest(source, valset(tmp_path / "v.npz"), tmp_path / "here", LIMITS))
    there = ingest_in_child(IngestRequest(source, tmp_path / "v.npz", tmp_path / "there", LIMITS))

    assert isinstance(there, IngestedModel)
    assert (there.signature, there.notes, there.tested) == (here.signature, here.notes, here.tested)
    assert there.model == tmp_path / "there" / "model.onnx" and there.model.is_file()

    baked = save(baked_batch_of_one(), tmp_path / "baked.onnx")
    val = valset(tmp_path / "v3.npz", inputs=np.zeros((6, 2, 4), np.float32))
    with pytest.raises(InvalidModelError, match="the graph fixes the batch size at 1"):
        ingest_in_child(IngestRequest(baked, val, tmp_path / "baked-work", LIMITS))


def test_a_corrupt_model_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(b"not a model" * 10)
    with pytest.raises(InvalidModelError, match="not a valid ONNX model"):
        ingest(request(tmp_path, source))
    assert load_model(save(linear(), tmp_path / "ok.onnx")).graph.input[0].name == "x"


# --- s3:// URIs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("https://bucket/model.onnx", "must be an s3://bucket/key URI"),
        ("s3://", "does not name a valid bucket"),
        ("s3://Bad_Bucket/m.onnx", "does not name a valid bucket"),
        ("s3://bucket", "names no object"),
        ("s3://bucket/models/", "names no object"),
    ],
)
def test_s3_uris_are_checked(uri: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as refused:
        S3Uri.parse(uri, "modelUri")
    assert refused.value.details == {"field": "modelUri"}


def test_s3_uri_parts() -> None:
    uri = S3Uri.parse("s3://models-1/exports/bert.onnx", "modelUri")
    assert (uri.bucket, uri.key, str(uri)) == (
        "models-1",
        "exports/bert.onnx",
        "s3://models-1/exports/bert.onnx",
    )


def test_format_detection_is_by_content(tmp_path: Path) -> None:
    named_zip = tmp_path / "really-a-zip.onnx"
    with zipfile.ZipFile(named_zip, "w") as archive:
        archive.writestr("m.onnx", b"x")
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as archive:
        info = tarfile.TarInfo("m.onnx")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "plain.bin").write_bytes(tar_bytes.getvalue())
    assert detect_format(named_zip) == "zip"
    assert detect_format(tmp_path / "plain.bin") == "tar"
    assert detect_format(save(linear(), tmp_path / "m.onnx")) == "onnx"
