"""Simulated goodput per device, disaggregated vs colocated, across prompt / output length mixes.

    .venv/bin/python scripts/sim_mixes.py [--rate 800] [--duration 300] [--slo 1000/100 ...]
        [--mix NAME ...] [--model llama-3-8b] [--accelerator h100-80gb] [--seed 0]
        [--router-replicas N] [--set disaggregation.KEY=VALUE ...] [--out FILE]

For every mix (`controller/sim/mixes.py`: chat 512/256, summarization 4096/128, code 256/1024,
rag 2048/256, short 128/64 mean prompt / output tokens) and every `--slo` (TTFT ms / TPOT ms),
a steady trace runs on three fixed deployments sized by the planner: colocated, disaggregated
(every prompt remote) and conditional (the disaggregated pools, each prompt routed by the
router's rule (`decide`) with the default config's `disaggregation` settings plus `--set`,
with one router replica per 50 req/s unless `--router-replicas`: each replica's policy sees only
its own share of the work in flight).
Prints a markdown table: goodput per device (SLO attainment, devices held), the plans, and the
conditional arm's path shares. About 10-30 s of CPU per run at the defaults (15 runs per SLO).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.controller.planner import Slo
from splitserve.controller.profiles import ACCELERATORS
from splitserve.controller.sim.mixes import MIXES, compare_mixes, format_table

from splitserve.config import DisaggregationConfig


def _slo(text: str) -> Slo:
    ttft, sep, tpot = text.partition("/")
    try:
        if not sep:
            raise ValueError
        return Slo(float(ttft) / 1e3, float(tpot) / 1e3)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slo {text!r}: expected TTFT_MS/TPOT_MS") from None


def _routing(pairs: list[str]) -> DisaggregationConfig:
    values = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        name = key.removeprefix("disaggregation.")
        if not sep or name not in DisaggregationConfig.model_fields:
            raise ValueError(f"--set {kv!r}: expected disaggregation.KEY=VALUE")
        values[name] = value
    return DisaggregationConfig(**values)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=800.0, help="requests/s (800)")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of trace (300)")
    p.add_argument("--slo", type=_slo, action="append", metavar="TTFT_MS/TPOT_MS",
                   help="repeatable (default: 1000/100 and 300/30)")
    p.add_argument("--mix", action="append", choices=[m.name for m in MIXES],
                   help="repeatable (default: all)")
    p.add_argument("--model", default="llama-3-8b", help="shape name or model dir")
    p.add_argument("--accelerator", default="h100-80gb", choices=sorted(ACCELERATORS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--router-replicas", type=int,
                   help="router replicas of the conditional arm (default: one per 50 req/s)")
    p.add_argument("--set", action="append", default=[], metavar="disaggregation.KEY=VALUE",
                   help="the conditional arm's routing settings (repeatable)")
    p.add_argument("--out", help="also write the results as JSON here")
    args = p.parse_args(argv)
    args.slo = args.slo or [Slo(1.0, 0.1), Slo(0.3, 0.03)]
    try:
        args.routing = _routing(args.set)
    except ValueError as err:  # pydantic's ValidationError is a ValueError too
        p.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every mix at every SLO and print the table."""
    args = parse_args(argv)
    mixes = [m for m in MIXES if not args.mix or m.name in args.mix]
    rows = []
    for slo in args.slo:
        rows += compare_mixes(mixes, rate=args.rate, duration_s=args.duration, slo=slo,
                              routing=args.routing, model=args.model,
                              accelerator=args.accelerator, seed=args.seed,
                              router_replicas=args.router_replicas,
                              progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    print(format_table(rows))
    if args.out:
        data = [{"mix": asdict(r.mix), "slo": asdict(r.slo),
                 "arms": {k: {"result": asdict(a.result), "plan": a.shape}
                          for k, a in r.arms.items()}} for r in rows]
        Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
