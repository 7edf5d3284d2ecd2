"""Getting a model in: what exporters produce, made into one self-contained ONNX file that
registration checks, test-runs and stores (docs/REGISTRATION.md).

Exporters write more than one bare ``.onnx``: torch (2.9 and later) and onnx's own large-model
path keep the weights in a separate ``x.onnx.data`` file the graph references; many exports fix
the batch dimension at the example's size. So a registration may send

- a bare ``.onnx`` with its weights inside it;
- a zip or tar (optionally gzip/bz2/xz-compressed) holding one ``.onnx`` and every external data
  file it references, at the paths it references them by;
- a bare ``.onnx`` plus its one external data file as a separate part (``modelData``).

``ingest`` makes one self-contained ``.onnx`` of it (weights loaded in, saved without external
data; refused past protobuf's 2 GB), rewrites a batch dimension that every input and output fixes
to a symbolic ``batch``, reads the signature (every input as a ``TensorSpec``), reads the
validation set into its canonical form (within its unpacked limit, ``modelless.inputs.archives``), and
test-runs the model with onnxruntime at batch 1 and batch 2 on the validation set's first
examples where onnxruntime is installed (the AWS gateway leaves it out: the registrar test-runs
it first there).

Every model that is test-run, and every registration whose files (or validation set, unpacked)
pass ``IN_PROCESS_MAX_BYTES``, is ingested in a child process (``ingest_in_child``): parsing,
checking and running an arbitrary graph costs several times its size in memory, and may take
any time, neither of which may stay with the gateway that serves queries; there it is held to a
time limit and an address-space limit. Every failure is a domain error (4xx) that says what to
send instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import posixpath
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from modelless import exceptions
from modelless.config import VALSET_UNPACK_FACTOR
from modelless.exceptions import InvalidInputError, InvalidModelError, ModellessError, first_line
from modelless.inputs.archives import UNREADABLE, npz_unpacked_bytes, open_zip
from modelless.inputs.tensors import to_feeds
from modelless.types import TensorSpec
from modelless.validation import (
    MAX_MODEL_SETTING,
    MAX_VALSET_SETTING,
    MAX_VALSET_UNPACKED_SETTING,
    ModelSignature,
    check_model,
    load_model,
    model_signature,
    read_valset,
    too_large,
)
from variants.examples import rows

if TYPE_CHECKING:
    import onnx

S3_SCHEME = "s3://"
# One serialized ONNX model (a protobuf message) holds at most 2 GiB.
MAX_PROTOBUF_BYTES = 2 * 1024**3 - 1
# Larger models (with their external data) or validation sets (unpacked) are ingested in a child
# process; so is every model that is test-run (the run is bounded in time and memory there).
IN_PROCESS_MAX_BYTES = 16 * 1024 * 1024
# ``python -m`` this module ingests in a child process (``ingest_in_child``).
INGEST_MODULE = __name__
CHILD_TIMEOUT_S = 600
# A test run (batch 1, then batch 2) is stopped past this: a graph that loops for ever is refused.
TRIAL_RUN_TIMEOUT_S = 60.0
# The child's address space, beyond what its files take (several times their size while a model
# is parsed, checked and run): the interpreter, numpy, onnx and onnxruntime themselves.
INGEST_BASE_MEMORY_BYTES = 2 * 1024**3
INGEST_MEMORY_PER_FILE_BYTE = 4
MAX_INGEST_MEMORY_SETTING = "MODELLESS_MAX_INGEST_MEMORY_BYTES"
# A model archive's members and central directory, at most: external data comes in one file, or
# one per tensor (a few thousand for the largest graphs); past these it is not a model's export.
MAX_ARCHIVE_MEMBERS = 10_000
ARCHIVE_DIRECTORY_BYTES = 4 * 1024 * 1024
BATCH_DIM = "batch"
COPY_CHUNK_BYTES = 1024 * 1024
# Archive members that are packaging debris, not the model's files.
IGNORED_MEMBERS = ("__MACOSX/",)

ModelFormat = Literal["onnx", "zip", "tar"]


# --- where files come from ---------------------------------------------------------------------


@dataclass(frozen=True)
class S3Uri:
    """``s3://bucket/key``: one object (a registration's model or validation set)."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str, field_name: str) -> S3Uri:
        if not isinstance(uri, str) or not uri.startswith(S3_SCHEME):
            raise InvalidInputError(
                f"{field_name} must be an s3://bucket/key URI; got {uri!r}", field=field_name
            )
        bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
        if not bucket or len(bucket) > 63 or not all(c.isalnum() or c in "-." for c in bucket):
            raise InvalidInputError(f"{field_name} {uri!r} does not name a valid bucket", field=field_name)
        if not key or key.endswith("/"):
            raise InvalidInputError(
                f"{field_name} {uri!r} names no object: give the full key of one file", field=field_name
            )
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key}"


@dataclass(frozen=True)
class RegistrationSource:
    """A registration's files: local paths (an upload already copied to disk) or s3:// objects."""

    model: Path | S3Uri
    valset: Path | S3Uri
    model_data: Path | S3Uri | None = None  # the model's one external data file, sent apart


@dataclass(frozen=True)
class Limits:
    """The size limits a registration's files are held to, with the settings that raise them."""

    model_bytes: int
    valset_bytes: int
    model_setting: str = MAX_MODEL_SETTING
    valset_setting: str = MAX_VALSET_SETTING
    # The validation set's arrays unpacked; 0: VALSET_UNPACK_FACTOR times valset_bytes.
    valset_unpacked_bytes: int = 0
    valset_unpacked_setting: str = MAX_VALSET_UNPACKED_SETTING
    # The ingesting child's address space; 0: derived from the files (``ingest_memory_limit``).
    memory_bytes: int = 0

    @property
    def valset_unpacked_limit(self) -> int:
        return self.valset_unpacked_bytes or VALSET_UNPACK_FACTOR * self.valset_bytes


# --- formats and archives ---------------------------------------------------------------------


def detect_format(path: Path) -> ModelFormat:
    """By content, not by name: a zip, a tar (compressed or not), else taken for an ONNX file."""
    with path.open("rb") as head:
        start = head.read(512)
    if start.startswith(b"PK\x03\x04") or start.startswith(b"PK\x05\x06"):
        return "zip"
    compressed = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
    if start.startswith(compressed) or start[257:262] == b"ustar":
        return "tar"
    return "onnx"


def unpack(archive: Path, target: Path, limit: int, setting: str = MAX_MODEL_SETTING) -> Path:
    """Extract a zip or tar into ``target`` (regular files only, never outside it, at most
    ``limit`` bytes and ``MAX_ARCHIVE_MEMBERS`` files in all) and return its one ``.onnx`` file.
    A zip is refused on what it declares (its directory, its members' sizes) before anything is
    extracted; what is extracted is counted as well, since declared sizes may lie."""
    kind = detect_format(archive)
    target.mkdir(parents=True, exist_ok=True)
    written = 0
    members = 0

    def count_member(name: str) -> None:
        nonlocal members
        members += 1
        if members > MAX_ARCHIVE_MEMBERS:
            raise InvalidModelError(
                f"the model archive holds more than {MAX_ARCHIVE_MEMBERS} files (at {name!r}); a "
                "model's export is its .onnx and its external data: send those only"
            )

    def extract(name: str, source: IO[bytes]) -> None:
        nonlocal written
        relative = _safe_member_path(name)
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        with destination.open("wb") as out:
            while piece := source.read(COPY_CHUNK_BYTES):
                written += len(piece)
                if written > limit:  # counted as extracted: a zip's declared sizes may lie
                    raise too_large("the model archive's contents", limit, setting)
                out.write(piece)

    try:
        if kind == "zip":
            with open_zip(archive, "the model archive", ARCHIVE_DIRECTORY_BYTES, InvalidModelError) as zipped:
                wanted = [i for i in zipped.infolist() if not i.is_dir() and not _ignored(i.filename)]
                declared = sum(info.file_size for info in wanted)
                if declared > limit:
                    raise too_large("the model archive's contents", limit, setting, declared)
                for info in wanted:
                    count_member(info.filename)
                    with zipped.open(info) as member:
                        extract(info.filename, member)
        elif kind == "tar":
            with tarfile.open(archive, mode="r:*") as tarred:
                for entry in tarred:
                    count_member(entry.name)  # every entry: tarfile keeps each one it has read
                    if entry.isdir() or _ignored(entry.name):
                        continue
                    if not entry.isfile():
                        raise InvalidModelError(
                            f"the model archive holds {entry.name!r}, which is not a regular file "
                            "(links and devices are refused)"
                        )
                    contents = tarred.extractfile(entry)
                    if contents is not None:
                        with contents:
                            extract(entry.name, contents)
        else:
            raise InvalidModelError("the model file is not a zip or tar archive")
    except (*UNREADABLE, tarfile.TarError) as error:
        raise InvalidModelError(f"the model archive cannot be read: {first_line(error)}") from error
    models = sorted(p for p in target.rglob("*.onnx") if p.is_file())
    if len(models) != 1:
        held = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        problem = "no .onnx file" if not models else f"{len(models)} .onnx files"
        raise InvalidModelError(
            f"the model archive must hold exactly one .onnx file (and the external data files it "
            f"references); it holds {problem}: {held[:20]}",
            files=held[:20],
        )
    return models[0]


def _ignored(name: str) -> bool:
    return name.startswith(IGNORED_MEMBERS) or posixpath.basename(name).startswith("._")


def _safe_member_path(name: str) -> str:
    """A member's path inside the archive, refused when it would land outside the extraction."""
    normal = posixpath.normpath(name.replace("\\", "/"))
    if normal.startswith(("/", "../")) or normal in {"..", "."} or ":" in normal.split("/")[0]:
        raise InvalidModelError(f"the model archive holds {name!r}, a path outside the archive")
    return normal


# --- external data ----------------------------------------------------------------------------


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph that may keep its data outside: initializers, constants'
    attributes, and those of subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _all_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_tensors(subgraph)


def external_data_locations(model: onnx.ModelProto) -> list[str]:
    """The files (relative to the model's directory) its tensors keep their data in."""
    import onnx

    locations: set[str] = set()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            location = entries.get("location", "")
            if not location:
                raise InvalidModelError(f"tensor {tensor.name!r} keeps external data but names no file")
            locations.add(location)
    return sorted(locations)


def _checked_location(location: str) -> str:
    normal = posixpath.normpath(location.replace("\\", "/"))
    if normal.startswith(("/", "../")) or normal == ".." or ":" in normal:
        raise InvalidModelError(
            f"the model references external data at {location!r}, outside its own directory: "
            "external data must sit beside the .onnx file (or below it)"
        )
    return normal


def missing_data_message(locations: Sequence[str], model_name: str = "model.onnx") -> str:
    named = ", ".join(repr(loc) for loc in locations)
    first = locations[0] if locations else f"{model_name}.data"
    return (
        f"the model keeps its weights in external data ({named}) that was not sent with it. Send "
        f"the .onnx file and its data together: a zip or tar(.gz) holding both at the paths the "
        f"model names, or the data file as the 'modelData' part of the upload (CLI: --model-data "
        f"{first}; Client.register_model(..., model_data=...)); or save the model as one file "
        "(onnx.save_model(model, path, save_as_external_data=False), under 2 GB)"
    )


def _point_at_model_data(model: onnx.ModelProto, data: Path) -> Path:
    """Make a model's tensors read their external data from a separately sent file (an upload's
    ``modelData`` part, stored under a name of its own); returns the directory to load from.
    The file is not copied nor linked (onnx refuses hard links as a possible attack)."""
    locations = external_data_locations(model)
    if not locations:
        raise InvalidModelError(
            "a 'modelData' file was sent, but the model references no external data: send the "
            ".onnx file alone"
        )
    if len(locations) > 1:
        raise InvalidModelError(
            f"the model references {len(locations)} external data files ({locations}); one "
            "'modelData' part carries one: send a zip or tar holding the .onnx file and all of them"
        )
    for tensor in _all_tensors(model.graph):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data.name
    return data.parent


def load_self_contained(
    model_path: Path,
    base_dir: Path,
    limit: int,
    setting: str = MAX_MODEL_SETTING,
    model_data: Path | None = None,
) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every external tensor loaded in (and the locations that were loaded), from
    ``base_dir``, or from ``model_data`` where its one external data file was sent apart;
    InvalidModelError when one is missing, with what to send."""
    import onnx

    model = load_model(model_path, check=False)
    named = external_data_locations(model)  # as the model names them, for the caller's notes
    if model_data is not None:
        base_dir = _point_at_model_data(model, model_data)
    locations = [_checked_location(loc) for loc in external_data_locations(model)]
    if not locations:
        check_model(model)
        return model, []
    missing = [loc for loc in locations if not (base_dir / loc).is_file()]
    if missing:
        raise InvalidModelError(missing_data_message(missing, model_path.name), missing=missing)
    total = model_path.stat().st_size + sum((base_dir / loc).stat().st_size for loc in locations)
    if total > limit:
        raise too_large("the model with its external data", limit, setting, total)
    if total > MAX_PROTOBUF_BYTES:
        raise InvalidModelError(_too_big_for_protobuf(total))
    try:
        onnx.load_external_data_for_model(model, str(base_dir))
    except (ValueError, OSError, RuntimeError) as error:
        raise InvalidModelError(f"the model's external data cannot be read: {first_line(error)}") from error
    check_model(model)
    return model, named


def _too_big_for_protobuf(size: int) -> str:
    return (
        f"the model is {size} bytes with its weights; one self-contained ONNX file holds at most "
        f"2 GB (protobuf's limit), so it cannot be registered as one: quantise or prune it first"
    )


# --- the batch dimension -----------------------------------------------------------------------


def fix_batch_dimension(model: onnx.ModelProto) -> int | None:
    """Make a batch size that every input and output fixes symbolic (``batch``); returns the
    size it was fixed at, or None when nothing was changed.

    Only when all of them fix it: a model with some dynamic and some fixed leading dims is not
    guessed at. Whether the graph really runs at another batch size (a Reshape may have baked it
    in) is for ``trial_run`` to find out."""
    initializers = {init.name for init in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers] + list(model.graph.output)
    leading = []
    for value in values:
        dims = value.type.tensor_type.shape.dim
        if not dims or not dims[0].HasField("dim_value") or dims[0].dim_value <= 0:
            return None
        leading.append(dims[0].dim_value)
    if not leading or len(set(leading)) != 1:
        return None
    for value in values:
        value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM  # clears dim_value (a oneof)
    # Intermediate shape annotations were inferred at the fixed size: stale now, and optional.
    del model.graph.value_info[:]
    return int(leading[0])


# --- the test run ------------------------------------------------------------------------------


def onnxruntime_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def trial_run(
    model_path: Path,
    signature: ModelSignature,
    examples: np.ndarray,
    fixed_batch: int | None = None,
    timeout_s: float = TRIAL_RUN_TIMEOUT_S,
) -> None:
    """Run the model with onnxruntime on real validation examples, the first alone (batch 1) and
    the first two (batch 2; the one repeated when the set holds one): InvalidModelError when it
    does not load, does not run on them, does not answer [batch, classes] at both sizes, or runs
    past ``timeout_s`` (stopped there). Real rows, not synthetic ones: a graph may run on zeros
    and fail on the values it will be sent (a token id past its embedding table)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # beside the gateway's own work: one core at most
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # what the run allocates is given back when it ends
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types, none exported cleanly
        raise InvalidModelError(f"onnxruntime cannot load the model: {first_line(error)}") from error
    names = [spec.name for spec in signature.inputs]
    for count in (1, 2):
        feeds = to_feeds(rows(examples, count), names)
        try:
            outputs = _run_within(session, feeds, timeout_s)
        except TimeoutError as error:
            raise InvalidModelError(
                f"the model's test run on {count} validation example(s) took longer than "
                f"{timeout_s:g} s and was stopped"
            ) from error
        except Exception as error:
            if count == 1:
                raise InvalidModelError(
                    f"the model loads but does not run on the first validation example: {first_line(error)}"
                ) from error
            raise InvalidModelError(
                _fixed_batch_message(signature, fixed_batch, f"onnxruntime at batch 2: {first_line(error)}")
            ) from error
        shape = tuple(outputs[0].shape)
        if shape != (count, signature.num_classes):
            if count == 2 and shape[:1] != (2,):
                raise InvalidModelError(
                    _fixed_batch_message(signature, fixed_batch, f"at batch 2 it answers {list(shape)}")
                )
            raise InvalidModelError(
                f"at batch {count} the model answers shape {list(shape)}, not its declared "
                f"[{count}, {signature.num_classes}]"
            )


def _run_within(session: Any, feeds: dict[str, np.ndarray], timeout_s: float) -> list[np.ndarray]:
    """``session.run``, told to stop (``RunOptions.terminate``, checked between the graph's nodes)
    once ``timeout_s`` has passed: TimeoutError then."""
    import onnxruntime as ort

    run_options = ort.RunOptions()
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        run_options.terminate = True

    timer = threading.Timer(timeout_s, stop)
    timer.daemon = True
    timer.start()
    try:
        outputs: list[np.ndarray] = session.run(None, feeds, run_options)
    except Exception:
        if stopped.is_set():
            raise TimeoutError(f"stopped after {timeout_s:g} s") from None
        raise
    finally:
        timer.cancel()
    return outputs


def _fixed_batch_message(signature: ModelSignature, fixed_batch: int | None, what: str) -> str:
    axes = ", ".join(f"{spec.name!r}: {{0: 'batch'}}" for spec in signature.inputs)
    return (
        f"the graph fixes the batch size at {fixed_batch or 1} ({what}); re-export with "
        f"dynamic_axes={{{axes}}} or dynamic_shapes"
    )


# --- the whole ingestion -----------------------------------------------------------------------


@dataclass(frozen=True)
class IngestRequest:
    model: Path  # a bare .onnx, or a zip/tar holding one
    valset: Path
    work_dir: Path  # where normalised files are written (the caller removes it)
    limits: Limits
    model_data: Path | None = None
    run_model: bool = True  # test-run with onnxruntime (where it is installed)

    def to_json(self) -> str:
        return json.dumps(
            {
                "model": str(self.model),
                "valset": str(self.valset),
                "work_dir": str(self.work_dir),
                "limits": self.limits.__dict__,
                "model_data": str(self.model_data) if self.model_data else None,
                "run_model": self.run_model,
            }
        )

    @classmethod
    def from_json(cls, raw: str) -> IngestRequest:
        data = json.loads(raw)
        return cls(
            Path(data["model"]),
            Path(data["valset"]),
            Path(data["work_dir"]),
            Limits(**data["limits"]),
            Path(data["model_data"]) if data["model_data"] else None,
            bool(data["run_model"]),
        )


@dataclass(frozen=True)
class IngestedModel:
    model: Path  # one self-contained .onnx: what the repository stores
    valset: Path  # the validation set in its canonical form
    signature: ModelSignature
    examples: int
    tested: bool  # test-run at batch 1 and 2 here (False: the registrar must do it)
    notes: tuple[str, ...] = field(default=())  # what was changed on the way, for the caller

    def to_json(self) -> str:
        return json.dumps(
            {
                "model": str(self.model),
                "valset": str(self.valset),
                "inputs": [spec.__dict__ for spec in self.signature.inputs],
                "num_classes": self.signature.num_classes,
                "examples": self.examples,
                "tested": self.tested,
                "notes": list(self.notes),
            }
        )

    @classmethod
    def from_json(cls, raw: str) -> IngestedModel:
        data = json.loads(raw)
        signature = ModelSignature(
            tuple(TensorSpec(**spec) for spec in data["inputs"]), int(data["num_classes"])
        )
        return cls(
            Path(data["model"]),
            Path(data["valset"]),
            signature,
            int(data["examples"]),
            bool(data["tested"]),
            tuple(data["notes"]),
        )


def ingest(request: IngestRequest) -> IngestedModel:
    """Normalise, check and (where onnxruntime is installed) test-run a registration's model, and
    read its validation set, in this process. Raises domain errors only for what the caller sent."""
    import onnx

    limits = request.limits
    request.work_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    sent = request.model.stat().st_size + (request.model_data.stat().st_size if request.model_data else 0)
    if sent > limits.model_bytes:
        raise too_large("model file", limits.model_bytes, limits.model_setting, sent)
    if request.model.stat().st_size == 0:
        raise InvalidModelError("model file is empty")
    model_path = request.model
    kind = detect_format(model_path)
    if kind != "onnx":
        if request.model_data is not None:
            raise InvalidModelError("send the external data inside the archive or as 'modelData', not both")
        model_path = unpack(
            model_path, request.work_dir / "unpacked", limits.model_bytes, limits.model_setting
        )
        notes.append(f"unpacked {model_path.name} from the {kind} archive")
    model, loaded = load_self_contained(
        model_path, model_path.parent, limits.model_bytes, limits.model_setting, request.model_data
    )
    if loaded:
        notes.append(f"external data {loaded} merged into one self-contained file")
    fixed_batch = fix_batch_dimension(model)
    if fixed_batch is not None:
        notes.append(f"the batch dimension every input and output fixed at {fixed_batch} was made dynamic")
    signature = model_signature(model)
    if loaded or fixed_batch is not None:
        size = model.ByteSize()
        if size > MAX_PROTOBUF_BYTES:
            raise InvalidModelError(_too_big_for_protobuf(size))
        model_path = request.work_dir / "model.onnx"
        onnx.save_model(model, str(model_path))
    del model  # the weights: the test run loads them again, from the file
    valset = read_valset(
        request.valset,
        signature,
        limits.valset_bytes,
        limits.valset_setting,
        limits.valset_unpacked_limit,
        limits.valset_unpacked_setting,
    )
    tested = request.run_model and onnxruntime_available()
    if tested:
        trial_run(model_path, signature, valset.batch(signature), fixed_batch)
    valset_path = request.valset
    if not valset.canonical:
        valset_path = request.work_dir / "valset.npz"
        valset.save(valset_path, signature)
    return IngestedModel(model_path, valset_path, signature, len(valset.labels), tested, tuple(notes))


def needs_child(request: IngestRequest) -> bool:
    """Whether to ingest ``request`` in a child process: always when the model is to be test-run
    (an arbitrary graph runs there, bounded in time and memory, not beside the queries this
    process serves), else when its files, or its validation set unpacked, are large (see the
    module's doc)."""
    if request.run_model and onnxruntime_available():
        return True
    files = [request.model, request.valset] + ([request.model_data] if request.model_data else [])
    sizes = [path.stat().st_size for path in files] + [npz_unpacked_bytes(request.valset)]
    return any(size > IN_PROCESS_MAX_BYTES for size in sizes)


def ingest_memory_limit(request: IngestRequest) -> int:
    """The ingesting child's address space: ``Limits.memory_bytes`` where set, else a base for the
    interpreter and its libraries plus a few times what its files hold (unpacked)."""
    if request.limits.memory_bytes > 0:
        return request.limits.memory_bytes
    files = [request.model] + ([request.model_data] if request.model_data else [])
    held = sum(path.stat().st_size for path in files) + max(
        request.valset.stat().st_size, npz_unpacked_bytes(request.valset)
    )
    return INGEST_BASE_MEMORY_BYTES + INGEST_MEMORY_PER_FILE_BYTE * held


def ingest_in_child(request: IngestRequest, timeout_s: float = CHILD_TIMEOUT_S) -> IngestedModel:
    """``ingest`` in a ``python -m modelless.registration.ingest`` child process: its memory (several times
    the model's size while it is parsed, checked and test-run) goes back to the system with it,
    and it may use at most ``ingest_memory_limit`` (its address space, set by the child itself),
    for at most ``timeout_s``. Its domain errors are raised here again, as they were raised there."""
    answer = request.work_dir / "ingest-answer.json"
    request.work_dir.mkdir(parents=True, exist_ok=True)
    memory = ingest_memory_limit(request)
    # The child imports what this process imports, wherever the runtime put it (Lambda's layers);
    # one BLAS thread, as onnxruntime gets one: each would reserve address space of its own.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        completed = subprocess.run(
            [sys.executable, "-m", INGEST_MODULE, request.to_json(), str(answer), str(memory)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise InvalidModelError(f"checking the model took longer than {timeout_s:.0f} s") from error
    if not answer.is_file():
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        died = (
            f"signal {-completed.returncode}" if completed.returncode < 0 else f"exit {completed.returncode}"
        )
        raise InvalidModelError(
            f"checking the model stopped its process ({died}; out of memory, or a malformed file "
            f"onnx could not parse): {last[:300]}"
        )
    reply = json.loads(answer.read_text())
    answer.unlink()
    if "error" in reply:
        raise _error_from(reply["error"])
    return IngestedModel.from_json(json.dumps(reply["ingested"]))


def _error_from(error: dict[str, Any]) -> Exception:
    kind = getattr(exceptions, str(error.get("type")), None)
    if isinstance(kind, type) and issubclass(kind, ModellessError):
        try:
            return kind(str(error["message"]), **dict(error.get("details") or {}))
        except TypeError:  # an error whose constructor takes other arguments
            return InvalidModelError(str(error["message"]))
    return RuntimeError(f"ingesting the model failed: {error.get('type')}: {error.get('message')}")


def main(argv: Sequence[str]) -> int:
    """The child's side of ``ingest_in_child``:
    ``python -m modelless.registration.ingest REQUEST_JSON ANSWER [MEMORY_BYTES]``."""
    request_json, answer_path, *memory = argv
    answer = Path(answer_path)
    limit = int(memory[0]) if memory else 0
    if limit > 0:
        import resource

        # The address space, not the resident set: what a graph asks for is refused when asked
        # (onnxruntime and numpy raise), not granted and then killed for by the kernel.
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        reply: dict[str, Any] = {"ingested": json.loads(_ingest_within(request_json, limit).to_json())}
    except ModellessError as error:
        reply = {"error": {"type": type(error).__name__, "message": error.message, "details": error.details}}
    except Exception as error:  # reported, not hidden: the parent raises it as a failure of its own
        reply = {"error": {"type": type(error).__name__, "message": first_line(error)}}
    partial = answer.with_suffix(".partial")
    partial.write_text(json.dumps(reply, default=str))
    partial.replace(answer)
    return 0


def _ingest_within(request_json: str, memory_limit: int) -> IngestedModel:
    """``ingest`` in the child, whose running out of its address space is the model's doing."""
    try:
        return ingest(IngestRequest.from_json(request_json))
    except MemoryError as error:
        raise InvalidModelError(
            f"checking and test-running the model needs more than {memory_limit} bytes of memory "
            f"({MAX_INGEST_MEMORY_SETTING} raises it)",
            limit=memory_limit,
            setting=MAX_INGEST_MEMORY_SETTING,
        ) from error


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
