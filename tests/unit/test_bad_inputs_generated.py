"""Generated bad input (Hypothesis): ``.npy`` and ``.npz`` headers, images and query strings, each
against an independent reference, so that the next hole of issue 33's kind is found here.

- ``.npy``: any header text (literal or not, any keys, any shape, descr and fortran_order, any
  version, truncated anywhere) is read as numpy's own loader reads it, or refused with an
  ``InvalidInputError`` (a 400), never anything else; where numpy (``allow_pickle=False``) reads
  an array, ours is the same array, and where ours reads one, numpy agrees.
- ``.npz``: an archive of such members, within a limit in all: the same, and a refusal for size
  comes before any array data is inflated.
- images: a real PNG or JPEG cut short, or with bytes flipped, decodes or is a 400.
- query strings: a repeated parameter is a 400 naming it; a reference parser written apart
  (split by hand, not ``urllib``) says which are repeated; over the API every one is a 4xx in
  the error shape or an answer, never a 500, and changes nothing.
"""

from __future__ import annotations

import ast
import io
import math
import struct
import zipfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote_plus

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import modelless.inputs.archives as archives_module
from modelless.api.query_strings import repeated_parameters
from modelless.exceptions import InvalidInputError, PayloadTooLargeError
from modelless.inputs.archives import open_zip, read_npy, read_npz_members
from modelless.inputs.preprocessing import decode_image, parse_recipe
from tests.input_models import IMAGE_RECIPE, IMAGE_SPEC, jpeg_bytes, npy_bytes, picture, png_bytes
from tests.unit.test_api import Api, error_of
from tests.unit.test_api_query_inputs import APP, api, images_app, post  # noqa: F401  (the fixture)

GENERATED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The API's examples each go through the whole route (TestClient): fewer of them.
OVER_THE_API = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- .npy headers -------------------------------------------------------------------------------


def npy_with_header(header: str | bytes, version: tuple[int, int] = (1, 0), data: bytes = b"") -> bytes:
    """An ``.npy`` of the given header text, framed as the format frames it (magic, version,
    little-endian length), padded as numpy pads it; ``data`` after it."""
    text = header.encode("utf-8") if isinstance(header, str) else header
    length_format = "<H" if version[0] == 1 else "<I"
    framing = 6 + 2 + struct.calcsize(length_format)
    text += b" " * ((-(framing + len(text) + 1)) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(length_format, len(text)) + text + data


def numpy_reads(body: bytes) -> np.ndarray | None:
    """The reference: numpy's own loader, pickles refused; None where it refuses, whatever it
    raises. (It allocates what a header declares before reading: only called on bodies whose
    headers declare at most a few KB, see ``sizes``.)"""
    try:
        loaded = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception:
        return None
    return loaded if isinstance(loaded, np.ndarray) else None


def ours(body: bytes) -> np.ndarray | InvalidInputError:
    """``read_npy``'s answer: an array, or its InvalidInputError; anything else fails the test."""
    try:
        return read_npy(body, "body")
    except InvalidInputError as error:
        assert error.status_code == 400 and error.message
        return error


dimensions = st.one_of(
    st.integers(-3, 6),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.floats(allow_nan=True),
    st.just("1"),
    st.none(),
)
shapes = st.one_of(
    st.lists(dimensions, max_size=4).map(tuple),
    st.lists(st.integers(0, 4), max_size=70).map(tuple),  # too many dimensions
    st.lists(st.integers(0, 3), max_size=3),  # a list, not a tuple
    st.integers(-2, 4),
)
descrs = st.one_of(
    st.sampled_from(
        ["<f4", "<f8", "|u1", "<i8", ">i4", "|b1", "<c8", "|V4", "|V0", "|O", "<U2", "|S3", "zz", ""]
    ),
    st.just([("a", "<f4"), ("b", "<i8", (2,))]),
    st.just([("a", "<f4", (-1,))]),
    st.just([("a", "|O")]),
    st.integers(),
    st.none(),
)
orders = st.one_of(st.booleans(), st.integers(0, 1), st.none(), st.just("False"))


@st.composite
def npy_headers(draw: st.DrawFn) -> str:
    """Header text: a dict literal with (usually) the three keys, or text that is no literal."""
    fields: dict[str, Any] = {
        "descr": draw(descrs),
        "fortran_order": draw(orders),
        "shape": draw(shapes),
    }
    for key in draw(st.lists(st.sampled_from(["descr", "fortran_order", "shape"]), max_size=1)):
        del fields[key]
    if draw(st.booleans()) and draw(st.booleans()):
        fields["extra"] = 1
    text = repr(fields)
    mangle = draw(st.sampled_from(["none", "none", "none", "call", "arith", "cut", "quote", "deep", "junk"]))
    if mangle == "call":
        text = text.replace("'shape': ", "'shape': tuple(").replace("}", ")}", 1)
    elif mangle == "arith":
        text = text.replace("'shape': (", "'shape': (1+", 1)
    elif mangle == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif mangle == "quote":
        text = text + '"""'
    elif mangle == "deep":
        text = "(" * 500 + text + ")" * 500
    elif mangle == "junk":
        text = draw(st.text(max_size=60))
    return text


def header_literal(body: bytes) -> Any:
    """A generated body's header as a Python literal, or None."""
    try:
        return ast.literal_eval(body[10:].split(b"\n", 1)[0].decode("latin-1"))
    except Exception:
        return None


def declared_bytes(body: bytes) -> int:
    """At least what a generated body's header declares, when it is a literal dict of a numeric
    shape (0 otherwise): bodies declaring more than a few KB are kept from the reference, which
    would allocate them."""
    header = header_literal(body)
    try:
        return int(math.prod(max(abs(int(size)), 1) for size in header["shape"])) * 16
    except Exception:
        return 0


def stricter_than_numpy(body: bytes, version: tuple[int, int]) -> bool:
    """Where ours refuses what numpy reads, by design: version 3.0 (a UTF-8 header, which no
    array of numbers needs), a boolean dimension (numpy takes True for 1) and elements of no
    bytes (``|V0``: nothing a model takes)."""
    header = header_literal(body)
    if not isinstance(header, dict):
        return version == (3, 0)
    shape = header.get("shape")
    try:
        descr: Any = header.get("descr")
        empty_elements = np.lib.format.descr_to_dtype(descr).itemsize == 0
    except Exception:
        empty_elements = False
    bool_dimension = isinstance(shape, tuple) and any(type(size) is bool for size in shape)
    return version == (3, 0) or bool_dimension or empty_elements


@GENERATED
@given(
    header=npy_headers(),
    version=st.sampled_from([(1, 0), (2, 0), (3, 0), (0, 9)]),
    data=st.binary(max_size=64),
    cut=st.one_of(st.none(), st.integers(0, 200)),
)
def test_any_npy_header_is_read_as_numpy_reads_it_or_refused_as_a_400(
    header: str, version: tuple[int, int], data: bytes, cut: int | None
) -> None:
    body = npy_with_header(header, version, data)
    if cut is not None:
        body = body[:cut]
    answer = ours(body)
    if isinstance(answer, np.ndarray):
        assert answer.nbytes <= len(body)  # never more than the body holds
        reference = numpy_reads(body)
        assert reference is not None, f"read {answer.dtype} {answer.shape}, which numpy refuses"
        assert reference.dtype == answer.dtype and reference.shape == answer.shape
        assert reference.tobytes() == answer.tobytes()
    elif declared_bytes(body) <= 4096 and not stricter_than_numpy(body, version):
        reference = numpy_reads(body)
        assert reference is None or reference.dtype.hasobject, (
            f"numpy reads {reference.dtype} {reference.shape}; ours refused: {answer.message}"
        )


# Issue 33's headers (each ended in a 500), and the neighbours the strict reader refuses with them.
ISSUE_33_HEADERS = [
    ("negative", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", b""),
    ("negative-and-zero", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 0), }", b"\0" * 8),
    ("two-negative", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, -2), }", b"\0" * 8),
    ("unterminated-string", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,\"\"\"", b""),
    ("not-a-literal", "{'descr': '<f4', 'fortran_order': False, 'shape': (1+1,), }", b"\0" * 8),
    ("a-call", "{'descr': '<f4', 'fortran_order': False, 'shape': tuple(), }", b""),
    ("bool-dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (True,), }", b"\0" * 4),
    ("empty-elements", "{'descr': '|V0', 'fortran_order': False, 'shape': (3,), }", b""),
    (
        "too-big-even-empty",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1180591620717411303424), }",
        b"",
    ),
]


@pytest.mark.parametrize(
    ("header", "data"), [case[1:] for case in ISSUE_33_HEADERS], ids=[c[0] for c in ISSUE_33_HEADERS]
)
def test_issue_33s_npy_headers_are_400s(header: str, data: bytes) -> None:
    answer = ours(npy_with_header(header, data=data))
    assert isinstance(answer, InvalidInputError), answer


arrays = st.one_of(
    st.builds(
        lambda shape, dtype, fortran, seed: (
            np.asfortranarray(np.random.default_rng(seed).normal(size=shape)).astype(dtype)
            if fortran
            else np.asarray(np.random.default_rng(seed).normal(size=shape)).astype(dtype)
        ),
        st.lists(st.integers(0, 4), max_size=3).map(tuple),
        st.sampled_from(["<f4", "<f8", ">f4", "<i8", "|u1", "|b1", "<f2"]),
        st.booleans(),
        st.integers(0, 100),
    ),
    st.just(np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8", (2,))])),
)


@GENERATED
@given(array=arrays, version=st.sampled_from([(1, 0), (2, 0)]))
def test_every_array_numpy_writes_is_read_back_equal(array: np.ndarray, version: tuple[int, int]) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    read = read_npy(buffer.getvalue(), "body")
    assert read.dtype == array.dtype and read.shape == array.shape
    assert np.array_equal(read, array)


# --- .npz archives ------------------------------------------------------------------------------


@st.composite
def npz_archives(draw: st.DrawFn) -> tuple[bytes, dict[str, bytes]]:
    """An .npz (deflated or stored) of a few members, each an array numpy wrote, a generated
    header, or bytes; returns it and its members as written."""
    members: dict[str, bytes] = {}
    for index in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["array", "header", "bytes"]))
        if kind == "array":
            content = npy_bytes(draw(arrays))
        elif kind == "header":
            content = npy_with_header(draw(npy_headers()), data=draw(st.binary(max_size=32)))
        else:
            content = draw(st.binary(max_size=80))
        members[f"m{index}"] = content
    method = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)
    return buffer.getvalue(), members


@GENERATED
@given(archive=npz_archives(), limit=st.integers(0, 4096))
def test_any_npz_is_read_member_by_member_as_numpy_reads_it_or_refused(
    archive: tuple[bytes, dict[str, bytes]], limit: int
) -> None:
    data, members = archive
    try:
        with open_zip(data, "the .npz") as opened:
            infos = {info.filename.removesuffix(".npy"): info for info in opened.infolist()}
            read = read_npz_members(
                opened, infos, limit, lambda name: f"array {name!r}", f"at most {limit}", PayloadTooLargeError
            )
    except PayloadTooLargeError as error:
        assert error.status_code == 413
        # Refused for size: the zip's sizes, or the headers' declarations together, exceed it.
        unpacked = [len(content) for content in members.values()]
        framing = archives_module.ARRAY_FRAMING_BYTES
        over_zip = any(size > limit + framing for size in unpacked) or sum(unpacked) > limit + framing * len(
            unpacked
        )
        assert over_zip or sum(numpy_declared(content) for content in members.values()) > limit
        return
    except InvalidInputError as error:
        assert error.status_code == 400
        assert any(not isinstance(ours(content), np.ndarray) for content in members.values())
        return
    assert sum(array.nbytes for array in read.values()) <= limit
    for name, array in read.items():
        reference = numpy_reads(members[name])
        assert reference is not None and reference.dtype == array.dtype and reference.shape == array.shape
        assert reference.tobytes() == array.tobytes()


def numpy_declared(content: bytes) -> int:
    """What numpy's header reader says a member declares (0 where it cannot read the header)."""
    try:
        stream = io.BytesIO(content)
        version = np.lib.format.read_magic(stream)
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }
        shape, _, dtype = read_header[version](stream)
        return int(math.prod(shape)) * dtype.itemsize
    except Exception:
        return 0


def test_a_refusal_for_the_total_inflates_no_array_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: a first member declaring the whole limit was inflated before the second one
    found the total over it. Now every header is read first, and no data at all."""
    inflated: list[int] = []
    real = archives_module._read_data

    def counting(stream: Any, shape: tuple[int, ...], *rest: Any) -> np.ndarray:
        inflated.append(math.prod(shape))
        return real(stream, shape, *rest)

    monkeypatch.setattr(archives_module, "_read_data", counting)
    limit = 64 * 1024
    buffer = io.BytesIO()
    np.savez_compressed(buffer, inputs=np.zeros(limit // 4, np.float32), labels=np.zeros(2, np.int64))
    with open_zip(buffer.getvalue(), "the .npz") as opened:
        infos = {info.filename.removesuffix(".npy"): info for info in opened.infolist()}
        with pytest.raises(PayloadTooLargeError, match="declare 65552 bytes of array data in all"):
            read_npz_members(opened, infos, limit, repr, f"at most {limit}", PayloadTooLargeError)
    assert inflated == []


# --- images -------------------------------------------------------------------------------------


@GENERATED
@given(
    encoder=st.sampled_from([png_bytes, jpeg_bytes]),
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), max_size=4),
)
def test_a_damaged_image_decodes_or_is_a_400(
    encoder: Any, height: int, width: int, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(encoder(picture(height, width)))
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    body = bytes(data[: max(cut, 8)])  # the magic stays: it is routed to the image decoder
    try:
        decoded = decode_image(body, parse_recipe(IMAGE_RECIPE, IMAGE_SPEC))
    except InvalidInputError as error:
        assert error.status_code == 400 and error.message
        return
    assert decoded.shape == (1, *IMAGE_SPEC.shape) and np.isfinite(decoded).all()


# --- query strings ------------------------------------------------------------------------------

PARAMETER_NAMES = ["appID", "latency", "accuracy", "modelName", "other", "lat ency", "a%26b"]
values = st.one_of(
    st.sampled_from(["50", "0.9", "true", "nan", "1e999", "-1", "", APP, "images", " 5", "0x10"]),
    st.text(max_size=8),
)


def reference_repeats(query: str) -> set[str]:
    """Names given more than once, read apart from the gateway's parser: split by hand on '&'
    and the first '=', '+' and %XX decoded."""
    seen: dict[str, int] = {}
    for part in query.split("&"):
        if not part:
            continue
        name = unquote_plus(part.split("=", 1)[0])
        seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


@st.composite
def query_strings(draw: st.DrawFn) -> str:
    pairs = draw(st.lists(st.tuples(st.sampled_from(PARAMETER_NAMES), values), max_size=6))
    return "&".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in pairs)


@GENERATED
@given(query=query_strings())
@example(query="latency=5&latency=500")
@example(query="latency=5&lat%65ncy=500")
@example(query="appID=a&&appID=a")
def test_the_gateway_finds_every_repeated_parameter_the_reference_finds(query: str) -> None:
    assert set(repeated_parameters(query.encode())) == reference_repeats(query)


@pytest.fixture
def images(api: Api) -> Iterator[dict[str, str]]:  # noqa: F811  (pytest's fixture by name)
    yield images_app(api)


@OVER_THE_API
@given(query=query_strings(), form=st.sampled_from(["npy", "png", "garbage-npy"]))
@example(query=f"appID={APP}&latency=5&latency=500&accuracy=0.5", form="npy")
def test_any_query_string_is_answered_or_refused_in_the_error_shape_never_500(
    api: Api,  # noqa: F811
    images: dict[str, str],
    query: str,
    form: str,
) -> None:
    bodies = {
        "npy": (npy_bytes(np.zeros((1, *IMAGE_SPEC.shape), np.float32)), "application/x-npy"),
        "png": (png_bytes(picture()), "image/png"),
        "garbage-npy": (
            npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
            "application/x-npy",
        ),
    }
    body, content_type = bodies[form]
    before = api.state()
    response = api.client.post(
        f"/v1/online_query?{query}", content=body, headers={**images, "Content-Type": content_type}
    )
    if response.status_code == 200:
        assert not reference_repeats(query) and form != "garbage-npy"
        return
    assert 400 <= response.status_code < 500, response.text
    error = error_of(response, response.status_code)
    if reference_repeats(query):
        assert response.status_code == 400 and "more than once" in error["message"]
        assert set(error["details"]["parameters"]) == reference_repeats(query)
    assert api.state() == before


@OVER_THE_API
@given(header=npy_headers(), data=st.binary(max_size=64))
def test_any_npy_body_over_the_api_is_answered_or_a_400(
    api: Api,  # noqa: F811
    images: dict[str, str],
    header: str,
    data: bytes,
) -> None:
    response = post(
        api, images, npy_with_header(header, data=data), "application/x-npy", appID=APP, accuracy=0.5
    )
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert error_of(response, 400)["code"] == "invalid_input"


def test_the_reference_parsers_agree_on_a_hand_made_case() -> None:
    """The two readers of repeats, on a case worked out by hand: 'a' twice (once encoded), 'c'
    twice (once without a value)."""
    query = "a=1&b=2&%61=3&c=&c"
    assert reference_repeats(query) == {"a", "c"}
    assert set(repeated_parameters(query.encode())) == {"a", "c"}
