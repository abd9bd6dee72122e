"""Controller: sizes and places the pools (never on a request's path).

- `placement`: CPU core ledger (Ray actor) for engine ranks.
- `profiles`: accelerator and model profiles, the roofline cost of one replica.
- `planner`: TP x PP and replicas per pool for a rate under the SLO (`splitserve plan`).
- `autoscale`: pure autoscaling policies (SLO-driven, and Ray Serve's queue baseline).
- `sim`: the cluster-scale simulator that runs those policies (`splitserve simulate`).

Names are imported on first use, so the pure modules load without Ray.
"""

from importlib import import_module

_EXPORTS = {
    "PlacementError": "placement", "pick_cores": "placement",
    "AcceleratorProfile": "profiles", "ModelShape": "profiles", "ReplicaCost": "profiles",
    "accelerator": "profiles", "model_shape": "profiles",
    "Plan": "planner", "PlanError": "planner", "PoolPlan": "planner", "Workload": "planner",
    "Slo": "planner", "Cluster": "planner", "plan_deployment": "planner",
    "plan_for_config": "planner", "format_plan": "planner",
    "PoolSample": "autoscale", "PoolTarget": "autoscale", "PoolState": "autoscale",
    "PolicyParams": "autoscale", "PoolDecision": "autoscale", "QueueParams": "autoscale",
    "QueueState": "autoscale", "slo_policy": "autoscale", "queue_policy": "autoscale",
}

__all__ = [  # noqa: RUF022 - grouped by module, as in _EXPORTS
    "PlacementError", "pick_cores",
    "AcceleratorProfile", "ModelShape", "ReplicaCost", "accelerator", "model_shape",
    "Cluster", "Plan", "PlanError", "PoolPlan", "Slo", "Workload", "format_plan",
    "plan_deployment", "plan_for_config",
    "PolicyParams", "PoolDecision", "PoolSample", "PoolState", "PoolTarget", "QueueParams",
    "QueueState", "queue_policy", "slo_policy",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
