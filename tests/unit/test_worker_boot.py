"""The worker instances' boot package (infra/aws/) against what it meets on an instance: the
settings template.yaml's user data writes, the flags modelless.worker.server accepts, the port the
worker security group opens, the lifecycle hook the groups carry, and the keys
scripts/publish-worker uploads. No AWS, no instance: the scripts are parsed and checked here, and
the drain script is run for real in tests/functional/test_worker_lifecycle.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.build.lambda_artifacts import load_template
from infra.build.publish_worker import WheelError, check_wheel, deploy_files
from modelless import __version__
from modelless.tuning import POLICIES

ROOT = Path(__file__).resolve().parents[2]
AWS_DIR = ROOT / "infra" / "aws"
SCRIPTS = sorted(AWS_DIR.glob("*.sh"))
WORKER_UNIT = AWS_DIR / "systemd" / "modelless-worker.service"
LIFECYCLE_UNIT = AWS_DIR / "systemd" / "modelless-lifecycle.service"
POOLS = {"cpu": "Cpu", "gpu": "Gpu", "accel": "Accel"}


def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def user_data(pool: str) -> str:
    data = template()["Resources"][f"{POOLS[pool]}LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text: str = data["UserData"]["Fn::Base64"]["Fn::Sub"]
    return text


def heredoc(text: str, opener: str, end: str) -> dict[str, str]:
    """NAME=value lines of the here-document that ``opener`` starts and ``end`` closes."""
    body = text.split(opener, 1)[1].split(f"\n{end}\n", 1)[0]
    pairs = (line.strip().split("=", 1) for line in body.splitlines() if "=" in line)
    return {name: value for name, value in pairs}


def user_data_settings(pool: str) -> dict[str, str]:
    return heredoc(user_data(pool), "cat > /etc/modelless-worker.env <<'EOF'\n", "EOF")


def instance_settings() -> dict[str, str]:
    boot = (AWS_DIR / "worker-boot.sh").read_text()
    return heredoc(boot, 'cat > "$INSTANCE_ENV_FILE" <<INSTANCE\n', "INSTANCE")


def exec_start(unit: Path) -> list[str]:
    text = unit.read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=").split()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_scripts_parse(script: Path) -> None:
    completed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr


def test_the_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or str(ROOT / ".venv-sam" / "bin" / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (scripts/sam-build installs it and runs it too)")
    completed = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout


def test_the_worker_service_uses_only_flags_the_worker_server_accepts() -> None:
    accepted = set(
        re.findall(
            r"--[a-z][a-z-]+",
            subprocess.run(
                [sys.executable, "-m", "modelless.worker", "--help"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout,
        )
    )
    command = exec_start(WORKER_UNIT)
    assert command[:3] == ["/opt/modelless/venv/bin/python", "-m", "modelless.worker"]
    flags = [token for token in command if token.startswith("--")]
    assert set(flags) <= accepted, f"flags modelless.worker.server does not take: {set(flags) - accepted}"
    # Bound on every interface, reached at the instance's private IP, as its instance id.
    arguments = dict(zip(command[3::2], command[4::2], strict=True))
    assert arguments["--host"] == "0.0.0.0"
    assert arguments["--advertise-host"] == "${MODELLESS_ADVERTISE_HOST}"
    assert arguments["--worker-id"] == "${MODELLESS_WORKER_ID}"
    assert instance_settings()["MODELLESS_WORKER_ID"] == "$INSTANCE_ID"
    assert instance_settings()["MODELLESS_ADVERTISE_HOST"] == "$PRIVATE_IP"


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_every_setting_the_services_read_is_written_at_boot(pool: str) -> None:
    defined = set(user_data_settings(pool)) | set(instance_settings())
    for unit in (WORKER_UNIT, LIFECYCLE_UNIT):
        used = set(re.findall(r"\$\{(\w+)\}", " ".join(exec_start(unit))))
        assert used <= defined, f"{unit.name} reads {used - defined}, which nothing writes"
    for script in SCRIPTS:
        required = set(re.findall(r"\$\{(MODELLESS_\w+):\?\}", script.read_text()))
        assert required <= defined, f"{script.name} requires {required - defined}"
    assert user_data_settings(pool)["MODELLESS_POOL"] == pool
    assert user_data_settings(pool)["MODELLESS_DEPLOY_URL"] == "s3://${ModelBucket}/deploy"


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_every_pool_launches_its_workers_tuning_as_the_template_says(pool: str) -> None:
    parameter = template()["Parameters"]["WorkerTuning"]
    assert parameter["Default"] == "region"  # as the local stack's workers (infra/local/stack.py)
    assert set(parameter["AllowedValues"]) == {"off", *POLICIES}  # what --tune takes
    assert user_data_settings(pool)["MODELLESS_WORKER_TUNING"] == "${WorkerTuning}"
    command = exec_start(WORKER_UNIT)
    assert command[command.index("--tune") + 1] == "${MODELLESS_WORKER_TUNING}"


def test_the_worker_port_is_the_one_the_security_group_opens() -> None:
    [ingress] = template()["Resources"]["WorkerSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert instance_settings()["MODELLESS_WORKER_PORT"] == "$WORKER_PORT"
    [port] = map(int, re.findall(r"^WORKER_PORT=(\d+)$", (AWS_DIR / "worker-boot.sh").read_text(), re.M))
    assert ingress["FromPort"] == ingress["ToPort"] == port
    assert "--port" in exec_start(WORKER_UNIT)


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_each_pool_drains_under_the_lifecycle_hook_its_instances_complete(pool: str) -> None:
    group = template()["Resources"][f"{POOLS[pool]}Pool"]["Properties"]
    [hook] = group["LifecycleHookSpecificationList"]
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hook["DefaultResult"] == "CONTINUE"  # a drain that never completes still ends
    assert user_data_settings(pool)["MODELLESS_LIFECYCLE_HOOK"] == hook["LifecycleHookName"]
    # The instances may complete it, on these groups only.
    policy = template()["Resources"]["WorkerScaleInPolicy"]["Properties"]["PolicyDocument"]
    [complete] = [s for s in policy["Statement"] if s["Action"] == "autoscaling:CompleteLifecycleAction"]
    assert any(f"${{{POOLS[pool]}Pool}}" in r["Fn::Sub"] for r in complete["Resource"])


def test_stopping_the_worker_drains_it() -> None:
    unit = WORKER_UNIT.read_text()
    assert "KillSignal=SIGTERM" in unit  # modelless.worker.server drains on SIGTERM
    assert "KillMode=mixed" in unit  # SIGTERM to the worker itself; SIGKILL only at the timeout
    lifecycle = (AWS_DIR / "worker-lifecycle.sh").read_text()
    stop = lifecycle.index("systemctl stop modelless-worker.service")
    complete = lifecycle.index("aws autoscaling complete-lifecycle-action")
    assert stop < complete, "the termination may go on only after the worker drained"


def test_the_boot_script_installs_what_is_published() -> None:
    boot = (AWS_DIR / "worker-boot.sh").read_text()
    files = deploy_files(Path(f"modelless-{__version__}-py3-none-any.whl"))
    published = set(files)
    # The user data fetches the boot script where scripts/publish-worker puts it.
    for pool in POOLS:
        assert "s3://${ModelBucket}/deploy/worker-boot.sh" in user_data(pool)
    assert "deploy/worker-boot.sh" in published
    for unit in (WORKER_UNIT, LIFECYCLE_UNIT):
        assert f"deploy/systemd/{unit.name}" in published
        assert f'"$HOME_DIR/deploy/systemd/{unit.name}"' in boot
    assert "deploy/worker-lifecycle.sh" in published
    assert exec_start(LIFECYCLE_UNIT) == ["/opt/modelless/worker-lifecycle"]
    assert 'install -m 0755 "$HOME_DIR/deploy/worker-lifecycle.sh" "$HOME_DIR/worker-lifecycle"' in boot
    assert "HOME_DIR=/opt/modelless" in boot
    # The wheel's worker extra, at the pins published beside it (the same file as .venv's).
    assert files["deploy/constraints.txt"] == ROOT / "constraints.txt"
    assert 'CONSTRAINTS="$HOME_DIR/deploy/constraints.txt"' in boot
    assert '"$VENV/bin/pip" install --quiet --constraint "$CONSTRAINTS" "${wheels[@]/%/[worker]}"' in boot


def test_the_worker_extra_names_what_the_worker_imports() -> None:
    """pyproject.toml's worker extra, which the boot script installs: onnxruntime, the S3 model
    repository (boto3), the Redis reports and the settings, besides the core (numpy, httpx)."""
    import tomllib

    from infra.build.lambda_package import canonical, requirement_name, requirements

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonical(requirement_name(r)[0]) for r in requirements(project, ["worker"])}
    assert {"numpy", "httpx", "onnxruntime", "boto3", "redis", "aws-lambda-powertools"} <= names
    assert {"pydantic", "pydantic-settings"} <= names
    assert not names & {"fastapi", "scipy", "torch", "matplotlib", "uvicorn"}


def test_every_dependency_pyproject_names_is_pinned_in_the_published_constraints() -> None:
    """constraints.txt (published beside the wheel; also .venv's and the Lambda packages' pins)
    pins every dependency of every extra to one exact version."""
    import tomllib

    from infra.build.lambda_package import canonical, read_pins, requirement_name, requirements

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = read_pins(ROOT / "constraints.txt")
    every_extra = project["optional-dependencies"]
    named = {canonical(requirement_name(r)[0]) for r in requirements(project, every_extra)}
    assert named <= set(pins), f"not pinned: {sorted(named - set(pins))}"
    assert pins["torch"] == "2.13.0"  # the local CPU wheel; any other spec pulls CUDA wheels


@pytest.mark.parametrize(
    "stray", ["bench/__init__.py", "sim/simulator.py", "infra/aws/worker-boot.sh", "sim.py"]
)
def test_a_wheel_with_bench_sim_or_infra_code_is_refused(tmp_path: Path, stray: str) -> None:
    import zipfile

    wheel = tmp_path / f"modelless-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("modelless/__init__.py", "")
        archive.writestr("modelless/worker/server.py", "")
        archive.writestr(f"modelless-{__version__}.dist-info/METADATA", "")
        archive.writestr(stray, "")
    with pytest.raises(WheelError, match=stray.replace(".", r"\.")):
        check_wheel(wheel)


def test_a_wheel_of_the_library_alone_passes(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / f"modelless-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("modelless/worker/server.py", "")
        archive.writestr("modelless/simulation.py", "")  # only top-level names count
    check_wheel(wheel)
