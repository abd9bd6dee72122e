"""The router's added latency: the same request through the HTTP proxy and router, and through
the engine's Serve handle directly, measured in alternating pairs (used by the benchmark scripts).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

MODEL = "splitserve-tiny"


async def direct_latency(handle: Any, ids: Sequence[int], *, tag: str, max_tokens: int = 1) -> float:
    """Seconds for one greedy request through a pool's Serve handle (no proxy, no router)."""
    from splitserve.engine.messages import GenerateRequest

    req = GenerateRequest.completion(f"bench-direct-{tag}", ids, max_tokens)
    t = time.perf_counter()
    async for _ in handle.options(stream=True).generate.remote(req):
        pass
    return time.perf_counter() - t


async def routed_latency(
    client: httpx.AsyncClient,
    ids: Sequence[int],
    *,
    max_tokens: int = 1,
    headers: dict[str, str] | None = None,
    model: str = MODEL,
) -> float:
    """Seconds for one non-streamed greedy completion through the proxy and the router."""
    body = {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0}
    t = time.perf_counter()
    r = await client.post("/v1/completions", json=body, headers=headers)
    r.raise_for_status()
    return time.perf_counter() - t


def pct_ms(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of seconds `xs`, in ms."""
    return round(float(np.percentile(xs, q)) * 1000, 2)


async def paired_overhead(
    base: str,
    handle: Any,
    ids: Sequence[int],
    *,
    pairs: int,
    max_tokens: int = 1,
    headers: Sequence[dict[str, str]] = ({},),
    warmup: int = 10,
) -> dict[str, float]:
    """Router vs direct latency, one of each in turn, sequential; `headers` rotate per request
    (one API key per tenant). p50/p99 of each path, their difference, and the median of the
    paired differences."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for i in range(warmup):
            await direct_latency(handle, ids, tag=f"w{i}-{time.time_ns()}", max_tokens=max_tokens)
            await routed_latency(client, ids, max_tokens=max_tokens,
                                 headers=headers[i % len(headers)])
        direct, routed = [], []
        for i in range(pairs):
            direct.append(await direct_latency(handle, ids, tag=f"{i}-{time.time_ns()}",
                                               max_tokens=max_tokens))
            routed.append(await routed_latency(client, ids, max_tokens=max_tokens,
                                               headers=headers[i % len(headers)]))
    diffs = [r - d for r, d in zip(routed, direct, strict=True)]
    return {
        "pairs": pairs,
        "prompt_tokens": len(ids),
        "direct_p50_ms": pct_ms(direct, 50),
        "direct_p99_ms": pct_ms(direct, 99),
        "router_p50_ms": pct_ms(routed, 50),
        "router_p99_ms": pct_ms(routed, 99),
        "added_p50_ms": round(pct_ms(routed, 50) - pct_ms(direct, 50), 2),
        "added_p99_ms": round(pct_ms(routed, 99) - pct_ms(direct, 99), 2),
        "paired_diff_median_ms": pct_ms(diffs, 50),
    }


async def closed_loop(send, concurrency: int, seconds: float, warm_s: float = 1.0) -> dict:
    """`concurrency` workers each calling `send(i)` back to back; completions per second counted
    in a window of `seconds` after `warm_s`, and their latency."""
    t0 = time.perf_counter()
    start, stop = t0 + warm_s, t0 + warm_s + seconds
    done: list[tuple[float, float]] = []
    errors = 0

    async def worker(w: int) -> None:
        nonlocal errors
        i = w
        while time.perf_counter() < stop:
            t = time.perf_counter()
            try:
                await send(i)
                done.append((time.perf_counter(), time.perf_counter() - t))
            except Exception:  # noqa: BLE001 - counted, the sweep goes on
                errors += 1
            i += concurrency

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    window = [lat for end, lat in done if start <= end <= stop]
    return {
        "concurrency": concurrency,
        "requests_per_s": round(len(window) / seconds, 2),
        "latency_p50_ms": pct_ms(window, 50) if window else None,
        "errors": errors,
    }


async def sweep(
    base: str, handle, ids: list[int], headers: list[dict], levels: Sequence[int], seconds: float
) -> dict:
    """Closed-loop rate per concurrency level through the router, then direct at the top."""
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        points = []
        for c in levels:
            points.append(
                await closed_loop(
                    lambda i: routed_latency(client, ids, headers=headers[i % len(headers)]), c, seconds
                )
            )
    direct = await closed_loop(
        lambda i: direct_latency(handle, ids, tag=f"s{i}-{time.time_ns()}"), max(levels), seconds
    )
    best = max(p["requests_per_s"] for p in points)
    return {
        "points": points,
        "max_requests_per_s": best,
        "direct_at_top_concurrency": direct,
        # the same deployment's engine-alone rate: shared-machine noise hits both
        "router_over_direct": round(best / direct["requests_per_s"], 3)
        if direct["requests_per_s"]
        else None,
    }
