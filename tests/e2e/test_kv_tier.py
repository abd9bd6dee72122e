"""The KV tier beyond engine memory (config `kv_tier`, vLLM's OffloadingConnector), end to end.

Engines with a KV cache of `BLOCKS` blocks: a prompt, then enough other prompts to evict it from
the engine's KV, then the same prompt again. With a tier the engine loads the evicted prefix
from it (vLLM's connector prefix-cache stats by source, read through the engine stats) and its
greedy tokens are those of the first run; with `medium: none` the same sequence loads nothing
(the prefix is recomputed) and the engine's own prefix cache hits nothing, so the tier's
assertion can fail. Disaggregated, the tier is composed with NIXL (vLLM's MultiConnector): the
handoff still moves the KV, and the prefill engine loads the evicted prefix from its tier.
"""

from __future__ import annotations

import time

import numpy as np
import openai
import pytest

from tests.conftest import direct_greedy, pool_stats, running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
BLOCKS = 17  # engine KV blocks: 16 usable x 128 tokens (CPU block size) = the 2048-token context
PROMPT_TOKENS = 900  # 7 full blocks: three other prompts fill the engine's KV
FILLERS = 4
MAX_TOKENS = 12
STATS_WAIT_S = 30  # the engine's stats of a finished request arrive after its response

CASES = {
    "cpu": {"mode": "colocated", "kv_tier.medium": "cpu", "kv_tier.size_gib": 0.25},
    "none": {"mode": "colocated"},
    # a host pool of 8 blocks (256 KiB each for the tiny model) in front of the disk: the
    # fillers evict the prompt from the pool too, so it comes back from the files
    "disk": {"mode": "colocated", "kv_tier.medium": "disk", "kv_tier.size_gib": 2 / 1024},
    "disaggregated-cpu": {
        "mode": "disaggregated", "kv_tier.medium": "cpu", "kv_tier.size_gib": 0.25,
        "disaggregation.prefill": "remote", "disaggregation.min_remote_prompt_tokens": 128,
        "pools.prefill.kv_cache_blocks": BLOCKS,
    },
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    overrides = {**CASES[request.param], "pools.decode.kv_cache_blocks": BLOCKS}
    if request.param == "disk":
        overrides["kv_tier.path"] = str(tmp_path_factory.mktemp("kv-tier"))
    with running_deployment(test_config(**overrides)) as base:
        yield request.param, base


def _prompts() -> tuple[list[int], list[list[int]]]:
    rng = np.random.default_rng(28)
    prompt = rng.integers(10, 500, PROMPT_TOKENS).tolist()
    fillers = [rng.integers(10, 500, PROMPT_TOKENS).tolist() for _ in range(FILLERS)]
    return prompt, fillers


def _greedy(client, ids: list[int]):
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"return_token_ids": True})
    return r.choices[0].model_extra["token_ids"], r.usage


def _tier_tokens(stats) -> int:
    return sum(stats.kv_loaded_tokens.get(source, 0) for source in ("host", "disk"))


def _after(pool: str, before, at_least: int):
    """The pool's stats once its tier loads reach `at_least` more tokens than `before` (or
    after STATS_WAIT_S: the caller's assertion then fails with what came in)."""
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        stats = pool_stats(pool)
        if _tier_tokens(stats) - _tier_tokens(before) >= at_least or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def test_an_evicted_prefix_loads_from_the_tier_with_the_same_tokens(case):
    name, base = case
    tier_pool = "prefill" if name.startswith("disaggregated") else "decode"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    prompt, fillers = _prompts()
    first, _ = _greedy(client, prompt)
    for ids in fillers:
        _greedy(client, ids)
    before = pool_stats(tier_pool)

    again, usage = _greedy(client, prompt)

    full_blocks = (PROMPT_TOKENS - 1) // 128 * 128  # what a prefix cache can hold of it
    after = _after(tier_pool, before, at_least=full_blocks if name != "none" else 1)
    assert again == first
    # the engine's own prefix cache no longer had it: the fillers evicted it
    assert after.prefix_cache_hits - before.prefix_cache_hits == 0
    loaded = {k: v - before.kv_loaded_tokens.get(k, 0) for k, v in after.kv_loaded_tokens.items()}
    if name == "none":
        assert after.kv_loaded_tokens == {}
        assert usage.prompt_tokens_details is None or not usage.prompt_tokens_details.cached_tokens
        return
    source = "disk" if name == "disk" else "host"
    assert loaded.get(source, 0) >= full_blocks, after.kv_loaded_tokens
    if name == "disk":  # the host pool in front of the disk had lost it too
        assert loaded.get("host", 0) == 0, after.kv_loaded_tokens


def test_the_handoff_still_moves_the_kv_over_nixl(case):
    """Disaggregated with the tier: vLLM's MultiConnector still hands a prompt's KV to the
    decode engine over NIXL (kv_transfer_params round trip), with the decode engine's tokens."""
    name, base = case
    if not name.startswith("disaggregated"):
        pytest.skip("colocated: no handoff")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    ids = np.random.default_rng(29).integers(10, 500, 600).tolist()
    before = pool_stats("decode")
    got, _ = _greedy(client, ids)
    after = pool_stats("decode")
    assert after.kv_transfers > before.kv_transfers
    assert after.kv_transfer_failures == before.kv_transfer_failures
    assert got == direct_greedy(ids, MAX_TOKENS, fresh_cache=True)
