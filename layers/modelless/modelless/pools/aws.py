"""Pool provider for AWS: one EC2 Auto Scaling group per pool.

Scaling sets the group's desired capacity (clamped to its min/max, which the template owns);
the plan's variant mix goes into the group's tags (propagated to new instances), which the
worker's user data reads at boot to know what to pre-load. The same boto3 calls run against an
emulated endpoint (``AWS_ENDPOINT_URL``) in the tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import boto3

from modelless.exceptions import NotFoundError

PLAN_TAG = "modelless:variants"
TAG_VALUE_LIMIT = 256  # EC2 tag values hold at most 256 characters


class AwsPoolProvider:
    def __init__(self, groups: Mapping[str, str], client: Any | None = None) -> None:
        """``groups``: pool name -> Auto Scaling group name."""
        self._groups = dict(groups)
        self._autoscaling = client or boto3.client("autoscaling")

    def _describe(self, pool: str) -> dict[str, Any]:
        name = self._groups.get(pool)
        if name is None:
            raise NotFoundError(f"pool {pool!r} has no Auto Scaling group configured")
        found = self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
            "AutoScalingGroups"
        ]
        if not found:
            raise NotFoundError(f"Auto Scaling group {name!r} of pool {pool!r} does not exist")
        group: dict[str, Any] = found[0]
        return group

    def size(self, pool: str) -> int:
        return int(self._describe(pool)["DesiredCapacity"])

    def scale(self, pool: str, workers: int) -> int:
        group = self._describe(pool)
        wanted = max(int(group["MinSize"]), min(int(group["MaxSize"]), workers))
        if wanted != int(group["DesiredCapacity"]):
            # No cooldown: the scaler has its own hysteresis (it waits a variant's load time).
            self._autoscaling.set_desired_capacity(
                AutoScalingGroupName=group["AutoScalingGroupName"],
                DesiredCapacity=wanted,
                HonorCooldown=False,
            )
        return wanted

    def assign(self, pool: str, variants: Mapping[str, int]) -> None:
        group = self._describe(pool)
        value = json.dumps(dict(sorted(variants.items())), separators=(",", ":"))
        if len(value) > TAG_VALUE_LIMIT:
            # Too long for one tag: keep the most replicated variants, which matter most at boot.
            ranked = sorted(variants.items(), key=lambda item: (-item[1], item[0]))
            kept: dict[str, int] = {}
            for variant, count in ranked:
                trial = json.dumps({**kept, variant: count}, separators=(",", ":"))
                if len(trial) > TAG_VALUE_LIMIT:
                    break
                kept[variant] = count
            value = json.dumps(kept, separators=(",", ":"))
        self._autoscaling.create_or_update_tags(
            Tags=[
                {
                    "ResourceId": group["AutoScalingGroupName"],
                    "ResourceType": "auto-scaling-group",
                    "Key": PLAN_TAG,
                    "Value": value,
                    "PropagateAtLaunch": True,
                }
            ]
        )

    def assigned(self, pool: str) -> dict[str, int]:
        """The variant mix last assigned to the pool (what a booting worker reads)."""
        for tag in self._describe(pool).get("Tags", []):
            if tag["Key"] == PLAN_TAG:
                loaded: dict[str, int] = json.loads(tag["Value"])
                return loaded
        return {}
