"""Multi-tenant routing: prefix-aware vs round-robin prefill routing, tenancy's overhead, and
multi-turn conversations under four routing configurations.

    .venv/bin/python scripts/bench_routing.py [--part prefix|tenancy|multi_turn ...]
        [--tenants 4] [--requests 48] [--rate 1] [--prefix-len 600-1200] [--suffix-len 32-96]
        [--output-len 8] [--overhead-requests 200] [--concurrency 1,4,16,64]
        [--level-seconds 6] [--rounds 1] [--seed 0] [--out bench-results/routing]
        [--users 200] [--turns 4-8] [--system-len 300-600] [--message-len 100-250]
        [--reply-len 32-64] [--user-rate 20] [--think-s 10] [--kv-cache-blocks 256]
        [--tier-gib 1] [--configs a,b,...] [--set KEY=VALUE ...] [--quick]

Part `prefix` (two deployments, one after the other, Ray in this process through
`tests.conftest.running_deployment`): mode disaggregated with 2 prefill replicas and 1 decode
replica, `placement.share_cores` on (3 engines on a 2-core machine), `disaggregation.prefill: remote` (every
prompt goes through the prefill pool, whose routing is measured), one deployment per prefill
routing policy (`router.routing.prefill` = prefix_aware, then round_robin; routing block size
128 = the CPU engine's KV block). `--tenants` tenants with API keys; each has a long system
prompt (`--prefix-len` tokens) and every request appends a unique suffix (`--suffix-len`).
Tenants 0 and 1 use the *same* system prompt: their cache salts differ, so they must not share
cached blocks. The same seeded request sequence (tenant, prompt, Poisson arrival) is sent to both
deployments. Reported: TTFT mean/p90 (streamed), and the prefill pool's prefix cache hit rate
(hit tokens / queried prompt tokens, from the engines' own counters, read before and after the
run), next to the hit rate that the same policy reaches in a sequential simulation over idle
replicas with unbounded caches (`router.routing`'s pure policies, the real cache salts).

Part `tenancy` (two deployments, off then on, `--rounds` times alternating): mode colocated, one
engine. Off = open mode (no tenants, no keys); on = `--tenants` tenants with keys and quotas so
high that they never reject (the quota, VTC and auth paths all run). Measures (a) the router's
added latency: requests alternate between the HTTP path (proxy -> router -> engine) and the
engine's Serve handle called directly, same token ids, max_tokens=1, p50/p99; (b) the highest
completed-requests rate in a closed-loop concurrency sweep (max_tokens=1, 32-token prompts), and
the engine alone through its handle at the top concurrency as a bound.

Part `multi_turn` (issue 28; not run by default): mode colocated, 2 decode replicas on a core
each (colocated, so that a conversation's whole history, prompt and generated tokens, is cached
on the replica that served its last turn: the replica choice decides the hits; disaggregated,
the prefill pool would cache prompts only), each with a KV cache of `--kv-cache-blocks` blocks
(vLLM's num_gpu_blocks_override; 128 tokens a block on the CPU), below the working set.
Configurations (`--configs`, `splitserve.bench.multi_turn_compare`): round_robin, prefix_aware
(the router's approximate index), kv_events (the engines' KV events), kv_events+tier (plus
`kv_tier.medium: cpu` of `--tier-gib` per engine), set on `router.routing.decode`; one that does
not validate in this build is reported as skipped with the config's message. `--tenants`
tenants with API keys (their own cache salts) and system prompts; `--users` conversations
(`splitserve.bench.multi_turn`): each turn resends the whole history (system prompt, earlier
messages, the server's replies as token ids) plus a new message; users arrive at `--user-rate`
(Poisson) and think `--think-s` on average between a reply and their next turn (closed loop per
user). The same seeded conversations go to every configuration, in `--rounds` interleaved rounds
(the order reversed every other round), each a fresh deployment. Reported per configuration:
TTFT mean/p90 over all turns of all rounds and over follow-up turns, the decode engines'
prefix-cache hit rate and the share of prompt tokens loaded from the tier, each round's mean;
the ratio of mean TTFT to round_robin's (issue 28's goal: kv_events+tier <= 1/3); the working
set (sum of the live conversations' histories; distinct: a tenant's system prompt once),
nominal and as replayed, against one engine's KV capacity as the engine reports it.
`--set KEY=VALUE` overrides the config of every configuration. `--quick`: 24 users, 2 tenants,
3 turns, 17-block engines, 1 round: a check that the runner works (a few minutes, mostly
start-up), not a measurement.

Writes, under --out: results.json (rewritten after each deployment),
prefix/<policy>/requests.jsonl and multi_turn/round-<r>/<configuration>.jsonl (one line per
turn). Prints a table per part.

Time: parts prefix and tenancy about 14 minutes on 2 cores with the defaults, most of it start-up (a 3-engine deployment
on shared cores takes ~3 minutes to load, a 1-engine one ~1.5). The load generator shares the 2
cores with the engines: compare rows with each other, not with a GPU cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.router.routing import (
    ReplicaState,
    choose_replica,
    make_policy,
    routing_request,
)
from splitserve.router.tenancy import cache_salt_for

from splitserve.bench.client import Target, make_client, send_one
from splitserve.bench.engine_counters import cache_delta, kv_capacity_tokens, pool_stats
from splitserve.bench.multi_turn import (
    Conversation,
    WorkingSet,
    build_conversations,
    working_set,
)
from splitserve.bench.multi_turn_cli import add_multi_turn_arguments, spec_from_args
from splitserve.bench.multi_turn_compare import (
    CONFIGURATIONS,
    check_configurations,
    combine,
    format_comparison,
    ttft_ratio,
)
from splitserve.bench.multi_turn_replay import (
    measured_working_set,
    replay_conversations,
    summarize_turns,
)
from splitserve.bench.overhead import paired_overhead, sweep
from splitserve.bench.report import json_safe, write_json, write_requests
from splitserve.bench.results import RequestResult
from splitserve.bench.stats import percentiles
from splitserve.bench.tenants import tenant_keys, tenants_config
from splitserve.bench.workload import BenchRequest, LengthSpec, arrival_times
from splitserve.config import RoutingConfig
from tests.conftest import running_deployment, test_config

MODEL = "splitserve-tiny"
ENGINE_BLOCK = 128  # vLLM's CPU KV block size; the router hashes blocks of the same size
TOKENS = (10, 500)  # the tiny model's ordinary token ids
POLICIES = ("prefix_aware", "round_robin")
SHORT_PROMPT_LEN = 32  # part 2: below one KV block, so the prefix cache plays no part


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", action="append", choices=("prefix", "tenancy", "multi_turn"),
                   help="default: prefix and tenancy")
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--requests", type=int, default=48, help="part 1: measured requests")
    p.add_argument("--rate", type=float, default=1.0, help="part 1: Poisson requests/s")
    p.add_argument("--prefix-len", default="600-1200", help="system prompt tokens per tenant")
    p.add_argument("--suffix-len", default="32-96", help="unique user tokens per request")
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--overhead-requests", type=int, default=200, help="part 2: pairs")
    p.add_argument("--concurrency", default="1,4,16,64", help="part 2: closed-loop levels")
    p.add_argument("--level-seconds", type=float, default=6.0, help="part 2: per level")
    p.add_argument("--rounds", type=int, default=1,
                   help="tenancy: off/on deployments each; multi_turn: interleaved rounds")
    add_multi_turn_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/routing")
    args = p.parse_args(argv)
    args.part = args.part or ["prefix", "tenancy"]
    if args.quick:
        for key, value in MULTI_TURN_QUICK.items():
            setattr(args, key, value)
    args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    if args.tenants < 2:
        p.error("--tenants must be at least 2 (tenants 0 and 1 share a system prompt)")
    return args


# ---------------------------------------------------------------- tenants and workload (pure)


@dataclass(frozen=True)
class TenantRequest:
    """One request of the multi-tenant workload: whose it is, and what and when to send."""

    tenant: str
    request: BenchRequest


def tenant_workload(
    tenants: Sequence[str],
    n: int,
    rate: float,
    prefix: LengthSpec,
    suffix: LengthSpec,
    output_len: int,
    seed: int,
) -> list[TenantRequest]:
    """Seeded: per tenant a system prompt (tenants 0 and 1 share one), then per request a random
    tenant, its system prompt + a unique suffix, and a Poisson arrival."""
    rng = np.random.default_rng([seed, 10])
    lengths = prefix.sample(rng, len(tenants))
    systems = [tuple(int(t) for t in rng.integers(*TOKENS, int(k))) for k in lengths]
    systems[1] = systems[0]
    owners = rng.integers(0, len(tenants), n)
    tails = suffix.sample(rng, n)
    times = arrival_times(n, rate, "poisson", np.random.default_rng([seed, 11]))
    out = []
    for i in range(n):
        tail = tuple(int(t) for t in rng.integers(*TOKENS, int(tails[i])))
        prompt = systems[owners[i]] + tail
        out.append(
            TenantRequest(tenants[owners[i]], BenchRequest(i, float(times[i]), prompt, output_len))
        )
    return out


def simulated_hit_rate(workload: Sequence[TenantRequest], policy: str, replicas: int) -> float:
    """Prefix cache hit rate of `policy` sending the workload one request at a time to idle
    replicas with unbounded caches: hits are the leading cached full blocks, at most
    (prompt - 1) tokens, as vLLM counts them."""
    pol = make_policy(policy, RoutingConfig(block_size=ENGINE_BLOCK))
    states = [ReplicaState(f"r{i}") for i in range(replicas)]
    held: dict[str, set[int]] = {s.replica_id: set() for s in states}
    hits = queried = 0
    for tr in workload:
        prompt = tr.request.prompt
        req = routing_request(prompt, cache_salt_for(tr.tenant, None), block_size=ENGINE_BLOCK)
        rid = choose_replica(pol, req, states)
        lead = next(
            (i for i, h in enumerate(req.block_hashes) if h not in held[rid]), req.num_blocks
        )
        hits += min(lead, (len(prompt) - 1) // ENGINE_BLOCK) * ENGINE_BLOCK
        queried += len(prompt)
        held[rid].update(req.block_hashes)
        pol.record(rid, req.block_hashes)
    return hits / queried


# ---------------------------------------------------------------- part 1: prefix routing


async def send_workload(
    base: str, keys: dict[str, str], workload: Sequence[TenantRequest]
) -> tuple[list[RequestResult], float]:
    """Send each request at its arrival offset with its tenant's key (open loop, streamed)."""
    targets = {t: Target(f"{base}/v1", MODEL, api_key=k) for t, k in keys.items()}
    clients = {t: make_client(target) for t, target in targets.items()}
    try:
        t0 = time.perf_counter()

        async def one(tr: TenantRequest) -> RequestResult:
            delay = tr.request.arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            return await send_one(clients[tr.tenant], targets[tr.tenant], tr.request, t0)

        results = await asyncio.gather(*(one(tr) for tr in workload))
        return list(results), time.perf_counter() - t0
    finally:
        for c in clients.values():
            await c.aclose()


def warmup_workload(tenants: Sequence[str], n: int, seed: int) -> list[TenantRequest]:
    """Sequential requests with random long prompts that share nothing with the measured ones."""
    rng = np.random.default_rng([seed, 99])
    return [
        TenantRequest(
            tenants[i % len(tenants)],
            BenchRequest(i, 0.0, tuple(int(t) for t in rng.integers(*TOKENS, 900)), 4),
        )
        for i in range(n)
    ]


def run_policy(
    args: argparse.Namespace,
    policy: str,
    keys: dict[str, str],
    workload: list[TenantRequest],
    out: Path,
) -> dict[str, Any]:
    """Deploy 2 prefill + 1 decode with `policy` on the prefill pool, send the workload."""
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "pools.prefill.replicas": 2,
            "placement.share_cores": True,
            # every prompt through the prefill pool: this part measures its routing
            "disaggregation.prefill": "remote",  # every prompt takes the NIXL path
            "router.routing.prefill": policy,
            "router.routing.block_size": ENGINE_BLOCK,
            "tenants": tenants_config(keys),
        }
    )
    start = time.perf_counter()
    with running_deployment(cfg) as base:
        print(f"[prefix/{policy}] ready after {time.perf_counter() - start:.0f} s", flush=True)
        for tr in warmup_workload(list(keys), 6, args.seed):
            asyncio.run(send_workload(base, keys, [tr]))
        time.sleep(1)
        before, dec_before = pool_stats("prefill", 2), pool_stats("decode", 1)
        results, duration = asyncio.run(send_workload(base, keys, workload))
        time.sleep(2)  # the engines' last step statistics
        after, dec_after = pool_stats("prefill", 2), pool_stats("decode", 1)
    write_requests(out / policy / "requests.jsonl", results)
    ok = [r for r in results if r.ok]
    return {
        "duration_s": duration,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok}),
        "ttft_ms": percentiles((r.ttft_s for r in ok), 1000),
        "e2e_ms": percentiles((r.e2e_s for r in ok), 1000),
        "prefill_cache": cache_delta(before, after),
        "decode_cache": cache_delta(dec_before, dec_after),
        "simulated_prefill_hit_rate": simulated_hit_rate(workload, policy, 2),
    }


def bench_prefix(args: argparse.Namespace, out: Path, results: dict[str, Any], save) -> None:
    """Part 1: both policies on the same seeded multi-tenant workload, into `results`."""
    keys = tenant_keys(args.tenants)
    workload = tenant_workload(
        list(keys),
        args.requests,
        args.rate,
        LengthSpec.parse(args.prefix_len),
        LengthSpec.parse(args.suffix_len),
        args.output_len,
        args.seed,
    )
    results.update(
        {
            "workload": {
                "tenants": args.tenants,
                "requests": args.requests,
                "rate": args.rate,
                "prefix_len": args.prefix_len,
                "suffix_len": args.suffix_len,
                "output_len": args.output_len,
                "shared_system_prompt": ["tenant-0", "tenant-1"],
                "mean_prompt_tokens": float(np.mean([len(t.request.prompt) for t in workload])),
            },
            "policies": {},
        }
    )
    for policy in POLICIES:
        results["policies"][policy] = run_policy(args, policy, keys, workload, out / "prefix")
        save()


# ---------------------------------------------------------------- part 2: tenancy overhead


def short_prompt(seed: int) -> list[int]:
    """A fixed prompt shorter than one KV block."""
    return [int(t) for t in np.random.default_rng([seed, 20]).integers(*TOKENS, SHORT_PROMPT_LEN)]


def run_tenancy(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One colocated deployment with tenancy `mode` ("off": open mode, "on": keyed tenants)."""
    from ray import serve

    keys = tenant_keys(args.tenants) if mode == "on" else {}
    overrides: dict[str, Any] = {"mode": "colocated"}
    if keys:
        overrides["tenants"] = tenants_config(keys)
    headers = [{"Authorization": f"Bearer {k}"} for k in keys.values()] or [{}]
    ids = short_prompt(args.seed)
    start = time.perf_counter()
    with running_deployment(test_config(**overrides)) as base:
        print(f"[tenancy/{mode}] ready after {time.perf_counter() - start:.0f} s", flush=True)
        handle = serve.get_deployment_handle("decode", app_name="splitserve")
        over = asyncio.run(
            paired_overhead(base, handle, ids, pairs=args.overhead_requests, headers=headers)
        )
        rates = asyncio.run(sweep(base, handle, ids, headers, args.concurrency, args.level_seconds))
    return {"tenants": len(keys), "overhead": over, "throughput": rates}


def bench_tenancy(args: argparse.Namespace, results: dict[str, Any], save) -> None:
    """Part 2: off and on, alternating for `--rounds` rounds, into `results`."""
    results.update({"off": [], "on": []})
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            results[mode].append(run_tenancy(args, mode))
            save()


# ---------------------------------------------------------------- part 3: multi-turn


MULTI_TURN_QUICK = {  # a check that the runner works, in a few minutes: not a measurement
    "users": 24, "tenants": 2, "turns": "3", "system_len": "200-300", "message_len": "60-120",
    "reply_len": "8-16", "user_rate": 4.0, "think_s": 0.5, "rounds": 1,
    "kv_cache_blocks": 17, "tier_gib": 0.25,  # 17: the fewest that hold a 2048-token context
}


def add_multi_turn_args(p: argparse.ArgumentParser) -> None:
    """Part multi_turn's options: the workload's (`splitserve bench --workload multi_turn`'s),
    with defaults whose working set passes one 1 GiB CPU engine's KV, and the runner's."""
    add_multi_turn_arguments(p, tenants=False)
    p.set_defaults(users=200, turns="4-8", system_len="300-600", message_len="100-250",
                   reply_len="32-64", user_rate=20.0, think_s=10.0)
    p.add_argument("--kv-cache-blocks", type=int, default=256,
                   help="multi_turn: KV blocks (128 tokens on the CPU) per decode engine, below "
                        "the working set (default %(default)s); 0: what kv_cache_gib holds")
    p.add_argument("--tier-gib", type=float, default=1.0,
                   help="multi_turn: kv_events+tier's host memory per engine (GiB)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="multi_turn: a config override for every configuration (YAML value), "
                        "e.g. kv_tier.size_gib=4; repeatable")
    p.add_argument("--configs", default=",".join(CONFIGURATIONS),
                   help="multi_turn: configurations, comma-separated")
    p.add_argument("--quick", action="store_true",
                   help=f"multi_turn: a small workload, one round ({MULTI_TURN_QUICK})")


def multi_turn_base(keys: dict[str, str], kv_blocks: int, sets: Sequence[str]) -> Any:
    """The deployment all configurations share: colocated, 2 decode replicas (one core each)
    with `kv_blocks` KV blocks each (0: what their memory holds), the tenants, then the `--set`
    overrides; the configurations change the decode pool's routing and the KV tier."""
    import yaml

    extra = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: use KEY=VALUE")
        extra[key.strip()] = yaml.safe_load(value)
    return test_config(**{
        "mode": "colocated",
        "pools.decode.replicas": 2,
        "pools.decode.kv_cache_blocks": kv_blocks or None,
        "tenants": tenants_config(keys),
        **extra,
    })


def run_multi_turn(
    name: str, cfg: Any, keys: dict[str, str], convs: list[Conversation], out: Path, seed: int
) -> dict[str, Any]:
    """Deploy `cfg`, warm up, replay the conversations; TTFTs, the engines' counters."""
    start = time.perf_counter()
    with running_deployment(cfg) as base:
        print(f"[multi_turn/{name}] ready after {time.perf_counter() - start:.0f} s", flush=True)
        for tr in warmup_workload(list(keys), 4, seed):
            asyncio.run(send_workload(base, keys, [tr]))
        time.sleep(1)
        before = pool_stats("decode", 2)
        turns, duration = asyncio.run(
            replay_conversations(f"{base}/v1", MODEL, keys, convs, timeout_s=600))
        time.sleep(2)  # the engines' last step statistics
        after = pool_stats("decode", 2)
    path = out / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(json_safe(t.to_json())) + "\n" for t in turns))
    ok = [t for t in turns if t.result.ok and t.result.ttft_s is not None]
    return {
        **summarize_turns(turns),
        "duration_s": duration,
        "ttft_ms_all": [t.result.ttft_s * 1000 for t in ok],
        "ttft_ms_follow_up": [t.result.ttft_s * 1000 for t in ok if t.turn > 0],
        "cache": cache_delta(before, after),
        "kv_capacity_tokens": kv_capacity_tokens(after),
        "measured_working_set": vars(measured_working_set(convs, turns)),
    }


def bench_multi_turn(args: argparse.Namespace, out: Path, results: dict[str, Any], save) -> None:
    """Part 3: each configuration that validates, once per round, interleaved; into `results`."""
    keys = tenant_keys(args.tenants)
    base = multi_turn_base(keys, args.kv_cache_blocks, args.set)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    configs, skipped = check_configurations(base, names, "decode", ENGINE_BLOCK, args.tier_gib)
    convs = build_conversations(
        spec_from_args(args, args.tenants, base.model.max_model_len, TOKENS))
    nominal = working_set(convs)
    results.update({
        "deployment": "colocated, 2 decode replicas (one core each); routing: router.routing.decode",
        "workload": {k: getattr(args, k) for k in (*MULTI_TURN_QUICK, "seed")},
        "config_overrides": args.set,
        "conversations": len(convs),
        "turns": sum(c.turns for c in convs),
        "nominal_working_set": vars(nominal),
        "skipped": skipped,
        "rounds": [],
    })
    print(f"[multi_turn] {len(convs)} conversations, {results['turns']} turns; working set "
          f"(nominal schedule): peak live {nominal.peak_live_tokens} tokens, "
          f"{nominal.peak_live_unique_tokens} distinct; all histories {nominal.total_tokens}",
          flush=True)
    for name, why in skipped.items():
        print(f"[multi_turn] skipped {name}: {why}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))  # balance drift
        for name in order:
            run = run_multi_turn(name, configs[name], keys, convs,
                                 out / "multi_turn" / f"round-{r}", args.seed)
            runs[name].append(run)
            results["rounds"].append({"round": r, "configuration": name, **{
                k: v for k, v in run.items() if not k.startswith("ttft_ms_")}})
            save()
            print_capacity(name, run, nominal)
    combined = {name: combine(rs) for name, rs in runs.items() if rs}
    results["combined"] = combined
    results["ratios_to_round_robin"] = {
        n: ttft_ratio(combined, n, "round_robin") for n in combined if n != "round_robin"}
    results["table"] = format_comparison(combined, skipped)


def print_capacity(name: str, run: dict[str, Any], nominal: WorkingSet) -> None:
    """One run's line: TTFT, hit rate, and the working set against one engine's KV."""
    cap, ws = run["kv_capacity_tokens"], run["measured_working_set"]
    hit = run["cache"]["hit_rate"]
    print(f"[multi_turn/{name}] TTFT mean {run['ttft_ms']['mean'] or 0:.1f} ms, "
          f"p90 {run['ttft_ms']['p90'] or 0:.1f} ms, failed {run['failed']}, hit rate "
          f"{'-' if hit is None else f'{hit:.1%}'}, tokens loaded by KV connectors "
          f"{run['cache']['loaded_tokens'] or 0}; working set: peak "
          f"{ws['peak_live_tokens']} tokens live, {ws['peak_live_unique_tokens']} distinct "
          f"(replayed; nominal {nominal.peak_live_tokens} / {nominal.peak_live_unique_tokens})"
          f" against one engine's KV of {cap} tokens: "
          f"{'exceeds' if ws['peak_live_unique_tokens'] > cap else 'does NOT exceed'} it",
          flush=True)


# ---------------------------------------------------------------- tables and main


def print_prefix(res: dict[str, Any]) -> None:
    """The prefix-routing table."""
    print(
        f"{'prefill policy':<16}{'TTFT mean':>10}{'p90':>8}{'e2e p90':>9}{'failed':>8}"
        f"{'prefill hit':>13}{'simulated':>11}{'decode hit':>12}  prefill tokens per replica"
    )
    for policy, r in res["policies"].items():
        per = [v["queried_tokens"] for v in r["prefill_cache"]["per_replica"].values()]
        hit = r["prefill_cache"]["hit_rate"] or 0.0
        dec = r["decode_cache"]["hit_rate"] or 0.0
        print(
            f"{policy:<16}{r['ttft_ms']['mean']:>10.1f}{r['ttft_ms']['p90']:>8.1f}"
            f"{r['e2e_ms']['p90']:>9.1f}{r['failed']:>8}{hit:>13.1%}"
            f"{r['simulated_prefill_hit_rate']:>11.1%}{dec:>12.1%}  {per}"
        )


def print_tenancy(res: dict[str, Any]) -> None:
    """The tenancy-overhead table (latency in ms, rates in completed requests/s)."""
    print(
        f"{'tenancy':<9}{'direct p50':>11}{'p99':>8}{'router p50':>11}{'p99':>8}"
        f"{'added p50':>10}{'p99':>8}{'paired':>8}   req/s by concurrency; max; direct; ratio"
    )
    for mode, rounds in res.items():
        for r in rounds:
            o, t = r["overhead"], r["throughput"]
            by_c = " ".join(f"{p['concurrency']}:{p['requests_per_s']}" for p in t["points"])
            print(
                f"{mode:<9}{o['direct_p50_ms']:>11}{o['direct_p99_ms']:>8}"
                f"{o['router_p50_ms']:>11}{o['router_p99_ms']:>8}{o['added_p50_ms']:>10}"
                f"{o['added_p99_ms']:>8}{o['paired_diff_median_ms']:>8}   {by_c}; "
                f"{t['max_requests_per_s']}; {t['direct_at_top_concurrency']['requests_per_s']}; "
                f"{t['router_over_direct']}"
            )


def main(argv: list[str] | None = None) -> None:
    """Run the chosen parts; results.json is rewritten after each deployment."""
    args = parse_args(argv)
    out = Path(args.out)
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "args": {k: v for k, v in vars(args).items()},
    }

    def save() -> None:
        write_json(out / "results.json", doc)

    if "prefix" in args.part:
        doc["prefix"] = {}
        bench_prefix(args, out, doc["prefix"], save)
        print_prefix(doc["prefix"])
    if "multi_turn" in args.part:
        doc["multi_turn"] = {}
        bench_multi_turn(args, out, doc["multi_turn"], save)
        save()
        print(doc["multi_turn"]["table"])
    if "tenancy" in args.part:
        doc["tenancy"] = {}
        bench_tenancy(args, doc["tenancy"], save)
        print_tenancy(doc["tenancy"])
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
