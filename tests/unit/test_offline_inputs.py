"""Offline inputs into the model's input (arrays, PNG/JPEG images), output keys, and the worker
batcher's background lane that offline runs take."""

from __future__ import annotations

import io
import re
import threading
import time
from typing import Any

import numpy as np
import pytest

from modelless.exceptions import InvalidJobError, OfflineInputError
from modelless.offline.decoding import decode_input, image_layout
from modelless.offline.jobs import S3Path, job_id_for_object, output_key, relative_key
from modelless.serving.batching import VariantBatcher
from tests.offline_kit import digit_inputs, image_bytes, model_record, npy, npz
from tests.waiting import scaled, wait_for

MODEL = model_record()  # takes [1, 8, 8]


def test_npy_single_input_and_batches() -> None:
    one = digit_inputs(1)[0]
    assert decode_input("a.npy", npy(one), MODEL, 64).shape == (1, 1, 8, 8)
    many = decode_input("b.npy", npy(digit_inputs(5)), MODEL, 64)
    np.testing.assert_array_equal(many, digit_inputs(5))
    assert many.dtype == np.float32


def test_npz_takes_inputs_or_its_only_array() -> None:
    rows = digit_inputs(3)
    assert decode_input("a.npz", npz(inputs=rows, labels=np.arange(3)), MODEL, 64).shape == (3, 1, 8, 8)
    assert decode_input("b.NPZ", npz(x=rows), MODEL, 64).shape == (3, 1, 8, 8)
    with pytest.raises(OfflineInputError, match="name the array 'inputs'"):
        decode_input("c.npz", npz(x=rows, y=rows), MODEL, 64)


@pytest.mark.parametrize(
    ("key", "data", "message"),
    [
        ("a.npy", b"not numpy", "the .npy file is not a readable .npy array"),
        ("a.npz", b"PK\x03\x04 broken zip", "not a readable .npz file"),
        ("a.npy", npy(np.zeros((2, 8, 8), dtype=np.float32)), "shape [2, 8, 8]"),
        ("a.npy", npy(np.array(["x", "y"])), "regular numeric array"),
        ("a.npy", npy(np.full((1, 1, 8, 8), np.nan, dtype=np.float32)), "NaN"),
        ("a.npy", npy(np.zeros((70, 1, 8, 8), dtype=np.float32)), "exceeds the limit of 64"),
        ("a.png", b"\x89PNG\r\n\x1a\n truncated", "not a decodable image"),
        ("a.jpg", b"GIF89a not a jpeg", "not a decodable image"),
        ("a.csv", b"1,2,3", "unsupported input type '.csv'"),
        ("noext", b"1,2,3", "(no extension)"),
    ],
)
def test_inputs_that_cannot_be_used_say_why(key: str, data: bytes, message: str) -> None:
    with pytest.raises(OfflineInputError, match=re.escape(message)):
        decode_input(key, data, MODEL, 64)


def test_a_deflated_npz_input_past_what_its_rows_could_hold_is_refused_before_it_is_inflated() -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, inputs=np.zeros((100_000, 1, 8, 8), np.float32))
    bomb = buffer.getvalue()  # 25.6 MB of zeros in a few KB
    assert len(bomb) < 100_000
    with pytest.raises(OfflineInputError, match=r"\.npz array 'inputs' is 25600128 bytes unpacked; 64 rows"):
        decode_input("bomb.npz", bomb, MODEL, 64)


def test_an_npy_input_whose_header_lies_is_refused_before_anything_is_allocated() -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 1, 8, 8)}
    )
    with pytest.raises(OfflineInputError, match="declares 256000000000000 bytes of array data"):
        decode_input("liar.npy", header.getvalue() + b"\0" * 64, MODEL, 64)


def test_a_gif_named_png_is_refused_by_format() -> None:
    from io import BytesIO

    from PIL import Image

    buffer = BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="GIF")
    with pytest.raises(OfflineInputError, match="not PNG or JPEG"):
        decode_input("a.png", buffer.getvalue(), MODEL, 64)


def test_png_is_resized_to_the_model_and_scaled_to_unit_range() -> None:
    digit = digit_inputs(1, start=3)[0, 0]
    big = np.kron(digit, np.ones((4, 4)))  # 32x32, each pixel a 4x4 block
    decoded = decode_input("seven.png", image_bytes(big), MODEL, 64)
    assert decoded.shape == (1, 1, 8, 8) and decoded.dtype == np.float32
    assert decoded.min() >= 0.0 and decoded.max() <= 1.0
    np.testing.assert_allclose(decoded[0, 0], digit, atol=0.01)


def test_jpeg_and_rgb_images_are_converted_to_the_models_channels() -> None:
    digit = digit_inputs(1, start=5)[0, 0]
    decoded = decode_input("five.jpeg", image_bytes(digit, fmt="JPEG", mode="RGB"), MODEL, 64)
    assert decoded.shape == (1, 1, 8, 8)
    rgb_model = model_record()
    rgb_model = type(rgb_model)(**{**rgb_model.__dict__, "input_shape": [6, 6, 3]})
    assert decode_input("five.png", image_bytes(digit), rgb_model, 64).shape == (1, 6, 6, 3)


def test_image_layouts() -> None:
    assert image_layout([3, 224, 224]) == ("chw", 3, 224, 224)
    assert image_layout([224, 224, 3]) == ("hwc", 3, 224, 224)
    assert image_layout([28, 28]) == ("hw", 1, 28, 28)
    with pytest.raises(OfflineInputError, match="not images"):
        image_layout([64])


def test_output_keys_are_derived_from_input_keys() -> None:
    assert output_key("in/", "out/", "in/a/b.png") == "out/a/b.png.result.json"
    # An input path naming one object: its base name.
    assert relative_key("in/a.npy", "in/a.npy") == "a.npy"
    assert output_key("in", "out/", "in/x.npy") == "out/x.npy.result.json"


def test_job_ids_from_objects_are_stable_per_upload() -> None:
    first = job_id_for_object("b", "jobs/a.job.json", '"etag-1"')
    assert first == job_id_for_object("b", "jobs/a.job.json", "etag-1")
    assert first != job_id_for_object("b", "jobs/a.job.json", "etag-2")  # uploaded again
    assert first.startswith("job-")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("bucket/prefix", "must be an s3://bucket/prefix URL"),
        ("s3:///prefix", "names no bucket"),
        ("s3://Bad_Bucket!/x", "not a valid bucket name"),
    ],
)
def test_bad_s3_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        S3Path.parse(url, "inputPath")


def test_prefixes_cover_by_plain_string_matching_as_s3_lists() -> None:
    assert S3Path("b", "in").covers(S3Path("b", "in-out/"))
    assert S3Path("b", "").covers(S3Path("b", "x/"))
    assert not S3Path("b", "in/").covers(S3Path("other", "in/x"))
    assert not S3Path("b", "in/").covers(S3Path("b", "out/"))


def test_background_work_runs_only_when_no_online_request_waits() -> None:
    """The batcher's background lane: an offline run never goes ahead of a queued online
    request, never shares a batch with one, and leaves the AIMD limit alone."""
    order: list[str] = []
    gate = threading.Event()

    def model(inputs: np.ndarray) -> np.ndarray:
        order.append("offline" if inputs.shape[0] == 5 else f"online:{inputs.shape[0]}")
        if len(order) == 1:
            gate.wait(scaled(5))  # hold the first online run while others queue behind it
        return inputs.reshape(len(inputs), -1)[:, :2]

    batcher = VariantBatcher("v", model, lambda rows: 0.1, max_limit=8)
    try:
        results: dict[str, Any] = {}
        first = threading.Thread(
            target=lambda: results.setdefault(
                "a", batcher.submit(np.ones((1, 4)), time.monotonic() + scaled(5))
            )
        )
        first.start()
        wait_for(lambda: bool(order), 5.0, "the first online run to start", interval_s=0.001)
        offline = threading.Thread(
            target=lambda: results.setdefault("off", batcher.submit_background(np.ones((5, 4))))
        )
        offline.start()
        wait_for(lambda: len(batcher._background) == 1, 5.0, "the offline run to queue", interval_s=0.001)
        offline_queued_at = time.monotonic()
        online = [
            threading.Thread(
                target=lambda i=i: results.setdefault(
                    f"o{i}", batcher.submit(np.ones((1, 4)), time.monotonic() + scaled(5))
                )
            )
            for i in range(3)
        ]
        for thread in online:
            thread.start()
        wait_for(lambda: batcher.queued == 3, 5.0, "the online requests to queue", interval_s=0.001)
        limit_before = batcher.controller.limit
        held_ms = (time.monotonic() - offline_queued_at) * 1000  # the online runs it waited behind, at least
        gate.set()
        for thread in [first, offline, *online]:
            thread.join(scaled(5))
    finally:
        batcher.close()
    # The queued online requests ran (as one batch) before the offline run that queued earlier.
    assert order[-1] == "offline" and "offline" not in order[:-1]
    assert sum(int(o.split(":")[1]) for o in order[:-1]) == 4
    background = results["off"]
    assert background.requests == 1 and background.batch == 5
    assert background.queue_ms >= held_ms  # it waited for an idle moment
    assert batcher.stats()["background_runs"] == 1 and batcher.stats()["background_rows"] == 5
    assert batcher.stats()["rows"] == 4  # online rows only
    assert batcher.controller.limit >= limit_before
