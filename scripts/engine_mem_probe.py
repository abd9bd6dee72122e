"""Probe: does one vLLM CPU engine's memory grow per request, or per new prompt shape?

    .venv/bin/python scripts/engine_mem_probe.py [--requests 300] [--passes 2] [--prompt-len 16-1500]
        [--max-tokens 2] [--sample-every 50] [--seed 0] [--out FILE.json]

One engine built exactly as a splitserve worker builds it (`engine_spec` / `engine_kwargs` /
`engine_env` of the default config, colocated: no NIXL), driven here without Ray. Pass 1 sends
`--requests` prompts of random lengths (uniform over `--prompt-len`, fresh random tokens: no
prefix-cache hits); every further pass sends the *same lengths* again in a new order, with new
tokens. RSS of every engine process is sampled every `--sample-every` requests.

A per-request leak grows in every pass alike; caches that fill once per shape (oneDNN
primitives keyed by the token count M, allocator pools sized by it) grow in pass 1 only. Vary
one thing at a time from outside, through the environment of this process (the engine's
processes inherit it), e.g. `MALLOC_ARENA_MAX=2`, `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`,
`LD_PRELOAD=<jemalloc>`. Must run under the engine lock (it starts a real engine on core 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.config import load_config
from splitserve.engine.args import engine_env, engine_kwargs, engine_spec
from splitserve.models import resolve_model_path

ENV_KNOBS = ("LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
             "MALLOC_TOP_PAD_", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "MALLOC_CONF")


def engine_rss() -> dict[str, float]:
    """RSS MiB of this process and each engine process under it, by title + pid."""
    out = {"driver": psutil.Process().memory_info().rss / 2**20}
    for p in psutil.Process().children(recursive=True):
        try:
            title = (p.cmdline() or [p.name()])[0].split(" ")[0]
            out[f"{title} [{p.pid}]"] = p.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {k: round(v, 1) for k, v in out.items()}


def main() -> int:
    """Run the passes; print one line per sample, write --out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--prompt-len", default="16-1500")
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--sample-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.prompt_len.split("-"))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = engine_spec(load_config(None).with_overrides(mode="colocated"), "decode", "cpu")
    os.environ.update(engine_env(spec, [0]))
    llm = LLM(**engine_kwargs(spec, resolve_model_path(spec.model)))
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(lo, hi + 1, size=args.requests)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    samples = [{"pass": 0, "done": 0, "rss": engine_rss()}]
    print("env:", {k: os.environ[k] for k in ENV_KNOBS if k in os.environ}, flush=True)
    print(f"start {samples[0]['rss']}", flush=True)
    t0 = time.perf_counter()
    for p in range(1, args.passes + 1):
        order = lengths if p == 1 else rng.permutation(lengths)
        for i, n in enumerate(order, 1):
            ids = rng.integers(10, 500, size=int(n)).tolist()
            llm.generate(TokensPrompt(prompt_token_ids=ids), sp, use_tqdm=False)
            if i % args.sample_every == 0 or i == len(order):
                s = {"pass": p, "done": i, "t_s": round(time.perf_counter() - t0, 1),
                     "rss": engine_rss()}
                samples.append(s)
                print(f"pass {p} req {i:4d} t={s['t_s']:6.1f}s {s['rss']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"args": vars(args), "env": {k: os.environ.get(k) for k in ENV_KNOBS},
             "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
