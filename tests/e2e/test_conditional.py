"""The default conditional-disaggregation policy end to end, as `make serve` deploys it.

One prefill and one decode worker with the default `disaggregation` settings. A request with a
short output (`max_tokens` at most `short_output_tokens`) runs whole on the pool with less work
ahead of its first token, with no KV handoff: on idle pools on the decode worker, beside a
decoding stream on the prefill worker. Its greedy tokens must equal the decode engine's own, and
no KV may move. The remote path itself is tested in test_disaggregated.py (rule switched off).
"""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from splitserve.config import load_config
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
SHORT = load_config(None).disaggregation.short_output_tokens  # the default threshold


@pytest.fixture(scope="module")
def deployment():
    with running_deployment(test_config(mode="disaggregated")) as base:
        yield base


@pytest.fixture(scope="module")
def client(deployment):
    return openai.OpenAI(base_url=f"{deployment}/v1", api_key="unused", max_retries=0, timeout=600)


def _moved() -> float:
    return pool_stats("decode").kv_bytes_received


def _prompt(seed: int, n: int = 1500) -> list[int]:
    return np.random.default_rng(seed).integers(10, 500, n).tolist()


def _greedy(client, ids: list[int], max_tokens: int) -> list[int]:
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0,
                                  extra_body={"return_token_ids": True})
    return r.choices[0].model_extra["token_ids"]


def test_a_short_output_on_idle_pools_runs_whole_on_decode(deployment, client):
    ids = _prompt(1)
    before, moved = disagg_reasons(deployment), _moved()
    got = _greedy(client, ids, 8)
    after = disagg_reasons(deployment)
    assert after.get("short_output", 0) == before.get("short_output", 0) + 1
    assert after.get("remote", 0) == before.get("remote", 0)
    assert _moved() == moved  # no KV came over NIXL: decode prefilled it itself
    assert got == direct_greedy(ids, 8, fresh_cache=True)


def test_a_short_output_beside_a_decoding_stream_runs_whole_on_prefill(deployment):
    ids = _prompt(2)

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key="x", max_retries=0,
                                      timeout=600) as c:
            # A long stream (short prompt: decoded on the decode worker) is decoding ...
            stream = await decoding_stream(c, MODEL)
            # (Serve's sync handle calls must not run on this event loop.)
            before, moved = await asyncio.to_thread(lambda: (disagg_reasons(deployment), _moved()))
            # ... so decode has more work ahead than the idle prefill worker: it runs there.
            r = await c.completions.create(model=MODEL, prompt=ids, max_tokens=SHORT,
                                           temperature=0, extra_body={"return_token_ids": True})
            after = await asyncio.to_thread(disagg_reasons, deployment)
            await stream.close()  # the client walks away from the stream
            return r.choices[0].model_extra["token_ids"], before, after, moved

    got, before, after, moved = asyncio.run(run())
    assert after.get("short_output_offload", 0) == before.get("short_output_offload", 0) + 1
    assert after.get("remote", 0) == before.get("remote", 0)
    assert _moved() == moved
    assert got == direct_greedy(ids, SHORT, fresh_cache=True)


def test_a_longer_output_takes_the_prompt_rules(deployment, client):
    ids = _prompt(3)
    before = disagg_reasons(deployment)
    got = _greedy(client, ids, SHORT + 1)
    after = disagg_reasons(deployment)
    changed = {k for k in after if after[k] != before.get(k, 0)}
    assert len(changed) == 1 and not changed & {"short_output", "short_output_offload"}, changed
    assert got == direct_greedy(ids, SHORT + 1, fresh_cache=True)


def test_mixed_outputs_with_cancellations_leave_both_pools_empty(deployment):
    """Short and long outputs at once, every fourth stream cancelled mid-way: the others finish
    with their exact counts; afterwards neither pool holds a request or a KV block."""
    rng = np.random.default_rng(5)
    outputs = [8 if i % 2 else 48 for i in range(16)]

    async def one(c, i: int, n_out: int):
        stream = await c.completions.create(
            model=MODEL, prompt=rng.integers(10, 500, int(rng.integers(100, 1800))).tolist(),
            max_tokens=n_out, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"min_tokens": n_out},
        )
        usage, pieces = None, 0
        async for chunk in stream:
            pieces += bool(chunk.choices)
            usage = chunk.usage or usage
            if i % 4 == 0 and pieces == 2:
                await stream.close()
                return None
        return usage.completion_tokens

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key="x", max_retries=0,
                                      timeout=600) as c:
            return await asyncio.gather(*(one(c, i, n) for i, n in enumerate(outputs)))

    before = disagg_reasons(deployment)
    results = asyncio.run(run())
    after = disagg_reasons(deployment)
    assert [r for i, r in enumerate(results) if i % 4] == [n for i, n in enumerate(outputs) if i % 4]
    assert sum(after.get(k, 0) - before.get(k, 0) for k in ("short_output",
                                                              "short_output_offload")) == 8
    assert pools_at_rest() == {"prefill": (0, 0.0), "decode": (0, 0.0)}
