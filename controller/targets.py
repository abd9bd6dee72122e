"""Per-pool policy targets from the planner's cost model (pure).

`slo_policy` needs what one replica sustains at the SLO (`PoolTarget`), and `queue_policy` its
ongoing-requests target (`QueueParams`). Both come from a `Plan`: the simulator builds them for
its scenario's plan, the live controller for the deployed config (`control_spec_for_config`).
"""

from __future__ import annotations

from dataclasses import replace

from splitserve.controller.autoscale import PolicyParams, PoolTarget, QueueParams
from splitserve.controller.control import ControlSpec
from splitserve.controller.planner import (
    MAX_PREFILL_UTILIZATION,
    Plan,
    Slo,
    config_inputs,
    plan_deployment,
    replan,
)
from splitserve.controller.profiles import ReplicaCost

# The live controller's policy names -> the control step's (`controller.control.POLICIES`).
POLICY_NAMES = {"slo": "ours", "queue": "queue"}


def pool_targets(plan: Plan, costs: dict[str, ReplicaCost], slo: Slo,
                 maxes: dict[str, int], mins: dict[str, int] | None = None,
                 scale_to_zero: bool = False) -> dict[str, PoolTarget]:
    """`PoolTarget` per pool of `plan` (roles as the plan names them: prefill, decode or
    colocated). Prefill is sized in prompt tokens/s against its own share of the TTFT; decode in
    sequences and output tokens/s against the TPOT; a colocated pool against both."""
    w = plan.workload
    mins = mins or {}

    def bounds(role: str) -> dict:
        return {"max_replicas": maxes[role], "min_replicas": mins.get(role, 1),
                "scale_to_zero": scale_to_zero}

    if plan.mode == "colocated":
        c, p = costs["colocated"], plan.pool("colocated")
        tokens = MAX_PREFILL_UTILIZATION * c.pp * w.prompt_tokens / c.prefill_s(w.prompt_tokens)
        return {"colocated": PoolTarget(token_capacity=tokens, seq_capacity=p.capacity,
                                        out_token_capacity=p.out_tokens_per_s,
                                        ttft_s=slo.ttft_s, tpot_s=slo.tpot_s,
                                        **bounds("colocated"))}
    decode = plan.pool("decode")
    # The prefill pool's own share of TTFT: the SLO minus the handoff and the first decode step.
    own = slo.ttft_s - costs["prefill"].kv_transfer_s(w.prompt_tokens) - (decode.tpot_s or 0.0)
    return {
        "prefill": PoolTarget(token_capacity=plan.pool("prefill").capacity, ttft_s=own,
                              **bounds("prefill")),
        "decode": PoolTarget(seq_capacity=decode.capacity, tpot_s=slo.tpot_s,
                             out_token_capacity=decode.out_tokens_per_s, **bounds("decode")),
    }


def queue_targets(plan: Plan, maxes: dict[str, int], target_ongoing: float | None = None,
                  mins: dict[str, int] | None = None) -> dict[str, QueueParams]:
    """Ray Serve defaults; target_ongoing_requests is 2 for prefill (Serve's default: about one
    prompt running and one queued) and the planner's SLO batch for decode pools, unless
    `target_ongoing` sets it for every pool."""
    out = {}
    for p in plan.pools:
        target = 2.0 if p.role == "prefill" else p.capacity
        out[p.role] = QueueParams(target_ongoing_requests=target_ongoing or target,
                                  min_replicas=(mins or {}).get(p.role, 1),
                                  max_replicas=maxes[p.role])
    return out


def _served_role(role: str) -> str:
    """The deployment a plan role runs as: a colocated pool is the config's decode pool."""
    return "decode" if role == "colocated" else role


def control_spec_for_config(cfg, accelerator: str | None = None) -> ControlSpec:
    """The live controller's `ControlSpec` for a config with an `autoscaling` section.

    Capacities are the cost model's for the pools as deployed (their TP and PP, not the
    planner's choice), on the config's accelerator (the CPU profile on the CPU), for the
    planner's default request shape. Targets are keyed by deployment name (prefill, decode).
    """
    auto = cfg.autoscaling
    if auto is None:
        raise ValueError("control_spec_for_config: the config has no autoscaling section")
    shape, cluster, w, slo = config_inputs(cfg, accelerator)
    chosen = plan_deployment(shape, cluster, w, slo, cfg.mode)
    deployed = cfg.deployed_pools()
    costs, pools = {}, []
    for p in chosen.pools:
        pool_cfg = deployed[_served_role(p.role)]
        tp, pp = pool_cfg.tensor_parallel_size, pool_cfg.pipeline_parallel_size
        costs[p.role] = ReplicaCost(shape, cluster.acc, tp, pp, cluster.memory_utilization,
                                    cluster.kv_cache_bytes)
        pools.append(replace(p, tp=tp, pp=pp))
    plan = replan(replace(chosen, pools=tuple(pools)), shape, cluster, w.rate)
    maxes = {p.role: auto.max_replicas for p in plan.pools}
    mins = {p.role: auto.min_replicas for p in plan.pools}
    params = PolicyParams(control_period_s=auto.control_period_s,
                          upscale_cooldown_s=auto.upscale_cooldown_s,
                          downscale_cooldown_s=auto.downscale_cooldown_s,
                          warmup_samples=auto.warmup_samples,
                          idle_to_zero_s=auto.idle_to_zero_s)
    targets = pool_targets(plan, costs, slo, maxes, mins, auto.scale_to_zero)
    queue = {role: replace(q, upscale_delay_s=auto.upscale_cooldown_s,
                           downscale_delay_s=auto.downscale_cooldown_s)
             for role, q in queue_targets(plan, maxes, auto.target_ongoing_requests, mins).items()}
    return ControlSpec(
        POLICY_NAMES[auto.policy],
        params,
        {_served_role(r): t for r, t in targets.items()},
        {_served_role(r): q for r, q in queue.items()},
    )

