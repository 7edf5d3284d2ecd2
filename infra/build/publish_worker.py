"""Publishes what the worker pools' instances install at boot, under ``deploy/`` of the model
bucket (template.yaml's user data downloads ``deploy/worker-boot.sh`` and runs it):

- ``deploy/wheels/modelless-*.whl``: the library (modelless, with the worker server,
  ``python -m modelless.worker``) as a wheel, built from a clean copy of its sources and of
  pyproject.toml (which names the ``worker`` extra the instances install); earlier wheels are
  removed. It never holds bench/, sim/ or infra/ (build_wheel checks);
- ``deploy/constraints.txt``: the versions that extra is installed at, the same pins as .venv's
  and the Lambda packages';
- ``deploy/worker-boot.sh``, ``deploy/worker-lifecycle.sh`` and ``deploy/systemd/*.service``
  (infra/aws/): the boot script, the scale-in drain, and the two systemd units.

    python -m infra.build.publish_worker --stack modelless     # the bucket from the stack's outputs
    python -m infra.build.publish_worker --bucket NAME

Instances read the package when they boot: instances already running keep what they installed
(replace them with an instance refresh, docs/DEPLOY.md).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import boto3

from infra.build.shipping import NOT_SHIPPED, unshipped

ROOT = Path(__file__).resolve().parents[2]
AWS_DIR = ROOT / "infra" / "aws"
DEPLOY_PREFIX = "deploy/"
WHEELS_PREFIX = f"{DEPLOY_PREFIX}wheels/"
# What the wheel is built from: pyproject.toml's packages found in this copy, modelless alone (the
# worker needs no variants/: it never generates variants), and the LICENSE and README it names.
WHEEL_SOURCES = ("pyproject.toml", "LICENSE", "README.md", "layers/modelless/modelless")
CONSTRAINTS = ROOT / "constraints.txt"


class WheelError(RuntimeError):
    """The worker's wheel holds what never ships."""


def check_wheel(wheel: Path) -> None:
    """Raises WheelError if the wheel holds any file of a top-level bench, sim or infra package."""
    with zipfile.ZipFile(wheel) as archive:
        stray = unshipped(archive.namelist())
    if stray:
        listed = ", ".join(stray[:5]) + (" …" if len(stray) > 5 else "")
        raise WheelError(
            f"{wheel.name} holds {'/'.join(NOT_SHIPPED)} code, which never ships to the workers: "
            f"{listed} (WHEEL_SOURCES: {', '.join(WHEEL_SOURCES)})"
        )


def build_wheel(out_dir: Path) -> Path:
    """The library's wheel, built from a fresh copy of its sources (a stale build/ directory in the
    working tree can never leak old files into it), without dependencies; checked to hold no
    bench, sim or infra code (a stray wheel is removed, and WheelError raised)."""
    with tempfile.TemporaryDirectory(prefix="modelless-wheel-") as scratch:
        source = Path(scratch) / "src"
        for relative in WHEEL_SOURCES:
            origin, target = ROOT / relative, source / relative
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--no-build-isolation", "--wheel-dir", str(out_dir), str(source),
            ],
            check=True,
        )  # fmt: skip
    [wheel] = sorted(out_dir.glob("modelless-*.whl"))
    try:
        check_wheel(wheel)
    except WheelError:
        wheel.unlink()
        raise
    return wheel


def deploy_files(wheel: Path) -> dict[str, Path]:
    """Object key -> local file, for everything an instance downloads."""
    files = {
        f"{DEPLOY_PREFIX}worker-boot.sh": AWS_DIR / "worker-boot.sh",
        f"{DEPLOY_PREFIX}worker-lifecycle.sh": AWS_DIR / "worker-lifecycle.sh",
        f"{DEPLOY_PREFIX}constraints.txt": CONSTRAINTS,
        f"{WHEELS_PREFIX}{wheel.name}": wheel,
    }
    for unit in sorted((AWS_DIR / "systemd").glob("*.service")):
        files[f"{DEPLOY_PREFIX}systemd/{unit.name}"] = unit
    return files


def publish(s3: Any, bucket: str, files: dict[str, Path]) -> list[str]:
    """Upload ``files`` and remove wheels that are not among them (an instance installs every
    wheel under deploy/wheels/). Returns the keys written."""
    listed = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=WHEELS_PREFIX)
    stale = [item["Key"] for page in listed for item in page.get("Contents", []) if item["Key"] not in files]
    for key in stale:
        s3.delete_object(Bucket=bucket, Key=key)
    for key, path in sorted(files.items()):
        s3.upload_file(str(path), bucket, key)
    return sorted(files)


def stack_bucket(cloudformation: Any, stack: str) -> str:
    """The model bucket of a deployed stack (its ModelBucketName output)."""
    [described] = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    for output in described.get("Outputs", []):
        if output["OutputKey"] == "ModelBucketName":
            return str(output["OutputValue"])
    raise SystemExit(f"stack {stack!r} has no ModelBucketName output: is it a modelless stack?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stack", help="the deployed stack's name (its model bucket is found from its outputs)"
    )
    where.add_argument("--bucket", help="the model bucket's name")
    parser.add_argument("--region", help="AWS region (default: the AWS CLI's configuration)")
    args = parser.parse_args(argv)

    session = boto3.Session(region_name=args.region)
    bucket = args.bucket or stack_bucket(session.client("cloudformation"), args.stack)
    with tempfile.TemporaryDirectory(prefix="modelless-publish-") as scratch:
        wheel = build_wheel(Path(scratch))
        keys = publish(session.client("s3"), bucket, deploy_files(wheel))
    for key in keys:
        print(f"s3://{bucket}/{key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
