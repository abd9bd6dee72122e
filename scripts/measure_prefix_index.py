"""Bytes per entry of the router's prefix index, and what `index_max_blocks: auto` costs.

Fills a `PrefixIndex` past its bound with real block hashes (random prompts, a salt per
tenant, the default routing block size) and measures the Python heap it holds with tracemalloc:
once with each block sent to one replica, once with every prompt sent to two. Then prints the
auto bound and its memory for the default CPU deployment (the built-in tiny model, 1 GiB of KV
per engine, one replica per pool) and for a GPU example. No Ray, no engines; a few seconds.

    .venv/bin/python scripts/measure_prefix_index.py [--entries 200000]
"""

from __future__ import annotations

import argparse
import random
import tracemalloc

from splitserve.config import load_config
from splitserve.models import tiny
from splitserve.router.routing import PrefixIndex, auto_index_blocks, routing_request

PROMPT_TOKENS = 640  # 40 routing blocks of 16


def bytes_per_entry(entries: int, holders: int, seed: int = 0) -> float:
    """Heap bytes per entry of an index filled to `entries` (each prompt sent to `holders`
    replicas). The hashes are computed before tracing: only the index's memory is counted."""
    rng = random.Random(seed)
    prompts = []
    for i in range(entries // (PROMPT_TOKENS // 16) + 1):
        ids = [rng.randrange(10, 500) for _ in range(PROMPT_TOKENS)]
        prompts.append(routing_request(ids, f"tenant-{i % 7}").block_hashes)
    tracemalloc.start()
    index = PrefixIndex(entries)
    for i, hashes in enumerate(prompts):
        for h in range(holders):
            index.record(f"replica-{(i + h) % 4}", hashes)
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(index) == entries
    return used / entries


def tiny_kv_tokens(kv_cache_gib: int) -> int:
    """The tiny model's KV cache in tokens on the CPU (float32 K and V, every layer)."""
    per_token = 2 * tiny.LAYERS * tiny.KV_HEADS * tiny.HEAD_DIM * 4
    return kv_cache_gib * (1 << 30) // per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    args = ap.parse_args()
    one = bytes_per_entry(args.entries, 1)
    two = bytes_per_entry(args.entries, 2)
    print(f"bytes per entry: {one:.0f} (one replica per block), {two:.0f} (two replicas)")
    print(f"old default (1 << 20 entries): {(1 << 20) * one / 2**20:.0f} MiB per index")

    cfg = load_config(None)
    block = cfg.router.routing.block_size
    rows = []
    for role, pool in cfg.deployed_pools().items():
        rows.append((f"default CPU, {role} pool", tiny_kv_tokens(pool.kv_cache_gib),
                     pool.replicas))
    # Llama-3-8B on an 80 GB GPU at gpu_memory_utilization 0.9: about 56 GiB of KV after the
    # 15 GiB of bf16 weights; 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB a token.
    gpu_tokens = 56 * (1 << 30) // (2 * 32 * 8 * 128 * 2)
    rows += [("GPU 8B, 8 replicas", gpu_tokens, 8), ("GPU 8B, 64 replicas", gpu_tokens, 64)]
    for name, tokens, replicas in rows:
        bound = auto_index_blocks(tokens, replicas, block_size=block)
        print(f"{name}: {tokens} KV tokens x {replicas} replicas -> {bound} entries, "
              f"{bound * one / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
