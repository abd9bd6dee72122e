"""Disaggregated serving end to end: prefill pool → NIXL KV transfer → decode pool.

One prefill and one decode worker, each on a core of its own. Greedy tokens through the
disaggregated path must equal the decode engine's own local prefill (the colocated path), and the
decode engine's connector stats must show that the KV really came over NIXL.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import direct_greedy, pool_stats, pools_at_rest, shared_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
THRESHOLD = 128  # prompts shorter than one CPU KV block prefill locally

PROMPTS = [
    "short prompt",
    "The quick brown fox jumps over the lazy dog. " * 15,
    "Once upon a time there was a little engine that wanted to serve the world. " * 30,
    "1 2 3 4 5 6 7 8 9 10 " * 60,
    "def f(x): return x * 2\n" * 80,
    "Every tenant has a key, a quota, and a fair share of the machines. " * 70,
]


@pytest.fixture(scope="module")
def deployment():
    # Spill off: this module checks the remote path itself, so every prompt of THRESHOLD tokens
    # or more must take it, also with 16 in flight (the spill rule has unit tests and a
    # benchmark: tests/unit/test_policy.py, scripts/bench_disagg.py).
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "disaggregation.min_remote_prompt_tokens": THRESHOLD,
            "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
        }
    )
    with shared_deployment(cfg) as base:  # shared with test_params
        yield base


@pytest.fixture(scope="module")
def client(deployment):
    return openai.OpenAI(base_url=f"{deployment}/v1", api_key="unused", max_retries=0)


def _samples(deployment: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The router's `/metrics` samples named `name`, by their sorted labels."""
    text = httpx.get(f"{deployment}/metrics", timeout=30).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
        if s.name == name
    }


def _by_label(deployment: str, name: str, label: str) -> dict[str, float]:
    """Sample values of `name` keyed by one label's value."""
    return {dict(ls)[label]: v for ls, v in _samples(deployment, name).items()}


def _decisions(deployment: str) -> dict[str, float]:
    return _by_label(deployment, "splitserve_disagg_decisions_total", "path")


def test_health_lists_both_pools(deployment):
    assert httpx.get(f"{deployment}/health").json()["pools"] == {"prefill": "ok", "decode": "ok"}


def _kv_histogram(deployment: str) -> tuple[float, float]:
    """(count, sum) of the router's per-request KV-transfer bytes histogram."""
    return tuple(  # type: ignore[return-value]
        sum(_samples(deployment, f"splitserve_kv_transfer_bytes_{field}").values())
        for field in ("count", "sum")
    )


def _ttft_sums(deployment: str) -> tuple[float, float, float]:
    """(count, sum) of the decode engines' own first-token latencies as the workers reported
    them, and the sum of the decode pool's first-token times as the router measured them."""
    engine = {("hop", "generate"), ("pool", "decode")}
    name = "splitserve_engine_time_to_first_token_seconds"
    count, total = (
        sum(v for ls, v in _samples(deployment, f"{name}_{field}").items() if engine <= set(ls))
        for field in ("count", "sum")
    )
    pool = _by_label(deployment, "splitserve_pool_time_to_first_token_seconds_sum", "pool")
    return count, total, pool.get("decode", 0.0)


def test_long_prompts_move_kv_over_nixl_and_match_local_prefill(deployment, client):
    results = []
    for prompt in PROMPTS[1:]:
        hist_before = _kv_histogram(deployment)
        before = pool_stats("decode")
        r = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        after = pool_stats("decode")
        moved = after.kv_bytes_received - before.kv_bytes_received
        count, total = _kv_histogram(deployment)
        # /metrics reports this request's bytes, equal to what the NIXL connector measured
        assert (count - hist_before[0], total - hist_before[1]) == (1, moved)
        results.append((r, moved))
    decisions = _decisions(deployment)
    assert decisions.get("remote", 0) >= len(PROMPTS) - 1
    for (r, moved), prompt in zip(results, PROMPTS[1:], strict=True):
        assert r.usage.prompt_tokens >= THRESHOLD
        assert moved > 0, "decode engine received no KV bytes: it prefilled itself"
        ids = _prompt_ids(client, prompt)
        assert r.choices[0].model_extra["token_ids"] == direct_greedy(ids, 16, fresh_cache=True), (
            prompt[:30]
        )
    assert pool_stats("decode").kv_transfer_failures == 0


def _prompt_ids(client, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    from splitserve.models import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())(prompt)["input_ids"]


def test_four_samples_of_one_prompt_take_one_prefill_and_one_kv_transfer(deployment, client):
    prompt = "Four samples share one handoff. " * 40

    def sample():
        return client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0.8, seed=7, n=4,
            extra_body={"return_token_ids": True, "min_tokens": 12})

    before, reasons = pool_stats("decode"), _decisions(deployment)
    r = sample()
    after = pool_stats("decode")
    assert _decisions(deployment).get("remote", 0) == reasons.get("remote", 0) + 1
    assert after.kv_transfers - before.kv_transfers == 1  # pulled once, not once per sample
    assert after.kv_bytes_received > before.kv_bytes_received
    assert r.usage.completion_tokens == 48 and len(r.choices) == 4
    # seeded samples read from the pulled KV are those of a second run, pulled again
    again = sample()
    assert pool_stats("decode").kv_transfers - after.kv_transfers == 1
    assert ([c.model_extra["token_ids"] for c in again.choices]
            == [c.model_extra["token_ids"] for c in r.choices])


def test_short_prompt_prefills_locally(deployment, client):
    before, kv_before = _decisions(deployment), pool_stats("decode").kv_bytes_received
    ttft_before = _ttft_sums(deployment)
    client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4)
    after = _decisions(deployment)
    assert after.get("local", 0) == before.get("local", 0) + 1
    assert after.get("remote", 0) == before.get("remote", 0)
    assert pool_stats("decode").kv_bytes_received == kv_before
    # The decode engine reported its own part of the first token's time: more than nothing,
    # at most the pool's time to first token that the router measured around it.
    count, engine_s, pool_s = (a - b for a, b in zip(_ttft_sums(deployment), ttft_before,
                                                      strict=True))
    assert count == 1
    assert 0 < engine_s <= pool_s


def test_streamed_disaggregated_equals_whole(client):
    prompt = PROMPTS[3]
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        if c.choices
    )
    assert text == whole.choices[0].text


def test_concurrent_disaggregated_requests_leave_no_request_behind(deployment):
    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="x", max_retries=0, timeout=300
        ) as c:
            return await asyncio.gather(
                *(
                    c.completions.create(
                        model=MODEL,
                        prompt=PROMPTS[1 + i % 5] + str(i),
                        max_tokens=12,
                        temperature=0,
                    )
                    for i in range(16)
                )
            )

    results = asyncio.run(run())
    assert all(r.usage.completion_tokens == 12 for r in results)
    for pool in ("prefill", "decode"):
        assert pool_stats(pool).num_unfinished == 0


def test_parity_50_prompts_up_to_context_limit_16_in_flight(deployment):
    """50 prompts from 1 token to near the 2048 context, streamed and not, 16 requests in flight:
    the disaggregated path's greedy tokens equal the decode engine's own (colocated) run."""
    import numpy as np

    rng = np.random.default_rng(7)
    lengths = np.linspace(1, 2040, 50).astype(int)
    prompts = [rng.integers(10, 500, n).tolist() for n in lengths]
    max_tokens = 8

    async def one(c, sem, ids, stream):
        async with sem:
            if not stream:
                r = await c.completions.create(
                    model=MODEL,
                    prompt=ids,
                    max_tokens=max_tokens,
                    temperature=0,
                    extra_body={"return_token_ids": True},
                )
                return r.choices[0].model_extra["token_ids"]
            got = []
            s = await c.completions.create(
                model=MODEL,
                prompt=ids,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"return_token_ids": True},
            )
            async for chunk in s:
                if chunk.choices:
                    got += chunk.choices[0].model_extra.get("token_ids") or []
            return got

    async def run():
        sem = asyncio.Semaphore(16)
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="x", max_retries=0, timeout=600
        ) as c:
            return await asyncio.gather(
                *(one(c, sem, ids, stream) for stream in (False, True) for ids in prompts)
            )

    before = _decisions(deployment)
    outputs = asyncio.run(run())
    after = _decisions(deployment)
    reference = [direct_greedy(ids, max_tokens, fresh_cache=True) for ids in prompts]
    assert outputs[:50] == reference
    assert outputs[50:] == reference
    remote = after.get("remote", 0) - before.get("remote", 0)
    assert remote == 2 * sum(n >= THRESHOLD for n in lengths)


def _interval_counts(deployment: str) -> dict[str, float]:
    return _by_label(deployment, "splitserve_stream_intervals_total", "tokens_per_chunk")


def test_streams_started_under_load_are_coalesced_and_keep_their_tokens(deployment):
    """Adaptive token coalescing (router.streaming, defaults: 8 chunks per step, at most 4
    tokens per chunk): 24 streams started one after another on the one decode replica, each
    once the previous one has its first token. Every stream's tokens equal the engine's own
    greedy run; every stream's first chunk is its first token alone; the router asked for more
    than one token per chunk for the later streams (`/metrics`), and those streams arrived in
    fewer chunks than tokens: at most one chunk per two tokens after the first."""
    import numpy as np

    rng = np.random.default_rng(11)
    prompts = [rng.integers(10, 500, 16).tolist() for _ in range(24)]  # short: local prefill
    max_tokens = 160  # long enough that the first streams still run when the last start

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="x", max_retries=0, timeout=600
        ) as c:
            async def one(ids, started: asyncio.Event):
                chunks: list[list[int]] = []
                s = await c.completions.create(
                    model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0, stream=True,
                    extra_body={"return_token_ids": True, "ignore_eos": True},
                )
                async for chunk in s:
                    if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
                        chunks.append(chunk.choices[0].model_extra["token_ids"])
                        started.set()
                return chunks

            tasks = []
            for ids in prompts:
                started = asyncio.Event()
                tasks.append(asyncio.create_task(one(ids, started)))
                await asyncio.wait_for(started.wait(), 120)
            return await asyncio.gather(*tasks)

    before = _interval_counts(deployment)
    streams = asyncio.run(run())
    after = _interval_counts(deployment)
    reference = [direct_greedy(ids, max_tokens, ignore_eos=True) for ids in prompts]
    assert [[t for c in chunks for t in c] for chunks in streams] == reference
    assert all(len(chunks[0]) == 1 for chunks in streams)
    coalesced = sum(after.get(k, 0) - before.get(k, 0) for k in ("2", "3", "4"))
    assert coalesced >= 8  # streams 9-24 found 8 or more streams per replica when they started
    late = streams[-8:]  # each found at least 16 streams: 2 or 3 tokens per chunk
    assert all(len(chunks) <= 1 + -(-(max_tokens - 1) // 2) for chunks in late), [
        len(c) for c in late
    ]


def test_mixed_load_with_cancellations_frees_everything(deployment):
    """64 requests of mixed lengths, every fourth cancelled by the client mid-stream: the others
    complete with exact token counts, and afterwards neither pool holds a request or KV block."""

    import numpy as np

    rng = np.random.default_rng(11)
    lengths = rng.integers(16, 1800, 64)

    async def one(c, i, n):
        stream = await c.completions.create(
            model=MODEL,
            prompt=rng.integers(10, 500, n).tolist(),
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage, pieces = None, 0
        async for chunk in stream:
            pieces += bool(chunk.choices)
            usage = chunk.usage or usage
            if i % 4 == 0 and pieces == 3:
                await stream.close()  # the client walks away mid-stream
                return None
        return usage.completion_tokens

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="x", max_retries=0, timeout=600
        ) as c:
            return await asyncio.gather(*(one(c, i, int(n)) for i, n in enumerate(lengths)))

    results = asyncio.run(run())
    assert [r for i, r in enumerate(results) if i % 4] == [24] * 48
    assert pools_at_rest() == {"prefill": (0, 0.0), "decode": (0, 0.0)}
