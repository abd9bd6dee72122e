"""Foundation benchmark: start-up time to first token, and the router's added latency.

    .venv/bin/python scripts/bench_foundation.py [--requests 200] [--skip-startup]
        [--set router.direct_ingress=true]
    .venv/bin/python scripts/bench_foundation.py --startup-compare 2   # start-up only, A/B

1. Start-up: runs `make serve` on a free port (warm machine: venv and tiny model present) and
   measures the wall time until the first chat completion returns through the `openai` client.
2. Router overhead: one colocated deployment (one engine on one core). Requests alternate between
   the full HTTP path (Serve proxy → router → engine) and the engine called directly through its
   Serve deployment handle, with the same token ids, so that both see the same machine noise.
   Reports p50/p99 of each and of the difference.

`--startup-compare N` measures only start-up, N rounds of two `make serve` runs side by side:
engine workers forked by their EngineCore (the default) and spawned
(`SPLITSERVE_FORK_ENGINE_WORKERS=0`, vLLM's choice inside Ray; splitserve/engine/vllm_plugin.py).

Prints a table and writes bench-results/foundation.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.bench.overhead import paired_overhead  # noqa: E402
from tests.conftest import free_port, running_deployment, test_config  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog while the small model counts tokens."


def bench_startup(env: dict[str, str] | None = None) -> dict:
    """Seconds from `make serve` to the first answered chat completion (`env`: extra
    environment variables for `make serve`)."""
    import openai

    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["make", "-s", "serve", f"ARGS=--port {port}"], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, **(env or {})},
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


def bench_overhead(n: int, max_tokens_list: tuple[int, ...],
                   overrides: dict | None = None) -> dict:
    """Router vs direct engine latency, interleaved, sequential requests; `overrides`: dotted
    config overrides of the colocated deployment (e.g. router.direct_ingress)."""
    from ray import serve
    from transformers import AutoTokenizer

    from splitserve.models import build_tiny_model

    ids = AutoTokenizer.from_pretrained(build_tiny_model())(PROMPT)["input_ids"]
    results = {}
    with running_deployment(test_config(mode="colocated", **(overrides or {}))) as base:
        handle = serve.get_deployment_handle("decode", app_name="splitserve")
        for mt in max_tokens_list:
            results[f"max_tokens={mt}"] = asyncio.run(
                paired_overhead(base, handle, ids, pairs=n, max_tokens=mt)
            )
    return results


def compare_startup(rounds: int) -> None:
    """Start-up with the EngineCore forking its worker vs spawning it, alternating."""
    variants = {"fork": {}, "spawn": {"SPLITSERVE_FORK_ENGINE_WORKERS": "0"}}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for name, env in variants.items():
            s = bench_startup(env)["make_serve_to_first_token_s"]
            times[name].append(s)
            print(f"round {r + 1} {name:5s} make serve -> first token: {s:.1f} s", flush=True)
    for name, ts in times.items():
        print(f"{name:5s} median {sorted(ts)[len(ts) // 2]:.1f} s over {len(ts)} runs")
    dest = ROOT / "bench-results" / "startup_fork_vs_spawn.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(times, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dotted config override of the router-overhead deployment (YAML "
                   "value), e.g. router.direct_ingress=true; repeatable")
    p.add_argument("--startup-compare", type=int, default=0, metavar="N",
                   help="only start-up: N rounds of forked vs spawned engine workers")
    args = p.parse_args()
    if args.startup_compare:
        compare_startup(args.startup_compare)
        return
    out: dict = {"machine": {"cpus": os.cpu_count()}}
    if not args.skip_startup:
        out["startup"] = bench_startup()
        print(f"make serve -> first token: {out['startup']['make_serve_to_first_token_s']:.1f} s")
    import yaml

    overrides = {k: yaml.safe_load(v) for k, _, v in (i.partition("=") for i in args.set)}
    out["router_overhead"] = bench_overhead(args.requests, (1, 16), overrides)
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
