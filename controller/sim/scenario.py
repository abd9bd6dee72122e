"""Build and run one simulation from names: model, accelerator, mode, policy, trace.

The planner chooses each pool's TP x PP for the trace's peak rate (every policy gets the same
replica shape); fixed-peak starts with the replica counts for the peak and keeps them, while
the autoscaling policies start sized for the rate at t = 0 and pay a start-up delay per new
replica. Policy capacities come from the same cost model the simulator runs on.

    result, timeline = run_scenario(Scenario(trace=TraceSpec("bursty", 800, 900)))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from splitserve.controller.autoscale import PolicyParams
from splitserve.controller.control import Controller, ControlSpec
from splitserve.controller.planner import (
    MAX_DECODE_BATCH,
    Cluster,
    Plan,
    Slo,
    Workload,
    plan_deployment,
    replan,
)
from splitserve.controller.profiles import ReplicaCost, accelerator, model_shape
from splitserve.controller.sim.engine import Simulation
from splitserve.controller.sim.pool import REPLICA_STARTUP_S, PoolSpec
from splitserve.controller.sim.report import SimResult, summarize
from splitserve.controller.sim.trace import Trace, TraceSpec, make_trace
from splitserve.controller.targets import pool_targets, queue_targets

from splitserve.config import DisaggregationConfig


@dataclass(frozen=True)
class Scenario:
    """Everything one run depends on; equal scenarios give equal results."""

    trace: TraceSpec
    model: str = "llama-3-8b"  # a built-in shape name, or a model directory
    accelerator: str = "h100-80gb"
    mode: str = "disaggregated"
    policy: str = "ours"
    slo: Slo = field(default_factory=lambda: Slo(ttft_s=1.0, tpot_s=0.1))  # the config's default
    params: PolicyParams = field(default_factory=PolicyParams)
    startup_s: float = REPLICA_STARTUP_S
    seed: int = 0
    # max_replicas of every autoscaled pool, as a multiple of the peak plan's count: what an
    # operator would configure; without it a queue-length policy grows without bound while
    # new replicas start (its queue keeps growing meanwhile).
    max_over_peak: float = 2.0
    # Disaggregated only: the router's conditional-disaggregation settings, which decide each
    # prompt's path with the router's rule (`decide`) (None: every prompt is prefilled remotely, the pure
    # disaggregation the planner sizes the pools for).
    routing: DisaggregationConfig | None = None
    router_replicas: int = 1  # router replicas sharing the traffic (each routes its own share)


def build(scn: Scenario) -> tuple[Simulation, Plan, Trace]:
    """The simulation of `scn`, the plan it started from, and its trace."""
    trace = make_trace(scn.trace)
    shape = model_shape(scn.model, scn.model)
    cluster = Cluster(accelerator(scn.accelerator))
    w = Workload(trace.peak_rate, scn.trace.prompt_mean, scn.trace.output_mean)
    peak = plan_deployment(shape, cluster, w, scn.slo, scn.mode)
    start_rate = trace.peak_rate if scn.policy == "fixed-peak" else float(trace.rate(0.0))
    plan = replan(peak, shape, cluster, start_rate)
    costs = {p.role: ReplicaCost(shape, cluster.acc, p.tp, p.pp, cluster.memory_utilization)
             for p in plan.pools}
    maxes = {p.role: math.ceil(p.replicas * scn.max_over_peak) for p in peak.pools}
    specs = {p.role: PoolSpec(p.role, costs[p.role], p.replicas, max_seqs=MAX_DECODE_BATCH,
                              startup_s=scn.startup_s, max_replicas=maxes[p.role])
             for p in plan.pools}
    control = ControlSpec(scn.policy, scn.params, pool_targets(plan, costs, scn.slo, maxes),
                          queue_targets(plan, maxes))
    ctl = Controller(control, {role: s.replicas for role, s in specs.items()})
    return Simulation(trace, specs, ctl, seed=scn.seed, routing=scn.routing,
                      router_replicas=scn.router_replicas, tpot_slo_s=scn.slo.tpot_s,
                      ttft_slo_s=scn.slo.ttft_s), plan, trace


def run_scenario(scn: Scenario) -> tuple[SimResult, list[dict]]:
    """Run `scn` to completion: its summary and its per-period timeline."""
    sim, _, trace = build(scn)
    raw = sim.run()
    result = summarize(raw, trace, scn.slo, sim.pools, sim.timeline, scn.policy, scn.mode)
    return result, sim.timeline
