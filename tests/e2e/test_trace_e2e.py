"""One disaggregated request's trace, end to end on real engines: the router (inside its Serve
replica) writes its spans to a JSON-lines file (`tracing.file`), and the test reads them back.

A streamed request through the real `openai` client must give one trace with the whole span tree
(root HTTP span -> dispatch -> prefill (+ attempt, admission), admission -> decode ->
kv_transfer), correctly parented; the kv_transfer span's bytes must equal what the decode
engine's NIXL connector reported for that request; and the spans' durations must add up to the
time to first token.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from ray import serve

from splitserve.router import tracing as tr
from tests.conftest import running_deployment, test_config, trace_of

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
ROOT = "POST /v1/completions"
# The stated margin: prefill span + decode hop's time to first token (the router's two hops)
# cover the root span's time to first token (its start to the decode hop's first_token event)
# up to max(10 %, 50 ms): the rest is the router's own work between them (parsing, tokenizing,
# the policy). The client's TTFT adds the HTTP proxy both ways: max(25 %, 100 ms) over the root's.
ROOT_MARGIN = (0.10, 0.050)
CLIENT_MARGIN = (0.25, 0.100)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    spans = tmp_path_factory.mktemp("trace") / "spans.jsonl"
    cfg = test_config(**{
        "mode": "disaggregated",
        "tracing.enabled": True,
        "tracing.file": str(spans),
        "disaggregation.min_remote_prompt_tokens": 0,  # every prompt goes remote
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
    })
    with running_deployment(cfg) as base:
        yield base, str(spans)


def _decode_stats():
    return serve.get_deployment_handle("decode", app_name="splitserve").stats.remote().result()


def _histogram_count(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f"{name}_count "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _streamed(client: openai.OpenAI, prompt: str) -> tuple[str, float, int]:
    """(response id, client-measured TTFT in seconds, output tokens) of one streamed request."""
    start = time.perf_counter()
    ttft, n_out, rid = None, 0, ""
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True,
        extra_body={"return_token_ids": True},
    )
    for chunk in stream:
        rid = chunk.id or rid
        new = (chunk.choices[0].model_extra.get("token_ids") or []) if chunk.choices else []
        if new and ttft is None:
            ttft = time.perf_counter() - start
        n_out += len(new)
    assert ttft is not None
    return rid, ttft, n_out



def _one(spans: list[dict], name: str, **attrs) -> dict:
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (name, attrs, [s["name"] for s in spans])
    return found[0]


def test_a_disaggregated_stream_is_one_trace_with_the_measured_kv_transfer(deployment):
    base, path = deployment
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    _streamed(client, "Warm up the NIXL handshake and the engines. " * 20)

    before, hist_before = _decode_stats(), _histogram_count(
        base, "splitserve_kv_transfer_duration_seconds")
    rid, client_ttft, n_out = _streamed(client, "Every tenant has a key and a fair share. " * 25)
    after = _decode_stats()
    moved = after.kv_bytes_received - before.kv_bytes_received
    assert moved > 0 and after.kv_transfers > before.kv_transfers
    assert _histogram_count(base, "splitserve_kv_transfer_duration_seconds") == hist_before + 1

    spans = trace_of(path, rid, ROOT)
    root, dispatch = _one(spans, ROOT), _one(spans, tr.DISPATCH)
    prefill, attempt = _one(spans, tr.PREFILL), _one(spans, tr.PREFILL_ATTEMPT)
    gate_p = _one(spans, tr.ADMISSION, **{tr.POOL: "prefill"})
    gate_d = _one(spans, tr.ADMISSION, **{tr.POOL: "decode"})
    decode, kv = _one(spans, tr.DECODE), _one(spans, tr.KV_TRANSFER)
    assert len(spans) == 8, sorted(s["name"] for s in spans)

    # Parents (one trace: trace_of selected by trace id).
    assert root["parent_id"] is None and root["kind"] == "SERVER"
    parent = {s["span_id"]: s for s in spans}
    assert dispatch["parent_id"] == root["span_id"]
    assert prefill["parent_id"] == gate_d["parent_id"] == decode["parent_id"] == dispatch["span_id"]
    assert attempt["parent_id"] == gate_p["parent_id"] == prefill["span_id"]
    assert parent[kv["parent_id"]] is decode
    assert all(s["status"] != "ERROR" for s in spans)
    assert dispatch["attributes"][tr.PREFILL_PATH] == "remote"
    assert dispatch["attributes"][tr.FALLBACK] is False
    assert root["attributes"][tr.GENAI_OUTPUT_TOKENS] == n_out

    # The KV transfer: what the connector measured for this request.
    a = kv["attributes"]
    assert a[tr.KV_BYTES] == moved == decode["attributes"][tr.KV_BYTES]
    assert a[tr.KV_BACKEND] == "nixl" and a[tr.KV_BLOCKS] > 0
    seconds = a[tr.KV_SECONDS]
    assert 0 < seconds < (decode["end_ns"] - decode["start_ns"]) / 1e9
    assert kv["end_ns"] - kv["start_ns"] == round(seconds * 1e9)
    (first_token,) = [e["time_ns"] for e in decode["events"] if e["name"] == tr.FIRST_TOKEN]
    assert kv["end_ns"] == first_token  # placed where the decode hop's first chunk arrived
    assert kv["start_ns"] >= decode["start_ns"]

    # The time to first token, split into the two hops.
    prefill_s = (prefill["end_ns"] - prefill["start_ns"]) / 1e9
    decode_ttft = decode["attributes"][tr.TTFT]
    spans_ttft = prefill_s + decode_ttft
    root_ttft = (first_token - root["start_ns"]) / 1e9
    figures = (f"client TTFT {client_ttft * 1e3:.1f} ms, root {root_ttft * 1e3:.1f} ms, prefill "
               f"{prefill_s * 1e3:.1f} + decode {decode_ttft * 1e3:.1f} ms, kv {seconds * 1e3:.2f}"
               f" ms, {moved} B")
    print(figures)
    assert spans_ttft <= root_ttft + 1e-3 <= client_ttft + 2e-3, figures
    assert root_ttft - spans_ttft <= max(ROOT_MARGIN[0] * root_ttft, ROOT_MARGIN[1]), figures
    assert client_ttft - root_ttft <= max(CLIENT_MARGIN[0] * client_ttft, CLIENT_MARGIN[1]), (
        figures
    )
