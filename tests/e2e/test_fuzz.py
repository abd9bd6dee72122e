"""Bad input and overload over HTTP: seeded malformed requests never give a 500 or crash the
router, and a flood beyond the admission queue is refused fast while /health and /metrics answer.

One colocated deployment (one decode worker on one core) for the module, with a small decode gate
(DECODE_SLOTS in flight, MAX_QUEUED waiting): the fuzz sends one request at a time, the flood
many at once. The cases come from
`tests/fuzz_requests.py` (a seeded `random.Random`; `hypothesis` is not in the pinned
environment): invalid JSON and UTF-8, deep nesting, NaN, bodies over `router.max_body_bytes`,
wrong types, negative and huge values (`n`, `max_tokens`, penalties...), unknown fields. Every
answer is a 2xx with a well-formed completion, or a 4xx with an OpenAI error body; afterwards the
router still answers /health, /metrics and a normal request.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import running_deployment, test_config
from tests.fuzz_requests import MODEL, cases

pytestmark = pytest.mark.engine

MAX_BODY = 32 * 1024
N_CASES = 400
DECODE_SLOTS = 2
MAX_QUEUED = 4
FLOOD = 40


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(
        **{
            "mode": "colocated",
            "router.max_body_bytes": MAX_BODY,
            "tenancy.decode_max_in_flight": DECODE_SLOTS,
            "tenancy.max_queued": MAX_QUEUED,
        }
    )
    with running_deployment(cfg) as base:
        yield base


def _check(status: int, content_type: str, text: str, sent: bytes) -> str:
    """The kind of answer ("ok" or "error"); fails on anything that is neither."""
    where = f"{status} for {sent[:200]!r}: {text[:300]}"
    assert status != 500 and status < 600, where
    if status == 200:
        if content_type.startswith("text/event-stream"):
            events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
            assert events and events[-1] == "[DONE]", where
            assert all("error" not in json.loads(e) for e in events[:-1]), where
        else:
            assert json.loads(text)["choices"], where
        return "ok"
    assert 400 <= status < 500 or status == 503, where
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], where
    return "error"


def test_malformed_requests_get_openai_errors_never_a_500(deployment):
    seen = {"ok": 0, "error": 0}
    statuses: set[int] = set()
    with httpx.Client(base_url=deployment, timeout=120) as client:
        for path, headers, body in cases(42, N_CASES, max_body=MAX_BODY):
            r = client.post(path, content=body, headers=headers)
            seen[_check(r.status_code, r.headers.get("content-type", ""), r.text, body)] += 1
            statuses.add(r.status_code)
    assert seen["ok"] > 5 and seen["error"] > N_CASES // 2, seen
    assert {400, 413} <= statuses, statuses


def test_router_is_healthy_after_the_fuzz(deployment):
    assert httpx.get(f"{deployment}/health").status_code == 200
    assert "splitserve_requests_total" in httpx.get(f"{deployment}/metrics").text
    r = httpx.post(
        f"{deployment}/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 3, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert '"500"' not in "".join(
        ln for ln in httpx.get(f"{deployment}/metrics").text.splitlines()
        if ln.startswith("splitserve_requests_total{")
    )


def test_a_flood_is_refused_fast_and_health_and_metrics_still_answer(deployment):
    """FLOOD concurrent requests against DECODE_SLOTS + MAX_QUEUED places: the rest get 429 or
    503 with Retry-After and an OpenAI error body at once; the admitted ones complete; /health
    and /metrics answer 200 while the flood is on."""
    body = {"model": MODEL, "prompt": "flood", "max_tokens": 48, "temperature": 0,
            "ignore_eos": True}

    async def run():
        async with httpx.AsyncClient(base_url=deployment, timeout=300) as client:
            flood = [asyncio.create_task(client.post("/v1/completions", json=body))
                     for _ in range(FLOOD)]
            await asyncio.sleep(0.5)  # the gate is full now
            side = [await client.get("/health", timeout=30), await client.get("/metrics",
                                                                               timeout=30)]
            return await asyncio.gather(*flood), side

    answers, side = asyncio.run(run())
    assert [r.status_code for r in side] == [200, 200]
    served = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert {r.status_code for r in refused} <= {429, 503}, [r.text for r in refused]
    assert len(served) >= DECODE_SLOTS and len(refused) >= FLOOD - DECODE_SLOTS - MAX_QUEUED - 4
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        _check(r.status_code, r.headers.get("content-type", ""), r.text, b"flood")
    assert all(r.json()["usage"]["completion_tokens"] == 48 for r in served)
