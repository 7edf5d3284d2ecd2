"""Fetching a public trace from a registry's archive: the member is taken out and checked."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from bench import public_traces
from bench.public_traces import RegistryTrace, TraceUnavailable, cached_trace, extract_member


def archive_with(member: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


CONTENT = b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,1,1\n0.5,2,2\n"
ARCHIVE = archive_with("pkg-1.0/data/trace.csv", CONTENT)


def trace(archive_sha: str = sha(ARCHIVE), file_sha: str = sha(CONTENT)) -> RegistryTrace:
    url = "https://registry.invalid/pkg-1.0.tar.gz"
    return RegistryTrace("t.csv", url, archive_sha, "pkg-1.0/data/trace.csv", file_sha, "a test trace")


def test_the_member_is_extracted_checked_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[str] = []

    def download(url: str) -> bytes:
        fetched.append(url)
        return ARCHIVE

    monkeypatch.setattr(public_traces, "_download", download)
    path = cached_trace(trace(), tmp_path)
    assert path == tmp_path / "traces" / "t.csv" and path.read_bytes() == CONTENT
    assert cached_trace(trace(), tmp_path) == path and len(fetched) == 1  # the cache is used


@pytest.mark.parametrize("which", ["archive", "file"])
def test_a_checksum_mismatch_is_refused_and_nothing_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    monkeypatch.setattr(public_traces, "_download", lambda url: ARCHIVE)
    wrong = trace(archive_sha="0" * 64) if which == "archive" else trace(file_sha="0" * 64)
    with pytest.raises(TraceUnavailable, match="SHA-256"):
        cached_trace(wrong, tmp_path)
    assert not (tmp_path / "traces" / "t.csv").exists()


def test_a_missing_member_says_so() -> None:
    with pytest.raises(TraceUnavailable, match=r"no pkg-1\.0/other\.csv"):
        extract_member(ARCHIVE, "pkg-1.0/other.csv")
