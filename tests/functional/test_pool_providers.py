"""Pool providers against real backends: the AWS one through boto3 against the emulated EC2 and
Auto Scaling endpoint (moto's server), exactly the calls it makes in AWS, with its workers real
``modelless.worker.server`` processes that report into a real Redis, as the instances' workers do."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelless.exceptions import NotFoundError
from modelless.metadata.redis import RedisMetadataStore
from modelless.pools.aws import PLAN_TAG, TAG_VALUE_LIMIT, AwsPoolProvider
from modelless.pools.processes import ChildProcess, spawn
from modelless.types import InstanceState, InstanceStats, WorkerState
from tests.functional.workers_kit import Setup, make_variant, reported
from tests.waiting import wait_for


def group_instances(client: Any, name: str) -> list[str]:
    [group] = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return sorted(i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService")


def wait_instances(client: Any, name: str, count: int) -> list[str]:
    def probe() -> list[str] | None:
        ids = group_instances(client, name)
        return ids if len(ids) == count else None

    return wait_for(probe, 10.0, f"{count} in-service instances of {name}")


def report(store: RedisMetadataStore, worker_id: str, utilisation: float, variants: list[str]) -> None:
    """A worker's report, as an instance's worker sends it every second."""
    instances = tuple(InstanceStats(v, InstanceState.ACTIVE, 1.0, 1.0, 2.0, 0) for v in variants)
    free = 2 - len(instances)
    store.put_worker_state(
        WorkerState(worker_id, "cpu", "http://10.42.16.7:8500", utilisation, free, time.time(), instances)
    )


def test_scaling_out_sets_the_desired_capacity_within_the_group_bounds(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, redis_store, client=client)
    assert provider.size("cpu") == 1

    assert provider.scale("cpu", 3) == 3
    assert provider.size("cpu") == 3
    described = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert described["DesiredCapacity"] == 3
    assert provider.scale("cpu", 10) == 4  # clamped to MaxSize
    assert provider.size("cpu") == 4


def test_scaling_in_terminates_the_instances_that_cost_least_to_lose(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, redis_store, client=client)
    provider.scale("cpu", 4)
    busy, idle, light, _booting = wait_instances(client, name, 4)
    report(redis_store, busy, 0.7, ["app/m/a/cpu-1t", "app/m/b/cpu-1t"])
    report(redis_store, light, 0.3, ["app/m/a/cpu-1t"])
    report(redis_store, idle, 0.0, [])
    # The fourth has no worker reporting yet: it is still booting.

    assert provider.scale("cpu", 2) == 2

    # The booting instance and the idle worker left; the workers holding instances stayed.
    assert group_instances(client, name) == sorted([busy, light])
    assert provider.size("cpu") == 2
    # The leaving worker was taken out of selection at once, before its drain.
    assert {w.worker_id for w in redis_store.list_workers("cpu")} == {busy, light}

    # Never below the group's MinSize (1): the lightest of the two leaves.
    assert provider.scale("cpu", 0) == 1
    assert group_instances(client, name) == [busy]


def test_an_instance_whose_worker_went_silent_is_handed_to_the_group_for_replacement(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, redis_store, client=client, silent_after_s=30.0)
    provider.scale("cpu", 3)
    silent, alive, booting = wait_instances(client, name, 3)
    report(redis_store, alive, 0.2, [])
    report(redis_store, silent, 0.2, [])
    last = redis_store.list_worker_reports("cpu")
    # The silent worker's last report is 31 s old: stale for selection long ago, and past the
    # provider's patience. The booting instance never reported: the group's own checks cover it.
    aged = next(w for w in last if w.worker_id == silent)
    redis_store.put_worker_state(WorkerState(**{**aged.__dict__, "reported_at": time.time() - 31.0}))
    assert {w.worker_id for w in redis_store.list_workers("cpu")} == {alive}

    assert provider.heal("cpu") == [silent]

    health = {  # AWS spells it "Unhealthy" in one call and "UNHEALTHY" in another
        i["InstanceId"]: i["HealthStatus"].upper()
        for i in client.describe_auto_scaling_instances(InstanceIds=[silent, alive, booting])[
            "AutoScalingInstances"
        ]
    }
    assert health == {silent: "UNHEALTHY", alive: "HEALTHY", booting: "HEALTHY"}
    assert {w.worker_id for w in redis_store.list_worker_reports("cpu")} == {alive}
    assert provider.heal("cpu") == []  # once


@pytest.fixture
def workers_of(setup: Setup, redis_store: RedisMetadataStore) -> Iterator[Any]:
    """Starts real worker processes with the given worker ids (an instance's worker takes its
    instance id), reporting into the test's Redis namespace; stops them afterwards."""
    started: list[ChildProcess] = []
    report_url = f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={redis_store.keys.prefix}"

    def start(*worker_ids: str) -> list[ChildProcess]:
        for worker_id in worker_ids:
            child = spawn(
                worker_id,
                "modelless.worker",
                ["--worker-id", worker_id, "--pool", "cpu", "--slots", "2", "--repository",
                 setup.repository_url, "--cache-dir", str(setup.tmp / "cache"), "--report-url", report_url],
                setup.tmp / "logs",
                env={"OMP_NUM_THREADS": "1"},
            )  # fmt: skip
            started.append(child)
            wait_for(partial(reported, redis_store, worker_id), 5.0, f"{worker_id}'s first report")
        return started[-len(worker_ids) :]

    try:
        yield start
    finally:
        for child in started:
            child.stop()


def loaded_on(child: ChildProcess) -> list[str]:
    loaded: list[str] = httpx.get(f"{child.address}/stats", timeout=5).json()["loaded"]
    return loaded


def test_a_plan_is_loaded_into_the_groups_workers_at_their_advertised_addresses(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore, workers_of: Any
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, redis_store, client=client)
    provider.scale("cpu", 2)
    instance_ids = wait_instances(client, name, 2)
    in_group = workers_of(*instance_ids)
    [outsider] = workers_of("i-not-in-the-group")  # reports to the same store, in another group
    variant = make_variant()
    profiles = {variant.variant_id: variant}

    provider.assign("cpu", {variant.variant_id: 2}, profiles)

    assert [loaded_on(child) for child in in_group] == [[variant.variant_id]] * 2
    assert loaded_on(outsider) == []
    assert provider.shortfall["cpu"] == {}
    assert provider.assigned("cpu") == {variant.variant_id: 2}  # the plan, tagged on the group
    # Every worker reports the instance, so selection sees it Active.
    wait_for(
        lambda: all(
            [i.variant_id for i in (reported(redis_store, w) or WorkerState(w, "", "", 0, 0, 0)).instances]
            == [variant.variant_id]
            for w in instance_ids
        ),
        5.0,
        "the loaded instances in the workers' reports",
    )

    # One worker per instance (a worker holds one session per variant): three cannot be placed.
    provider.assign("cpu", {variant.variant_id: 3}, profiles)
    assert provider.shortfall["cpu"] == {variant.variant_id: 1}

    # The plan wants none: the idle instances are unloaded.
    provider.assign("cpu", {}, profiles)
    assert [loaded_on(child) for child in in_group] == [[], []]
    provider.close()


def test_the_plan_tag_keeps_the_most_replicated_variants_when_too_long(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, redis_store, client=client)
    many = {f"app/model-{i:03d}/fp32_all/cpu-1t": (50 - i) for i in range(40)}

    provider.assign("cpu", many, {})  # no worker reports yet: nothing placed

    assert provider.shortfall["cpu"] == many
    kept = provider.assigned("cpu")
    assert 0 < len(kept) < len(many)
    assert len(json.dumps(kept, separators=(",", ":"))) <= TAG_VALUE_LIMIT
    assert min(kept.values()) >= max(v for k, v in many.items() if k not in kept)
    tags = client.describe_tags(Filters=[{"Name": "auto-scaling-group", "Values": [name]}])["Tags"]
    assert next(t for t in tags if t["Key"] == PLAN_TAG)["PropagateAtLaunch"] is False


def test_an_unknown_pool_or_group_is_a_clear_error(
    autoscaling_group: tuple[Any, str], redis_store: RedisMetadataStore
) -> None:
    client, _ = autoscaling_group
    with pytest.raises(NotFoundError, match="no Auto Scaling group configured"):
        AwsPoolProvider({}, redis_store, client=client).size("gpu")
    with pytest.raises(NotFoundError, match="does not exist"):
        AwsPoolProvider({"gpu": "no-such-group"}, redis_store, client=client).size("gpu")


def test_the_boot_package_is_published_where_the_user_data_reads_it(
    s3_bucket: str, aws_endpoint: str, tmp_path: Path
) -> None:
    """scripts/publish-worker: the wheel holds the library with the worker server and nothing of
    bench, sim or infra; the pins it is installed at go beside it; an earlier wheel is replaced."""
    import zipfile

    import boto3

    from infra.build.publish_worker import build_wheel, deploy_files, publish

    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    s3.put_object(Bucket=s3_bucket, Key="deploy/wheels/modelless-0.0.1-py3-none-any.whl", Body=b"old")
    wheel = build_wheel(tmp_path)

    keys = publish(s3, s3_bucket, deploy_files(wheel))

    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="deploy/")["Contents"])
    assert listed == keys
    assert {
        "deploy/worker-boot.sh",
        "deploy/worker-lifecycle.sh",
        "deploy/constraints.txt",
        "deploy/systemd/modelless-worker.service",
        "deploy/systemd/modelless-lifecycle.service",
        f"deploy/wheels/{wheel.name}",
    } == set(keys)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        extras = archive.read(metadata).decode()
    assert {"modelless/worker/server.py", "modelless/pools/aws.py"} <= names
    # The library alone: no benchmark, simulator or infrastructure code (nor variants/).
    assert {name.split("/", 1)[0] for name in names} == {"modelless", metadata.split("/", 1)[0]}
    assert "Provides-Extra: worker" in extras  # what worker-boot.sh installs
    root = Path(__file__).resolve().parents[2]
    constraints = s3.get_object(Bucket=s3_bucket, Key="deploy/constraints.txt")["Body"].read()
    assert constraints == (root / "constraints.txt").read_bytes()
    boot = s3.get_object(Bucket=s3_bucket, Key="deploy/worker-boot.sh")["Body"].read()
    assert boot == (root / "infra/aws/worker-boot.sh").read_bytes()
