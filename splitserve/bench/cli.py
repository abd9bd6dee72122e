"""`splitserve bench`: benchmark any OpenAI-compatible endpoint (ours or a plain vLLM server).

    splitserve bench --base-url http://127.0.0.1:8000/v1 --model splitserve-tiny \\
        --rate 4 --arrivals poisson --num-requests 200 --prompt-len 512:128 --output-len 64 \\
        [--shared-prefix 256] --seed 0 --ttft-slo-ms 1000 --tpot-slo-ms 100 \\
        --out bench-results/run1 [--sweep-rates 1,2,4,8]

`--workload multi_turn` replays seeded multi-tenant conversations instead (closed loop per user,
each turn resending the history; see splitserve.bench.multi_turn_cli).

Lengths: N (constant), MEAN:STD (normal, clipped to >= 1) or LOW-HIGH (uniform, inclusive).
Prompts are random token ids in [--token-low, --token-high); against another model, set that
range inside its vocabulary. Exit status: 0 when the benchmark ran (failed requests are
reported, not fatal), 1 when every request failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from splitserve.bench.workload import DEFAULT_TOKEN_RANGE

if TYPE_CHECKING:
    from splitserve.bench.runner import BenchConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the bench options to `p` (no httpx or matplotlib import: the CLI stays quick)."""
    from splitserve.bench.multi_turn_cli import add_multi_turn_arguments

    p.add_argument("--workload", choices=["requests", "multi_turn"], default="requests",
                   help="independent requests (default) or multi-turn conversations")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI base URL")
    p.add_argument("--model", default="splitserve-tiny", help="model id to send")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token if given")
    p.add_argument("--rate", default="4", help="requests/s (inf: all at once); default 4")
    p.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--prompt-len", default="512", help="N, MEAN:STD or LOW-HIGH (default 512)")
    p.add_argument("--output-len", default="64", help="N, MEAN:STD or LOW-HIGH (default 64)")
    p.add_argument("--shared-prefix", type=int, default=0, help="ids shared by every prompt")
    p.add_argument("--token-low", type=int, default=DEFAULT_TOKEN_RANGE[0])
    p.add_argument("--token-high", type=int, default=DEFAULT_TOKEN_RANGE[1], help="exclusive")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    p.add_argument("--tpot-slo-ms", type=float, default=100.0)
    p.add_argument("--max-in-flight", type=int, default=256, help="concurrency cap (default 256)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per-request limit")
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests sent first")
    p.add_argument("--sweep-rates", default=None, help="comma-separated rates, e.g. 1,2,4,8")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--same-prompts", action="store_true",
                   help="send the same prompts at every sweep rate and in the warm-up "
                        "(default: fresh prompts each time, so no run hits another's prefix cache)")
    p.add_argument("--out", default=None, help="output dir (default bench-results/<UTC time>)")
    add_multi_turn_arguments(p)
    p.add_argument("--tenant-keys", default=None,
                   help="multi_turn: comma-separated API keys, one tenant each")


def _rates(text: str) -> tuple[float, ...]:
    return tuple(float(r) for r in text.split(",") if r.strip())


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the `BenchConfig`; raises ValueError with a readable message on bad values."""
    from splitserve.bench.client import Target
    from splitserve.bench.runner import BenchConfig
    from splitserve.bench.stats import SLO
    from splitserve.bench.workload import LengthSpec, WorkloadSpec

    workload = WorkloadSpec(
        num_requests=args.num_requests,
        prompt_len=LengthSpec.parse(args.prompt_len),
        output_len=LengthSpec.parse(args.output_len),
        rate=float(args.rate),
        arrivals=args.arrivals,
        shared_prefix=args.shared_prefix,
        token_range=(args.token_low, args.token_high),
        seed=args.seed,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return BenchConfig(
        target=Target(args.base_url, args.model, args.api_key, args.timeout_s, args.max_in_flight),
        workload=workload,
        slo=SLO(args.ttft_slo_ms, args.tpot_slo_ms),
        out_dir=Path(args.out or f"bench-results/{stamp}"),
        sweep_rates=_rates(args.sweep_rates) if args.sweep_rates else (),
        warmup=args.warmup,
        plots=not args.no_plots,
        fresh_prompts=not args.same_prompts,
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the arguments describe, print a table, return the exit status."""
    if args.workload == "multi_turn":
        from splitserve.bench.multi_turn_cli import run as run_multi_turn

        return run_multi_turn(args)
    from splitserve.bench.report import format_summary, format_sweep
    from splitserve.bench.runner import run_bench

    try:
        cfg = config_from_args(args)
    except ValueError as err:
        print(f"splitserve bench: {err}", file=sys.stderr)
        return 2
    rate = "sweep " + args.sweep_rates if cfg.sweep_rates else f"rate {cfg.workload.rate:g}"
    print(f"bench {cfg.target.base_url} model={cfg.target.model} {rate} "
          f"n={cfg.workload.num_requests} prompt={cfg.workload.prompt_len} "
          f"output={cfg.workload.output_len}", flush=True)

    def progress(rate: float, summary: dict) -> None:
        print(f"-- rate {rate:g} req/s\n{format_summary(summary)}", flush=True)

    result = run_bench(cfg, on_rate=progress)
    print(format_sweep(result) if cfg.sweep_rates else format_summary(result))
    print(f"wrote {cfg.out_dir}")
    failed_all = (
        all(p["failed"] == cfg.workload.num_requests for p in result["points"])
        if cfg.sweep_rates else result["requests"]["succeeded"] == 0
    )
    return 1 if failed_all else 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (`python -m splitserve.bench`)."""
    p = argparse.ArgumentParser(prog="splitserve bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))

