"""Pool provider for AWS: one EC2 Auto Scaling group per pool, its instances' workers reached over
the VPC at the addresses they advertise in the metadata store.

- **Scaling out** sets the group's desired capacity (clamped to its min/max, which the template
  owns); each new instance's boot script starts ``modelless.worker.server`` with its instance id as
  its worker id (infra/aws/worker-boot.sh).
- **Scaling in** chooses the instances that leave, as the local provider stops the newest worker:
  those whose workers hold the fewest instances and carry the least load (an instance still
  booting, with no worker yet, first). Each one's worker state is removed from the metadata
  store at once (selection stops routing to it), then it is terminated with the group's desired
  capacity decremented. The group's termination lifecycle hook holds the instance in
  ``Terminating:Wait`` while its worker drains (SIGTERM: stop reporting, finish what is in
  flight) and completes the lifecycle action (infra/aws/worker-lifecycle.sh).
- **Assigning** a plan's instances loads and unloads variants on the group's in-service workers
  through their HTTP API (``InstancePlacer``, the same code the local provider uses); the plan
  also goes into a group tag, so that an operator sees what the scaler wants beside what runs.

The same boto3 calls run against an emulated endpoint (``AWS_ENDPOINT_URL``) in the tests
(clients from ``modelless.aws_clients``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from modelless import aws_clients
from modelless.exceptions import NotFoundError
from modelless.metadata.base import MetadataStore
from modelless.pools.provider import InstancePlacer, logger
from modelless.types import VariantProfile, WorkerState

PLAN_TAG = "modelless:variants"
TAG_VALUE_LIMIT = 256  # EC2 tag values hold at most 256 characters
# Instances that count towards the desired capacity and may be chosen to leave.
COUNTED_STATES = {"Pending", "Pending:Wait", "Pending:Proceed", "InService"}
# A worker silent this long (it left selection after WORKER_STALE_AFTER_S) has its instance
# replaced: longer than systemd takes to restart a crashed worker process (2 s) and than a pause
# of the network, far shorter than an instance left broken until someone looks.
SILENT_WORKER_REPLACED_AFTER_S = 30.0


class AwsPoolProvider:
    def __init__(
        self,
        groups: Mapping[str, str],
        store: MetadataStore,
        client: Any | None = None,
        placer: InstancePlacer | None = None,
        silent_after_s: float = SILENT_WORKER_REPLACED_AFTER_S,
    ) -> None:
        """``groups``: pool name -> Auto Scaling group name. ``store``: where workers report
        (their advertised address, load and instances)."""
        self._groups = dict(groups)
        self._store = store
        self._autoscaling = client or aws_clients.client("autoscaling")
        self._placer = placer or InstancePlacer()
        self.silent_after_s = silent_after_s
        self.assignments: dict[str, dict[str, int]] = {}
        self.shortfall: dict[str, dict[str, int]] = {}  # pool -> variant -> instances not placed

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
        name = group["AutoScalingGroupName"]
        desired = int(group["DesiredCapacity"])
        wanted = max(int(group["MinSize"]), min(int(group["MaxSize"]), workers))
        if wanted > desired:
            # No cooldown: the scaler has its own hysteresis (it waits a variant's load time).
            self._autoscaling.set_desired_capacity(
                AutoScalingGroupName=name, DesiredCapacity=wanted, HonorCooldown=False
            )
        elif wanted < desired:
            leaving = self.choose_leaving(pool, group, desired - wanted)
            for instance_id in leaving:
                self._store.remove_worker(instance_id)  # out of selection before it drains
                self._autoscaling.terminate_instance_in_auto_scaling_group(
                    InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
                )
            logger.info("scaling in", extra={"pool": pool, "group": name, "terminating": leaving})
            if len(leaving) < desired - wanted:
                # Capacity asked for but not launched yet: the group takes it back itself.
                self._autoscaling.set_desired_capacity(
                    AutoScalingGroupName=name, DesiredCapacity=wanted, HonorCooldown=False
                )
        return wanted

    def choose_leaving(self, pool: str, group: Mapping[str, Any], count: int) -> list[str]:
        """The ``count`` instances whose loss costs least: no worker reporting yet (still booting),
        then the fewest variant instances held, then the lowest utilisation. Instances an operator
        protected from scale-in stay."""
        candidates = [
            instance["InstanceId"]
            for instance in group.get("Instances", [])
            if instance.get("LifecycleState") in COUNTED_STATES and not instance.get("ProtectedFromScaleIn")
        ]
        reports = {state.worker_id: state for state in self._store.list_workers(pool)}

        def cost(instance_id: str) -> tuple[int, int, float, str]:
            state = reports.get(instance_id)
            if state is None:
                return (0, 0, 0.0, instance_id)
            return (1, len(state.instances), state.utilisation, instance_id)

        return sorted(candidates, key=cost)[:count]

    def workers(self, pool: str) -> list[WorkerState]:
        """The pool's workers that report and run on an in-service instance of its group."""
        in_service = {
            instance["InstanceId"]
            for instance in self._describe(pool).get("Instances", [])
            if instance.get("LifecycleState") == "InService"
        }
        return [state for state in self._store.list_workers(pool) if state.worker_id in in_service]

    def heal(self, pool: str) -> list[str]:
        """Mark Unhealthy the in-service instances whose worker reported once and then went silent
        for ``silent_after_s``: the group terminates and replaces each (its own EC2 status checks
        cover an instance whose worker never came up). The worker's report leaves the store. A
        worker process that crashed is restarted by systemd within seconds and reports again
        under the same id; silence this long means the instance itself is lost or wedged."""
        group = self._describe(pool)
        in_service = {
            instance["InstanceId"]
            for instance in group.get("Instances", [])
            if instance.get("LifecycleState") == "InService" and instance.get("HealthStatus") == "Healthy"
        }
        silent_since = time.time() - self.silent_after_s
        silent = sorted(
            report.worker_id
            for report in self._store.list_worker_reports(pool)
            if report.worker_id in in_service and report.reported_at < silent_since
        )
        for instance_id in silent:
            self._autoscaling.set_instance_health(
                InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
            )
            self._store.remove_worker(instance_id)
        if silent:
            logger.warning("replacing silent workers", extra={"pool": pool, "instances": silent})
        return silent

    def assign(self, pool: str, instances: Mapping[str, int], profiles: Mapping[str, VariantProfile]) -> None:
        self.assignments[pool] = dict(instances)
        addresses = {state.worker_id: state.address for state in self.workers(pool)}
        self.shortfall[pool] = self._placer.place(addresses, instances, profiles)
        self._tag_plan(pool, instances)

    def _tag_plan(self, pool: str, variants: Mapping[str, int]) -> None:
        value = json.dumps(dict(sorted(variants.items())), separators=(",", ":"))
        if len(value) > TAG_VALUE_LIMIT:
            # Too long for one tag: keep the most replicated variants.
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
                    "ResourceId": self._groups[pool],
                    "ResourceType": "auto-scaling-group",
                    "Key": PLAN_TAG,
                    "Value": value,
                    "PropagateAtLaunch": False,
                }
            ]
        )

    def assigned(self, pool: str) -> dict[str, int]:
        """The variant mix last tagged on the pool's group."""
        for tag in self._describe(pool).get("Tags", []):
            if tag["Key"] == PLAN_TAG:
                loaded: dict[str, int] = json.loads(tag["Value"])
                return loaded
        return {}

    def close(self) -> None:
        self._placer.close()
