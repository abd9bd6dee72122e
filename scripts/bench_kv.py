"""KV transfer bandwidth, and the handoff's share of TTFT, on this machine.

    .venv/bin/python scripts/bench_kv.py [--lengths 256,1024,2040] [--repeats 10] [--warmup 3]
        [--max-tokens 4] [--copy-repeats 30] [--skip-colocated] [--seed 0] [--out bench-results/kv]

1. Disaggregated deployment (1 prefill + 1 decode worker, each on a core of its own,
   `disaggregation.prefill: remote`, Ray in this process
   through `tests.conftest.running_deployment`). For each prompt length, after `--warmup` unmeasured
   rounds, `--repeats` rounds of two sequential requests, each with a fresh random prompt (no
   prefix-cache hit is possible between repeats):
     routed   streamed `/v1/completions` through the router: client TTFT, and the decode engine's
              NIXL connector stats for that request (bytes and transfer duration: the deltas of
              `EngineStats.kv_bytes_received` / `kv_transfer_seconds`);
     handles  the router's dispatch steps done here through the Serve handles: the prefill hop
              (`max_tokens=1`, `do_remote_decode`), then the decode request carrying the handoff,
              timed to its first token chunk; the same connector-stat deltas.
   TTFT is split into the prefill hop, the NIXL transfer, and the rest of the decode's first
   chunk (the one-token forward, scheduling, polling, Ray streaming); "router" is the routed
   TTFT minus the handles' TTFT (paired median), i.e. HTTP, tokenization and admission.
2. Plain memory copy of the same number of bytes in this process (torch `copy_` and numpy
   `copyto`, one thread, warm buffers), median over `--copy-repeats`.
3. Colocated deployment (one engine on one core) for the same prompt lengths: routed TTFT.

The tiny model's context is 2048 tokens, so the longest prompt is 2040 with `--max-tokens 4`.
Writes <out>/kv.json (every sample and the summaries) and prints two tables.
Time: about 6 minutes on 2 cores with the defaults (two engine start-ups of 1-2 min each).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.kv_transfer.handoff import KVHandoff, prefill_request_params  # noqa: E402

from splitserve.bench.client import Target, make_client, send_one  # noqa: E402
from splitserve.bench.report import write_json  # noqa: E402
from splitserve.bench.workload import DEFAULT_TOKEN_RANGE, BenchRequest  # noqa: E402
from splitserve.engine.messages import GenerateRequest  # noqa: E402
from splitserve.router.forward import engine_request  # noqa: E402
from tests.conftest import running_deployment, test_config  # noqa: E402

MODEL = "splitserve-tiny"
DISAGG = {
    "mode": "disaggregated",
    "disaggregation.min_remote_prompt_tokens": 0,
    "disaggregation.prefill": "remote",  # every prompt takes the NIXL path
}
COLOCATED = {"mode": "colocated"}
STATS_WAIT_S = 2.0  # the stat logger records a step's connector stats just after the step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="256,1024,2040", help="prompt lengths in tokens")
    p.add_argument("--repeats", type=int, default=10, help="measured rounds per length")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured rounds per length")
    p.add_argument("--max-tokens", type=int, default=4, help="output tokens per request")
    p.add_argument("--copy-repeats", type=int, default=30, help="memcpy repeats per size")
    p.add_argument("--skip-colocated", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/kv")
    args = p.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",")]
    if max(args.lengths) + args.max_tokens > 2048:
        p.error("prompt + max_tokens must fit the tiny model's 2048-token context")
    return args


def pct(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100, linear interpolation) of xs; None when empty."""
    return float(np.percentile(xs, q)) if xs else None


def summary(xs: list[float], scale: float = 1.0) -> dict[str, float | None]:
    """p50 and p90 of xs x scale."""
    ys = [x * scale for x in xs]
    return {"p50": pct(ys, 50), "p90": pct(ys, 90)}


class Prompts:
    """Fresh random prompts of exact lengths (ids as the bench workload draws them)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, n: int) -> tuple[int, ...]:
        low, high = DEFAULT_TOKEN_RANGE
        return tuple(int(t) for t in self.rng.integers(low, high, size=n))


async def kv_delta(decode, before, expect: int = 1) -> dict:
    """The decode engine's connector-stat deltas since `before` (waits for `expect` pulls)."""
    deadline = time.perf_counter() + STATS_WAIT_S
    while True:
        after = await decode.stats.remote()
        if after.kv_transfers - before.kv_transfers >= expect or time.perf_counter() > deadline:
            break
        await asyncio.sleep(0.02)
    return {
        "transfers": after.kv_transfers - before.kv_transfers,
        "nixl_bytes": after.kv_bytes_received - before.kv_bytes_received,
        "transfer_s": after.kv_transfer_seconds - before.kv_transfer_seconds,
        "failures": after.kv_transfer_failures - before.kv_transfer_failures,
    }


async def routed(client, target: Target, decode, ids: tuple[int, ...], max_tokens: int,
                 i: int) -> dict:
    """One streamed request through the router: client TTFT and (decode given) its KV pull."""
    before = await decode.stats.remote() if decode is not None else None
    req = BenchRequest(i, 0.0, ids, max_tokens)
    rec = await send_one(client, target, req, time.perf_counter())
    if rec.error is not None:
        raise RuntimeError(f"routed request {i} failed: {rec.error}")
    out = {"ttft_s": rec.ttft_s, "e2e_s": rec.e2e_s, "output_tokens": rec.output_tokens}
    if decode is not None:
        out |= await kv_delta(decode, before)
    return out


async def handles(prefill, decode, ids: tuple[int, ...], max_tokens: int, i: int) -> dict:
    """The router's dispatch steps through the Serve handles, each hop timed."""
    req = GenerateRequest.completion(f"bench-kv-{i}", ids, max_tokens, ignore_eos=True)
    before = await decode.stats.remote()
    t0 = time.perf_counter()
    pre = dataclasses.replace(
        req, request_id=f"{req.request_id}-prefill", kv_transfer_params=prefill_request_params(),
    )
    params, prefill_cached = None, 0
    async for chunk in prefill.options(stream=True).generate.remote(engine_request(pre)):
        params = chunk.kv_transfer_params or params
        prefill_cached = max(prefill_cached, chunk.num_cached_tokens)
    t1 = time.perf_counter()
    handoff = KVHandoff.from_params(params)
    dec = dataclasses.replace(req, kv_transfer_params=handoff.decode_request_params())
    first, tokens, chunk_bytes, received = None, 0, 0, 0
    async for chunk in decode.options(stream=True).generate.remote(engine_request(dec)):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        tokens += len(chunk.token_ids)
        chunk_bytes += chunk.kv_bytes
        received = max(received, chunk.num_cached_tokens)
    return {
        "prefill_hop_s": t1 - t0,
        "decode_first_chunk_s": first - t1,
        "ttft_s": first - t0,
        "output_tokens": tokens,
        "blocks": handoff.num_blocks,
        "chunk_kv_bytes": chunk_bytes,
        "prefill_cached_tokens": prefill_cached,
        "decode_received_tokens": received,
        **await kv_delta(decode, before),
    }


async def disagg_length(base: str, n: int, args, prompts: Prompts, log: list) -> dict:
    """Warm-up then paired routed/handle rounds for one prompt length."""
    from ray import serve

    prefill = serve.get_deployment_handle("prefill", app_name="splitserve")
    decode = serve.get_deployment_handle("decode", app_name="splitserve")
    out = {"routed": [], "handles": []}
    target = Target(f"{base}/v1", MODEL)
    async with make_client(target) as client:
        for i in range(args.warmup + args.repeats):
            r = await routed(client, target, decode, prompts(n), args.max_tokens, i)
            h = await handles(prefill, decode, prompts(n), args.max_tokens, len(log))
            log.append({"prompt_tokens": n, "round": i, "routed": r, "handles": h})
            if i >= args.warmup:
                out["routed"].append(r)
                out["handles"].append(h)
    return out


def run_disagg(args, prompts: Prompts) -> tuple[dict, list]:
    """Every length on one disaggregated deployment; samples by length and the full log."""
    samples, log = {}, []
    start = time.perf_counter()
    with running_deployment(test_config(**DISAGG)) as base:
        print(f"[disagg] ready after {time.perf_counter() - start:.0f} s ({base})", flush=True)
        for n in args.lengths:
            samples[n] = asyncio.run(disagg_length(base, n, args, prompts, log))
            print(f"[disagg] prompt {n}: done", flush=True)
    return samples, log


def run_colocated(args, prompts: Prompts) -> dict:
    """Routed TTFT samples by length on one colocated engine."""

    async def length(base: str, n: int) -> list[dict]:
        target = Target(f"{base}/v1", MODEL)
        async with make_client(target) as client:
            rs = [await routed(client, target, None, prompts(n), args.max_tokens, i)
                  for i in range(args.warmup + args.repeats)]
        return rs[args.warmup:]

    start = time.perf_counter()
    with running_deployment(test_config(**COLOCATED)) as base:
        print(f"[colocated] ready after {time.perf_counter() - start:.0f} s", flush=True)
        return {n: asyncio.run(length(base, n)) for n in args.lengths}


def copy_seconds(nbytes: int, repeats: int) -> dict[str, float]:
    """Median seconds of one warm single-threaded copy of `nbytes`: torch copy_ and numpy."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.zeros(nbytes, dtype=torch.uint8)
        a, b = src.numpy(), np.zeros(nbytes, dtype=np.uint8)
        timings: dict[str, list[float]] = {"torch": [], "numpy": []}
        for k in range(repeats + 3):  # the first 3 warm caches and page tables
            t = time.perf_counter()
            dst.copy_(src)
            t1 = time.perf_counter()
            np.copyto(b, a)
            t2 = time.perf_counter()
            if k >= 3:
                timings["torch"].append(t1 - t)
                timings["numpy"].append(t2 - t1)
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(ts) for name, ts in timings.items()}


def summarize_length(s: dict, copies: dict[str, float], coloc: list[dict] | None) -> dict:
    """Medians and p90s of one length's samples (see the tables)."""
    r, h = s["routed"], s["handles"]
    xfer = [x["transfer_s"] for x in r + h]
    nbytes = [x["nixl_bytes"] for x in r + h]
    gbps = [b / t / 1e9 for b, t in zip(nbytes, xfer, strict=True) if t > 0]
    med_bytes = int(statistics.median(nbytes))
    rest = [x["decode_first_chunk_s"] - x["transfer_s"] for x in h]
    router = [a["ttft_s"] - b["ttft_s"] for a, b in zip(r, h, strict=True)]
    return {
        "kv_bytes_p50": med_bytes,
        "blocks_p50": statistics.median(x["blocks"] for x in h),
        "transfers_per_request": sorted({x["transfers"] for x in r + h}),
        "transfer_failures": sum(x["failures"] for x in r + h),
        "prefill_cached_tokens_max": max(x["prefill_cached_tokens"] for x in h),
        "nixl_transfer_ms": summary(xfer, 1e3),
        "nixl_gb_per_s": summary(gbps),
        "memcpy_ms": {k: v * 1e3 for k, v in copies.items()},
        "memcpy_gb_per_s": {k: med_bytes / v / 1e9 for k, v in copies.items()},
        "routed_ttft_ms": summary([x["ttft_s"] for x in r], 1e3),
        "transfer_pct_of_ttft": summary([x["transfer_s"] / x["ttft_s"] for x in r], 100),
        "prefill_hop_ms": summary([x["prefill_hop_s"] for x in h], 1e3),
        "decode_first_chunk_ms": summary([x["decode_first_chunk_s"] for x in h], 1e3),
        "decode_first_chunk_minus_transfer_ms": summary(rest, 1e3),
        "handles_ttft_ms": summary([x["ttft_s"] for x in h], 1e3),
        "router_ms_paired": summary(router, 1e3),
        "colocated_ttft_ms": summary([x["ttft_s"] for x in coloc], 1e3) if coloc else None,
    }


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_tables(results: dict) -> None:
    """The bandwidth table and the TTFT-split table (p50, p90 in brackets)."""
    print(f"\n{'prompt':>6} {'KV MiB':>7} {'NIXL ms':>14} {'NIXL GB/s':>10} "
          f"{'memcpy ms':>10} {'memcpy GB/s':>12} {'numpy GB/s':>11}")
    for n, s in results.items():
        x, g = s["nixl_transfer_ms"], s["nixl_gb_per_s"]
        print(f"{n:>6} {s['kv_bytes_p50'] / 2**20:>7.2f} {_f(x['p50'], 2):>6} "
              f"({_f(x['p90'], 2):>5}) {_f(g['p50'], 2):>10} "
              f"{s['memcpy_ms']['torch']:>10.3f} {s['memcpy_gb_per_s']['torch']:>12.2f} "
              f"{s['memcpy_gb_per_s']['numpy']:>11.2f}")
    print(f"\n{'prompt':>6} {'TTFT ms':>14} {'xfer %':>12} {'prefill hop':>12} "
          f"{'xfer ms':>8} {'decode rest':>12} {'router':>7} {'colocated':>14}")
    for n, s in results.items():
        t, p = s["routed_ttft_ms"], s["transfer_pct_of_ttft"]
        c = s["colocated_ttft_ms"] or {"p50": None, "p90": None}
        print(f"{n:>6} {_f(t['p50']):>6} ({_f(t['p90']):>5}) {_f(p['p50']):>5} "
              f"({_f(p['p90']):>4}) {_f(s['prefill_hop_ms']['p50']):>12} "
              f"{_f(s['nixl_transfer_ms']['p50'], 2):>8} "
              f"{_f(s['decode_first_chunk_minus_transfer_ms']['p50']):>12} "
              f"{_f(s['router_ms_paired']['p50']):>7} {_f(c['p50']):>6} ({_f(c['p90']):>5})")


def main(argv: list[str] | None = None) -> None:
    """Disaggregated rounds, memcpy, colocated rounds; write kv.json and print the tables."""
    args = parse_args(argv)
    prompts = Prompts(args.seed)
    samples, log = run_disagg(args, prompts)
    coloc = None if args.skip_colocated else run_colocated(args, prompts)
    results = {}
    for n in args.lengths:
        nbytes = int(statistics.median(x["nixl_bytes"] for x in samples[n]["routed"]))
        copies = copy_seconds(max(nbytes, 1), args.copy_repeats)
        results[n] = summarize_length(samples[n], copies, coloc[n] if coloc else None)
    dest = write_json(Path(args.out) / "kv.json", {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "args": {k: v for k, v in vars(args).items()},
        "configs": {"disagg": DISAGG, "colocated": None if args.skip_colocated else COLOCATED},
        "results": results,
        "first_round": log[0] if log else None,  # includes the one-time NIXL handshake
        "samples": log,
        "colocated_samples": coloc,
    })
    print_tables(results)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
