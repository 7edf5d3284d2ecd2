"""Pool providers against real backends: the AWS one through boto3 against the emulated EC2 and
Auto Scaling endpoint (moto's server), exactly the calls it makes in AWS."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from modelless.exceptions import NotFoundError
from modelless.pools.aws import PLAN_TAG, TAG_VALUE_LIMIT, AwsPoolProvider


@pytest.fixture
def autoscaling_group(aws_endpoint: str) -> Iterator[tuple[Any, str]]:
    ec2 = boto3.client("ec2", endpoint_url=aws_endpoint)
    autoscaling = boto3.client("autoscaling", endpoint_url=aws_endpoint)
    suffix = uuid.uuid4().hex[:8]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"modelless-cpu-{suffix}",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "c5.large"},
    )["LaunchTemplate"]
    name = f"modelless-cpu-{suffix}"
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
        MinSize=1,
        MaxSize=4,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )
    try:
        yield autoscaling, name
    finally:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])


def test_scaling_sets_the_desired_capacity_within_the_group_bounds(
    autoscaling_group: tuple[Any, str],
) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, client=client)
    assert provider.size("cpu") == 1

    assert provider.scale("cpu", 3) == 3
    assert provider.size("cpu") == 3
    described = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert described["DesiredCapacity"] == 3

    assert provider.scale("cpu", 10) == 4  # clamped to MaxSize
    assert provider.scale("cpu", 0) == 1  # clamped to MinSize
    assert provider.size("cpu") == 1


def test_the_variant_mix_goes_into_propagated_tags(autoscaling_group: tuple[Any, str]) -> None:
    client, name = autoscaling_group
    provider = AwsPoolProvider({"cpu": name}, client=client)
    provider.assign(
        "cpu", {"digits/digits-cnn/int8-static_all/cpu-1t": 2, "digits/digits-mlp/int8_all/cpu-1t": 1}
    )

    assert provider.assigned("cpu") == {
        "digits/digits-cnn/int8-static_all/cpu-1t": 2,
        "digits/digits-mlp/int8_all/cpu-1t": 1,
    }
    tags = client.describe_tags(Filters=[{"Name": "auto-scaling-group", "Values": [name]}])["Tags"]
    plan = next(t for t in tags if t["Key"] == PLAN_TAG)
    assert plan["PropagateAtLaunch"] is True

    # A mix too long for one tag keeps its most replicated variants.
    many = {f"app/model-{i:03d}/fp32_all/cpu-1t": (50 - i) for i in range(40)}
    provider.assign("cpu", many)
    kept = provider.assigned("cpu")
    assert 0 < len(kept) < len(many)
    assert len(json.dumps(kept, separators=(",", ":"))) <= TAG_VALUE_LIMIT
    assert min(kept.values()) >= max(v for k, v in many.items() if k not in kept)


def test_an_unknown_pool_or_group_is_a_clear_error(autoscaling_group: tuple[Any, str]) -> None:
    client, _ = autoscaling_group
    with pytest.raises(NotFoundError, match="no Auto Scaling group configured"):
        AwsPoolProvider({}, client=client).size("gpu")
    with pytest.raises(NotFoundError, match="does not exist"):
        AwsPoolProvider({"gpu": "no-such-group"}, client=client).size("gpu")
