"""Data plane (issue #26): splitserve against a plain vLLM OpenAI server, same engine, same cores.

    .venv/bin/python scripts/bench_dataplane.py [--num-prompts 160] [--seed 0]
        [--servers plain,colocated,disaggregated] [--disagg-config disagg] [--num-warmups 0]
        [--out bench-results/dataplane] [--set KEY=VALUE ...] [--env KEY=VALUE ...] [--quick]

Servers, started, measured and stopped one after another on this machine (two cores):

    plain          vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`) on
                   the tiny model: float32, max_model_len 2048, eager, 128 sequence slots, the
                   engines' structured-outputs config, one compute core
                   (VLLM_CPU_OMP_THREADS_BIND=0), 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE=1)
    colocated      splitserve, mode colocated, one engine (pools.decode.replicas 1,
                   max_num_seqs 128) on one core, clients through direct ingress (HAProxy to
                   the router replica, `router.direct_ingress: true`, set here)
    colocated-proxy  the same through Serve's Python HTTP proxy (`router.direct_ingress: false`);
                   not in the default run: --servers plain,colocated-proxy,colocated
    colocated-direct  the same with direct streaming (`router.direct_streaming: true`: the
                   engine replica answers the client; not in the default run)
    disaggregated-direct  `disaggregated` with direct streaming (the router prefills, the
                   decode replica answers the client; not in the default run)
    disaggregated  splitserve, 1 prefill + 1 decode engine on two cores, every prompt prefilled
                   remotely (scripts/bench_disagg.py's `disagg` config; --disagg-config names
                   another of its disaggregated configs), max_num_seqs 128 on both pools,
                   direct ingress as `colocated`
    rayllm         Ray Serve LLM (the installed Ray's `ray.serve.llm`), colocated, one engine
                   on core 0 with the plain server's engine settings, started by
                   ../shared/tools/rayllm_serve.py from a side venv that has its two extra
                   packages (--rayllm-python; see the tool's docstring); not in the default run
    rayllm-pd      the same, 1 prefill + 1 decode engine over NIXL (Ray's P/D pattern)

splitserve deployments start as scripts/bench_disagg.py starts them (Ray in this process,
`tests.conftest.running_deployment`, the default config with dotted overrides on a free port);
--set and --env apply to them as there (--env also to the plain server).

The client is vLLM's own (`vllm.benchmarks.serve`, its arguments built with `add_cli_args`,
run in this process): chat backend (/v1/chat/completions), random dataset, 256 prompt and 128
output tokens, --ignore-eos, 32 requests in flight, --num-prompts requests (default 160), seeded.
`--quick`: 16 prompts of 64 prompt and 16 output tokens per server (a smoke test).

While the client's measured run lasts, the CPU time of every process this script started (and
their descendants) is read from /proc (scripts/proc_cpu.py) and charged per role: the router
replica, the Serve proxy, each engine replica, vLLM's EngineCore (and its worker) of each,
the plain vLLM server's process, the client (this process), other Ray processes. CPU per
streamed output token = the role's CPU seconds / the output tokens the client received.
The CPU of processes this script did not start (other load on the shared machine) is reported
beside it as a warning sign, not charged.

Prints two tables: per server output tokens/s, the ratio to the plain vLLM server, tokens/s
per engine, TPOT p50 (and its ratio); then per server and process role, CPU seconds, cores and
CPU ms per output token; then issue #26's goals (colocated >= 0.9x plain's tokens/s, TPOT p50
within 1.2x; disaggregated tokens/s per engine >= colocated's).

After its measured run the plain server gets the same requests again with one output token
each: the engine's time on the prompts alone, as a share of the full run. That share bounds
what 1P + 1D can make per engine on this workload (`disaggregated_bound`), printed with the
goals.

Writes, under --out: results.json (arguments, server commands and configs, every figure),
<server>/bench.json (vLLM's client result), plain/server.log (the plain server's output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path[:0] = [str(SCRIPTS), str(ROOT)]

import bench_disagg  # noqa: E402  (scripts/bench_disagg.py: deployments, config overrides)
import proc_cpu  # noqa: E402  (scripts/proc_cpu.py: CPU seconds per process from /proc)

from splitserve.engine.args import STRUCTURED_OUTPUTS  # noqa: E402
from tests.conftest import free_port  # noqa: E402

MODEL_NAME = "splitserve-tiny"
SERVERS = ("plain", "colocated", "disaggregated")  # the default run
# Also available: splitserve colocated behind Serve's Python HTTP proxy instead of direct
# ingress (`router.direct_ingress: false`), to measure the two side by side in one run.
EXTRA_SERVERS = ("colocated-proxy", "colocated-direct", "disaggregated-direct", "rayllm",
                 "rayllm-pd")
LABELS = {
    "plain": "plain vLLM OpenAI server, engine on 1 core",
    "colocated": "splitserve colocated, 1 engine on 1 core",
    "colocated-proxy": "splitserve colocated via Serve's proxy, 1 engine on 1 core",
    "colocated-direct": "splitserve colocated, direct streaming, 1 engine on 1 core",
    "disaggregated": "splitserve disaggregated, 1P + 1D on 2 cores",
    "disaggregated-direct": "splitserve disaggregated, direct streaming, 1P + 1D on 2 cores",
    "rayllm": "Ray Serve LLM colocated, 1 engine on 1 core",
    "rayllm-pd": "Ray Serve LLM P/D, 1P + 1D on 2 cores",
}
ENGINES = {"plain": 1, "colocated": 1, "colocated-proxy": 1, "colocated-direct": 1,
           "disaggregated": 2, "disaggregated-direct": 2, "rayllm": 1, "rayllm-pd": 2}
# The plain server's engine settings: those of a splitserve engine (splitserve/engine/args.py).
PLAIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
MAX_NUM_SEQS = 128
MAX_MODEL_LEN = 2048
# Issue #26's workload, and --quick's.
FULL = {"input_len": 256, "output_len": 128, "num_prompts": 160}
QUICK = {"input_len": 64, "output_len": 16, "num_prompts": 16}
CONCURRENCY = 32
# Issue #26's goals.
GOAL_THROUGHPUT_RATIO = 0.9
GOAL_TPOT_RATIO = 1.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated subset, in order")
    p.add_argument("--disagg-config", default="disagg",
                   help="scripts/bench_disagg.py's config for `disaggregated` (default: disagg, "
                   "every prompt prefilled remotely; e.g. conditional: the default policy)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help=f"requests per server (default {FULL['num_prompts']}; "
                   f"--quick: {QUICK['num_prompts']})")
    p.add_argument("--max-concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--num-warmups", type=int, default=0,
                   help="unmeasured requests per server before the run (vLLM's client)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['num_prompts']} prompts of {QUICK['input_len']}/"
                   f"{QUICK['output_len']} tokens per server: a smoke test")
    p.add_argument("--profile", action="store_true",
                   help="py-spy on the router and engine replicas (and the plain server's "
                   "process) during each measured run: OUT/<server>/profile-<role>-<pid>.txt")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the servers this many times, every other round in reverse order "
                   "(OUT/round-K), and report each server's median ratio to the plain server "
                   "of the same round: this machine's speed drifts between runs")
    p.add_argument("--rayllm-python", default="/tmp/rayllm-venv/bin/python",
                   help="the side venv's Python that runs Ray Serve LLM (rayllm servers)")
    p.add_argument("--out", default="bench-results/dataplane")
    p.add_argument("--start-timeout-s", type=float, default=600.0,
                   help="how long the plain server may take to answer /health")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dotted config override for the splitserve deployments (YAML value); "
                   "repeatable")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for every server's processes; repeatable")
    args = p.parse_args(argv)
    args.set = {k: yaml.safe_load(v)
                for k, v in (bench_disagg.parse_pair(i, p, "--set") for i in args.set)}
    args.env = dict(bench_disagg.parse_pair(i, p, "--env") for i in args.env)
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(args.servers) - set(SERVERS) - set(EXTRA_SERVERS)
    if unknown:
        p.error(f"unknown servers {sorted(unknown)}; choose from "
                f"{list(SERVERS) + list(EXTRA_SERVERS)}")
    if bench_disagg.CONFIGS.get(args.disagg_config, {}).get("mode") != "disaggregated":
        choices = [n for n, c in bench_disagg.CONFIGS.items() if c.get("mode") == "disaggregated"]
        p.error(f"--disagg-config {args.disagg_config!r}: not one of bench_disagg's "
                f"disaggregated configs {choices}")
    shape = QUICK if args.quick else FULL
    args.input_len, args.output_len = shape["input_len"], shape["output_len"]
    if args.num_prompts is None:
        args.num_prompts = shape["num_prompts"]
    return args


# --- what each server is -------------------------------------------------------------------


def splitserve_overrides(server: str, disagg_config: str = "disagg",
                         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dotted config overrides of splitserve server `server` (colocated, colocated-proxy,
    colocated-direct, disaggregated, disaggregated-direct)."""
    if server in ("colocated", "colocated-proxy", "colocated-direct"):
        base = {"mode": "colocated", "pools.decode.replicas": 1,
                "pools.decode.max_num_seqs": MAX_NUM_SEQS,
                "router.direct_ingress": server != "colocated-proxy",
                "router.direct_streaming": server == "colocated-direct"}
    elif server in ("disaggregated", "disaggregated-direct"):
        # direct ingress as for `colocated`, so that the two differ in the disaggregation only
        base = {**bench_disagg.CONFIGS[disagg_config], "pools.prefill.replicas": 1,
                "pools.decode.replicas": 1, "pools.prefill.max_num_seqs": MAX_NUM_SEQS,
                "pools.decode.max_num_seqs": MAX_NUM_SEQS, "router.direct_ingress": True,
                "router.direct_streaming": server == "disaggregated-direct"}
    else:
        raise ValueError(f"{server!r} is not a splitserve server")
    return {**base, **(extra or {})}


def plain_server_command(model_dir: str, port: int, python: str = sys.executable) -> list[str]:
    """The plain vLLM OpenAI server's command line, with a splitserve engine's settings (as
    tests/e2e/test_vllm_compat.py's reference server, plus 128 sequence slots)."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir, "--served-model-name", MODEL_NAME,
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
        "--max-num-seqs", str(MAX_NUM_SEQS), "--seed", "0",
        "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS, separators=(",", ":")),
        "--host", "127.0.0.1", "--port", str(port),
    ]


RAYLLM_TOOL = ROOT.parent / "shared" / "tools" / "rayllm_serve.py"
# Ray Serve LLM's engines: the plain server's dtype (its tool's other engine settings are the
# plain server's already: eager, max_model_len 2048, 128 sequence slots, 1 GiB of KV cache).
RAYLLM_ENV = {"RAYLLM_DTYPE": "float32"}


def rayllm_command(server: str, model_dir: str, port: int, python: str) -> list[str]:
    """Ray Serve LLM's server command line (`rayllm`: colocated on core 0, as the plain
    server's engine; `rayllm-pd`: 1P + 1D over NIXL, on cores 0 and 1)."""
    command = [python, str(RAYLLM_TOOL), model_dir, str(port), "--model-id", MODEL_NAME,
               "--quiet", "--core", "0"]
    return command + (["--mode", "disaggregated"] if server == "rayllm-pd" else [])


def client_argv(args: argparse.Namespace, base_url: str, model_dir: str,
                result_dir: str | None = None) -> list[str]:
    """vLLM's benchmark client's arguments for one server (`vllm bench serve`'s flags)."""
    argv = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", base_url,
        "--model", MODEL_NAME, "--tokenizer", model_dir,
        "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--ignore-eos",
        "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.max_concurrency),
        "--num-warmups", str(args.num_warmups),
        "--seed", str(args.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--disable-tqdm",
    ]
    if result_dir is not None:
        argv += ["--save-result", "--result-dir", result_dir, "--result-filename", "bench.json"]
    return argv


def client_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by vLLM's own benchmark client parser (imports vLLM)."""
    from vllm.benchmarks.serve import add_cli_args

    parser = argparse.ArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return parser.parse_args(argv)


# --- the figures ---------------------------------------------------------------------------


def summarize(server: str, result: dict[str, Any]) -> dict[str, Any]:
    """The figures the tables read from vLLM's client result for `server`."""
    engines = ENGINES[server]
    throughput = float(result["output_throughput"])
    return {
        "server": server,
        "label": LABELS[server],
        "engines": engines,
        "completed": int(result["completed"]),
        "failed": int(result.get("failed", 0)),
        "total_output_tokens": int(result["total_output_tokens"]),
        "duration_s": float(result["duration"]),
        "output_throughput": throughput,
        "output_throughput_per_engine": throughput / engines,
        "median_tpot_ms": float(result["median_tpot_ms"]),
        "median_ttft_ms": float(result["median_ttft_ms"]),
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` (summaries and `{"server", "label", "error"}` for servers that failed), each
    with `throughput_ratio` and `tpot_ratio` against the plain vLLM server (None without a
    plain figure)."""
    plain = next((r for r in rows if r["server"] == "plain" and "error" not in r), None)
    out = []
    for row in rows:
        row = dict(row)
        if "error" not in row and plain is not None:
            row["throughput_ratio"] = (row["output_throughput"] / plain["output_throughput"]
                                       if plain["output_throughput"] else None)
            row["tpot_ratio"] = (row["median_tpot_ms"] / plain["median_tpot_ms"]
                                 if plain["median_tpot_ms"] else None)
        else:
            row["throughput_ratio"] = row["tpot_ratio"] = None
        out.append(row)
    return out


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown_table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """A Markdown table; columns in `right` right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, align, *rows])


def format_throughput(rows: list[dict[str, Any]]) -> str:
    """The first table: per server, tokens/s, ratio to plain vLLM, per engine, TPOT p50."""
    header = ["server", "output tok/s", "vs plain vLLM", "tok/s per engine", "TPOT p50",
              "TPOT vs plain", "completed / failed"]
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["label"], "error", "-", "-", "-", "-", r["error"][:60]])
            continue
        lines.append([
            r["label"], f"{r['output_throughput']:,.0f}", _ratio(r["throughput_ratio"]),
            f"{r['output_throughput_per_engine']:,.0f}", f"{r['median_tpot_ms']:.1f} ms",
            _ratio(r["tpot_ratio"]), f"{r['completed']} / {r['failed']}",
        ])
    return markdown_table(header, lines, right={1, 2, 3, 4, 5, 6})


def disaggregated_bound(prefill_share: float, prefill_engines: int = 1,
                        decode_engines: int = 1) -> float:
    """Pure: the most output tokens/s per engine that `prefill_engines` + `decode_engines`
    disaggregated engines can make, as a fraction of one colocated engine's, when a colocated
    engine spends `prefill_share` of its time on the prompts (the rest on the outputs).

    The engines do the colocated engine's work split by phase, with nothing added (no KV
    transfer, no host cost, each pool perfectly balanced): the run lasts as long as the busier
    pool needs, and every engine counts. 1P + 1D reaches 1.0 only when prefill is exactly half
    of the work; a decode-heavy workload (prefill a tenth) caps it near 0.55, whatever the
    serving layer does. The phase split disaggregation is for is a P:D ratio of about
    (share) : (1 - share), and its gain is each phase's latency, not tokens/s per engine.
    """
    if not 0.0 < prefill_share < 1.0:
        raise ValueError(f"prefill_share {prefill_share} is not between 0 and 1")
    busiest = max(prefill_share / prefill_engines, (1.0 - prefill_share) / decode_engines)
    return 1.0 / ((prefill_engines + decode_engines) * busiest)


def goals(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """Issue #26's goals on `rows` (from `with_ratios`): (statement, met; None: not measured),
    for each data path measured: the relay path (`colocated`, `disaggregated`) and direct
    streaming (`colocated-direct`, `disaggregated-direct`, each judged against its own path).
    With the plain server's measured prefill share, the disaggregated goal's statement also
    gives what 1P + 1D can reach at most on this workload (`disaggregated_bound`)."""
    by = {r["server"]: r for r in rows if "error" not in r}
    share = by["plain"].get("prefill_share") if "plain" in by else None
    paths = [p for p in ("", "-direct") if f"colocated{p}" in by] or [""]
    out: list[tuple[str, bool | None]] = []
    for path in paths:
        colo, disagg = by.get(f"colocated{path}"), by.get(f"disaggregated{path}")
        ratio = colo["throughput_ratio"] if colo else None
        out.append((f"colocated{path} output tok/s >= {GOAL_THROUGHPUT_RATIO}x plain vLLM's "
                    f"(got {_ratio(ratio)}x)",
                    None if ratio is None else ratio >= GOAL_THROUGHPUT_RATIO))
        ratio = colo["tpot_ratio"] if colo else None
        out.append((f"colocated{path} TPOT p50 <= {GOAL_TPOT_RATIO}x plain vLLM's "
                    f"(got {_ratio(ratio)}x)",
                    None if ratio is None else ratio <= GOAL_TPOT_RATIO))
        goal = f"disaggregated{path} tok/s per engine >= colocated{path}'s"
        if colo and disagg:
            a, b = disagg["output_throughput_per_engine"], colo["output_throughput_per_engine"]
            bound = ""
            if share is not None:
                bound = (f"; 1P + 1D can make at most {disaggregated_bound(share):.2f}x: the "
                         f"engine spends {share:.0%} of this workload's time on the prompts, "
                         f"measured on the plain server")
            out.append((f"{goal} ({a:,.0f} vs {b:,.0f}, {a / b:.2f}x{bound})", a >= b))
        else:
            out.append((f"{goal} (not measured)", None))
    return out


def round_orders(servers: list[str], rounds: int) -> list[list[str]]:
    """Pure: the servers' order in each round, every other round reversed (so that a drift of
    the machine's speed does not always favour the same server)."""
    return [list(servers) if i % 2 == 0 else list(reversed(servers)) for i in range(rounds)]


def median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Pure: one row per server over `rounds` (each a `with_ratios` list: every ratio is to the
    plain server of the same round): the median of each figure over the rounds it completed,
    the ratios' spread as `throughput_ratios` / `tpot_ratios`, `rounds` counted."""
    import statistics

    servers: dict[str, list[dict[str, Any]]] = {}
    for rows in rounds:
        for row in rows:
            servers.setdefault(row["server"], []).append(row)
    out = []
    for server, rows in servers.items():
        ok = [r for r in rows if "error" not in r]
        if not ok:
            out.append({**rows[-1], "rounds": 0})
            continue
        row: dict[str, Any] = {"server": server, "label": ok[0]["label"], "rounds": len(ok),
                               "completed": sum(r["completed"] for r in ok),
                               "failed": sum(r["failed"] for r in ok)}
        for key in ("output_throughput", "output_throughput_per_engine", "median_tpot_ms"):
            row[key] = statistics.median(r[key] for r in ok)
        shares = [r["prefill_share"] for r in ok if r.get("prefill_share") is not None]
        if shares:
            row["prefill_share"] = statistics.median(shares)
        for key in ("throughput_ratio", "tpot_ratio"):
            values = [r[key] for r in ok if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
            row[key + "s"] = values
        out.append(row)
    return out


def format_rounds(rows: list[dict[str, Any]]) -> str:
    """Each server's ratios to plain vLLM round by round, and their medians."""
    header = ["server", "rounds", "vs plain vLLM, by round", "median", "TPOT vs plain, by round",
              "median"]
    lines = [[r["label"], str(r["rounds"]),
              ", ".join(_ratio(v) for v in r.get("throughput_ratios", [])),
              _ratio(r.get("throughput_ratio")),
              ", ".join(_ratio(v) for v in r.get("tpot_ratios", [])),
              _ratio(r.get("tpot_ratio"))] for r in rows if r["server"] != "plain"]
    return markdown_table(header, lines, right={1, 3, 5})


def format_goals(items: list[tuple[str, bool | None]]) -> str:
    mark = {True: "met", False: "NOT met", None: "n/a"}
    return "\n".join(f"  [{mark[met]}] {text}" for text, met in items)


# --- CPU per process -----------------------------------------------------------------------

Snapshot = dict[str, tuple[str, str, float]]  # pid -> (title, ppid, CPU seconds so far)


def snapshot() -> Snapshot:
    """Every process now: its title, parent and CPU seconds so far (scripts/proc_cpu.py)."""
    return {t.pid: (t.title, t.ppid, t.cpu_s) for t in proc_cpu.tasks()}


def descendants(procs: Snapshot, root: str) -> set[str]:
    """`root` and every process below it in `procs`."""
    children: dict[str, list[str]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def _replica_deployment(title: str) -> str | None:
    """The Serve deployment of a replica's title (`ray::ServeReplica:<app>:<deployment>`, with
    `.<method>` while Ray runs one), or None."""
    if not title.startswith("ray::ServeReplica:"):
        return None
    return title.split(":")[-1].split(".")[0].split()[0]


def process_role(pid: str, procs: Snapshot, me: str, server_pid: str | None = None) -> str:
    """What process `pid` is to the benchmark: the client (this process, `me`), the plain vLLM
    server's process (`server_pid`), a splitserve replica ("router replica", "engine replica
    (decode)"), the Serve proxy, HAProxy (direct ingress), vLLM's processes named by their title and, for an engine
    replica's, by its pool ("EngineCore (decode)"), another Ray actor ("Ray ServeController"),
    or "other" (Ray's GCS, raylet, monitors)."""
    title = procs[pid][0]
    if pid == me:
        return "client (this process)"
    if pid == server_pid:
        return "vLLM server process"
    deployment = _replica_deployment(title)
    if deployment is not None:
        return "router replica" if deployment == "router" else f"engine replica ({deployment})"
    if title.startswith("ray::ProxyActor"):
        return "Serve proxy"
    if os.path.basename((title.split() or [""])[0]) == "haproxy":
        return "HAProxy"
    if title.startswith("VLLM::"):
        name = (title[len("VLLM::"):].split() or ["?"])[0]
        parent, seen = procs[pid][1], set()
        while parent in procs and parent not in seen:  # the nearest engine replica above it
            seen.add(parent)
            owner = _replica_deployment(procs[parent][0])
            if owner is not None:
                return f"{name} ({owner})"
            parent = procs[parent][1]
        return name
    if title.startswith("ray::"):
        return "Ray " + title[len("ray::"):].split(".")[0].split()[0]
    return "other"


def cpu_by_role(before: Snapshot, after: Snapshot, me: str,
                server_pid: str | None = None) -> tuple[dict[str, dict[str, Any]], float]:
    """CPU seconds used between two snapshots by `me`'s descendants, per role (with their pids),
    and by every other process on the machine (load this script did not start)."""
    ours = descendants(after, me)
    roles: dict[str, dict[str, Any]] = {}
    others = 0.0
    for pid, (_, _, cpu) in after.items():
        used = max(cpu - before.get(pid, ("", "", 0.0))[2], 0.0)
        if pid not in ours:
            others += used
            continue
        entry = roles.setdefault(process_role(pid, after, me, server_pid),
                                 {"cpu_s": 0.0, "pids": []})
        entry["cpu_s"] += used
        entry["pids"].append(int(pid))
    return roles, others


def cpu_rows(roles: dict[str, dict[str, Any]], output_tokens: int,
             wall_s: float) -> list[dict[str, Any]]:
    """Per role, CPU seconds, cores (CPU / wall) and CPU ms per streamed output token, most
    first; then "server total": every role but the client's."""
    def row(role: str, cpu: float, pids: list[int]) -> dict[str, Any]:
        return {
            "role": role, "cpu_s": cpu, "pids": sorted(pids),
            "cores": cpu / wall_s if wall_s > 0 else None,
            "cpu_ms_per_token": 1e3 * cpu / output_tokens if output_tokens else None,
        }

    rows = [row(k, v["cpu_s"], v["pids"]) for k, v in roles.items()]
    rows.sort(key=lambda r: -r["cpu_s"])
    server = [r for r in rows if not r["role"].startswith("client")]
    rows.append(row("server total", sum(r["cpu_s"] for r in server),
                    [p for r in server for p in r["pids"]]))
    return rows


def format_cpu(results: list[dict[str, Any]]) -> str:
    """The second table: per server and process role, CPU s, cores, CPU ms per output token."""
    header = ["server", "process", "CPU s", "cores", "CPU ms / output token"]
    lines = []
    for res in results:
        cpu = res.get("cpu")
        if not cpu:
            continue
        for r in cpu["roles"]:
            if r["cpu_s"] < 0.005 and r["role"] != "server total":
                continue
            cores = "-" if r["cores"] is None else f"{r['cores']:.2f}"
            per = "-" if r["cpu_ms_per_token"] is None else f"{r['cpu_ms_per_token']:.3f}"
            lines.append([res["server"], r["role"], f"{r['cpu_s']:.2f}", cores, per])
        lines.append([res["server"], "(other load on the machine, not charged)",
                      f"{cpu['other_cpu_s']:.2f}",
                      f"{cpu['other_cpu_s'] / cpu['wall_s']:.2f}" if cpu["wall_s"] else "-", "-"])
    return markdown_table(header, lines, right={2, 3, 4})


# --- running ---------------------------------------------------------------------------------


@contextlib.contextmanager
def cpu_window(record: dict[str, Any]) -> Iterator[None]:
    """While the client's measured run lasts (vLLM's `benchmark` coroutine: after the dataset
    is built, without the tokenizer's load), snapshots of /proc around it go into `record`
    (`before`, `after`, `wall_s`)."""
    from vllm.benchmarks import serve as vllm_serve

    real = vllm_serve.benchmark

    async def measured(*a: Any, **kw: Any) -> Any:
        record["before"], t0 = snapshot(), time.monotonic()
        try:
            return await real(*a, **kw)
        finally:
            record["after"], record["wall_s"] = snapshot(), time.monotonic() - t0

    vllm_serve.benchmark = measured
    try:
        yield
    finally:
        vllm_serve.benchmark = real


# The roles --profile samples: where the Python work per token is, and vLLM's engine processes,
# sampled idle too (`--idle`): where a step waits (EngineCore's input queue, the worker's
# broadcast queue) is what tells a host-bound engine from a busy one.
PROFILED = ("router replica", "engine replica", "vLLM server process", "Serve proxy")
PROFILED_IDLE = ("EngineCore", "Worker")


@contextlib.contextmanager
def profiling(out: Path, me: str, server_pid: str | None) -> Iterator[None]:
    """py-spy (`record --format raw`: collapsed stacks, one line per stack with its sample
    count) on every process of the `PROFILED` roles while the block runs, written to
    `out/profile-<role>-<pid>.txt`; the top of each is printed by `top_frames`."""
    procs = snapshot()
    mine = descendants(procs, me)
    spies = []
    for pid in sorted(mine):
        role = process_role(pid, procs, me, server_pid)
        idle = role.startswith(PROFILED_IDLE)
        if not (idle or role.startswith(PROFILED)) or pid == me:
            continue
        slug = "-".join("".join(c if c.isalnum() else " " for c in role.lower()).split())
        path = out / f"profile-{slug}-{pid}.txt"
        spies.append((subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", pid, "--rate",
             "100", "--format", "raw", "--output", str(path), "--nonblocking",
             *(["--idle"] if idle else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path))
    try:
        yield
    finally:
        for spy, _ in spies:
            spy.send_signal(signal.SIGINT)
        for spy, path in spies:
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
            if path.exists():
                print(f"[profile] {path.name}:\n{top_frames(path.read_text())}", flush=True)


def top_frames(collapsed: str, n: int = 12) -> str:
    """Pure: the `n` functions with the most samples in py-spy's collapsed stacks, counted
    where they are on the stack (inclusive), as "share  function (file)" lines."""
    total, inclusive = 0, {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        for frame in set(stack.split(";")):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    top = sorted(inclusive.items(), key=lambda kv: -kv[1])[:n]
    return "\n".join(f"  {100 * c / max(total, 1):5.1f}%  {f}" for f, c in top)


def measure(args: argparse.Namespace, server: str, base_url: str, model_dir: str, out: Path,
            server_pid: str | None = None) -> dict[str, Any]:
    """Run vLLM's client against `base_url`; the summary, the client's result and the CPU."""
    from vllm.benchmarks.serve import main as vllm_bench

    out.mkdir(parents=True, exist_ok=True)
    bench_args = client_args(client_argv(args, base_url, model_dir, str(out)))
    record: dict[str, Any] = {}
    profile = (profiling(out, str(os.getpid()), server_pid) if args.profile
               else contextlib.nullcontext())
    with cpu_window(record), profile:
        result = vllm_bench(bench_args)
    summary = summarize(server, result)
    roles, others = cpu_by_role(record["before"], record["after"], str(os.getpid()), server_pid)
    cpu = {"wall_s": record["wall_s"], "other_cpu_s": others,
           "roles": cpu_rows(roles, summary["total_output_tokens"], record["wall_s"])}
    return {**summary, "cpu": cpu}


def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float,
               name: str = "the plain vLLM server") -> None:
    """Until server `name` answers /health and lists the model (or fail)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}) while starting")
        with contextlib.suppress(httpx.HTTPError):
            if (httpx.get(f"{base_url}/health", timeout=5).status_code == 200
                    and MODEL_NAME in httpx.get(f"{base_url}/v1/models", timeout=5).text):
                return
        time.sleep(1)
    raise TimeoutError(f"{name} did not answer within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM a server's process group (it and its engines), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the EngineCore may outlive the server's own process: end what is left of its group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_process(args: argparse.Namespace, server: str, model_dir: str, out: Path,
                command: Callable[[int], list[str]], env: dict[str, str],
                after: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                ) -> dict[str, Any]:
    """Start a server that is a process of its own (`command` for a free port, `env` added to
    this one's), measure it, run `after` on its base URL and the measured result (figures
    added to the result), stop it; its output goes to OUT/<server>/server.log."""
    port = free_port()
    argv = command(port)
    env = {**env, **args.env}
    out.mkdir(parents=True, exist_ok=True)
    base_url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    with open(out / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            wait_ready(base_url, proc, args.start_timeout_s, LABELS[server])
            print(f"[{server}] ready after {time.perf_counter() - start:.0f} s ({base_url})",
                  flush=True)
            result = measure(args, server, base_url, model_dir, out, str(proc.pid))
            if after is not None:
                result.update(after(base_url, result))
        finally:
            stop(proc)
    return {**result, "command": argv, "env": env}


def run_plain(args: argparse.Namespace, model_dir: str, out: Path) -> dict[str, Any]:
    """Start the plain vLLM server, measure it and its time on the prompts alone, stop it."""
    def prompts_alone(base_url: str, measured: dict[str, Any]) -> dict[str, Any]:
        prefill_s = prefill_pass(args, base_url, model_dir)
        return {"prefill_only_s": prefill_s,
                "prefill_share": min(prefill_s / measured["duration_s"], 0.99)}

    return run_process(args, "plain", model_dir, out,
                       lambda port: plain_server_command(model_dir, port), PLAIN_ENV,
                       after=prompts_alone)


def run_rayllm(args: argparse.Namespace, server: str, model_dir: str,
               out: Path) -> dict[str, Any]:
    """Start Ray Serve LLM (`rayllm_command`), measure it, stop it."""
    return run_process(args, server, model_dir, out,
                       lambda port: rayllm_command(server, model_dir, port, args.rayllm_python),
                       RAYLLM_ENV)


def prefill_pass(args: argparse.Namespace, base_url: str, model_dir: str) -> float:
    """Seconds the plain server takes for the run's requests with one output token each: the
    engine's time on the prompts alone (its share of the full run bounds disaggregation)."""
    from vllm.benchmarks.serve import main as vllm_bench

    prompts_only = argparse.Namespace(**{**vars(args), "output_len": 1})
    result = vllm_bench(client_args(client_argv(prompts_only, base_url, model_dir)))
    print(f"[plain] the same prompts with 1 output token each: {result['duration']:.2f} s",
          flush=True)
    return float(result["duration"])


def run_splitserve(args: argparse.Namespace, server: str, model_dir: str,
                   out: Path) -> dict[str, Any]:
    """Deploy splitserve `server` as scripts/bench_disagg.py does, measure it, tear it down."""
    overrides = splitserve_overrides(server, args.disagg_config, args.set)
    cfg = bench_disagg.test_config(**overrides)
    start = time.perf_counter()
    with bench_disagg.running_deployment(cfg) as base_url:
        print(f"[{server}] ready after {time.perf_counter() - start:.0f} s ({base_url})",
              flush=True)
        result = measure(args, server, base_url, model_dir, out)
    return {**result, "overrides": overrides}


def run_all(args: argparse.Namespace, model_dir: str, out: Path,
            on_result: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Each server in turn: started, measured, stopped; a failed one is recorded as such."""
    results: list[dict[str, Any]] = []
    for server in args.servers:
        print(f"[{server}] starting: {LABELS[server]}", flush=True)
        try:
            if server == "plain":
                result = run_plain(args, model_dir, out / server)
            elif server.startswith("rayllm"):
                result = run_rayllm(args, server, model_dir, out / server)
            else:
                result = run_splitserve(args, server, model_dir, out / server)
        # recorded; the next server still runs (`wait_healthy` fails with pytest's exception)
        except (Exception, pytest.fail.Exception) as err:  # noqa: BLE001
            print(f"[{server}] failed: {err!r}", flush=True)
            result = {"server": server, "label": LABELS[server], "error": repr(err)}
        results.append(result)
        on_result(results)
    return results


def write_results(args: argparse.Namespace, out: Path, results: list[dict[str, Any]]) -> None:
    rows = with_ratios([{k: v for k, v in r.items() if k != "cpu"} for r in results])
    data = {
        "machine": {"cpus": os.cpu_count()},
        "workload": {
            "backend": "openai-chat", "dataset": "random", "input_len": args.input_len,
            "output_len": args.output_len, "num_prompts": args.num_prompts,
            "max_concurrency": args.max_concurrency, "ignore_eos": True, "seed": args.seed,
            "num_warmups": args.num_warmups, "quick": args.quick,
        },
        "disagg_config": args.disagg_config,
        "overrides": args.set,
        "env": args.env,
        "rows": rows,
        "goals": [{"goal": text, "met": met} for text, met in goals(rows)],
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.update(args.env)  # before Ray starts: every process of every deployment has it
    from splitserve.models import build_tiny_model

    model_dir = str(build_tiny_model())
    out = Path(args.out)
    if args.rounds > 1:
        run_rounds(args, model_dir, out)
        return
    results = run_all(args, model_dir, out, lambda res: write_results(args, out, res))
    rows = with_ratios([{k: v for k, v in r.items() if k != "cpu"} for r in results])
    print(f"\nwrote {out / 'results.json'}")
    shape = (f"{args.num_prompts} requests, {args.input_len} prompt / {args.output_len} output "
             f"tokens, {args.max_concurrency} concurrent, chat, --ignore-eos, seed {args.seed}")
    print(f"\nOutput tokens/s ({shape})\n")
    print(format_throughput(rows))
    print("\nCPU per process during the measured run (CPU ms per streamed output token)\n")
    print(format_cpu(results))
    print("\nIssue #26's goals\n")
    print(format_goals(goals(rows)))


def run_rounds(args: argparse.Namespace, model_dir: str, out: Path) -> None:
    """`--rounds`: every round as a run of its own (OUT/round-K/results.json, its tables), then
    each server's median ratios over the rounds (OUT/rounds.json) and the goals on them."""
    rounds = []
    servers = args.servers
    for k, order in enumerate(round_orders(servers, args.rounds), start=1):
        print(f"\n== round {k} of {args.rounds}: {', '.join(order)}", flush=True)
        args.servers = order
        where = out / f"round-{k}"
        results = run_all(args, model_dir, where, lambda res, w=where: write_results(args, w, res))
        rows = with_ratios([{k: v for k, v in r.items() if k != "cpu"} for r in results])
        print(format_throughput(rows))
        rounds.append(rows)
    args.servers = servers
    medians = median_rows(rounds)
    (out / "rounds.json").write_text(json.dumps({"rounds": rounds, "medians": medians},
                                                indent=2) + "\n")
    print(f"\nwrote {out / 'rounds.json'}\n\nRatios to the plain vLLM server of the same round "
          f"({args.rounds} rounds)\n")
    print(format_rounds(medians))
    print("\nIssue #26's goals, on the medians\n")
    print(format_goals(goals(medians)))


if __name__ == "__main__":
    main()
