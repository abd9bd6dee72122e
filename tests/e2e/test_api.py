"""The OpenAI API end to end: real Ray Serve router, real vLLM engine, the official `openai` client.

One colocated deployment (one decode worker on one core) is started for the whole module.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from splitserve.config import load_config
from splitserve.models import build_tiny_model
from tests.conftest import direct_greedy, shared_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
MAX_BODY = load_config(None).router.max_body_bytes  # the default limit
# Deadlines the deadline tests ask for (x-splitserve-timeout-s): far shorter than the 2000-token
# generations they cut (seconds at the tiny model's fastest, a few ms per token), long enough for
# the first tokens of a stream.
SHORT_DEADLINE_S = 0.5
STREAM_DEADLINE_S = 2.0

PROMPTS = [
    "Hello, how are you today?",
    "The quick brown fox",
    "Once upon a time there was a little engine",
    "def main(): return [x * 2 for x in range(10)]",
    "1 2 3 4 5 6 7 8 9 10",
    "a",
    "The mountain river runs cold and clear",
    "Questions, answers, stories, lists, code",
    "Ünïcödé tëxt wörks tøø ✓ 🚀",
    "   leading and trailing spaces   ",
    "UPPER CASE LETTERS ONLY",
    "tokens tokens tokens tokens tokens",
    "Every tenant has a key, a quota, and a fair share",
    "In the morning the market opens",
    "What would you like to know about the weather?",
    "Latency is measured as the time to the first token",
    "\n\nnew lines\n\n",
    "The cluster grows when the queues are long",
    "prefill decode prefill decode",
    "A serving platform takes requests from many clients " * 20,
    "Numbers such as 100 1000 appear in logs, prices, dates and counts.",
    "x" * 300,
]


@pytest.fixture(scope="module")
def deployment():
    # The default colocated config, shared with test_bench and test_params (tests/conftest.py)
    with shared_deployment(test_config(mode="colocated")) as base:
        yield base


@pytest.fixture(scope="module")
def client(deployment):
    return openai.OpenAI(base_url=f"{deployment}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def _completion_ids(client, prompt, max_tokens=24, **kw):
    r = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True},
        **kw,
    )
    return r


def test_models_and_health(deployment, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    # A ping that misses `router.health_timeout_s` is a 503 by design; on two busy cores the
    # engine replica's first seconds can miss it (CI, 2026-12-06), so the test polls for the
    # 200 it checks (a few tries) instead of timing a single ping.
    for _ in range(30):
        health = httpx.get(f"{deployment}/health", timeout=10)
        if health.status_code != 503:
            break
        time.sleep(2)
    assert health.status_code == 200, health.text
    assert health.json()["pools"] == {"decode": "ok"}


def test_router_matches_direct_engine(client, tokenizer):
    for prompt in PROMPTS:
        r = _completion_ids(client, prompt)
        got = r.choices[0].model_extra["token_ids"]
        ids = tokenizer(prompt)["input_ids"]
        want = direct_greedy(ids, 24)
        assert got == want, prompt
        assert r.usage.prompt_tokens == len(ids)
        assert r.usage.completion_tokens == len(got) == 24


def test_chat_matches_direct_engine(client, tokenizer):
    for prompt in PROMPTS[:6]:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
        r = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert r.choices[0].model_extra["token_ids"] == direct_greedy(list(ids), 16)
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].message.role == "assistant"


def test_different_prompts_give_different_outputs(client):
    outs = {tuple(_completion_ids(client, p).choices[0].model_extra["token_ids"]) for p in PROMPTS}
    assert len(outs) == len(PROMPTS)
    assert all(len(set(o)) > 1 for o in outs)


def test_stream_equals_whole_completions(client):
    for prompt in PROMPTS[:8]:
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
        stream = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        assert text == whole.choices[0].text
        assert finish == whole.choices[0].finish_reason == "length"
        # the same counts (the cached prompt tokens differ: the second run hits the prefix cache)
        assert usage.model_dump(exclude={"prompt_tokens_details"}) == whole.usage.model_dump(
            exclude={"prompt_tokens_details"})


def test_stream_equals_whole_chat(client):
    messages = [{"role": "user", "content": "Tell me about the sea"}]
    whole = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    text, ids, roles, usage = "", [], [], None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            roles += [delta.role] if delta.role else []
            text += delta.content or ""
            ids += chunk.choices[0].model_extra.get("token_ids") or []
        else:
            usage = chunk.usage
    assert roles == ["assistant"]
    assert text == whole.choices[0].message.content
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert usage.completion_tokens == whole.usage.completion_tokens == 20
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_without_usage_has_no_usage_chunk(client):
    stream = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=5, temperature=0, stream=True
    )
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def _assert_error(err: openai.APIStatusError, status: int, param: str | None, code=None):
    assert err.status_code == status
    body = err.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["message"]
    assert body["param"] == param
    if code is not None:
        assert body["code"] == code
    return body


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=4)
    body = _assert_error(exc.value, 404, "model", "model_not_found")
    assert "gpt-17" in body["message"]


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_non_positive_max_tokens_is_400(client, max_tokens):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=max_tokens)
    _assert_error(exc.value, 400, "max_tokens")


def test_prompt_longer_than_context_is_400(client):
    long_prompt = list(range(10, 500)) * 5  # 2450 token ids > 2048
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4)
    body = _assert_error(exc.value, 400, "input_tokens", 400)  # vLLM's server's answer
    assert "maximum context length is 2048" in body["message"]


def test_max_tokens_past_the_context_is_capped_to_what_fits_as_vllm_does(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2048,
        temperature=0, extra_body={"ignore_eos": True},
    )
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 2048
    assert r.choices[0].finish_reason == "length"


def test_malformed_json_is_400(deployment):
    r = httpx.post(
        f"{deployment}/v1/chat/completions",
        content=b'{"model": "x", ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in r.json()["error"]["message"]


def test_body_over_limit_is_413(deployment, client):
    huge = {"model": MODEL, "prompt": "x" * (MAX_BODY + 10), "max_tokens": 1}
    r = httpx.post(f"{deployment}/v1/completions", content=json.dumps(huge))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as exc:
        client.completions.create(model=MODEL, prompt="y" * (MAX_BODY + 10), max_tokens=1)
    _assert_error(exc.value, 413, None, "request_too_large")


def test_unknown_parameter_is_ignored_as_vllm_ignores_it(client):
    # vLLM's server answers a request with a field it does not know (and logs the field);
    # tests/e2e/test_vllm_compat.py compares every known one with a plain vLLM server
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=2,
                                  extra_body={"bogus": 1})
    assert r.usage.completion_tokens == 2


def test_unknown_route_is_openai_404(deployment):
    r = httpx.get(f"{deployment}/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_32_concurrent_streams_all_complete(deployment):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int]:
        stream = await client.completions.create(
            model=MODEL,
            prompt=PROMPTS[i % len(PROMPTS)],
            max_tokens=16 + i % 8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = 0, None
        async for chunk in stream:
            pieces += bool(chunk.choices)
            usage = chunk.usage or usage
        return usage.completion_tokens, 16 + i % 8

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run())
    assert [got for got, _ in results] == [want for _, want in results]


def test_cancelled_stream_leaves_nothing_running(client):
    from ray import serve

    stream = client.completions.create(
        model=MODEL, prompt="cancel me", max_tokens=1500, temperature=0, stream=True
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    handle = serve.get_deployment_handle("decode", app_name="splitserve")
    for _ in range(50):
        stats = handle.stats.remote().result()
        if stats.num_unfinished == 0 and stats.open_streams == 0:
            break
        asyncio.run(asyncio.sleep(0.2))
    assert stats.num_unfinished == 0
    assert stats.open_streams == 0  # the replica's stream of the response is gone too


def test_a_response_streams_from_the_engine_replica_over_http(client):
    """The default transport (`router.streaming.transport: http`): the response's bytes come
    from the decode replica's stream server, one stream per request, none left open."""
    from ray import serve

    handle = serve.get_deployment_handle("decode", app_name="splitserve")
    before = handle.stats.remote().result().streams_opened
    ref = client.completions.create(model=MODEL, prompt="over http", max_tokens=8,
                                    temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="over http", max_tokens=8,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.choices[0].text
    for _ in range(50):  # the replica forgets a stream just after its call's last item
        stats = handle.stats.remote().result()
        if stats.open_streams == 0:
            break
        asyncio.run(asyncio.sleep(0.2))
    assert stats.streams_opened - before == 2
    assert stats.open_streams == 0


def test_replicas_run_on_one_event_loop_and_this_process_keeps_serves_default(deployment):
    """`ray.one_event_loop` (on by default) reaches the cluster's processes, not the driver's
    (whose handles are also called from synchronous code)."""
    import os

    from pathlib import Path

    from splitserve import ingress

    replicas = {}  # this machine's replica processes, by their titles (ray::ServeReplica:...)
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
            if title.startswith("ray::ServeReplica:splitserve:"):
                replicas[proc.name] = (title, (proc / "environ").read_bytes())
        except OSError:
            continue
    names = {title.split(":")[-1].split(".")[0].split()[0] for title, _ in replicas.values()}
    assert names >= {"router", "decode"}, names
    for title, environ in replicas.values():
        env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)
        assert all(env.get(k.encode()) == b"0" for k in ingress.LOOP_VARIABLES), title
    assert not any(k in os.environ for k in ingress.LOOP_VARIABLES)


def test_replicas_and_engines_run_at_the_configured_niceness(deployment):
    """`ray.worker_niceness` (0 by default, not Ray's 15) for every replica and the engine's
    processes it starts (its EngineCore and model worker)."""
    import os

    from pathlib import Path

    want = load_config(None).ray.worker_niceness
    seen = {}
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if title.startswith(("ray::ServeReplica:splitserve:", "VLLM::")):
            try:
                seen[title.split()[0]] = os.getpriority(os.PRIO_PROCESS, int(proc.name))
            except OSError:
                continue
    assert any(t.startswith("VLLM::Worker") for t in seen), seen
    assert any(t.startswith("ray::ServeReplica:splitserve:router") for t in seen), seen
    assert set(seen.values()) == {want}, seen


def test_a_bad_timeout_header_is_400(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2,
            extra_headers={"x-splitserve-timeout-s": "soon"},
        )
    _assert_error(exc.value, 400, "x-splitserve-timeout-s")


def _decode_idle() -> int:
    """The decode engine's unfinished requests, once it has none or after ~10 s."""
    from ray import serve

    handle = serve.get_deployment_handle("decode", app_name="splitserve")
    for _ in range(50):
        unfinished = handle.stats.remote().result().num_unfinished
        if unfinished == 0:
            break
        asyncio.run(asyncio.sleep(0.2))
    return unfinished


def test_request_past_its_deadline_is_504_and_aborted(client):
    with pytest.raises(openai.APIStatusError) as exc:
        client.completions.create(
            model=MODEL, prompt="slow", max_tokens=2000, temperature=0,
            extra_body={"ignore_eos": True},
            extra_headers={"x-splitserve-timeout-s": str(SHORT_DEADLINE_S)},
        )
    body = _assert_error(exc.value, 504, None, code="request_timeout")
    assert f"{SHORT_DEADLINE_S:g} s deadline" in body["message"]
    assert body["type"] == "timeout_error"
    assert _decode_idle() == 0


def test_stream_past_its_deadline_ends_with_an_error_event(client):
    stream = client.completions.create(
        model=MODEL, prompt="slow", max_tokens=2000, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-splitserve-timeout-s": str(STREAM_DEADLINE_S)},
    )
    received = 0
    with pytest.raises(openai.APIError) as exc:
        for chunk in stream:
            received += len(chunk.choices[0].text) > 0 if chunk.choices else 0
    assert received > 0  # it was streaming when the deadline struck
    assert exc.value.body["code"] == "request_timeout"
    assert _decode_idle() == 0


def test_metrics_count_requests(deployment, client):
    def count(text: str, status: str) -> float:  # summed over the tenant and outcome labels
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("splitserve_requests_total{")
            and f'status="{status}"' in line
            and 'endpoint="completions"' in line
        )

    before = httpx.get(f"{deployment}/metrics").text
    client.completions.create(model=MODEL, prompt="count me", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    after = httpx.get(f"{deployment}/metrics").text
    assert count(after, "200") == count(before, "200") + 1
    assert count(after, "404") == count(before, "404") + 1
    assert "splitserve_time_to_first_token_seconds_bucket" in after
