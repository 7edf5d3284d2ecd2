"""The variant-mix program (docs/ARCHITECTURE.md §5): how many instances of which variant on which pool,
how many workers, and what is left to Lambda. Pure functions over explicit inputs."""

from modelless.scaling.bridge import start_up_bridge
from modelless.scaling.exact import solve_compact, solve_exact
from modelless.scaling.greedy import solve_greedy
from modelless.scaling.problem import (
    PlanStatus,
    ScalingGroup,
    ScalingPlan,
    ScalingPool,
    ScalingProblem,
    ScalingVariant,
    lambda_price_per_query,
    one_instance_per_worker,
    pool_from_spec,
    resource_demand,
    saturation_for_budget,
    variant_from_profile,
    violations,
)

__all__ = [
    "PlanStatus",
    "ScalingGroup",
    "ScalingPlan",
    "ScalingPool",
    "ScalingProblem",
    "ScalingVariant",
    "lambda_price_per_query",
    "one_instance_per_worker",
    "pool_from_spec",
    "resource_demand",
    "saturation_for_budget",
    "solve_compact",
    "solve_exact",
    "solve_greedy",
    "start_up_bridge",
    "variant_from_profile",
    "violations",
]
