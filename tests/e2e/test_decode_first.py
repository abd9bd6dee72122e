"""Decode first on real engines: one prefill and two decode replicas; each remote request's decode
replica is reserved before its prefill, the prefill is told which one, and the decode hop runs
there (issue 27).

The router writes its spans to a file (`tracing.file`): the dispatch span names the reserved
replica (`splitserve.decode_replica`), so does the prefill attempt's, and the decode span names
the replica whose engine answered (`splitserve.replica`, "decode#<id>", from the chunks). Three
engines on two cores: the test sets `placement.share_cores` (development only).
"""

from __future__ import annotations


import httpx
import numpy as np
import openai
import pytest
from splitserve.router import tracing as tr

from tests.conftest import running_deployment, test_config, trace_of

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
ROOT = "POST /v1/completions"
REQUESTS = 6


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    spans = tmp_path_factory.mktemp("trace") / "spans.jsonl"
    cfg = test_config(**{
        "mode": "disaggregated",
        "pools.decode.replicas": 2,
        "placement.share_cores": True,
        "tracing.enabled": True,
        "tracing.file": str(spans),
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
        # three engines on two cores can be slow: no fallback to a local prefill meanwhile
        "disaggregation.prefill_timeout_s": 300,
    })
    with running_deployment(cfg) as base:
        yield base, str(spans)


def _counter(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0



def _one(spans: list[dict], name: str) -> dict:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, (name, [s["name"] for s in spans])
    return found[0]


def test_each_remote_decode_hop_runs_on_the_replica_reserved_before_its_prefill(deployment):
    base, path = deployment
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    rng = np.random.default_rng(27)
    # warm-up: both pools' handles and request routers up, the NIXL handshakes made
    for _ in range(2):
        client.completions.create(model=MODEL, prompt=rng.integers(10, 500, 64).tolist(),
                                  max_tokens=2)
    misses = _counter(base, "splitserve_decode_pin_misses_total")
    reserved = []
    for _ in range(REQUESTS):
        ids = rng.integers(10, 500, int(rng.integers(40, 300))).tolist()
        stream = client.completions.create(model=MODEL, prompt=ids, max_tokens=4,
                                           temperature=0, stream=True)
        rid = ""
        for chunk in stream:
            rid = chunk.id or rid
        spans = trace_of(path, rid, ROOT)
        dispatch, attempt = _one(spans, tr.DISPATCH), _one(spans, tr.PREFILL_ATTEMPT)
        decode = _one(spans, tr.DECODE)
        assert dispatch["attributes"][tr.PREFILL_PATH] == "remote"
        pinned = dispatch["attributes"][tr.DECODE_REPLICA]
        assert attempt["attributes"][tr.DECODE_REPLICA] == pinned  # the prefill was told
        assert decode["attributes"][tr.REPLICA].rsplit("#", 1)[-1] == pinned  # and it ran there
        reserved.append(pinned)
    assert _counter(base, "splitserve_decode_pin_misses_total") == misses
    assert len(reserved) == REQUESTS
