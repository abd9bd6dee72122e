"""TPOT of one CPU engine with and without the NIXL connector: same workload, same core.

Why: on the decode-heavy workload, disaggregated engines decoded at about twice the time per
token of colocated ones (BENCHMARKS.md, "offload"). The engines differ in one thing when no KV
moves: a disaggregated engine has vLLM's NixlConnector (scheduler and worker halves, a NIXL
agent with its progress thread). This probe runs one engine, configured as the deployment
configures a decode engine (`engine_spec`, `engine_kwargs`, `engine_env`), with and without
the connector, and times decode steps at several numbers of concurrent streams. No KV moves in
either variant, so any difference is the connector's per-step cost.
(The doubling itself turned out to be placement, not per-step cost: vLLM's connector moved
every engine's compute thread to the node's last core, so both disaggregated engines shared it.
This probe binds its engine to `--core`, default 1, that same core, and so could not see it.
The vLLM plugin now keeps each engine on its own cores; BENCHMARKS.md, session 7.)

Each variant runs in its own process (a fresh engine, bound to the same core); variants
alternate over `--rounds` so that the machine's noise falls on both. Prints one line per
variant and round, then per stream count the medians of TPOT and of the CPU time per output
token of the engine's two processes: the EngineCore (scheduler, and the connector's scheduler
half) and its worker (the model, and the connector's worker half). The EngineCore is not bound
to the engine's core, so on an idle machine its extra work does not show in TPOT; in a loaded
deployment it competes for the same cores.

    flock /tmp/engine.lock nice -n 5 .venv/bin/python scripts/probe_connector_tpot.py \
        [--variants plain,nixl,...] [--streams 16,32] [--rounds 2]

Variants: `plain` (no connector), `nixl` (the connector as deployed), `nixl-hooks-off` (UCX's
malloc/mmap hooks off), `nixl-tls-tcp` (UCX limited to its TCP transport, so each progress
call polls fewer transports; limited to shared memory, `sm,self`, the engine fails to start),
`tier` (vLLM's OffloadingConnector with 1 GiB of host memory, `kv_tier.medium: cpu`: every
newly full block is stored in the tier; the engine's own KV is large enough that nothing is
evicted or loaded back, so a difference is the tier's cost per step and per stored block).
Each stream count also reports the mean TTFT of its streams (all start together: the later
ones queue behind the earlier ones' prefills), e.g. with long prompts:

    .venv/bin/python scripts/probe_connector_tpot.py --variants plain,tier \
        --prompt-len 1024 --output-len 32 --streams 1,8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import proc_cpu  # scripts/proc_cpu.py: this script's folder is on sys.path

# variant -> environment of the engine with the connector (None: no connector). UCX, which NIXL
# loads, hooks malloc and mmap in the whole process by default to track registered memory.
UCX_HOOKS_OFF = {"UCX_MEM_MALLOC_HOOKS": "no", "UCX_MEM_MMAP_HOOK_MODE": "none"}
# UCX_TLS: the transports UCX's worker progresses on every call (unset: all it finds).
VARIANT_ENV: dict[str, dict[str, str] | None] = {
    "plain": None, "nixl": {}, "nixl-hooks-off": UCX_HOOKS_OFF,
    "nixl-tls-tcp": {"UCX_TLS": "tcp,self"},  # (UCX_TLS=sm,self: the engine fails to start)
}
# `tier`: vLLM's OffloadingConnector, 1 GiB of host memory (`kv_tier.medium: cpu`), no NIXL
VARIANTS = (*VARIANT_ENV, "tier")
PROCESSES = ("VLLM::EngineCore", "VLLM::Worker")


def _owner(title: str, names: tuple[str, ...]) -> str | None:
    """The first of `names` that the process title starts with (None: not one of them)."""
    return next((n for n in names if title.startswith(n)), None)


def cpu_seconds(names: tuple[str, ...] = PROCESSES) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the processes whose title starts with each
    name (vLLM sets its processes' titles), summed per name."""
    out = dict.fromkeys(names, 0.0)
    for task in proc_cpu.tasks():
        name = _owner(task.title, names)
        if name is not None:
            out[name] += task.cpu_s
    return out


def thread_cpu_seconds(names: tuple[str, ...] = PROCESSES) -> dict[str, float]:
    """CPU seconds used so far by each thread of those processes, keyed "<process>/<thread
    name>" (threads of one name summed): tells a process's compute thread from its helpers
    (NIXL's progress threads, vLLM's busy-waiting message queue, OpenMP)."""
    out: dict[str, float] = {}
    for task in proc_cpu.tasks(lambda title: title.startswith(names)):
        name = _owner(task.title, names)
        if name is not None:  # every other process comes whole, not split into threads
            key = f"{name}/{task.name}"
            out[key] = out.get(key, 0.0) + task.cpu_s
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="1,4,8,16", help="concurrent streams, comma-separated")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--core", type=int, default=1, help="the core the engine runs on")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated subset of: " + ", ".join(VARIANTS))
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def _measure(variant: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """In a child process: start the engine and time decode at each stream count."""
    import numpy as np
    from splitserve.kv_transfer.nixl import nixl_env, nixl_transfer_config
    from vllm import SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from splitserve.config import load_config
    from splitserve.engine.args import engine_env, engine_kwargs, engine_spec
    from splitserve.models import build_tiny_model, resolve_model_path

    cfg = load_config(None).with_overrides(mode="disaggregated")
    spec = engine_spec(cfg, "decode", "cpu", kv_host="127.0.0.1")
    os.environ.update(engine_env(spec, [args.core]))
    build_tiny_model()
    kwargs = engine_kwargs(spec, resolve_model_path(spec.model, spec.tiny_variant))
    if variant == "tier":
        from splitserve.kv_transfer.tier import tier_transfer_config

        kwargs["kv_transfer_config"] = KVTransferConfig(**tier_transfer_config("cpu", 1.0))
    elif VARIANT_ENV[variant] is not None:  # a NIXL variant
        os.environ.update(nixl_env("127.0.0.1", 15600))
        os.environ.update(VARIANT_ENV[variant])
        kwargs["kv_transfer_config"] = KVTransferConfig(
            **nixl_transfer_config("probe-decode", "cpu")
        )
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    rng = np.random.default_rng(0)

    ttfts: list[float] = []

    async def one(n_out: int) -> float:
        ids = [int(t) for t in rng.integers(10, 500, args.prompt_len)]
        sp = SamplingParams(max_tokens=n_out, min_tokens=n_out, temperature=0.0, ignore_eos=True)
        first, n, sent = None, 0, time.perf_counter()
        async for out in engine.generate(
            TokensPrompt(prompt_token_ids=ids), sp, request_id=f"p-{time.time_ns()}-{rng.random()}"
        ):
            if first is None:
                first = time.perf_counter()
                ttfts.append(first - sent)
            n = len(out.outputs[0].token_ids)
        return (time.perf_counter() - first) / max(n - 1, 1)

    await asyncio.gather(*(one(8) for _ in range(4)))  # warm-up
    result: dict[int, dict[str, float]] = {}
    for s in (int(x) for x in args.streams.split(",")):
        before, threads_before = cpu_seconds(), thread_cpu_seconds()
        ttfts.clear()
        per_stream = await asyncio.gather(*(one(args.output_len) for _ in range(s)))
        used = {k: v - before[k] for k, v in cpu_seconds().items()}
        threads = {k: v - threads_before.get(k, 0.0) for k, v in thread_cpu_seconds().items()}
        tokens = s * args.output_len
        result[s] = {"tpot_ms": 1000 * statistics.mean(per_stream),
                     "ttft_ms": 1000 * statistics.mean(ttfts),
                     "core_cpu_ms_per_token": 1000 * used["VLLM::EngineCore"] / tokens,
                     "worker_cpu_ms_per_token": 1000 * used["VLLM::Worker"] / tokens,
                     "threads_cpu_ms_per_token": {k: 1000 * v / tokens
                                                  for k, v in threads.items() if v > 0}}
    engine.shutdown()
    return result


def _run_child(variant: str, argv: list[str]) -> dict[str, dict[str, float]]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, *argv],
        capture_output=True, text=True, timeout=600, check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{variant} probe failed (rc {out.returncode}):\n{out.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(asyncio.run(_measure(args.child, args))), flush=True)
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants:
            res = _run_child(variant, argv)
            runs[variant].append(res)
            cells = "  ".join(f"{s}:{v['tpot_ms']:.1f}/{v['core_cpu_ms_per_token']:.2f}"
                              for s, v in res.items())
            print(f"round {r + 1} {variant:14s} streams:TPOT ms/EngineCore CPU ms per token  "
                  f"{cells}", flush=True)
    print("\nCPU ms per output token by thread (medians over rounds), per stream count")
    for s in runs[variants[0]][0]:
        names = sorted({k for v in variants for run in runs[v]
                        for k in run[s].get("threads_cpu_ms_per_token", {})})
        for name in names:
            cells = [statistics.median(run[s].get("threads_cpu_ms_per_token", {}).get(name, 0.0)
                                       for run in runs[v]) for v in variants]
            if max(cells) >= 0.01:
                print(f"{s:>7}  {name:<48} " + "  ".join(
                    f"{v} {c:6.2f}" for v, c in zip(variants, cells, strict=True)))

    def med(variant: str, s: str, key: str) -> float:
        return statistics.median(run[s][key] for run in runs[variant])

    print("\nmedians per variant: TTFT ms / TPOT ms / EngineCore CPU ms per output token / "
          "worker CPU ms per output token")
    print("streams  " + "  ".join(f"{v:>32}" for v in variants))
    for s in runs[variants[0]][0]:
        print(f"{s:>7}  " + "  ".join(
            f"{med(v, s, 'ttft_ms'):7.1f} /{med(v, s, 'tpot_ms'):6.1f} /"
            f"{med(v, s, 'core_cpu_ms_per_token'):6.2f} /"
            f"{med(v, s, 'worker_cpu_ms_per_token'):6.2f}" for v in variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
