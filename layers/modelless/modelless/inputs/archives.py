"""Arrays and archives that callers send, read within limits set before anything is inflated.

A few compressed bytes can stand for gigabytes: an ``.npz`` member of zeros deflates a
thousandfold, an ``.npy`` header may declare 10**12 elements that numpy allocates before it reads
one, and a zip's central directory may list a million members, each of which costs memory when
the archive is merely opened. So every reader here checks what the archive *declares* (the size
of its directory, each member's unpacked size, each array header's shape and dtype) against its
limit first, and then reads through a bounded stream, so that a header that lies cannot carry it
past the limit either: it reads exactly what the header declares, never more.

Query bodies, validation sets, offline inputs and the validation examples a variant is profiled on
all read ``.npz``/``.npy`` through here; model archives (``modelless.registration.ingest``) open zips here.
"""

from __future__ import annotations

import ast
import io
import math
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import numpy as np

from modelless.exceptions import InvalidInputError, ModellessError, first_line

# The central directory of an ``.npz``: it lists a few arrays (a few hundred bytes each, with
# numpy's zip64 extras); past this, the archive is not an array file but a memory bomb.
NPZ_DIRECTORY_BYTES = 64 * 1024
# An ``.npy`` member's own framing beyond its array data: the magic, the header (numpy caps it
# at 10,000 bytes) and zip's local header.
ARRAY_FRAMING_BYTES = 64 * 1024
READ_CHUNK_BYTES = 1024 * 1024
# The .npy format (numpy.lib.format): a magic, a version byte pair, then the header's length as
# a little-endian u2 (1.0) or u4 (2.0). numpy itself reads headers of at most 10,000 bytes, and
# arrays of at most 64 dimensions.
NPY_MAGIC = b"\x93NUMPY"
NPY_LENGTH_FORMATS = {(1, 0): "<H", (2, 0): "<I"}
NPY_HEADER_BYTES = 10_000
NPY_HEADER_KEYS = frozenset({"descr", "fortran_order", "shape"})
NPY_MAX_DIMS = 64
# An array's bytes are counted in a signed 64-bit integer, its empty dimensions aside.
NPY_MAX_BYTES = 2**63 - 1
# CPython 3.11 builds an AST with one recursion counter per interpreter, not per thread: two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth mismatch"
# (cpython gh-106905; seen once under a burst of concurrent queries). A header is a few hundred
# bytes, so parsing them one at a time costs nothing.
_AST_LOCK = threading.Lock()
# What zipfile and zlib raise for a member that cannot be inflated: corrupt data, a bad CRC, an
# encrypted member (RuntimeError), a compression method this Python lacks (NotImplementedError).
UNREADABLE = (
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    NotImplementedError,
    zipfile.BadZipFile,
    zlib.error,
)

# Builds the error for a size refusal: the caller's domain error (a 400 for a query batch, a
# 413 naming the setting for a validation set).
Refusal = Callable[[str], ModellessError]


def zip_directory_bytes(stream: IO[bytes]) -> int | None:
    """The size of the central directory ``zipfile`` would read from ``stream``, as the archive
    declares it (its zip64 record included); None when there is no end record (not a zip).

    ``zipfile`` has no public way to say this before it parses the directory, so this asks the
    very function ``ZipFile`` itself reads the end record with."""
    try:
        end = zipfile._EndRecData(stream)  # type: ignore[attr-defined]
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    finally:
        stream.seek(0)
    return None if end is None else int(end[zipfile._ECD_SIZE])  # type: ignore[attr-defined]


def open_zip(
    source: bytes | Path,
    what: str,
    max_directory_bytes: int = NPZ_DIRECTORY_BYTES,
    refuse: Refusal = InvalidInputError,
) -> zipfile.ZipFile:
    """``source`` opened as a zip, once its declared central directory is found no larger than
    ``max_directory_bytes``; ``refuse`` builds the error for one that is larger. A source that
    is no zip at all is left for ``zipfile`` to refuse (``zipfile.BadZipFile``)."""
    stream: IO[bytes] = io.BytesIO(source) if isinstance(source, bytes) else source.open("rb")
    try:
        directory = zip_directory_bytes(stream)
        if directory is not None and directory > max_directory_bytes:
            raise refuse(
                f"{what} lists {directory} bytes of members in its directory; at most "
                f"{max_directory_bytes} are read (an archive of a few files needs far fewer)"
            )
        return zipfile.ZipFile(stream)
    except BaseException:
        stream.close()
        raise


def read_npz_member(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    limit: int,
    what: str,
    beyond: str,
    refuse: Refusal = InvalidInputError,
) -> np.ndarray:
    """One ``.npy`` member of an ``.npz`` holding at most ``limit`` bytes of array data: refused
    (``refuse``) when the zip declares it larger unpacked, or its header declares more data,
    before a byte is inflated; read through a bounded stream otherwise. ``beyond`` finishes the
    refusal's sentence: what the limit is (``"a batch of at most 8 is at most 4096"``).
    InvalidInputError when it is not a readable array."""
    if info.file_size > limit + ARRAY_FRAMING_BYTES:
        raise refuse(f"{what} is {info.file_size} bytes unpacked; {beyond}")
    try:
        with archive.open(info) as stream:
            return read_array(stream, limit, what, beyond, refuse)
    except ModellessError:
        raise
    except UNREADABLE as error:
        raise InvalidInputError(f"{what} is unreadable: {first_line(error)}") from error


def read_npz_members(
    archive: zipfile.ZipFile,
    members: Mapping[str, zipfile.ZipInfo],
    limit: int,
    what: Callable[[str], str],
    beyond: str,
    refuse: Refusal = InvalidInputError,
) -> dict[str, np.ndarray]:
    """The ``.npy`` members of an ``.npz`` (by name), holding at most ``limit`` bytes of array
    data *in all*. Every size is checked before any array data is inflated: each member's and
    then all members' unpacked sizes as the zip declares them, and then what every member's
    header declares (a header is a few hundred bytes into its member), summed. Only then is each
    read, through a bounded stream, within what its header declared. ``what(name)`` names a
    member in a refusal; ``beyond`` finishes the refusal's sentence.

    Checking the total only as each member is read would inflate a first member that declares
    the whole limit before finding that the next one leaves it over: seconds of server work per
    small request."""
    for name, info in members.items():
        if info.file_size > limit + ARRAY_FRAMING_BYTES:
            raise refuse(f"{what(name)} is {info.file_size} bytes unpacked; {beyond}")
    unpacked = sum(info.file_size for info in members.values())
    if unpacked > limit + ARRAY_FRAMING_BYTES * len(members):
        raise refuse(f"the arrays {sorted(members)} are {unpacked} bytes unpacked in all; {beyond}")
    declared: dict[str, int] = {}
    for name, info in members.items():
        try:
            with archive.open(info) as stream:
                shape, _, dtype = _read_header(stream, what(name))
        except UNREADABLE as error:
            raise InvalidInputError(f"{what(name)} is unreadable: {first_line(error)}") from error
        declared[name] = math.prod(shape) * dtype.itemsize
        if declared[name] > limit:
            array = f"{list(shape)} {dtype}"
            raise refuse(f"{what(name)} declares {declared[name]} bytes of array data ({array}); {beyond}")
    if sum(declared.values()) > limit:
        each = ", ".join(f"{what(name)}: {size}" for name, size in declared.items())
        raise refuse(
            f"the arrays declare {sum(declared.values())} bytes of array data in all ({each}); {beyond}"
        )
    return {
        name: read_npz_member(archive, info, declared[name], what(name), beyond, refuse)
        for name, info in members.items()
    }


def read_array(
    stream: IO[bytes], limit: int, what: str, beyond: str, refuse: Refusal = InvalidInputError
) -> np.ndarray:
    """One ``.npy`` array from ``stream``, never unpickled: its header's declared size (shape x
    itemsize) is checked against ``limit`` before anything is allocated (numpy's own loader
    allocates the whole declared array first), then exactly that many bytes are read, in pieces.
    A stream that ends early is refused as unreadable; one that would go on is not read on."""
    shape, fortran_order, dtype = _read_header(stream, what)
    declared = math.prod(shape) * dtype.itemsize
    if declared > limit:
        raise refuse(f"{what} declares {declared} bytes of array data ({list(shape)} {dtype}); {beyond}")
    return _read_data(stream, shape, fortran_order, dtype, what)


def read_npy(data: bytes, what: str) -> np.ndarray:
    """``.npy`` bytes as an array, never unpickled: the header may declare no more data than the
    bytes hold (a 100-byte body declaring 10**12 elements is refused before any allocation)."""
    stream = io.BytesIO(data)
    shape, fortran_order, dtype = _read_header(stream, what)
    declared = math.prod(shape) * dtype.itemsize
    available = len(data) - stream.tell()
    if declared > available:
        raise InvalidInputError(
            f"{what} declares {declared} bytes of array data ({list(shape)} {dtype}); it holds {available}"
        )
    return _read_data(stream, shape, fortran_order, dtype, what)


def _read_header(stream: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype]:  # type: ignore[type-arg]
    """The header of an ``.npy`` array, decoded strictly: a version 1.0 or 2.0 magic, a header of
    at most ``NPY_HEADER_BYTES`` that is one Python literal dict of exactly ``descr``,
    ``fortran_order`` (a bool) and ``shape`` (a tuple of at most ``NPY_MAX_DIMS`` non-negative
    ints, never bools), and a ``descr`` naming a dtype of non-zero size that holds no objects.
    Anything else is an InvalidInputError, whatever the parser raised on it.

    numpy's own header readers are not used: they let a negative dimension, a bool dimension or
    a zero-sized dtype through, and their Python 2 compatibility pass tokenizes the header
    (``tokenize.TokenError`` for an unterminated string), so a crafted header ended in a 500."""

    def refuse(reason: str) -> InvalidInputError:
        return InvalidInputError(f"{what} is not a readable .npy array: {reason}")

    try:
        magic = stream.read(len(NPY_MAGIC) + 2)
    except UNREADABLE as error:
        raise refuse(first_line(error)) from error
    if len(magic) < len(NPY_MAGIC) + 2 or not magic.startswith(NPY_MAGIC):
        raise refuse("it does not start with the .npy magic and version (\\x93NUMPY, 2 bytes)")
    version = (magic[-2], magic[-1])
    if version not in NPY_LENGTH_FORMATS:
        raise refuse(f".npy format version {version[0]}.{version[1]} is not supported; use 1.0 or 2.0")
    length_format = NPY_LENGTH_FORMATS[version]
    try:
        length_bytes = stream.read(struct.calcsize(length_format))
        (length,) = struct.unpack(length_format, length_bytes)
        if length > NPY_HEADER_BYTES:
            raise refuse(f"its header declares {length} bytes; at most {NPY_HEADER_BYTES} are read")
        text = stream.read(length)
    except struct.error as error:
        raise refuse("it ends inside its header") from error
    except UNREADABLE as error:
        raise refuse(first_line(error)) from error
    if len(text) < length:
        raise refuse(f"its header declares {length} bytes; it holds {len(text)}")
    try:
        with _AST_LOCK:
            header = ast.literal_eval(text.decode("latin1"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as error:
        raise refuse(f"its header is not a Python literal dict ({type(error).__name__})") from error
    if not isinstance(header, dict) or set(header) != NPY_HEADER_KEYS:
        keys = sorted(map(repr, header)) if isinstance(header, dict) else type(header).__name__
        raise refuse(f"its header must be a dict of exactly {sorted(NPY_HEADER_KEYS)}, not {keys}")
    shape, fortran_order, descr = header["shape"], header["fortran_order"], header["descr"]
    if (
        not isinstance(shape, tuple)
        or len(shape) > NPY_MAX_DIMS
        or not all(type(size) is int and size >= 0 for size in shape)
    ):
        raise refuse(
            f"its shape must be a tuple of at most {NPY_MAX_DIMS} non-negative integers, not "
            f"{_clip(repr(shape))}"
        )
    if type(fortran_order) is not bool:
        raise refuse(f"its fortran_order must be True or False, not {_clip(repr(fortran_order))}")
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, MemoryError) as error:
        raise refuse(f"its descr {_clip(repr(descr))} is not a dtype ({first_line(error)})") from error
    if dtype.hasobject:
        # Object arrays are pickles: never loaded, whatever they hold.
        raise refuse(
            f"it holds Python objects ({dtype}), which are refused (pickles are never loaded); send "
            "numeric arrays"
        )
    if dtype.itemsize == 0:
        raise refuse(f"its dtype {dtype} holds no bytes per element")
    if math.prod(max(size, 1) for size in shape) * dtype.itemsize > NPY_MAX_BYTES:
        # numpy cannot lay it out even when it is empty ("array is too big").
        raise refuse(f"its shape {_clip(repr(shape))} of {dtype} is larger than any array can be")
    return shape, fortran_order, dtype


def _clip(text: str, length: int = 80) -> str:
    return text if len(text) <= length else text[: length - 3] + "..."


def _read_data(
    stream: IO[bytes],
    shape: tuple[int, ...],
    fortran_order: bool,
    dtype: np.dtype,  # type: ignore[type-arg]
    what: str,
) -> np.ndarray:
    """Exactly the array data the header declared (already checked against its limit), read in
    pieces into one buffer that becomes the array (no second copy)."""
    declared = math.prod(shape) * dtype.itemsize
    buffer = bytearray(declared)
    view = memoryview(buffer)
    filled = 0
    try:
        while filled < declared:
            piece = stream.read(min(READ_CHUNK_BYTES, declared - filled))
            if not piece:
                break
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
    except UNREADABLE as error:
        raise InvalidInputError(f"{what} is not a readable .npy array: {first_line(error)}") from error
    if filled < declared:
        raise InvalidInputError(
            f"{what} is not a readable .npy array: its header declares {declared} bytes of data "
            f"({list(shape)} {dtype}); it holds {filled}"
        )
    flat = np.frombuffer(buffer, dtype=dtype)
    if fortran_order:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def npz_unpacked_bytes(path: Path) -> int:
    """What the ``.npz`` (any zip) at ``path`` declares its members to unpack to, in all; 0 for
    a file that is not a readable zip (its reader says why later). An upper bound on what
    ``read_npz_member`` inflates from it: it never reads past a member's declared size."""
    try:
        with open_zip(path, str(path)) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (ModellessError, *UNREADABLE):
        return 0
