"""The conditional policy's slow-decode rule end to end (router/policy.py, router/pace.py).

One prefill and one decode worker with the rule on (it is off by default) at half a TPOT target
of 1 ms: any decoding stream is slower than that, so the rule applies whenever decode streams. A request that arrives
while decode streams and the prefill worker's streams are faster (or absent) runs whole on the
prefill worker: no KV moves, and its greedy tokens equal the engine's own. Under concurrency the
streams spread over both workers; each finishes with its exact count and both pools end empty.
"""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from tests.conftest import (
    decoding_stream,
    direct_greedy,
    disagg_reasons,
    pool_stats,
    pools_at_rest,
    running_deployment,
    test_config,
)

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
LONG = 64  # above the short-output threshold (32): the prompt and slow-decode rules decide


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(mode="disaggregated", **{
        "slo.tpot_ms": 1, "disaggregation.slow_decode_tpot_fraction": 0.5})
    with running_deployment(cfg) as base:
        yield base


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, 500, n).tolist()


def test_a_request_beside_a_slow_decode_stream_runs_whole_on_prefill(deployment):
    ids = _prompt(1, 600)

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key="x", max_retries=0,
                                      timeout=600) as c:
            # A long stream on the decode worker, a few tokens in: decode's pace is measured
            stream = await decoding_stream(c, MODEL, chunks=8)
            # (Serve's sync handle calls must not run on this event loop.)
            before = await asyncio.to_thread(disagg_reasons, deployment)
            moved = await asyncio.to_thread(lambda: pool_stats("decode").kv_bytes_received)
            r = await c.completions.create(model=MODEL, prompt=ids, max_tokens=LONG,
                                           temperature=0, extra_body={"return_token_ids": True})
            after = await asyncio.to_thread(disagg_reasons, deployment)
            await stream.close()
            return r.choices[0].model_extra["token_ids"], before, after, moved

    got, before, after, moved = asyncio.run(run())
    assert _delta(before, after) == {"slow_decode": 1}
    assert pool_stats("decode").kv_bytes_received == moved  # no KV came over NIXL
    assert got == direct_greedy(ids, LONG, fresh_cache=True)


def test_concurrent_streams_spread_over_both_workers_and_leave_them_empty(deployment):
    """16 long streams at once: once decode streams, later ones run whole on prefill while its
    streams are faster; every stream ends with its exact count, then both pools are at rest."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(10, 500, int(rng.integers(150, 1200))).tolist() for _ in range(16)]

    async def one(c, prompt: list[int], n: int = LONG) -> int:
        r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=n,
                                       temperature=0, extra_body={"min_tokens": n})
        return r.usage.completion_tokens

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key="x", max_retries=0,
                                      timeout=600) as c:
            # decode streams first (no stream anywhere yet: the prompt rules put it there),
            # a few tokens in: decode's pace is measured ...
            first = await decoding_stream(c, MODEL, chunks=8)
            # ... then a burst arrives while it does
            rest = await asyncio.gather(*(one(c, p) for p in prompts[1:]))
            await first.close()
            return rest

    before = disagg_reasons(deployment)
    counts = asyncio.run(run())
    delta = _delta(before, disagg_reasons(deployment))
    assert counts == [LONG] * 15
    assert sum(delta.values()) == 16
    assert delta.get("slow_decode", 0) >= 1, delta  # the prefill worker decoded too
    assert delta.get("slow_decode", 0) < 16, delta  # and decode kept streams of its own
    assert pools_at_rest() == {"prefill": (0, 0.0), "decode": (0, 0.0)}
