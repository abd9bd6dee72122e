"""The table of `scripts/bench_rule_vs_baseline.sh`: goodput per round of the rule, colocation and
the baseline's default, and the rule's predicted against measured TTFT.

    .venv/bin/python scripts/bench_rule_vs_baseline.py bench-results/rule-vs-baseline

Per workload and rate: each side's goodput (requests/s meeting both SLOs) in every round, the
median over rounds, and whether the rule's median is at least the better of the other two
(issue 27's goal); then the same with every gap between two tokens of a request within the TPOT
target (`goodput_every_gap_rps`, `splitserve.bench.stats`: what the rule keeps; recounted from
each run's requests.jsonl where its summary predates the figure). Then, per rate and path, the
rule's measured / predicted TTFT: the median ratio and the share of requests within 25 %; a share of at least half is a median absolute
error within 25 % (the goal on the CPU workloads).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from splitserve.bench.report import rate_dir_name, read_requests
from splitserve.bench.stats import SLO, summarize

SIDES = {"rule": "candidate-conditional", "colocated": "candidate-colocated",
         "baseline": "baseline"}


def load(out: Path) -> dict[str, dict[str, dict]]:
    """{round: {side: that run's `results` (by workload, then config)}} for the runs present."""
    rounds: dict[str, dict[str, dict]] = {}
    for rdir in sorted(out.glob("round-*")):
        for side, sub in SIDES.items():
            f = rdir / sub / "comparison.json"
            if f.exists():
                comparison = json.loads(f.read_text())
                slo = SLO(**comparison["slo"])
                by_preset = {}
                for preset, by_config in comparison["results"].items():
                    config, res = next(iter(by_config.items()))
                    for pt in res.get("points", []):
                        if pt.get("goodput_every_gap_rps") is None:
                            pt["goodput_every_gap_rps"] = recount_every_gap(
                                f.parent / config / preset, pt["rate"], slo)
                    by_preset[preset] = res
                rounds.setdefault(rdir.name, {})[side] = by_preset
    return rounds


def recount_every_gap(runs: Path, rate: float, slo: SLO) -> float | None:
    """Goodput with every gap within the TPOT target of the run at `rate` under `runs`, from
    its folder's summary.json (the duration) and requests.jsonl; None when they are absent."""
    folder = runs / rate_dir_name(rate)
    summary_file, requests_file = folder / "summary.json", folder / "requests.jsonl"
    if not summary_file.exists() or not requests_file.exists():
        return None
    duration = json.loads(summary_file.read_text())["duration_s"]
    return summarize(read_requests(requests_file), duration, slo)["slo"]["goodput_every_gap_rps"]


def goodput_table(rounds: dict[str, dict[str, dict]], key: str = "goodput_rps") -> list[str]:
    """Lines: per workload and rate, each side's per-round goodput (`key` of each sweep point),
    median, and the goal."""
    lines = []
    presets = sorted({p for sides in rounds.values() for res in sides.values() for p in res})
    for preset in presets:
        lines.append(f"\n{preset}")
        lines.append(f"{'rate':>5}  " + "  ".join(f"{s:>26}" for s in SIDES) + "   goal")
        rates = sorted({pt["rate"] for sides in rounds.values() for res in sides.values()
                        for pt in res.get(preset, {}).get("points", [])})
        for rate in rates:
            medians, cells = {}, []
            for side in SIDES:
                vals = [pt[key] for sides in rounds.values()
                        for pt in sides.get(side, {}).get(preset, {}).get("points", [])
                        if pt["rate"] == rate and pt.get(key) is not None]
                medians[side] = statistics.median(vals) if vals else None
                per_round = "/".join(f"{v:.2f}" for v in vals)
                med = "-" if medians[side] is None else f"{medians[side]:.2f}"
                cells.append(f"{per_round + ' (' + med + ')':>26}")
            others = [m for s, m in medians.items() if s != "rule" and m is not None]
            goal = "-" if medians["rule"] is None or not others else (
                "met" if medians["rule"] >= max(others) else "missed")
            lines.append(f"{rate:>5g}  " + "  ".join(cells) + f"   {goal}")
    return lines


def prediction_table(rounds: dict[str, dict[str, dict]]) -> list[str]:
    """Lines: the rule's measured / predicted TTFT per workload, rate and path, every round."""
    lines = ["\nmeasured / predicted TTFT (the rule): median ratio, share within 25 %"]
    for rname, sides in rounds.items():
        for preset, res in sides.get("rule", {}).items():
            for rate, paths in sorted(res.get("predictions", {}).items(),
                                      key=lambda kv: float(kv[0])):
                cells = ", ".join(
                    f"{path} {p['median_ratio']:.2f} ({100 * p['within_25pct']:.0f} % of "
                    f"{p['requests']})" for path, p in sorted(paths.items()))
                lines.append(f"  {rname} {preset} rate {rate}: {cells}")
    return lines


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results/rule-vs-baseline")
    rounds = load(out)
    if not rounds:
        sys.exit(f"no results under {out}")
    print(f"goodput req/s per round (median) - {len(rounds)} round(s) under {out}")
    print("\n".join(goodput_table(rounds)))
    print("\ngoodput with every gap between two tokens within the TPOT target")
    print("\n".join(goodput_table(rounds, "goodput_every_gap_rps") + prediction_table(rounds)))


if __name__ == "__main__":
    main()
