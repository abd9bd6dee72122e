"""The default disaggregation rule end to end, as `make serve` deploys it (router/policy.py).

One prefill and one decode worker with the default `disaggregation` settings (`prefill: auto`).
The router starts without measurements and takes the remote path, which measures the handoff;
the engines report their step costs with every request. From then on each request takes the
path the rule predicts fastest within the TPOT target, and its prediction is scored against the
TTFT it got. A prompt the decode worker already holds stays there: no KV moves, and its greedy
tokens equal the decode engine's own.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import (
    direct_greedy,
    disagg_reasons,
    pool_stats,
    pools_at_rest,
    running_deployment,
    test_config,
)

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"


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


def _scored(base_url: str) -> float:
    """How many of the rule's predictions were scored against a measured TTFT (all paths)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "splitserve_ttft_prediction_ratio_count")


def test_the_first_request_takes_the_remote_path_and_measures_it(deployment, client):
    ids = _prompt(1)
    before, moved = disagg_reasons(deployment), _moved()
    got = _greedy(client, ids, 8)
    after = disagg_reasons(deployment)
    assert after.get("remote", 0) == before.get("remote", 0) + 1
    assert _moved() > moved  # its KV came over NIXL
    assert got == direct_greedy(ids, 8, fresh_cache=True)


def test_then_the_rule_decides_and_scores_its_predictions(deployment, client):
    for seed, n in ((2, 300), (3, 900), (4, 1500), (5, 600)):
        _greedy(client, _prompt(seed, n), 8)
    assert _scored(deployment) >= 1


def test_a_prompt_decode_already_holds_stays_there(deployment, client):
    ids = _prompt(6)
    _greedy(client, ids, 4)  # wherever it prefills, decode holds its blocks afterwards
    turn = ids + _prompt(7, 40)
    before, moved = disagg_reasons(deployment), _moved()
    got = _greedy(client, turn, 8)
    after = disagg_reasons(deployment)
    assert after.get("local", 0) == before.get("local", 0) + 1, (before, after)
    assert _moved() == moved  # no KV came over NIXL: decode had it, and prefilled the rest
    assert got == direct_greedy(turn, 8, fresh_cache=True)


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
    assert sum(after.values()) - sum(before.values()) == 16  # one decision each
    assert pools_at_rest() == {"prefill": (0, 0.0), "decode": (0, 0.0)}
