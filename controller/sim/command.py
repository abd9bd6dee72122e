"""The controller's commands: `splitserve plan` and `splitserve simulate`.

    splitserve plan [-c FILE] [--rate R] [--accelerator NAME] [--prompt-tokens N] ...
    splitserve simulate --trace bursty|diurnal|steady [--policy ours|queue|fixed-peak|all]
                        [--mode disaggregated|colocated] [-c FILE] [--rate R] [--duration S]

The deployment config supplies the SLO, the model (when `model.path` names one), the
accelerator and the autoscaling timings; flags override. `simulate` prints one line per run and
writes `<trace>-<policy>-<mode>.json` (summary) and `...-timeline.json` (replica counts over
time) under `--out`, plus a PNG when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from splitserve.controller.autoscale import PolicyParams
from splitserve.controller.control import POLICIES
from splitserve.controller.planner import PlanError, Slo, format_plan, plan_for_config
from splitserve.controller.profiles import ACCELERATORS, ModelShapeError
from splitserve.controller.sim.report import SimResult, write_outputs
from splitserve.controller.sim.scenario import Scenario, run_scenario
from splitserve.controller.sim.trace import TRACE_KINDS, TraceSpec

# CLI defaults: a cluster-scale run (a few hundred H100s at the bursts' peak, ~1.2 M requests)
# that finishes in about a minute on one CPU core.
DEFAULT_MODEL = "llama-3-8b"
DEFAULT_ACCELERATOR = "h100-80gb"
DEFAULT_RATE = 800.0
DEFAULT_DURATION_S = 1200.0


def params_from_config(section) -> PolicyParams:
    """`PolicyParams` from the config's optional `autoscaling` section (None: the defaults)."""
    if section is None:
        return PolicyParams()
    return PolicyParams(
        control_period_s=section.control_period_s,
        upscale_cooldown_s=section.upscale_cooldown_s,
        downscale_cooldown_s=section.downscale_cooldown_s,
        warmup_samples=section.warmup_samples,
        idle_to_zero_s=section.idle_to_zero_s,
    )


def scenario_from_args(cfg, args: argparse.Namespace, policy: str) -> Scenario:
    """The scenario the flags and the config describe."""
    model = args.model or cfg.model.path or DEFAULT_MODEL
    acc = getattr(cfg, "accelerator", None)
    accelerator = args.accelerator or (acc.name if acc is not None else DEFAULT_ACCELERATOR)
    trace = TraceSpec(args.trace, args.rate, args.duration, seed=args.seed,
                      max_model_len=max(cfg.model.max_model_len, 2048))
    return Scenario(
        trace=trace, model=model, accelerator=accelerator, mode=cfg.mode, policy=policy,
        slo=Slo(cfg.slo.ttft_ms / 1e3, cfg.slo.tpot_ms / 1e3),
        params=params_from_config(getattr(cfg, "autoscaling", None)), seed=args.seed,
    )


def format_result(r: SimResult) -> str:
    """One line per run, as printed."""
    return (
        f"{r.trace:8s} {r.mode:13s} {r.policy:10s} requests {r.requests:>9,} "
        f"SLO attainment {r.slo_attainment:6.1%}  goodput {r.goodput_rps:8.1f} req/s  "
        f"device-hours {r.device_hours:7.2f}  goodput/device {r.goodput_per_device:6.2f}  "
        f"p90 TTFT {1e3 * r.ttft_p90_s:8.0f} ms  p90 TPOT {1e3 * r.tpot_p90_s:5.1f} ms  "
        f"failed {r.failed}  peak replicas {r.max_replicas}  ({r.wall_s:.1f} s)"
    )


def simulate_command(cfg, args: argparse.Namespace) -> int:
    """Run the policies asked for (`--policy all`: every one) and write their outputs."""
    policies = POLICIES if args.policy == "all" else (args.policy,)
    for policy in policies:
        scn = scenario_from_args(cfg, args, policy)
        if args.startup_s is not None:
            scn = replace(scn, startup_s=args.startup_s)
        result, timeline = run_scenario(scn)
        print(format_result(result), flush=True)
        for note in write_outputs(result, timeline, args.out):
            print(f"  {note}")
    return 0


def plan_command(cfg, args: argparse.Namespace) -> int:
    """Print the plan for the config at `--rate`, or why none exists (exit status 1)."""
    try:
        plan = plan_for_config(
            cfg, args.accelerator, rate=args.rate, prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens, nodes=args.nodes,
            devices_per_node=args.devices_per_node,
        )
    except (PlanError, ModelShapeError) as err:
        print(f"splitserve plan: {err}", file=sys.stderr)
        return 1
    print(format_plan(plan))
    return 0


def add_controller_commands(sub, add_config_args, load) -> None:
    """Register `plan` and `simulate` on the CLI's subparsers; `load(args)` gives the config."""
    plan = sub.add_parser("plan", help="choose TP, PP and replicas per pool for a rate and SLO")
    add_config_args(plan)
    plan.add_argument("--rate", type=float, default=1.0, help="requests/s to size for (1)")
    plan.add_argument("--accelerator", choices=sorted(ACCELERATORS),
                      help="device kind (default: config `accelerator`, else cpu/h100-80gb)")
    plan.add_argument("--prompt-tokens", type=int, default=1024, help="mean prompt length")
    plan.add_argument("--output-tokens", type=int, default=256, help="mean output length")
    plan.add_argument("--nodes", type=int, help="cluster nodes (default: unbounded)")
    plan.add_argument("--devices-per-node", type=int, help="override the profile's (8)")
    plan.set_defaults(func=lambda a: plan_command(load(a), a))

    sim = sub.add_parser("simulate", help="simulate the pools and autoscaler at cluster scale")
    add_config_args(sim)
    sim.add_argument("--trace", choices=TRACE_KINDS, required=True)
    sim.add_argument("--policy", choices=[*POLICIES, "all"], default="ours")
    sim.add_argument("--model", help=f"shape name or model dir (default: {DEFAULT_MODEL})")
    sim.add_argument("--accelerator", choices=sorted(ACCELERATORS))
    sim.add_argument("--rate", type=float, default=DEFAULT_RATE, help="base requests/s")
    sim.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--startup-s", type=float, help="replica start-up delay (default 60)")
    sim.add_argument("--out", default="sim-results", help="output directory (sim-results)")
    sim.set_defaults(func=lambda a: simulate_command(load(a), a))
