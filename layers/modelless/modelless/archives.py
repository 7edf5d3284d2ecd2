"""Arrays and archives that callers send, read within limits set before anything is inflated.

A few compressed bytes can stand for gigabytes: an ``.npz`` member of zeros deflates a
thousandfold, an ``.npy`` header may declare 10**12 elements that numpy allocates before it reads
one, and a zip's central directory may list a million members, each of which costs memory when
the archive is merely opened. So every reader here checks what the archive *declares* (the size
of its directory, each member's unpacked size, each array header's shape and dtype) against its
limit first, and then reads through a bounded stream, so that a header that lies cannot carry it
past the limit either: it reads exactly what the header declares, never more.

Query bodies, validation sets, offline inputs and the validation examples a variant is profiled on
all read ``.npz``/``.npy`` through here; model archives (``modelless.ingest``) open zips here.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Callable
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
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(
                f".npy format version {version[0]}.{version[1]} is not supported; use 1.0 or 2.0"
            )
    except UNREADABLE as error:
        raise InvalidInputError(f"{what} is not a readable .npy array: {first_line(error)}") from error
    if dtype.hasobject:
        # Object arrays are pickles: never loaded, whatever they hold.
        raise InvalidInputError(
            f"{what} is not a readable .npy array: it holds Python objects ({dtype}), which are "
            "refused (pickles are never loaded); send numeric arrays"
        )
    return tuple(shape), bool(fortran_order), dtype


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
