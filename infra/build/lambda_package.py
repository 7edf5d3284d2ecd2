"""Builds the Lambda layer's and each function's package for ``sam build``: template.yaml's
resources say ``BuildMethod: makefile``, and infra/build/Makefile's ``build-<LogicalId>`` targets
run this with the directory SAM gives them (``ARTIFACTS_DIR``).

The dependencies are pyproject.toml's (its core and ``lambda-*`` extras), at the versions
constraints.txt pins, installed from manylinux x86_64 wheels for CPython 3.12 (the ``python3.12``
runtime) whatever machine builds them:

- ``layer``: ``python/`` holds the library (layers/modelless/modelless), variants/, the core
  dependencies and the ``lambda-layer`` extra's;
- a function (``gateway``, ``cpu_worker``, …): its handler directory, functions/NAME/, and the
  ``lambda-NAME`` extra's dependencies (``_`` read as ``-``) less what the layer holds at the same
  version: Lambda's 250 MB limit counts a function and its layers together.

Nothing the Lambda runtime provides (boto3) goes in, nor anything of bench/, sim/ or infra/
(infra/build/lambda_artifacts.py checks what was built). Packages are kept under
.aws-sam/modelless-packages/, keyed by a hash of everything they are made from, so that a rebuild
whose inputs did not change is a copy.

    python3.12 -m infra.build.lambda_package layer ARTIFACTS_DIR
    python3.12 -m infra.build.lambda_package gateway ARTIFACTS_DIR
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints.txt"
LIBRARY = ROOT / "layers" / "modelless" / "modelless"
VARIANTS = ROOT / "variants"
FUNCTIONS = ROOT / "functions"
CACHE = ROOT / ".aws-sam" / "modelless-packages"
PROJECT = "modelless"
LAYER = "layer"
LAYER_EXTRA = "lambda-layer"

# The python3.12 runtime: CPython 3.12 on Amazon Linux 2023 (glibc 2.34), x86_64 (template.yaml's
# Architectures). pip takes manylinux_2_Y tags only as listed, so every one up to 2.34 is.
PYTHON_VERSION = "3.12"
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(34, 16, -1)), "manylinux2014_x86_64")
# What the runtime provides; the functions use its copy (as they did with SAM's python builder).
RUNTIME_PROVIDED = frozenset({"boto3", "botocore", "s3transfer"})
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc")


class PackageError(RuntimeError):
    """The package cannot be built as asked (an unknown function, an unpinned dependency)."""


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> tuple[str, list[str]]:
    """(name, extras) of a requirement string such as ``redis[hiredis]>=5.0``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    if match is None:
        raise PackageError(f"cannot read the requirement {requirement!r} in pyproject.toml")
    extras = [extra.strip() for extra in (match.group(2) or "").split(",") if extra.strip()]
    return match.group(1), extras


def requirements(project: dict[str, Any], extras: Iterable[str]) -> list[str]:
    """The core dependencies and those of ``extras``, with the project's own extras that an extra
    names (``modelless[shared]``) expanded, in order and once each."""
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    found: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()

    def expand(extra: str) -> None:
        if extra in seen:
            return
        if extra not in optional:
            known = ", ".join(sorted(optional))
            raise PackageError(f"pyproject.toml has no extra {extra!r} (it has: {known})")
        seen.add(extra)
        for requirement in optional[extra]:
            name, named_extras = requirement_name(requirement)
            if canonical(name) == PROJECT:
                for named in named_extras:
                    expand(named)
            elif requirement not in found:
                found.append(requirement)

    for extra in extras:
        expand(extra)
    return found


def read_pins(path: Path) -> dict[str, str]:
    """constraints.txt: canonical name -> exact version."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*([^\s;]+)", line)
        if match is None:
            raise PackageError(f"{path.name}:{number}: {raw!r} is not an exact pin (name==version)")
        pins[canonical(match.group(1))] = match.group(2)
    return pins


def check_pinned(names: Iterable[str], pins: dict[str, str], what: str) -> None:
    missing = sorted({canonical(name) for name in names} - set(pins))
    if missing:
        raise PackageError(
            f"constraints.txt pins no version of {', '.join(missing)} ({what}); add a name==version "
            "line for each (the version .venv has: .venv/bin/pip freeze)"
        )


def pip(*arguments: str) -> None:
    """``python -m pip`` for the runtime's platform, quiet but for errors (pip's configured extra
    indexes print a warning per package)."""
    platform = [option for tag in PLATFORMS for option in ("--platform", tag)]
    completed = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION,
            *platform, *arguments,
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        output = (completed.stdout + completed.stderr).splitlines()
        errors = "\n".join(line for line in output if not line.startswith("WARNING: Location 'file://"))
        raise PackageError(f"pip install {' '.join(arguments[-3:])}… failed:\n{errors}")


def resolve(wanted: list[str]) -> dict[str, str]:
    """What pip installs for ``wanted`` under constraints.txt: canonical name -> version."""
    with tempfile.TemporaryDirectory(prefix="modelless-resolve-") as scratch:
        report = Path(scratch) / "report.json"
        pip(
            "--dry-run", "--ignore-installed", "--target", str(Path(scratch) / "target"),
            "--report", str(report), "--constraint", str(CONSTRAINTS), *wanted,
        )  # fmt: skip
        installed = json.loads(report.read_text())["install"]
    return {canonical(item["metadata"]["name"]): str(item["metadata"]["version"]) for item in installed}


def install(distributions: dict[str, str], target: Path) -> None:
    """Exactly these distributions (no dependencies: they are the resolution) into ``target``,
    unpacked as Lambda imports them: no compiled bytecode, no console scripts."""
    if distributions:
        pinned = [f"{name}=={version}" for name, version in sorted(distributions.items())]
        pip("--no-deps", "--no-compile", "--target", str(target), *pinned)
    shutil.rmtree(target / "bin", ignore_errors=True)


def function_extra(function: str) -> str:
    return f"lambda-{function.replace('_', '-')}"


def dependencies(name: str, project: dict[str, Any], pins: dict[str, str]) -> dict[str, str]:
    """The distributions the package ``name`` (``layer`` or a function) installs."""
    layer_wanted = requirements(project, [LAYER_EXTRA])
    wanted = layer_wanted if name == LAYER else requirements(project, [LAYER_EXTRA, function_extra(name)])
    check_pinned((requirement_name(r)[0] for r in wanted), pins, f"pyproject.toml, for the {name} package")
    resolved = resolve(wanted)
    check_pinned(resolved, pins, f"pulled in by the {name} package's dependencies")
    if name != LAYER:
        in_layer = resolve(layer_wanted)
        resolved = {dist: version for dist, version in resolved.items() if in_layer.get(dist) != version}
    return {dist: version for dist, version in resolved.items() if dist not in RUNTIME_PROVIDED}


def sources(name: str) -> dict[str, Path]:
    """Where in the package (relative) -> the directory of this repository copied there."""
    if name == LAYER:
        return {"python/modelless": LIBRARY, "python/variants": VARIANTS}
    return {".": FUNCTIONS / name}


def cache_key(name: str) -> str:
    """A hash of everything the package is made from: this builder, pyproject.toml,
    constraints.txt, the runtime's tags and the files copied in."""
    digest = hashlib.sha256()
    for part in (Path(__file__).read_bytes(), PYPROJECT.read_bytes(), CONSTRAINTS.read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    digest.update(json.dumps([name, PYTHON_VERSION, PLATFORMS, sorted(RUNTIME_PROVIDED)]).encode())
    for relative, origin in sorted(sources(name).items()):
        for directory, subdirectories, files in os.walk(origin):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for file in sorted(f for f in files if not f.endswith(".pyc")):
                path = Path(directory, file)
                digest.update(f"{relative}/{path.relative_to(origin)}".encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def build(name: str, out: Path) -> None:
    """The package ``name`` built into ``out`` (made if missing)."""
    if name != LAYER and not (FUNCTIONS / name).is_dir():
        known = sorted(p.name for p in FUNCTIONS.iterdir() if (p / "app.py").is_file())
        raise PackageError(f"no function {name!r} under functions/ (there are: {', '.join(known)})")
    project: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = read_pins(CONSTRAINTS)
    key = cache_key(name)
    CACHE.mkdir(parents=True, exist_ok=True)
    # sam build --parallel builds functions that share a package (CpuWorker1769, CpuWorker3538)
    # at once: one builds it, the other waits and copies it.
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = CACHE / f"{name}-{key}"
        if cached.is_dir():
            print(f"{name}: unchanged since its last build ({key}): copied", flush=True)
        else:
            scratch = Path(tempfile.mkdtemp(prefix=f".{name}-{key}.", dir=CACHE))
            scratch.chmod(0o755)  # mkdtemp's 0700 would be copied onto the package's root
            try:
                distributions = dependencies(name, project, pins)
                for relative, origin in sources(name).items():
                    shutil.copytree(origin, scratch / relative, ignore=SKIPPED, dirs_exist_ok=True)
                install(distributions, scratch / "python" if name == LAYER else scratch)
                for stale in CACHE.glob(f"{name}-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                scratch.rename(cached)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            listed = ", ".join(f"{dist}=={version}" for dist, version in sorted(distributions.items()))
            print(f"{name}: built with {listed or 'no dependencies of its own'}", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cached, out, dirs_exist_ok=True, symlinks=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("package", help=f"{LAYER!r}, or a function's directory under functions/")
    parser.add_argument("artifacts_dir", type=Path, help="where the package goes (sam build's ARTIFACTS_DIR)")
    args = parser.parse_args(argv)
    try:
        build(args.package, args.artifacts_dir)
    except PackageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
