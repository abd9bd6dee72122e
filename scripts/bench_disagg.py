"""Disaggregated vs colocated vs conditional serving: goodput against request rate.

    .venv/bin/python scripts/bench_disagg.py [--preset NAME ...] [--configs a,b,c]
        [--rates 0.5,1,2,4] [--num-requests 30] [--ttft-slo-ms 1000] [--tpot-slo-ms 100]
        [--seed 0] [--warmup 4] [--rounds 1] [--out bench-results/disagg]
        [--set KEY=VALUE ...] [--env KEY=VALUE ...]

Configurations, deployed one after another on this machine (Ray in this process, through
`tests.conftest.running_deployment`, on a free port), each with two engines:

    disagg       1 prefill + 1 decode worker, every prompt prefilled remotely
                 (mode disaggregated, disaggregation.prefill remote)
    colocated    2 colocated workers (mode colocated, pools.decode.replicas 2)
    colocated-nixl  2 colocated workers whose engines carry vLLM's NIXL connector as
                 disaggregated engines do (no KV ever moves): the connector's cost in a
                 deployment, side by side with `colocated` (a measurement, not a mode)
    conditional  1 prefill + 1 decode worker with the default rule (router/policy.py): per
                 request the path with the lowest predicted TTFT that keeps the TPOT SLO,
                 from costs measured while serving
    conditional-remote128  the rule with a floor: prompts under 128 tokens run on decode
                 (disaggregation.min_remote_prompt_tokens 128)
    conditional-chunk512, colocated-chunk512  with a 512-token step budget on the decode
                 engines (pools.decode.max_num_batched_tokens; vLLM's CPU default 2048)
    <any>-per-token  that configuration without adaptive token coalescing (router.streaming:
                 every token its own streamed chunk)
    <any>-spin   that configuration with vLLM's busy-wait between each engine's scheduler and
                 worker (pools.*.step_wait_ms 0; the default before session 10)

Workload presets (`--preset`, repeatable; default both), Poisson arrivals, exact output lengths:

    long-prompt-short-output   prompt 1536, output 16   (prefill-bound)
    short-prompt-long-output   prompt 128,  output 256  (decode-bound)

Each configuration is started once per round and runs every preset's sweep (one `splitserve
bench` run per rate, each rate with prompts of its own, so that no rate hits a prefix cache an
earlier one filled) after `--warmup` unmeasured requests.

The TTFT and TPOT SLOs given are the deployments' `slo` too, which the slow-decode rule reads.

`--rounds N` repeats the whole comparison N times, interleaved: round 1 runs the configurations
in the order given, round 2 in reverse, and so on, so that a drift in the machine's load over
the run falls on every configuration alike. Round r uses seed `--seed + r - 1`, the same for
every configuration of that round, so each round is a paired comparison. On this shared
two-core machine single runs move by up to 2x; compare configurations by their per-round
goodput and by how many rounds each one won, not by one run.

Writes, under --out:
    <config>/<preset>/rate-<r>/{summary.json,requests.jsonl,latency_cdf.png}, sweep.json
                      (with --rounds > 1: round-<r>/<config>/<preset>/...)
    comparison.json   per preset and configuration: per-rate attainment, goodput, throughput,
                      and the highest rate meeting 90 % attainment (rewritten after each config;
                      with --rounds > 1 the last round's, and `rounds`: every round's goodput
                      per preset, rate and configuration, their medians and the rounds won)
    <preset>.png      SLO attainment and goodput vs rate, one line per configuration

The rule's scored predictions per rate and path (how many, the median of measured over
predicted TTFT, the share within 25 %) are read from the router's
`splitserve_ttft_prediction_ratio` and kept as `predictions`.
The conditional policy's decisions (remote, local, offload, ...) per rate are read from
the router's /metrics, printed, and kept in comparison.json (`decisions`), and so is where the
first token's time went (`ttft_parts`): per pool that generated tokens, the mean time from its
admission gate to the first token (`splitserve_pool_time_to_first_token_seconds`; the prefill
pool's also counts remote prefills up to their handoff) against the engine's own mean part
(`splitserve_engine_time_to_first_token_seconds`, as vLLM measured it in the worker).

Time: about (engine start ~1 min + presets x sum over rates of num_requests / rate) per
configuration; the defaults take roughly 15 minutes on 2 cores. The load generator shares
the machine with the engines, so on 2 cores the absolute numbers are pessimistic; compare
configurations with each other, not with a GPU cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.bench.client import Target
from splitserve.bench.plots import plot_sweeps
from splitserve.bench.report import format_sweep, write_json
from splitserve.bench.runner import BenchConfig, run_sweep, run_warmup
from splitserve.bench.stats import SLO
from splitserve.bench.workload import LengthSpec, WorkloadSpec
from tests.conftest import running_deployment, test_config

PRESETS = {
    "long-prompt-short-output": {"prompt_len": "1536", "output_len": "16"},
    "short-prompt-long-output": {"prompt_len": "128", "output_len": "256"},
}
CONFIGS = {
    "disagg": {"mode": "disaggregated", "disaggregation.prefill": "remote"},
    "colocated": {"mode": "colocated", "pools.decode.replicas": 2},
    "conditional": {"mode": "disaggregated"},
    "conditional-remote128": {
        "mode": "disaggregated", "disaggregation.min_remote_prompt_tokens": 128,
    },
    # a 512-token step budget on the decode engines (chunked prefill; vLLM's CPU default 2048)
    "conditional-chunk512": {"mode": "disaggregated", "pools.decode.max_num_batched_tokens": 512},
    "colocated-chunk512": {
        "mode": "colocated", "pools.decode.replicas": 2, "pools.decode.max_num_batched_tokens": 512,
    },
}
# `colocated` whose engines carry the connector (see `connector_everywhere`)
CONFIGS["colocated-nixl"] = CONFIGS["colocated"]
# Each configuration also as variants, named `<config>-<variant>`:
VARIANTS = {
    # without adaptive token coalescing (router.streaming): every token its own streamed
    # chunk, as before session 7
    "per-token": {"router.streaming.max_tokens_per_chunk": 1},
    # with vLLM's busy-wait between each engine's scheduler and worker, as before session 10
    "spin": {"pools.prefill.step_wait_ms": 0, "pools.decode.step_wait_ms": 0},
}
CONFIGS.update({
    f"{name}-{variant}": {**overrides, **extra}
    for name, overrides in list(CONFIGS.items()) for variant, extra in VARIANTS.items()
})
# Configurations whose engines all carry the NIXL connector whatever the mode (see
# `connector_everywhere`).
WITH_CONNECTOR = {name for name in CONFIGS if name.startswith("colocated-nixl")}


@contextlib.contextmanager
def connector_everywhere(on: bool) -> Iterator[None]:
    """While `on`: every engine the application builds in this process gets vLLM's NIXL
    connector (`EngineSpec.kv_transfer`), colocated ones too. The specs are built here, in the
    driver, and travel to the replicas, so patching the application's `engine_spec` suffices."""
    if not on:
        yield
        return
    from splitserve import app

    real = app.engine_spec

    def with_connector(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(real(*args, **kwargs), kv_transfer=True)

    app.engine_spec = with_connector
    try:
        yield
    finally:
        app.engine_spec = real


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
    p.add_argument("--rounds", type=int, default=1, help="interleaved repeats of the comparison")
    p.add_argument("--out", default="bench-results/disagg")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dotted config override for every configuration (YAML value), e.g. "
                   "tracing.file=/tmp/spans.jsonl; repeatable")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for every configuration's processes (Ray, "
                   "its replicas and their engines inherit it), e.g. SPLITSERVE_MQ_WAIT_MS=2; "
                   "repeatable")
    args = p.parse_args(argv)
    args.set = {k: yaml.safe_load(v) for k, v in (parse_pair(i, p, "--set") for i in args.set)}
    args.env = dict(parse_pair(item, p, "--env") for item in args.env)
    args.preset = args.preset or list(PRESETS)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    args.rates = tuple(float(r) for r in args.rates.split(","))
    return args


def bench_config(
    args: argparse.Namespace, base_url: str, preset: str, out: Path, seed: int
) -> BenchConfig:
    """The sweep of one preset against one running deployment."""
    shape = PRESETS[preset]
    workload = WorkloadSpec(
        num_requests=args.num_requests,
        prompt_len=LengthSpec.parse(shape["prompt_len"]),
        output_len=LengthSpec.parse(shape["output_len"]),
        rate=args.rates[0],
        seed=seed,
    )
    return BenchConfig(
        target=Target(f"{base_url}/v1", "splitserve-tiny"),
        workload=workload,
        slo=SLO(args.ttft_slo_ms, args.tpot_slo_ms),
        out_dir=out,
        sweep_rates=args.rates,
        warmup=args.warmup,
    )


def _histogram_key(family: str, labels: dict[str, str]) -> str | None:
    """The counter prefix of one first-token histogram that the comparison reads, or None."""
    if family == "splitserve_pool_time_to_first_token_seconds":
        return f"pool_ttft:{labels['pool']}"
    if family == "splitserve_time_to_first_token_seconds":
        return "router_ttft"  # all tenants summed
    if (family == "splitserve_engine_time_to_first_token_seconds"
            and labels.get("hop") == "generate"):
        return f"engine_ttft:{labels['pool']}"
    return None


def router_counters(base_url: str) -> Counter[str]:
    """What the router has counted so far (`/metrics`) that the comparison reads per rate:
    the conditional-disaggregation decisions by reason (`reason:<r>`), and per pool the count
    and sum of its first-token times (`pool_ttft:<pool>:count|sum`) and of the engines' own part
    of them on the generating hop (`engine_ttft:<pool>:count|sum`), and the first-token times
    from each request's arrival at the router (`router_ttft:count|sum`, all tenants)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if family.name == "splitserve_disagg_reasons" and sample.name.endswith("_total"):
                counts[f"reason:{labels['reason']}"] += int(sample.value)
                continue
            if (family.name == "splitserve_ttft_prediction_ratio"
                    and sample.name.endswith("_bucket")):
                counts[f"pred:{labels['path']}:{labels['le']}"] += sample.value
                continue
            key = _histogram_key(family.name, labels)
            field = sample.name.rsplit("_", 1)[1]
            if key is not None and field in ("count", "sum"):
                counts[f"{key}:{field}"] += sample.value
    return counts


def rate_figures(delta: Counter[str]) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """One rate's counter increments as (decisions by reason, and per pool the requests whose
    first token it generated with the mean first-token time at the router's gate and the
    engine's own mean part of it, in ms). The mean from the router's arrival to the first token
    over all requests is under "router" (`router_ttft_mean_ms`): what the client's TTFT adds
    beyond it is the HTTP proxy's and the client's own time."""
    decisions = {k.split(":", 1)[1]: int(v) for k, v in delta.items() if k.startswith("reason:")}
    ttft: dict[str, dict[str, float]] = {}
    if delta.get("router_ttft:count", 0):
        ttft["router"] = {
            "requests": int(delta["router_ttft:count"]),
            "router_ttft_mean_ms": round(
                1e3 * delta["router_ttft:sum"] / delta["router_ttft:count"], 1),
        }
    for pool in ("prefill", "decode"):
        n = delta.get(f"engine_ttft:{pool}:count", 0)
        if n:
            ttft[pool] = {
                "requests": int(n),
                "pool_ttft_mean_ms": round(1e3 * delta[f"pool_ttft:{pool}:sum"]
                                           / max(delta[f"pool_ttft:{pool}:count"], 1), 1),
                "engine_ttft_mean_ms": round(1e3 * delta[f"engine_ttft:{pool}:sum"] / n, 1),
            }
    return decisions, ttft


def prediction_figures(delta: Counter[str]) -> dict[str, dict[str, float]]:
    """One rate's scored predictions of the disaggregation rule, per path: how many, the
    median of measured over predicted TTFT (interpolated in the histogram's buckets) and the
    share within 25 % (a ratio in (0.8, 1.25])."""
    by_path: dict[str, dict[float, float]] = {}
    for key, value in delta.items():
        if key.startswith("pred:"):
            _, path, le = key.split(":", 2)
            by_path.setdefault(path, {})[float(le)] = value
    out = {}
    for path, cumulative in by_path.items():
        bounds = sorted(cumulative)
        n = cumulative[bounds[-1]]  # le=+Inf
        if not n:
            continue
        lower, below, median = 0.0, 0.0, bounds[-2] if len(bounds) > 1 else 1.0
        for bound in bounds:
            at = cumulative[bound]
            if at >= n / 2:
                span = at - below
                top = bound if bound != float("inf") else lower
                median = lower + (top - lower) * ((n / 2 - below) / span if span else 0.0)
                break
            lower, below = bound, at
        out[path] = {"requests": int(n), "median_ratio": round(median, 2),
                     "within_25pct": round((cumulative.get(1.25, 0) - cumulative.get(0.8, 0))
                                           / n, 2)}
    return out


def round_order(configs: list[str], round_index: int) -> list[str]:
    """The order of the configurations in round `round_index` (0-based): as given in even
    rounds, reversed in odd ones (an ABBA schedule)."""
    return list(configs) if round_index % 2 == 0 else list(reversed(configs))


def combine_rounds(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Every round's goodput side by side: preset -> rate -> {"goodput": {config: [per round]},
    "median": {config: median}, "wins": {config: rounds in which it had the highest goodput}}.

    `rounds` holds one `results` mapping (preset -> config -> sweep) per round. A round won by
    several configurations at once (equal goodput) counts for none of them."""
    combined: dict[str, dict] = {}
    for results in rounds:
        for preset, by_config in results.items():
            for name, sweep in by_config.items():
                for point in sweep["points"]:
                    row = combined.setdefault(preset, {}).setdefault(str(point["rate"]), {})
                    row.setdefault("goodput", {}).setdefault(name, []).append(
                        point["goodput_rps"]
                    )
    for by_rate in combined.values():
        for row in by_rate.values():
            goodput = row["goodput"]
            row["median"] = {name: statistics.median(v) for name, v in goodput.items()}
            wins = Counter()
            for i in range(min(len(v) for v in goodput.values())):
                per_round = {name: v[i] for name, v in goodput.items()}
                best = max(per_round.values())
                leaders = [name for name, g in per_round.items() if g == best]
                if len(leaders) == 1:
                    wins[leaders[0]] += 1
            row["wins"] = {name: wins[name] for name in goodput}
    return combined


def format_rounds(combined: dict[str, dict]) -> str:
    """A text table of `combine_rounds`: per preset and rate, each configuration's goodput per
    round, median and rounds won."""
    lines = []
    for preset, by_rate in combined.items():
        lines.append(preset)
        for rate, row in by_rate.items():
            for name, values in row["goodput"].items():
                per_round = ", ".join(f"{v:.2f}" for v in values)
                lines.append(
                    f"  rate {rate:>4}  {name:<20} goodput {per_round}  "
                    f"median {row['median'][name]:.2f}  won {row['wins'][name]}"
                )
    return "\n".join(lines)


def parse_pair(item: str, parser: argparse.ArgumentParser, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` (the argument of `flag`) as (key, value)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        parser.error(f"{flag} {item!r}: expected KEY=VALUE")
    return key.strip(), value


def run_config(args: argparse.Namespace, name: str, out: Path, seed: int) -> dict[str, dict]:
    """Deploy configuration `name`, sweep every preset, tear down; sweeps by preset, each with
    the policy's decisions per rate (`decisions`: reason -> requests, warm-up excluded)."""
    sweeps = {}
    slo = {"slo.ttft_ms": args.ttft_slo_ms, "slo.tpot_ms": args.tpot_slo_ms}
    cfg = test_config(**{**CONFIGS[name], **slo, **args.set})
    start = time.perf_counter()
    with connector_everywhere(name in WITH_CONNECTOR), running_deployment(cfg) as base:
        print(f"[{name}] ready after {time.perf_counter() - start:.0f} s ({base})", flush=True)
        for preset in args.preset:
            bench = bench_config(args, base, preset, out / name / preset, seed)
            run_warmup(bench)
            decisions: dict[str, dict[str, int]] = {}
            ttft_parts: dict[str, dict[str, dict[str, float]]] = {}
            predictions: dict[str, dict[str, dict[str, float]]] = {}
            seen = [router_counters(base)]

            def on_rate(rate: float, _summary: dict, seen=seen, decisions=decisions,
                        ttft_parts=ttft_parts, predictions=predictions) -> None:
                now = router_counters(base)
                decisions[str(rate)], ttft_parts[str(rate)] = rate_figures(now - seen[0])
                predictions[str(rate)] = prediction_figures(now - seen[0])
                seen[0] = now

            sweep = run_sweep(bench, on_rate)
            print(f"[{name}] {preset}\n{format_sweep(sweep)}", flush=True)
            if any(decisions.values()):
                print(f"[{name}] {preset} decisions by rate: {decisions}", flush=True)
            print(f"[{name}] {preset} TTFT at the pool's gate vs the engine's own part, by "
                  f"rate: {ttft_parts}", flush=True)
            sweeps[preset] = {k: v for k, v in sweep.items() if k != "config"}
            if any(predictions.values()):
                print(f"[{name}] {preset} measured/predicted TTFT by rate and path: "
                      f"{predictions}", flush=True)
            sweeps[preset]["decisions"] = decisions
            sweeps[preset]["ttft_parts"] = ttft_parts
            sweeps[preset]["predictions"] = predictions
    return sweeps


def write_comparison(
    args: argparse.Namespace, out: Path, results: dict[str, dict], rounds: dict[str, dict]
) -> None:
    """Write comparison.json (with every round's goodput under `rounds`) and one
    goodput/attainment plot per preset (the latest round)."""
    write_json(out / "comparison.json", {
        "machine": {"cpus": os.cpu_count()},
        "slo": {"ttft_ms": args.ttft_slo_ms, "tpot_ms": args.tpot_slo_ms},
        "num_requests_per_rate": args.num_requests,
        "seed": args.seed,
        "presets": {p: PRESETS[p] for p in args.preset},
        "configs": {c: CONFIGS[c] for c in args.configs},
        "overrides": args.set,
        "env": args.env,
        "results": results,
        "rounds": rounds,
    })
    for preset, by_config in results.items():
        series = {name: sweep["points"] for name, sweep in by_config.items()}
        shape = PRESETS[preset]
        title = f"{preset} (prompt {shape['prompt_len']}, output {shape['output_len']})"
        plot_sweeps(series, out / f"{preset}.png", title=title)


def main(argv: list[str] | None = None) -> None:
    """Run every configuration in turn (per round); results are written after each one."""
    args = parse_args(argv)
    os.environ.update(args.env)  # before Ray starts: every process of every deployment has it
    out = Path(args.out)
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):
        round_out = out / f"round-{r + 1}" if args.rounds > 1 else out
        results: dict[str, dict] = {}
        rounds.append(results)
        for name in round_order(args.configs, r):
            if args.rounds > 1:
                print(f"[round {r + 1}/{args.rounds}] {name}", flush=True)
            for preset, sweep in run_config(args, name, round_out, args.seed + r).items():
                results.setdefault(preset, {})[name] = sweep
            write_comparison(args, out, results, combine_rounds(rounds))
    print(f"wrote {out / 'comparison.json'}")
    if args.rounds > 1:
        print(format_rounds(combine_rounds(rounds)))
    for preset, by_config in results.items():
        best = {name: s["max_rate_meeting_target"] for name, s in by_config.items()}
        print(f"{preset}: highest rate with >= 90% SLO attainment: {best}")


if __name__ == "__main__":
    main()
