"""A request without `max_tokens` under a per-request token cap (issue #24, point 7): the
router reserves what the tenant can be charged for, and the engine stops there."""

from __future__ import annotations

import asyncio
import json

from splitserve.config import parse_config
from splitserve.router.tenancy.keys import hash_api_key
from tests.unit.router_fakes import DECODE_OK, Pool, build_router, drain, http_request

KEY = "sk-capped"


def _router(cap: int):
    cfg = parse_config({
        "mode": "colocated",
        "tenants": [{"name": "capped", "api_key_hashes": [hash_api_key(KEY)],
                     "quotas": {"max_tokens_per_request": cap}}],
    })
    decode = Pool(DECODE_OK)
    return build_router(cfg, None, decode), decode


def _send(router, body):
    async def run():
        response = await router._serve("completions", http_request(
            body, {"authorization": f"Bearer {KEY}"}))
        if hasattr(response, "body_iterator"):
            await drain(response)
        return response
    return asyncio.run(run())


def test_no_max_tokens_under_a_cap_is_served_up_to_the_cap():
    router, decode = _router(cap=1000)
    body = {"model": "splitserve-tiny", "prompt": list(range(300)), "stream": False}
    response = _send(router, body)
    assert response.status_code == 200
    (sent,) = decode.requests
    assert sent.http.json["max_tokens"] == 700  # the cap less the prompt
    assert sent.sampling.max_tokens == 700


def test_no_max_tokens_under_a_cap_past_the_context_keeps_the_engine_default():
    router, decode = _router(cap=100_000)
    response = _send(router, {"model": "splitserve-tiny", "prompt": list(range(300))})
    assert response.status_code == 200
    (sent,) = decode.requests
    assert "max_tokens" not in sent.http.json  # vLLM's server fills the context, as on vLLM
    assert sent.sampling.max_tokens == 2048 - 300


def test_a_prompt_over_the_cap_alone_is_400_naming_the_limit():
    router, decode = _router(cap=200)
    response = _send(router, {"model": "splitserve-tiny", "prompt": list(range(300))})
    assert response.status_code == 400
    assert "tokens per request" in json.loads(response.body)["error"]["message"]
    assert decode.requests == []
