"""Run a benchmark: build the workload, send it, summarize, write the report and plots.

    summary = run_bench(BenchConfig(target, workload, slo, out_dir))

The async client does the sending; everything else here is glue between the pure parts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from splitserve.bench.client import Target, run_requests, warm_up
from splitserve.bench.plots import plot_latency_cdfs, plot_sweeps
from splitserve.bench.report import rate_dir_name, write_json, write_requests
from splitserve.bench.stats import SLO, summarize, summarize_sweep, sweep_point
from splitserve.bench.workload import WorkloadSpec, build_workload

Transport = httpx.AsyncBaseTransport | None
OnRate = Callable[[float, dict[str, Any]], None] | None


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: where, what, which SLO, where to write; `sweep_rates` repeats it per rate."""

    target: Target
    workload: WorkloadSpec
    slo: SLO
    out_dir: Path
    sweep_rates: tuple[float, ...] = ()
    warmup: int = 0  # unmeasured sequential requests before the (first) run
    plots: bool = True
    # Each rate of a sweep and the warm-up draw their own prompts (seed + 1 + rate index;
    # warm-up: seed + WARMUP_SEED_OFFSET) from the same distributions, so that no run is
    # served from the prefix cache an earlier run filled. False: the same prompts every time.
    fresh_prompts: bool = True

    def __post_init__(self) -> None:
        if any(not (math.isfinite(r) and r > 0) for r in self.sweep_rates):
            raise ValueError("sweep rates must be finite and > 0")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")


def describe(cfg: BenchConfig, workload: WorkloadSpec) -> dict[str, Any]:
    """The `config` section of a summary: enough to rerun the same benchmark."""
    return {
        "base_url": cfg.target.base_url,
        "model": cfg.target.model,
        "max_in_flight": cfg.target.max_in_flight,
        "timeout_s": cfg.target.timeout_s,
        "num_requests": workload.num_requests,
        "rate": workload.rate,
        "arrivals": workload.arrivals,
        "prompt_len": str(workload.prompt_len),
        "output_len": str(workload.output_len),
        "shared_prefix": workload.shared_prefix,
        "token_range": list(workload.token_range),
        "seed": workload.seed,
        "warmup": cfg.warmup,
        "fresh_prompts": cfg.fresh_prompts,
    }


def run_once(
    cfg: BenchConfig, workload: WorkloadSpec, out_dir: Path, transport: Transport = None
) -> dict[str, Any]:
    """Send one workload and write its summary, requests and CDF plot into `out_dir`."""
    requests = build_workload(workload)
    results, duration = asyncio.run(run_requests(cfg.target, requests, transport))
    summary = {"config": describe(cfg, workload), **summarize(results, duration, cfg.slo)}
    write_json(out_dir / "summary.json", summary)
    write_requests(out_dir / "requests.jsonl", results)
    if cfg.plots:
        plot_latency_cdfs(results, cfg.slo, out_dir / "latency_cdf.png")
    return summary


WARMUP_SEED_OFFSET = 10_000


def rate_workload(cfg: BenchConfig, rate: float, index: int) -> WorkloadSpec:
    """The workload of the sweep's `index`-th rate (its own prompts when `fresh_prompts`)."""
    spec = cfg.workload.at_rate(rate)
    return replace(spec, seed=spec.seed + 1 + index) if cfg.fresh_prompts else spec


def run_warmup(cfg: BenchConfig, transport: Transport = None) -> None:
    """Send `cfg.warmup` requests of the workload's shape, one at a time, and drop the results
    (with `fresh_prompts`, prompts that no measured run sends)."""
    if cfg.warmup:
        spec = cfg.workload.at_rate(math.inf)
        if cfg.fresh_prompts:
            spec = replace(spec, seed=spec.seed + WARMUP_SEED_OFFSET)
        requests = build_workload(spec)[: cfg.warmup]
        asyncio.run(warm_up(cfg.target, requests, transport))


def run_sweep(
    cfg: BenchConfig, on_rate: OnRate = None, transport: Transport = None
) -> dict[str, Any]:
    """Run the workload once per rate (`rate_workload`), then write `sweep.json` and
    `sweep.png`.

    `on_rate(rate, summary)` is called after each rate (for progress output).
    """
    points = []
    for i, rate in enumerate(sorted(cfg.sweep_rates)):
        out = cfg.out_dir / rate_dir_name(rate)
        summary = run_once(cfg, rate_workload(cfg, rate, i), out, transport)
        points.append(sweep_point(rate, summary))
        if on_rate is not None:
            on_rate(rate, summary)
    sweep = {"config": describe(cfg, cfg.workload), **summarize_sweep(points)}
    sweep["config"]["rate"] = None
    write_json(cfg.out_dir / "sweep.json", sweep)
    if cfg.plots:
        plot_sweeps({cfg.target.model: points}, cfg.out_dir / "sweep.png")
    return sweep


def run_bench(
    cfg: BenchConfig, on_rate: OnRate = None, transport: Transport = None
) -> dict[str, Any]:
    """Warm up, then one run (returns its summary) or a sweep (returns the sweep).

    `transport`: an httpx transport to send through instead of the network (tests).
    """
    run_warmup(cfg, transport)
    if cfg.sweep_rates:
        return run_sweep(cfg, on_rate, transport)
    return run_once(cfg, cfg.workload, cfg.out_dir, transport)

