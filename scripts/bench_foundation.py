"""Foundation benchmark: start-up time to first token, and the router's added latency.

    .venv/bin/python scripts/bench_foundation.py [--requests 200] [--skip-startup]

1. Start-up: runs `make serve` on a free port (warm machine: venv and tiny model present) and
   measures the wall time until the first chat completion returns through the `openai` client.
2. Router overhead: one colocated deployment (one engine on one core). Requests alternate between
   the full HTTP path (Serve proxy → router → engine) and the engine called directly through its
   Serve deployment handle, with the same token ids, so that both see the same machine noise.
   Reports p50/p99 of each and of the difference.

Prints a table and writes bench-results/foundation.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port, running_deployment, test_config  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog while the small model counts tokens."


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def bench_startup() -> dict:
    """Seconds from `make serve` to the first answered chat completion."""
    import openai

    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["make", "-s", "serve", f"ARGS=--port {port}"], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    first_token = None
    try:
        while time.perf_counter() - start < 600:
            try:
                client.chat.completions.create(
                    model="splitserve-tiny", messages=[{"role": "user", "content": "hi"}],
                    max_tokens=1, timeout=5,
                )
                first_token = time.perf_counter() - start
                break
            except openai.APIError:
                time.sleep(0.25)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    return {"make_serve_to_first_token_s": first_token}


async def _direct(handle, ids: list[int], max_tokens: int, i: int) -> float:
    from splitserve.engine.messages import GenerateRequest, Sampling

    req = GenerateRequest(
        request_id=f"bench-direct-{i}", prompt_token_ids=tuple(ids),
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
    )
    t = time.perf_counter()
    async for _ in handle.options(stream=True).generate.remote(req):
        pass
    return time.perf_counter() - t


async def _routed(client: httpx.AsyncClient, ids: list[int], max_tokens: int) -> float:
    t = time.perf_counter()
    r = await client.post(
        "/v1/completions",
        json={"model": "splitserve-tiny", "prompt": ids, "max_tokens": max_tokens,
              "temperature": 0},
    )
    r.raise_for_status()
    return time.perf_counter() - t


def bench_overhead(n: int, max_tokens_list: tuple[int, ...]) -> dict:
    """Router vs direct engine latency, interleaved, sequential requests."""
    from ray import serve
    from transformers import AutoTokenizer

    from splitserve.models import build_tiny_model

    ids = AutoTokenizer.from_pretrained(build_tiny_model())(PROMPT)["input_ids"]
    results = {}
    with running_deployment(test_config(mode="colocated")) as base:
        handle = serve.get_deployment_handle("decode", app_name="splitserve")

        async def run(max_tokens: int) -> dict:
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                for i in range(10):  # warm-up both paths
                    await _direct(handle, ids, max_tokens, -i - 1)
                    await _routed(client, ids, max_tokens)
                direct, routed = [], []
                for i in range(n):
                    direct.append(await _direct(handle, ids, max_tokens, i))
                    routed.append(await _routed(client, ids, max_tokens))
            diffs = [r - d for r, d in zip(routed, direct)]
            ms = lambda xs, q: round(pct(xs, q) * 1000, 2)  # noqa: E731
            return {
                "requests": n,
                "prompt_tokens": len(ids),
                "direct_p50_ms": ms(direct, 0.5), "direct_p99_ms": ms(direct, 0.99),
                "router_p50_ms": ms(routed, 0.5), "router_p99_ms": ms(routed, 0.99),
                "added_p50_ms": round((pct(routed, .5) - pct(direct, .5)) * 1000, 2),
                "added_p99_ms": round((pct(routed, .99) - pct(direct, .99)) * 1000, 2),
                "paired_diff_median_ms": round(statistics.median(diffs) * 1000, 2),
            }

        for mt in max_tokens_list:
            results[f"max_tokens={mt}"] = asyncio.run(run(mt))
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--skip-startup", action="store_true")
    args = p.parse_args()
    out: dict = {"machine": {"cpus": os.cpu_count()}}
    if not args.skip_startup:
        out["startup"] = bench_startup()
        print(f"make serve -> first token: {out['startup']['make_serve_to_first_token_s']:.1f} s")
    out["router_overhead"] = bench_overhead(args.requests, (1, 16))
    print(f"{'case':<14}{'direct p50':>11}{'p99':>8}{'router p50':>12}{'p99':>8}"
          f"{'added p50':>11}{'p99':>8}  (ms)")
    for case, r in out["router_overhead"].items():
        print(f"{case:<14}{r['direct_p50_ms']:>11}{r['direct_p99_ms']:>8}{r['router_p50_ms']:>12}"
              f"{r['router_p99_ms']:>8}{r['added_p50_ms']:>11}{r['added_p99_ms']:>8}")
    dest = ROOT / "bench-results" / "foundation.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(out, indent=2))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
