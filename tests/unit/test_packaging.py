"""The distribution: one version, stated once (and in the changelog); the license; and a
client-only install (`pip install modelless[client]`) that holds the Python client and the CLI
without the server's dependencies: no onnxruntime, SciPy or boto3."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import modelless

ROOT = Path(__file__).resolve().parents[2]
# What a client-only install must never pull in: inference, the solver, AWS, the server side.
SERVER_ONLY = {
    "onnxruntime",
    "onnxruntime-gpu",
    "onnx",
    "scipy",
    "boto3",
    "botocore",
    "torch",
    "aws-lambda-powertools",
    "redis",
    "fastapi",
    "uvicorn",
}
# Their import names, for the import check.
SERVER_ONLY_MODULES = {
    "onnxruntime",
    "onnx",
    "scipy",
    "boto3",
    "botocore",
    "torch",
    "aws_lambda_powertools",
    "redis",
    "fastapi",
    "starlette",
    "uvicorn",
    "mangum",
    "PIL",
    "prometheus_client",
}


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_stated_once_and_has_its_changelog_section() -> None:
    project = pyproject()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "modelless.__version__"}
    library = ROOT / "layers" / "modelless" / "modelless"
    stated = [
        path for path in library.rglob("*.py") if re.search(r"^__version__\s*=", path.read_text(), re.M)
    ]
    assert stated == [library / "__init__.py"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", modelless.__version__)
    assert importlib.metadata.version("modelless") == modelless.__version__  # the installed metadata
    sections = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert modelless.__version__ in sections
    assert next(s for s in sections if s != "Unreleased") == modelless.__version__  # the newest


def test_the_license_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "Copyright 2026 The modelless authors" in text
    assert pyproject()["project"]["license"] == "Apache-2.0"


def client_requirements() -> list[Requirement]:
    """The core dependencies and the client extra's, with the project's own extras expanded."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    wanted: list[Requirement] = []
    pending = [Requirement(r) for r in [*project["dependencies"], *extras["client"]]]
    while pending:
        requirement = pending.pop()
        if canonicalize_name(requirement.name) == "modelless":
            pending.extend(Requirement(r) for extra in requirement.extras for r in extras[extra])
        else:
            wanted.append(requirement)
    return wanted


def closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution installing ``requirements`` pulls in, read from the installed
    distributions' metadata (the environment holds them all: it has the server extras too),
    with each dependency's markers and extras as pip would evaluate them here."""
    found: set[str] = set()
    pending = [(r, frozenset(r.extras)) for r in requirements]
    while pending:
        requirement, extras = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in found:
            continue
        found.add(key)
        for raw in importlib.metadata.requires(name) or []:
            dependency = Requirement(raw)
            marker = dependency.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in {"", *extras}):
                dependency.marker = None
                pending.append((dependency, frozenset(dependency.extras)))
    return {key.split("[")[0] for key in found}


def test_a_client_install_pulls_no_server_dependency() -> None:
    installed = closure(client_requirements())
    assert {"numpy", "httpx"} <= installed  # what the client needs is there
    assert installed & SERVER_ONLY == set()


def test_the_client_and_the_cli_import_without_any_server_dependency() -> None:
    """In a child whose imports of the server's packages fail, as in a client-only install."""
    program = f"""
import importlib.abc, sys

BLOCKED = {sorted(SERVER_ONLY_MODULES)!r}

class ClientOnlyInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (a client-only install)", name=name)
        return None

sys.meta_path.insert(0, ClientOnlyInstall())
import modelless.client, modelless.cli
from modelless.client import Client
Client("http://127.0.0.1:9", api_key="k").close()
print("imported")
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("imported")
