"""Checks on what ``sam build`` produced, run by scripts/sam-build:

- every zip function, unzipped, with its layers, stays under Lambda's 250 MB limit;
- every function's handler imports under the Lambda runtime's Python with nothing but its own
  package, its layers and the runtime's boto3 on the path (``python -S``: no site-packages of the
  machine's interpreter), as Lambda imports it: a dependency missing from a function's extra in
  pyproject.toml (infra/build/lambda_package.py builds the packages from them) fails here, not on
  the first invocation in AWS;
- no function and no layer holds benchmark, simulator or local-infrastructure code: no top-level
  ``bench``, ``sim`` or ``infra`` package, nor any file of one (infra/build/shipping.py).

    python -m infra.build.lambda_artifacts .aws-sam/build --python python3.12 --runtime-path DIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.build.shipping import NOT_SHIPPED, unshipped

# "Unzipped size must be smaller than 262144000 bytes": a function and all its layers together.
UNZIPPED_LIMIT_BYTES = 262_144_000
MiB = 1024 * 1024


class _TemplateLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """CloudFormation's short-form tags (!Ref, !Sub, !GetAtt…) as ``{"Fn": value}`` mappings."""


def _tag(loader: _TemplateLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    name = suffix if suffix in {"Ref", "Condition"} else f"Fn::{suffix}"
    return {name: value}


_TemplateLoader.add_multi_constructor("!", _tag)


def load_template(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(path.read_text(), Loader=_TemplateLoader)
    return loaded


@dataclass(frozen=True)
class FunctionArtifact:
    name: str
    handler: str
    code_dir: Path
    layer_dirs: tuple[Path, ...]

    @property
    def code_bytes(self) -> int:
        return tree_bytes(self.code_dir)

    @property
    def layer_bytes(self) -> int:
        return sum(tree_bytes(d) for d in self.layer_dirs)


def tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_size
    return total


def functions_of(build_dir: Path) -> list[FunctionArtifact]:
    """The zip functions of the built template, each with its code and layer directories."""
    template = load_template(build_dir / "template.yaml")
    resources: dict[str, Any] = template["Resources"]
    global_layers = template.get("Globals", {}).get("Function", {}).get("Layers", [])
    found: list[FunctionArtifact] = []
    for name, resource in sorted(resources.items()):
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        properties = resource.get("Properties", {})
        if properties.get("PackageType") == "Image":
            continue
        layers = []
        for layer in [*global_layers, *properties.get("Layers", [])]:
            layer_name = layer.get("Ref") if isinstance(layer, dict) else None
            if layer_name is None or layer_name not in resources:
                continue  # a layer from outside the template (an ARN): not built here
            layers.append(build_dir / str(resources[layer_name]["Properties"]["ContentUri"]))
        found.append(
            FunctionArtifact(
                name=name,
                handler=str(properties["Handler"]),
                code_dir=build_dir / str(properties["CodeUri"]),
                layer_dirs=tuple(layers),
            )
        )
    return found


def unshipped_code(root: Path) -> list[str]:
    """What ``root`` (a function's package, a layer or its ``python/``) holds of bench, sim or
    infra: each such top-level package or module, with the number of files under it."""
    if not root.is_dir():
        return []
    entries = {f"{entry.name}/" if entry.is_dir() else entry.name: entry for entry in root.iterdir()}
    found = []
    for name in unshipped(entries):
        entry = entries[name]
        files = sum(len(f) for _, _, f in os.walk(entry)) if entry.is_dir() else 1
        found.append(f"{entry} ({files} file{'' if files == 1 else 's'})")
    return found


def package_roots(artifacts: list[FunctionArtifact]) -> list[Path]:
    """Every built directory Lambda puts on the path, once: functions' code, layers and their
    ``python/``."""
    roots: list[Path] = []
    for artifact in artifacts:
        for root in (artifact.code_dir, *artifact.layer_dirs, *(d / "python" for d in artifact.layer_dirs)):
            if root not in roots:
                roots.append(root)
    return roots


IMPORT_CHECK = """
import importlib, sys, time
started = time.perf_counter()
module, _, attribute = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module), attribute)
assert callable(handler), f"{sys.argv[1]} is not callable"
print(f"{(time.perf_counter() - started) * 1000:.0f}")
"""


def import_handler(artifact: FunctionArtifact, python: str, runtime_path: Path | None) -> tuple[bool, str]:
    """Import the handler as Lambda would: its code first, then its layers' ``python/``, then the
    runtime's own packages (boto3). Returns (ok, import ms or the error's last lines)."""
    python = os.path.abspath(python) if os.sep in python else python  # it runs in a scratch directory
    path = [str(artifact.code_dir.resolve())]
    path += [str((d / "python").resolve()) for d in artifact.layer_dirs]
    if runtime_path is not None:
        path.append(str(runtime_path.resolve()))
    with tempfile.TemporaryDirectory(prefix="modelless-import-") as scratch:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.pathsep.join(path),
            "HOME": scratch,
            "LAMBDA_TASK_ROOT": str(artifact.code_dir),
            "AWS_LAMBDA_FUNCTION_NAME": artifact.name,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "POWERTOOLS_METRICS_NAMESPACE": "Modelless",
            "PYTHONDONTWRITEBYTECODE": "1",  # Lambda's /var/task and /opt are read-only
            # Stores that need no server: the check is about packages, not connections.
            "MODELLESS_METADATA_URL": "memory://",
            "MODELLESS_REPOSITORY_URL": str(Path(scratch) / "repo"),
            "MODELLESS_CACHE_DIR": str(Path(scratch) / "cache"),
        }
        completed = subprocess.run(
            [python, "-S", "-c", IMPORT_CHECK, artifact.handler],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if completed.returncode != 0:
        lines = (completed.stderr.strip() or completed.stdout.strip() or "no output").splitlines()
        return False, " | ".join(lines[-3:])
    return True, completed.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("build_dir", type=Path, nargs="?", default=Path(".aws-sam/build"))
    parser.add_argument("--python", help="the Lambda runtime's Python (python3.12) for the import check")
    parser.add_argument("--runtime-path", type=Path, help="packages the Lambda runtime provides (boto3)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    artifacts = functions_of(args.build_dir)
    if not artifacts:
        print(f"no functions in {args.build_dir / 'template.yaml'}", file=sys.stderr)
        return 1
    failures: list[str] = []
    print(f"{'function':<16} {'code MB':>8} {'layers MB':>9} {'total MB':>8}  (limit 250)  import")
    for artifact in artifacts:
        code, layers = artifact.code_bytes, artifact.layer_bytes
        total = code + layers
        imported = "not checked"
        if args.python:
            ok, detail = import_handler(artifact, args.python, args.runtime_path)
            imported = f"{detail} ms" if ok else f"FAILED: {detail}"
            if not ok:
                failures.append(f"{artifact.name}: handler {artifact.handler} does not import: {detail}")
        print(
            f"{artifact.name:<16} {code / MiB:8.1f} {layers / MiB:9.1f} {total / MiB:8.1f}"
            f"  {'ok' if total < UNZIPPED_LIMIT_BYTES else 'OVER':<11}  {imported}"
        )
        if total >= UNZIPPED_LIMIT_BYTES:
            failures.append(
                f"{artifact.name}: {total} bytes unzipped with its layers; Lambda's limit is "
                f"{UNZIPPED_LIMIT_BYTES} (make it a container image, or move dependencies out)"
            )
    stray = [found for root in package_roots(artifacts) for found in unshipped_code(root)]
    for found in stray:
        failures.append(
            f"{found}: {'/'.join(NOT_SHIPPED)} code never ships (benchmarks, simulator, local "
            "infrastructure); infra/build/lambda_package.py copies only the library, variants/ and "
            "the handler directories"
        )
    if not stray:
        print(f"no {', '.join(NOT_SHIPPED)} code in any function or layer")
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    print(f"checked {len(artifacts)} functions in {time.perf_counter() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
