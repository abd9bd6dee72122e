"""Goodput per device across prompt / output length mixes: disaggregated vs colocated.

For each mix, a steady trace with the mix's mean lengths runs on three deployments, each at a
fixed allocation (no autoscaling):

- colocated: the planner's colocated plan for the mix at the trace's rate;
- disaggregated: the planner's disaggregated plan, every prompt prefilled remotely;
- conditional: the same pools as disaggregated, but every arrival asks the router's own
  `decide` (`router/policy.py`) where to prefill, with the given `DisaggregationConfig`
  (remote, on the decode replica, or offloaded whole to a prefill replica).

    rows = compare_mixes(MIXES, rate=800, duration_s=300, slo=Slo(1.0, 0.1))
    print(format_table(rows))

`scripts/sim_mixes.py` is the command line. Goodput per device is DistServe's metric: requests/s
that meet both SLOs (TTFT p90 target and mean TPOT per request), divided by the devices held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from splitserve.controller.planner import Plan, Slo
from splitserve.controller.sim.report import SimResult, summarize
from splitserve.controller.sim.scenario import Scenario, build
from splitserve.controller.sim.trace import TraceSpec

from splitserve.config import DisaggregationConfig

# Context of every mix's trace: Llama-3-8B's 8,192 tokens, so a long-prompt mix's log-normal
# tail is not clipped much harder than a short one's.
MIX_MAX_MODEL_LEN = 8192
# Requests/s one router replica is given: the highest rate measured through one router replica
# was 51-70 req/s (BENCHMARKS.md, tenancy), on a core it shared with an engine. The router's
# policy counts only its own replica's work in flight (its queues are per replica), so
# a cluster-scale rate needs the router replicas a deployment would run.
ROUTER_REPLICA_RPS = 50.0


def router_replicas_for(rate: float) -> int:
    """Router replicas a deployment serving `rate` requests/s would run."""
    return max(1, math.ceil(rate / ROUTER_REPLICA_RPS - 1e-9))


@dataclass(frozen=True)
class Mix:
    """A workload's mean prompt and output lengths (the trace draws log-normal lengths)."""

    name: str
    prompt_tokens: int
    output_tokens: int


# Shapes of common traffic: chat (ShareGPT-like), summarization, code generation, retrieval-
# augmented answers, and short classification-like calls.
MIXES = (
    Mix("chat", 512, 256),
    Mix("summarization", 4096, 128),
    Mix("code", 256, 1024),
    Mix("rag", 2048, 256),
    Mix("short", 128, 64),
)
ARMS = ("colocated", "disaggregated", "conditional")


@dataclass(frozen=True)
class Arm:
    """One deployment's run of one mix: its result and the plan it ran."""

    result: SimResult
    plan: Plan

    @property
    def shape(self) -> str:
        """The plan as `replicas x TP` per pool, e.g. `P 12xTP1 + D 4xTP2`."""
        tag = {"prefill": "P", "decode": "D", "colocated": "C"}
        return " + ".join(f"{tag[p.role]} {p.replicas}xTP{p.tp}" + (f"xPP{p.pp}" if p.pp > 1 else "")
                          for p in self.plan.pools)


@dataclass(frozen=True)
class MixRow:
    """The three deployments' runs of one mix at one SLO."""

    mix: Mix
    slo: Slo
    arms: dict[str, Arm]


def run_arm(mix: Mix, arm: str, *, rate: float, duration_s: float, slo: Slo,
            routing: DisaggregationConfig, model: str = "llama-3-8b",
            accelerator: str = "h100-80gb", seed: int = 0,
            router_replicas: int | None = None) -> Arm:
    """Simulate `mix` on one deployment (`arm`, one of `ARMS`) sized by the planner
    (`router_replicas`, the conditional arm's: default `router_replicas_for(rate)`)."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}; known: {', '.join(ARMS)}")
    trace = TraceSpec("steady", rate, duration_s, prompt_mean=mix.prompt_tokens,
                      output_mean=mix.output_tokens, max_model_len=MIX_MAX_MODEL_LEN, seed=seed)
    mode = "colocated" if arm == "colocated" else "disaggregated"
    scn = Scenario(trace=trace, model=model, accelerator=accelerator, mode=mode,
                   policy="fixed-peak", slo=slo, seed=seed,
                   routing=routing if arm == "conditional" else None,
                   router_replicas=router_replicas or router_replicas_for(rate))
    sim, plan, tr = build(scn)
    raw = sim.run()
    result = summarize(raw, tr, slo, sim.pools, sim.timeline, "fixed-peak", arm)
    return Arm(result, plan)


def compare_mixes(mixes: Sequence[Mix], *, rate: float, duration_s: float, slo: Slo,
                  routing: DisaggregationConfig | None = None, progress=None,
                  **kwargs) -> list[MixRow]:
    """Every mix on every arm. `routing`: the conditional arm's settings (default: the
    config's defaults); `progress(arm_label)` is called after each run; `kwargs` go to
    `run_arm` (model, accelerator, seed, router_replicas)."""
    routing = routing or DisaggregationConfig()
    rows = []
    for mix in mixes:
        arms = {}
        for arm in ARMS:
            arms[arm] = run_arm(mix, arm, rate=rate, duration_s=duration_s, slo=slo,
                                routing=routing, **kwargs)
            if progress is not None:
                progress(f"{mix.name} {arm}: {_cell(arms[arm])} ({arms[arm].result.wall_s:.0f} s)")
        rows.append(MixRow(mix, slo, arms))
    return rows


def _cell(a: Arm) -> str:
    r = a.result
    return f"{r.goodput_per_device:.1f} ({r.slo_attainment:.0%}, {r.mean_devices:.0f} dev)"


def _paths(r: SimResult) -> str:
    total = sum(r.paths.values()) or 1
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(r.paths.items(), key=lambda kv: -kv[1]))


def format_table(rows: Sequence[MixRow]) -> str:
    """A markdown table: per mix and SLO, goodput per device (attainment, devices) of each
    arm, the plans, the conditional arm's path shares, and disaggregated / colocated."""
    head = ("| mix (prompt / output) | SLO TTFT / TPOT | colocated | disaggregated | conditional "
            "| plan colocated | plan disaggregated | conditional paths | best disagg / colocated |")
    lines = [head, "|---|---|---:|---:|---:|---|---|---|---:|"]
    for row in rows:
        a = row.arms
        co = a["colocated"].result.goodput_per_device
        best = max(a["disaggregated"].result.goodput_per_device,
                   a["conditional"].result.goodput_per_device)
        ratio = f"{best / co:.2f}x" if co else "-"
        lines.append(
            f"| {row.mix.name} ({row.mix.prompt_tokens} / {row.mix.output_tokens}) "
            f"| {1e3 * row.slo.ttft_s:.0f} ms / {1e3 * row.slo.tpot_s:.0f} ms "
            f"| {_cell(a['colocated'])} | {_cell(a['disaggregated'])} | {_cell(a['conditional'])} "
            f"| {a['colocated'].shape} | {a['disaggregated'].shape} "
            f"| {_paths(a['conditional'].result)} | {ratio} |"
        )
    return "\n".join(lines)
