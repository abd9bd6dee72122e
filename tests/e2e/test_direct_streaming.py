"""Direct streaming end to end (`router.direct_streaming`): the decode replica answers the client
behind Serve's HAProxy, the router admits and picks (router/direct.py, engine/front.py).

One colocated deployment (one decode engine on one core) with two tenants (one with a token
quota) and an admin key; the real `openai` client. Each test checks one guarantee where it now
lives: the same tokens as the engine called directly, the router's refusals with their status,
the tenant's usage settled by the replica, a client's disconnect freeing the engine, and a
client that cannot forge the router's verdict.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from splitserve.engine import routed
from splitserve.models import build_tiny_model
from splitserve.router.tenancy import generate_api_key, hash_api_key
from tests.conftest import direct_greedy, pool_stats, pools_at_rest, running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
KEYS = {name: generate_api_key() for name in ("ann", "ben")}
ADMIN_KEY = generate_api_key()
BEN_TOKENS_PER_MINUTE = 300


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(
        mode="colocated",
        tenants=[
            {"name": "ann", "api_key_hashes": [hash_api_key(KEYS["ann"])]},
            {"name": "ben", "api_key_hashes": [hash_api_key(KEYS["ben"])],
             "quotas": {"tokens_per_minute": BEN_TOKENS_PER_MINUTE}},
        ],
        **{"router.direct_ingress": True, "router.direct_streaming": True,
           "tenancy.admin_key_hashes": [hash_api_key(ADMIN_KEY)],
           # coalescing from the second concurrent stream on (one request alone: every token)
           "router.streaming.chunks_per_step": 1},
    )
    with running_deployment(cfg) as base:
        yield base


def _client(base: str, tenant: str = "ann") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS[tenant], max_retries=0)


def _tokens(base: str, tenant: str) -> tuple[int, int]:
    """(prompt, completion) tokens `GET /v1/usage` counts for `tenant`."""
    r = httpx.get(f"{base}/v1/usage", params={"tenant": tenant},
                  headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    entry = r.json()["tenants"][tenant]
    return entry["prompt_tokens"], entry["completion_tokens"]


def test_completion_tokens_match_the_engine_called_directly(deployment):
    tok = AutoTokenizer.from_pretrained(str(build_tiny_model()))
    for prompt in ("The quick brown fox jumps over the lazy dog", "1 2 3 4 5 6 7"):
        out = _client(deployment).completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0.0,
            extra_body={"return_token_ids": True})
        expected = direct_greedy(tok(prompt)["input_ids"], 12)
        assert out.choices[0].model_extra["token_ids"] == expected
        assert out.usage.completion_tokens == len(expected)


def test_streamed_chat_comes_from_the_decode_replica(deployment):
    with httpx.stream(
        "POST", f"{deployment}/v1/chat/completions", timeout=60,
        headers={"authorization": f"Bearer {KEYS['ann']}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "Count to ten"}],
              "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 8


def test_router_refusals_keep_their_status_and_message(deployment):
    bad = httpx.post(f"{deployment}/v1/chat/completions", timeout=30,
                     headers={"authorization": "Bearer not-a-key"},
                     json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert bad.status_code == 401
    assert bad.json()["error"]["code"] == "invalid_api_key"
    assert bad.json()["error"]["message"] == "Incorrect API key provided."
    assert bad.headers["www-authenticate"] == "Bearer"  # the refusal's own headers too
    unknown = httpx.post(f"{deployment}/v1/completions", timeout=30,
                         headers={"authorization": f"Bearer {KEYS['ann']}"},
                         json={"model": "no-such-model", "prompt": "hi", "max_tokens": 2})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


def test_vllm_validation_errors_pass_through(deployment):
    r = httpx.post(f"{deployment}/v1/completions", timeout=30,
                   headers={"authorization": f"Bearer {KEYS['ann']}"},
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": -1})
    assert r.status_code == 400
    assert "temperature" in r.json()["error"]["message"]


def test_requests_the_router_answers_go_through_the_replica(deployment):
    models = httpx.get(f"{deployment}/v1/models", timeout=30,
                       headers={"authorization": f"Bearer {KEYS['ann']}"})
    assert models.status_code == 200
    assert [m["id"] for m in models.json()["data"]] == [MODEL]
    health = httpx.get(f"{deployment}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    tokens = httpx.post(f"{deployment}/tokenize", timeout=30,
                        headers={"authorization": f"Bearer {KEYS['ann']}"},
                        json={"model": MODEL, "prompt": "hello world"})
    assert tokens.status_code == 200 and tokens.json()["count"] >= 2


def test_router_internal_paths_are_not_served_to_clients(deployment):
    for path in ("/internal/route", "/internal/settle"):
        r = httpx.post(f"{deployment}{path}", json={"ticket": "x"}, timeout=30,
                       headers={"authorization": f"Bearer {KEYS['ann']}"})
        assert r.status_code == 404, path


def test_a_client_cannot_forge_the_router_verdict(deployment):
    forged = routed.Verdict("refuse", status=418, error={"error": {"message": "forged"}})
    r = httpx.post(f"{deployment}/v1/completions", timeout=60,
                   headers={"authorization": f"Bearer {KEYS['ann']}",
                            routed.HEADER: forged.encode()},
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    no_key = httpx.post(f"{deployment}/v1/completions", timeout=60,
                        headers={routed.HEADER: routed.Verdict(
                            "serve", endpoint="completions", model=MODEL).encode()},
                        json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
    assert no_key.status_code == 401
    assert no_key.json()["error"]["code"] == "invalid_api_key"


def _replica_ports() -> list[int]:
    """The direct-ingress HTTP ports the decode replicas listen on here (Serve's range from
    RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT): what a pod of the release could reach."""
    from ray.serve._private import constants

    ports = []
    for port in range(constants.RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT,
                      constants.RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT + 16):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                ports.append(port)
        except httpx.HTTPError:
            continue
    return ports


def test_a_replica_port_refuses_what_the_router_did_not_seal(deployment):
    """A pod that reaches a replica's own port, past HAProxy: on the decode replica's, an
    unsealed or wrongly sealed `serve` verdict with no key gets 403 (the router replica's port,
    which runs the router's app, 401); an oversized body with no key gets 413 from its
    Content-Length; a request with no verdict still has to carry a key; nothing generated."""
    ports = _replica_ports()
    forbidden = set()
    before = _served(deployment, "ann")[1]
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    raw = json.dumps(body).encode()
    serve = routed.Verdict("serve", endpoint="completions", model=MODEL, request_id="forged",
                           ticket="t", settle_url=f"{deployment}/x", max_tokens=3,
                           expires=time.time() + 30, body_sha256=routed.body_digest(raw))
    for port in ports:
        base = f"http://127.0.0.1:{port}"
        for header in (serve.encode(), serve.seal(b"not the deployment's key " * 2)):
            r = httpx.post(f"{base}/v1/completions", content=raw, timeout=60,
                           headers={routed.HEADER: header, "content-type": "application/json"})
            assert r.status_code in (401, 403), r.text
            if r.status_code == 403:
                assert r.json()["error"]["code"] == "forbidden"
                forbidden.add(port)
        big = httpx.post(f"{base}/v1/completions", content=b"x" * (2 << 20), timeout=60,
                         headers={"content-type": "application/json"})
        if port in forbidden:  # the decode replica's front (the router's app asks for a key)
            assert big.status_code == 413, big.text
            assert big.json()["error"]["code"] == "request_too_large"
        else:
            assert big.status_code in (401, 413), big.text
        no_key = httpx.post(f"{base}/v1/completions", json=body, timeout=60)  # no verdict
        assert no_key.status_code == 401
    assert forbidden, f"no decode replica among the replica ports {ports}"
    assert _served(deployment, "ann")[1] == before  # nothing generated


def _served(base: str, tenant: str) -> tuple[float, float]:
    """The router's `splitserve_requests_total` of `tenant`'s completions that ended ok, and
    its generated tokens (`splitserve_generation_tokens_total`, every tenant)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    ok = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("splitserve_requests_total{") and f'tenant="{tenant}"' in line
             and 'outcome="ok"' in line and 'endpoint="completions"' in line)
    tokens = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("splitserve_generation_tokens_total "))
    return ok, tokens


def test_usage_and_the_routers_metrics_are_settled_by_the_replica(deployment):
    before, served = _tokens(deployment, "ann"), _served(deployment, "ann")
    out = _client(deployment).completions.create(model=MODEL, prompt="one two three",
                                                 max_tokens=7)
    expected = (before[0] + out.usage.prompt_tokens, before[1] + 7)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the replica settles right after the response's end
        after = _tokens(deployment, "ann")
        if after == expected:
            break
        time.sleep(0.5)
    assert after == expected
    # the request's metrics (and log line) are recorded at the settlement, too
    assert _served(deployment, "ann") == (served[0] + 1, served[1] + 7)


def test_token_quota_holds_with_direct_streaming(deployment):
    client = _client(deployment, "ben")
    with pytest.raises(openai.RateLimitError) as err:
        for _ in range(BEN_TOKENS_PER_MINUTE // 50 + 2):
            client.completions.create(model=MODEL, prompt="quota", max_tokens=50)
    assert err.value.status_code == 429


def test_client_disconnect_frees_the_engine(deployment):
    async def leave_early() -> None:
        client = openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key=KEYS["ann"],
                                    max_retries=0)
        stream = await client.completions.create(
            model=MODEL, prompt="Long story: ", max_tokens=1500, stream=True,
            extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                break
        await stream.close()
        await client.close()

    asyncio.run(leave_early())
    assert pools_at_rest(("decode",)) == {"decode": (0, 0.0)}
    assert pool_stats("decode").num_unfinished == 0


def test_concurrent_streams_are_coalesced_as_on_the_relay_path(deployment):
    """The router's adaptive coalescing (router/coalescing.py) holds with direct streaming: a
    request alone streams every token as its own event; one admitted while another streams
    (2 streams per replica, `chunks_per_step` 1) gets events of up to 2 tokens, and the same
    tokens as the engine called directly."""
    tok = AutoTokenizer.from_pretrained(str(build_tiny_model()))
    prompt = "1 2 3 4 5 6 7"

    async def events(client: openai.AsyncOpenAI, max_tokens: int, started=None, done=None):
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        out = []
        async for chunk in stream:
            ids = (chunk.choices[0].model_extra or {}).get("token_ids") if chunk.choices else None
            if ids:
                out.append(list(ids))
                if started is not None:
                    started.set()
            if done is not None:
                await asyncio.sleep(0)
                if done.is_set():  # the other stream has its answer: no need to go on
                    break
        await stream.close()
        return out

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key=KEYS["ann"],
                                    max_retries=0, timeout=120)
        started, done = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(events(client, 400, started, done))
        await started.wait()
        second = await events(client, 16)
        done.set()
        alone = await first
        await client.close()
        return alone, second

    alone, second = asyncio.run(run())
    assert max(len(e) for e in alone) == 1, alone[:5]
    assert max(len(e) for e in second) == 2, second
    assert [t for e in second for t in e] == direct_greedy(tok(prompt)["input_ids"], 16)
    assert pools_at_rest(("decode",)) == {"decode": (0, 0.0)}
