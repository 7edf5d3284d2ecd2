"""Public arrival traces that are not in ``../shared/traces``, fetched at run time from a package
registry and cached under ``<state>/traces/`` (gitignored): never copied into the repository.

The second real trace (issue 14's "a second real public trace, not the conv trace") is the Azure
LLM inference trace 2023 of the *code* service (``AzureLLMInferenceTrace_code.csv``, 8,819
requests over 57 minutes on 2023-11-16; Azure Public Dataset, CC-BY; cite Patel et al.,
"Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024). The machine
reaches package registries only; the trace ships inside the source archive of ``vidur`` on PyPI
(Microsoft's LLM inference simulator, MLSys 2024) as ``data/processed_traces/splitwise_code.csv``,
its timestamps turned into seconds after the first request (its ``splitwise_conv.csv`` matches
``../shared/traces/azure_llm_conv_2023.csv`` row for row, to 2e-7 s). Both the archive and the
file are checked against their SHA-256 before use.

It is far burstier than the conv trace: 73 % of its seconds have no request, the coefficient of
variation of its gaps is 13 (the conv trace's: 1.1), and its busiest second holds 26 times the
mean.

    python -m bench.public_traces [--state-dir .modelless]   # fetch it, print where it is
"""

from __future__ import annotations

import argparse
import hashlib
import io
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path(".modelless")


@dataclass(frozen=True)
class RegistryTrace:
    """A trace file inside a package's archive on a registry."""

    name: str  # the cached file's name
    url: str
    archive_sha256: str
    member: str  # the file's path inside the archive
    file_sha256: str
    description: str


AZURE_LLM_CODE_2023 = RegistryTrace(
    name="azure_llm_code_2023.csv",
    url=(
        "https://files.pythonhosted.org/packages/28/96/"
        "67e05e80a5c85d041d5719332f69fdfbaf590b7f5a47aa8cedd7c236cac0/vidur-0.0.26.tar.gz"
    ),
    archive_sha256="6b3ca065fc9828fbe634136df0dc02fa2b212f11be5d185457738b7c8a9edb94",
    member="vidur-0.0.26/data/processed_traces/splitwise_code.csv",
    file_sha256="f266b907d109d471c61283ab69771c17ad79a18b33ff6e96aa546346f52767a6",
    description="Azure LLM inference trace 2023, code service (from the PyPI sdist of vidur 0.0.26)",
)


class TraceUnavailable(RuntimeError):
    """The trace could not be fetched or did not match its checksum."""


def cached_trace(trace: RegistryTrace = AZURE_LLM_CODE_2023, state_dir: Path = DEFAULT_STATE_DIR) -> Path:
    """The trace's path under ``state_dir/traces``, fetched (and checked) if it is not there."""
    path = state_dir / "traces" / trace.name
    if path.exists() and _sha256(path.read_bytes()) == trace.file_sha256:
        return path
    archive = _download(trace.url)
    if _sha256(archive) != trace.archive_sha256:
        raise TraceUnavailable(f"{trace.url}: the archive's SHA-256 is not the one expected")
    content = extract_member(archive, trace.member)
    if _sha256(content) != trace.file_sha256:
        raise TraceUnavailable(f"{trace.member}: the file's SHA-256 is not the one expected")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_bytes(content)
    partial.replace(path)
    return path


def extract_member(archive: bytes, member: str) -> bytes:
    """One file of a gzipped tar archive."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        try:
            handle = tar.extractfile(member)
        except KeyError as error:
            raise TraceUnavailable(f"the archive has no {member}") from error
        if handle is None:
            raise TraceUnavailable(f"{member} is not a file in the archive")
        return handle.read()


def _download(url: str, timeout_s: float = 120.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bytes(reply.read())
    except OSError as error:
        raise TraceUnavailable(f"could not fetch {url}: {error}") from error


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    print(cached_trace(state_dir=args.state_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
