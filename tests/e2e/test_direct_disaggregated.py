"""Direct streaming with disaggregation end to end: the router (Serve's ingress request router)
admits each request, prefills it on the prefill pool and answers HAProxy with the decode replica
and a verdict that carries the KV handoff; the decode replica pulls the KV over NIXL and streams
to the client itself (router/direct.py, engine/front.py, docs/dataplane.md).

One prefill and one decode engine, each on a core of its own; every prompt of THRESHOLD tokens
or more is prefilled remotely; a seeded fault makes some prompts' prefill fail. The real
`openai` client. Greedy tokens must equal the decode engine's own local prefill, the decode
engine's connector must have received the KV (or none, for a prompt whose prefill failed and
fell back to the decode engine), and nothing may be left allocated afterwards. The router
writes its spans to a file: each request's trace holds its remote prefill and ends when the
decode replica settles the request.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest

from splitserve.config import FaultsConfig
from splitserve.engine.faults import prefill_fails
from splitserve.router import tracing as tr
from splitserve.router.span_file import read_spans
from tests.conftest import direct_greedy, pool_stats, pools_at_rest, running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
THRESHOLD = 128
FAULTS = FaultsConfig(seed=7, prefill_error_rate=0.3)


@pytest.fixture(scope="module")
def span_file(tmp_path_factory) -> str:
    """The file the router writes its spans to."""
    return str(tmp_path_factory.mktemp("trace") / "spans.jsonl")


@pytest.fixture(scope="module")
def deployment(span_file):
    cfg = test_config(**{
        "tracing.enabled": True,
        "tracing.file": span_file,
        "mode": "disaggregated",
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
        "disaggregation.min_remote_prompt_tokens": THRESHOLD,
        "disaggregation.prefill_attempts": 2,
        "faults": FAULTS.model_dump(),
        "router.direct_ingress": True,
        "router.direct_streaming": True,
    })
    with running_deployment(cfg) as base:
        yield base


@pytest.fixture(scope="module")
def client(deployment):
    return openai.OpenAI(base_url=f"{deployment}/v1", api_key="unused", max_retries=0)


def _prompts(seed: int, n: int, *, failing: bool) -> list[list[int]]:
    """`n` prompts of 150-400 token ids (all prefilled remotely) whose prefill fails or not."""
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    while len(out) < n:
        ids = rng.integers(10, 500, int(rng.integers(150, 400))).tolist()
        if prefill_fails(FAULTS, ids) == failing:
            out.append(ids)
    return out


def _metric(base: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{want}}}" if labels else name
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(key + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_remote_prefills_move_kv_to_the_decode_replica_and_match_local_prefill(deployment,
                                                                                client):
    remote_before = _metric(deployment, "splitserve_disagg_decisions_total", path="remote")
    for ids in _prompts(1, 3, failing=False):
        before = pool_stats("decode").kv_bytes_received
        out = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0,
                                        extra_body={"return_token_ids": True})
        moved = pool_stats("decode").kv_bytes_received - before
        assert moved > 0, "the decode engine received no KV: it prefilled the prompt itself"
        assert out.choices[0].model_extra["token_ids"] == direct_greedy(ids, 16,
                                                                         fresh_cache=True)
        assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 16
    assert _metric(deployment, "splitserve_disagg_decisions_total", path="remote") \
        == remote_before + 3
    assert pool_stats("decode").kv_transfer_failures == 0


def test_a_failed_prefill_falls_back_to_the_decode_engine(deployment, client):
    (ids,) = _prompts(2, 1, failing=True)
    fallbacks = _metric(deployment, "splitserve_prefill_fallbacks_total")
    before = pool_stats("decode").kv_bytes_received
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert pool_stats("decode").kv_bytes_received == before  # prefilled on decode itself
    assert out.choices[0].model_extra["token_ids"] == direct_greedy(ids, 8, fresh_cache=True)
    assert _metric(deployment, "splitserve_prefill_fallbacks_total") == fallbacks + 1


def test_a_streamed_remote_prefill_equals_the_whole_response(client):
    (ids,) = _prompts(3, 1, failing=False)
    whole = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ids, max_tokens=12, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == whole.choices[0].text and len(parts) > 1


def test_concurrent_remote_requests_complete_and_leave_nothing_allocated(deployment):
    prompts = _prompts(4, 8, failing=False)

    async def run() -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=f"{deployment}/v1", api_key="unused",
                                     max_retries=0)
        try:
            outs = await asyncio.gather(*(aclient.completions.create(
                model=MODEL, prompt=ids, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True}) for ids in prompts))
        finally:
            await aclient.close()
        return [o.usage.completion_tokens for o in outs]

    assert asyncio.run(run()) == [24] * len(prompts)
    assert pools_at_rest() == {"prefill": (0, 0.0), "decode": (0, 0.0)}


def test_a_request_is_one_trace_from_its_route_to_its_settlement(deployment, client, span_file):
    (ids,) = _prompts(3, 1, failing=False)
    since = len(read_spans(span_file))
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    deadline = time.monotonic() + 30  # the root span ends with the replica's settlement
    while True:
        spans = read_spans(span_file)[since:]
        roots = [s for s in spans if s["parent_id"] is None]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (root,) = roots
    assert root["name"] == "POST /v1/completions"
    assert root["attributes"][tr.HTTP_STATUS] == 200
    assert root["attributes"][tr.GENAI_RESPONSE_ID] == out.id
    assert root["attributes"][tr.GENAI_INPUT_TOKENS] == len(ids)
    assert root["attributes"][tr.GENAI_OUTPUT_TOKENS] == 5
    trace = {s["name"]: s for s in spans if s["trace_id"] == root["trace_id"]}
    assert trace[tr.DISPATCH]["parent_id"] == root["span_id"]
    assert trace[tr.DISPATCH]["attributes"][tr.PREFILL_PATH] == "remote"
    assert trace[tr.PREFILL]["parent_id"] == trace[tr.DISPATCH]["span_id"]
    assert root["end_ns"] >= trace[tr.PREFILL]["end_ns"]
