"""Fair admission on a saturated pool, end to end with the real `openai` client.

One colocated deployment whose decode engine runs `SLOTS` sequences at a time, so its admission
gate (`router/tenancy/admission.py`, capacity = replicas x max_num_seqs) is full with a handful of
requests; everything beyond waits in the gate's per-tenant queues and is picked in Virtual Token
Counter order. Two checks, the acceptance of the multi-tenancy issue:

1. Isolation. Tenant A floods (`FLOOD` streams back to back, 10x tenant B's one stream) while B
   sends the same requests one at a time. B's p90 TTFT stays within `ISOLATION_FACTOR` of its
   p90 TTFT measured alone just before, while A's own requests wait far longer (proof that the
   pool really was saturated and that B jumped A's queue).
2. Weights. Tenants C (weight 2) and D (weight 1) each submit `BATCH` identical requests at
   once. Up to the moment C's queue drains (both backlogged until then), the tokens served to C
   and D divide 2:1 within `WEIGHT_TOLERANCE`.

TTFT here is the time from sending the request to the first SSE chunk: the router answers a
stream only once the engine produced the first token, so that chunk marks the first token. Only
ratios of TTFTs measured side by side are asserted, never absolute times.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import numpy as np
import openai
import pytest

from splitserve.router.tenancy import generate_api_key, hash_api_key
from tests.conftest import running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
SLOTS = 2  # decode max_num_seqs, hence the gate's capacity: saturated by three requests
OUTPUT_TOKENS = 8  # short, fixed-length outputs (ignore_eos): a slot frees every few steps
PROMPT = "A fair share of a saturated pool for every tenant, whatever the others send. " * 2
FLOOD = 10  # A's concurrent streams: 10x B's offered load (one stream)
B_REQUESTS = 12  # B's requests per phase; p90 of 12 is the second-worst
BATCH = 24  # C's and D's requests in the weight check
# B waits for a slot like anyone (the gate never preempts): up to one running request's length,
# plus at most one A request that ties with it on the counter. Alone, its TTFT is one prefill.
# With 8-token outputs that is ~5-10x on an idle machine; the factor leaves room for a loaded
# 2-core CI runner. Without fairness (FIFO) B would wait behind A's whole queue, FLOOD / SLOTS =
# 5 requests of 8 tokens each, and A's TTFT (asserted to be far above B's) shows that cost.
ISOLATION_FACTOR = 15.0
QUEUE_MARGIN = 2.0  # A's median TTFT under the flood vs B's: A waits behind its own queue
WEIGHT_TOLERANCE = 0.25  # C:D service within 25% of 2:1 (edge effects: the first picks)

TENANTS = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 1.0}
KEYS = {name: generate_api_key() for name in TENANTS}
ADMIN_KEY = generate_api_key()


@pytest.fixture(scope="module")
def deployment():
    tenants = [
        {"name": name, "weight": weight, "api_key_hashes": [hash_api_key(KEYS[name])]}
        for name, weight in TENANTS.items()
    ]
    cfg = test_config(
        mode="colocated",
        tenants=tenants,
        **{
            "pools.decode.max_num_seqs": SLOTS,
            "tenancy.admin_key_hashes": [hash_api_key(ADMIN_KEY)],
        },
    )
    with running_deployment(cfg) as base:
        yield base


@dataclass
class Result:
    """One streamed request, times relative to a shared origin."""

    tenant: str
    sent: float
    first: float  # first chunk (the first token)
    tokens: int  # prompt + completion, from the stream's usage

    @property
    def ttft(self) -> float:
        return self.first - self.sent


def _client(base: str, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=KEYS[tenant], max_retries=0, timeout=300
    )


async def _one(client: openai.AsyncOpenAI, tenant: str, origin: float) -> Result:
    sent = time.monotonic() - origin
    first, usage = None, None
    stream = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=OUTPUT_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        first = time.monotonic() - origin if first is None else first
        usage = chunk.usage or usage
    assert first is not None and usage is not None
    assert usage.completion_tokens == OUTPUT_TOKENS
    return Result(tenant, sent, first, usage.total_tokens)


async def _sequential(client: openai.AsyncOpenAI, tenant: str, n: int) -> list[Result]:
    origin = time.monotonic()
    return [await _one(client, tenant, origin) for _ in range(n)]


def _p(results: list[Result], q: float) -> float:
    return float(np.percentile([r.ttft for r in results], q))


def _usage(base: str) -> dict:
    r = httpx.get(
        f"{base}/v1/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    )
    r.raise_for_status()
    return r.json()["tenants"]


def test_a_flood_does_not_starve_a_light_tenant(deployment):
    async def run() -> tuple[list[Result], list[Result], list[Result]]:
        a, b = _client(deployment, "a"), _client(deployment, "b")
        await _sequential(b, "b", 2)  # warm-up: compile paths, cache B's prompt
        alone = await _sequential(b, "b", B_REQUESTS)

        stop = asyncio.Event()
        flood: list[Result] = []
        origin = time.monotonic()

        async def a_stream() -> None:
            while not stop.is_set():
                flood.append(await _one(a, "a", origin))

        streams = [asyncio.create_task(a_stream()) for _ in range(FLOOD)]
        while len(flood) < FLOOD:  # every stream has had a turn: the queue is at steady state
            if any(s.done() for s in streams):  # a stream failed: gather() below raises it
                break
            await asyncio.sleep(0.05)
        start = time.monotonic() - origin
        loaded = await _sequential(b, "b", B_REQUESTS)
        end = time.monotonic() - origin
        stop.set()
        await asyncio.gather(*streams)
        await a.close()
        await b.close()
        # A's requests that got their turn while B was measured (all sent at steady state: the
        # first FLOOD ones had finished before `start`)
        during = [r for r in flood if start <= r.first <= end]
        return alone, loaded, during

    alone, loaded, a_during = asyncio.run(run())
    b_alone, b_loaded = _p(alone, 90), _p(loaded, 90)
    a_median, b_median = _p(a_during, 50), _p(loaded, 50)
    print(
        f"B p90 TTFT alone {b_alone * 1e3:.0f} ms, under A's flood {b_loaded * 1e3:.0f} ms "
        f"(x{b_loaded / b_alone:.1f}); median TTFT under the flood: A {a_median * 1e3:.0f} ms, "
        f"B {b_median * 1e3:.0f} ms over {len(a_during)} A requests"
    )
    assert len(a_during) >= B_REQUESTS  # A kept the pool busy all along (B holds one slot at most)
    assert a_median >= QUEUE_MARGIN * b_median  # A queued; B did not wait behind it
    assert b_loaded <= ISOLATION_FACTOR * b_alone
    usage = _usage(deployment)
    assert usage["a"]["rejections"] == {} and usage["b"]["rejections"] == {}
    assert usage["b"]["requests"] == 2 + 2 * B_REQUESTS
    assert usage["b"]["completion_tokens"] == (2 + 2 * B_REQUESTS) * OUTPUT_TOKENS


def test_service_divides_by_weight_while_both_are_backlogged(deployment):
    before = _usage(deployment)

    async def run() -> list[Result]:
        c, d = _client(deployment, "c"), _client(deployment, "d")
        origin = time.monotonic()
        jobs = [_one(client, name, origin) for _ in range(BATCH) for client, name in
                ((c, "c"), (d, "d"))]
        results = list(await asyncio.gather(*jobs))
        await c.close()
        await d.close()
        return results

    results = asyncio.run(run())
    c_drained = max(r.first for r in results if r.tenant == "c")  # C's last request started
    served = {
        name: sum(r.tokens for r in results if r.tenant == name and r.first <= c_drained)
        for name in ("c", "d")
    }
    d_started = sum(1 for r in results if r.tenant == "d" and r.first <= c_drained)
    ratio = served["c"] / served["d"]
    print(f"served while both backlogged: c {served['c']} d {served['d']} tokens (x{ratio:.2f}); "
          f"d had {d_started} of {BATCH} requests started")
    assert d_started < BATCH  # D was still backlogged when C drained
    assert abs(ratio / (TENANTS["c"] / TENANTS["d"]) - 1) <= WEIGHT_TOLERANCE
    after = _usage(deployment)
    for name in ("c", "d"):  # the server's ledger saw every request and token the API returned
        mine = [r for r in results if r.tenant == name]
        assert after[name]["requests"] - before[name]["requests"] == BATCH
        assert after[name]["total_tokens"] - before[name]["total_tokens"] == sum(
            r.tokens for r in mine
        )
        assert after[name]["rejections"] == {}
