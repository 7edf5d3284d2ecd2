"""The pools a variant can run in, with their prices and sizes.

Prices are on-demand us-east-1 list prices, per vCPU-second for provisioned pools (a variant
instance holds ``threads`` vCPUs of a worker) and per GB-second plus a request fee for Lambda.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

LAMBDA_MB_PER_VCPU = 1769  # Lambda gives one full vCPU per 1,769 MB of memory
LAMBDA_PRICE_PER_GB_SECOND = 0.0000166667
LAMBDA_PRICE_PER_REQUEST = 0.0000002


class PoolKind(StrEnum):
    LAMBDA = "lambda"  # serverless: per-request billing, cold starts, no capacity to provision
    PROVISIONED = "provisioned"  # EC2 workers in an Auto Scaling group


@dataclass(frozen=True)
class PoolSpec:
    name: str
    kind: PoolKind
    vcpus_per_worker: int
    memory_mb_per_worker: int
    price_per_vcpu_second: float
    request_price: float = 0.0
    device: str = "cpu"  # "cpu" | "cuda" | "neuron"

    def instance_price_per_second(self, threads: int) -> float:
        return self.price_per_vcpu_second * threads


def lambda_pool(memory_mb: int) -> PoolSpec:
    vcpus = max(1, memory_mb // LAMBDA_MB_PER_VCPU)
    per_vcpu = LAMBDA_PRICE_PER_GB_SECOND * (memory_mb / 1024) / vcpus
    return PoolSpec(
        name="lambda-cpu",
        kind=PoolKind.LAMBDA,
        vcpus_per_worker=vcpus,
        memory_mb_per_worker=memory_mb,
        price_per_vcpu_second=per_vcpu,
        request_price=LAMBDA_PRICE_PER_REQUEST,
    )


# c5.large: 2 vCPUs, 4 GiB, $0.085/h.
CPU_POOL = PoolSpec(
    name="cpu",
    kind=PoolKind.PROVISIONED,
    vcpus_per_worker=2,
    memory_mb_per_worker=4096,
    price_per_vcpu_second=0.085 / 3600 / 2,
)

DEFAULT_POOLS: dict[str, PoolSpec] = {pool.name: pool for pool in (lambda_pool(1769), CPU_POOL)}
