"""Disaggregated vs colocated vs conditional serving: goodput against request rate.

    .venv/bin/python scripts/bench_disagg.py [--preset NAME ...] [--configs a,b,c]
        [--rates 0.5,1,2,4] [--num-requests 30] [--ttft-slo-ms 1000] [--tpot-slo-ms 100]
        [--seed 0] [--warmup 4] [--out bench-results/disagg]

Configurations, deployed one after another on this machine (Ray in this process, through
`tests.conftest.running_deployment`, on a free port), each with two engines:

    disagg       1 prefill + 1 decode worker, every prompt prefilled remotely
                 (mode disaggregated, min_remote_prompt_tokens 0, spill_to_decode and
                 offload_to_prefill off)
    colocated    2 colocated workers (mode colocated, pools.decode.replicas 2)
    conditional  1 prefill + 1 decode worker with the default policy (router/policy.py):
                 remote prefill for prompts of at least `min_remote_prompt_tokens` (128),
                 prefilled on the decode worker when that is the faster path
    conditional-offload  conditional, and whole requests run on the prefill worker when
                 decode is the bottleneck (disaggregation.offload_to_prefill, off by default)

Workload presets (`--preset`, repeatable; default both), Poisson arrivals, exact output lengths:

    long-prompt-short-output   prompt 1536, output 16   (prefill-bound)
    short-prompt-long-output   prompt 128,  output 256  (decode-bound)

Each configuration is started once and runs every preset's sweep (one `splitserve bench`
run per rate, the same prompts at every rate) after `--warmup` unmeasured requests.

Writes, under --out:
    <config>/<preset>/rate-<r>/{summary.json,requests.jsonl,latency_cdf.png}, sweep.json
    comparison.json   per preset and configuration: per-rate attainment, goodput, throughput,
                      and the highest rate meeting 90 % attainment (rewritten after each config)
    <preset>.png      SLO attainment and goodput vs rate, one line per configuration

The conditional policy's decisions (remote, short, spill, offload, ...) per rate are read from
the router's /metrics, printed, and kept in comparison.json (`decisions`).

Time: about (engine start ~1 min + presets x sum over rates of num_requests / rate) per
configuration; the defaults take roughly 15 minutes on 2 cores. The load generator shares
the machine with the engines, so on 2 cores the absolute numbers are pessimistic; compare
configurations with each other, not with a GPU cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.bench.client import Target  # noqa: E402
from splitserve.bench.plots import plot_sweeps  # noqa: E402
from splitserve.bench.report import format_sweep, write_json  # noqa: E402
from splitserve.bench.runner import BenchConfig, run_sweep, run_warmup  # noqa: E402
from splitserve.bench.stats import SLO  # noqa: E402
from splitserve.bench.workload import LengthSpec, WorkloadSpec  # noqa: E402
from tests.conftest import running_deployment, test_config  # noqa: E402

PRESETS = {
    "long-prompt-short-output": {"prompt_len": "1536", "output_len": "16"},
    "short-prompt-long-output": {"prompt_len": "128", "output_len": "256"},
}
CONFIGS = {
    "disagg": {
        "mode": "disaggregated",
        "disaggregation.min_remote_prompt_tokens": 0,
        "disaggregation.spill_to_decode": False,
        "disaggregation.offload_to_prefill": False,
    },
    "colocated": {"mode": "colocated", "pools.decode.replicas": 2},
    "conditional": {"mode": "disaggregated"},
    # the default policy plus whole requests on an idle prefill engine (off by default)
    "conditional-offload": {"mode": "disaggregated", "disaggregation.offload_to_prefill": True},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="default: all")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    p.add_argument("--rates", default="0.5,1,2,4", help="comma-separated request rates")
    p.add_argument("--num-requests", type=int, default=30, help="requests per rate")
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    p.add_argument("--tpot-slo-ms", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=4, help="unmeasured requests per preset")
    p.add_argument("--out", default="bench-results/disagg")
    args = p.parse_args(argv)
    args.preset = args.preset or list(PRESETS)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    args.rates = tuple(float(r) for r in args.rates.split(","))
    return args


def bench_config(args: argparse.Namespace, base_url: str, preset: str, out: Path) -> BenchConfig:
    """The sweep of one preset against one running deployment."""
    shape = PRESETS[preset]
    workload = WorkloadSpec(
        num_requests=args.num_requests,
        prompt_len=LengthSpec.parse(shape["prompt_len"]),
        output_len=LengthSpec.parse(shape["output_len"]),
        rate=args.rates[0],
        seed=args.seed,
    )
    return BenchConfig(
        target=Target(f"{base_url}/v1", "splitserve-tiny"),
        workload=workload,
        slo=SLO(args.ttft_slo_ms, args.tpot_slo_ms),
        out_dir=out,
        sweep_rates=args.rates,
        warmup=args.warmup,
    )


def decision_counts(base_url: str) -> Counter[str]:
    """The router's conditional-disaggregation decisions so far, by reason (`/metrics`)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "splitserve_disagg_reasons":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["reason"]] += int(sample.value)
    return counts


def run_config(args: argparse.Namespace, name: str, out: Path) -> dict[str, dict]:
    """Deploy configuration `name`, sweep every preset, tear down; sweeps by preset, each with
    the policy's decisions per rate (`decisions`: reason -> requests, warm-up excluded)."""
    sweeps = {}
    cfg = test_config(**CONFIGS[name])
    start = time.perf_counter()
    with running_deployment(cfg) as base:
        print(f"[{name}] ready after {time.perf_counter() - start:.0f} s ({base})", flush=True)
        for preset in args.preset:
            bench = bench_config(args, base, preset, out / name / preset)
            run_warmup(bench)
            decisions: dict[str, dict[str, int]] = {}
            seen = [decision_counts(base)]

            def on_rate(rate: float, _summary: dict, seen=seen, decisions=decisions) -> None:
                now = decision_counts(base)
                decisions[str(rate)] = dict(now - seen[0])
                seen[0] = now

            sweep = run_sweep(bench, on_rate)
            print(f"[{name}] {preset}\n{format_sweep(sweep)}", flush=True)
            if any(decisions.values()):
                print(f"[{name}] {preset} decisions by rate: {decisions}", flush=True)
            sweeps[preset] = {k: v for k, v in sweep.items() if k != "config"}
            sweeps[preset]["decisions"] = decisions
    return sweeps


def write_comparison(args: argparse.Namespace, out: Path, results: dict[str, dict]) -> None:
    """Write comparison.json and one goodput/attainment plot per preset."""
    write_json(out / "comparison.json", {
        "machine": {"cpus": os.cpu_count()},
        "slo": {"ttft_ms": args.ttft_slo_ms, "tpot_ms": args.tpot_slo_ms},
        "num_requests_per_rate": args.num_requests,
        "seed": args.seed,
        "presets": {p: PRESETS[p] for p in args.preset},
        "configs": {c: CONFIGS[c] for c in args.configs},
        "results": results,
    })
    for preset, by_config in results.items():
        series = {name: sweep["points"] for name, sweep in by_config.items()}
        shape = PRESETS[preset]
        title = f"{preset} (prompt {shape['prompt_len']}, output {shape['output_len']})"
        plot_sweeps(series, out / f"{preset}.png", title=title)


def main(argv: list[str] | None = None) -> None:
    """Run every configuration in turn; results are written after each one."""
    args = parse_args(argv)
    out = Path(args.out)
    results: dict[str, dict] = {}
    for name in args.configs:
        for preset, sweep in run_config(args, name, out).items():
            results.setdefault(preset, {})[name] = sweep
        write_comparison(args, out, results)
    print(f"wrote {out / 'comparison.json'}")
    for preset, by_config in results.items():
        best = {name: s["max_rate_meeting_target"] for name, s in by_config.items()}
        print(f"{preset}: highest rate with >= 90% SLO attainment: {best}")


if __name__ == "__main__":
    main()
