"""The pools a variant can run in, with their prices, sizes and the ways an instance sits in them.

Prices are on-demand us-east-1 list prices: per vCPU-second for provisioned CPU pools (an
instance holds ``threads`` vCPUs of a worker), per accelerator-second shared by the instances on
it for GPU and Inferentia pools, and per GB-second plus a request fee for Lambda.
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
    thread_options: tuple[int, ...] = (1,)  # intra-op threads an instance may be given
    memory_options_mb: tuple[int, ...] = ()  # Lambda: function memory sizes (threads follow)
    price_per_device_second: float = 0.0  # accelerator pools: the worker's price
    instances_per_device: int = 1  # accelerator pools: instances sharing one device

    def instance_price_per_second(self, threads: int, memory_mb: int = 0) -> float:
        if self.kind is PoolKind.LAMBDA:
            # Billed per GB·s of the function's memory; the pool's price is that of one vCPU's worth.
            return self.price_per_vcpu_second * (memory_mb or LAMBDA_MB_PER_VCPU) / LAMBDA_MB_PER_VCPU
        if self.device != "cpu":
            return self.price_per_device_second / self.instances_per_device
        return self.price_per_vcpu_second * threads


@dataclass(frozen=True)
class Placement:
    """How one instance of a variant runs in a pool: its threads and, on Lambda, its memory."""

    pool: PoolSpec
    threads: int
    memory_mb: int = 0

    @property
    def name(self) -> str:
        if self.pool.kind is PoolKind.LAMBDA:
            return f"{self.pool.name}-{self.memory_mb}mb"
        return f"{self.pool.name}-{self.threads}t"

    @property
    def price_per_second(self) -> float:
        return self.pool.instance_price_per_second(self.threads, self.memory_mb)


def placements(pool: PoolSpec) -> list[Placement]:
    if pool.kind is PoolKind.LAMBDA:
        return [Placement(pool, lambda_threads(memory), memory) for memory in pool.memory_options_mb]
    return [Placement(pool, threads) for threads in pool.thread_options]


def lambda_threads(memory_mb: int) -> int:
    return max(1, memory_mb // LAMBDA_MB_PER_VCPU)


LAMBDA_POOL = PoolSpec(
    name="lambda-cpu",
    kind=PoolKind.LAMBDA,
    vcpus_per_worker=1,
    memory_mb_per_worker=LAMBDA_MB_PER_VCPU,
    price_per_vcpu_second=LAMBDA_PRICE_PER_GB_SECOND * LAMBDA_MB_PER_VCPU / 1024,
    request_price=LAMBDA_PRICE_PER_REQUEST,
    memory_options_mb=(LAMBDA_MB_PER_VCPU, 2 * LAMBDA_MB_PER_VCPU),
)

# c5.large: 2 vCPUs, 4 GiB, $0.085/h.
CPU_POOL = PoolSpec(
    name="cpu",
    kind=PoolKind.PROVISIONED,
    vcpus_per_worker=2,
    memory_mb_per_worker=4096,
    price_per_vcpu_second=0.085 / 3600 / 2,
    thread_options=(1, 2),
)

# g4dn.xlarge: 4 vCPUs, one T4, $0.526/h; up to 4 variant instances share the GPU.
GPU_POOL = PoolSpec(
    name="gpu",
    kind=PoolKind.PROVISIONED,
    vcpus_per_worker=4,
    memory_mb_per_worker=16384,
    price_per_vcpu_second=0.526 / 3600 / 4,
    device="cuda",
    price_per_device_second=0.526 / 3600,
    instances_per_device=4,
)

# inf1.xlarge: 4 vCPUs, one Inferentia chip (4 NeuronCores), $0.228/h.
ACCEL_POOL = PoolSpec(
    name="accel",
    kind=PoolKind.PROVISIONED,
    vcpus_per_worker=4,
    memory_mb_per_worker=8192,
    price_per_vcpu_second=0.228 / 3600 / 4,
    device="neuron",
    price_per_device_second=0.228 / 3600,
    instances_per_device=4,
)

DEFAULT_POOLS: dict[str, PoolSpec] = {
    pool.name: pool for pool in (LAMBDA_POOL, CPU_POOL, GPU_POOL, ACCEL_POOL)
}
