"""The async client against an in-process fake server (httpx.MockTransport): no network."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from bench_fakes import DONE, FakeServer, chunk

from splitserve.bench.client import Target, run_requests, send_one
from splitserve.bench.workload import BenchRequest, LengthSpec, WorkloadSpec, build_workload

TARGET = Target("http://bench.invalid/v1", "tiny", max_in_flight=8, timeout_s=5)


def workload(n=4, rate=math.inf, out="5"):
    return build_workload(WorkloadSpec(n, LengthSpec.parse("6"), LengthSpec.parse(out), rate,
                                       arrivals="fixed"))


def run(target, reqs, transport):
    return asyncio.run(run_requests(target, reqs, transport))


def test_request_body_and_measurements():
    server = FakeServer(gap_s=0.02, first_s=0.05)
    results, duration = run(TARGET, workload(n=2), server.transport())
    body = server.bodies[0]
    assert body["prompt"] == list(workload()[0].prompt) and body["max_tokens"] == 5
    assert body["ignore_eos"] is True and body["stream"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "tiny"
    for r in results:
        assert r.ok and r.status_code == 200 and r.output_tokens == 5 and r.chunks == 5
        assert r.ttft_s >= 0.05 and len(r.itl_s) == 4 and min(r.itl_s) >= 0.015
        assert r.e2e_s >= r.ttft_s + sum(r.itl_s) - 1e-6
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
    assert duration >= max(r.e2e_s for r in results)


def test_path_joins_base_url():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(404, json={"error": {"message": "no"}})

    run(TARGET, workload(n=1), httpx.MockTransport(handler))
    assert seen == ["/v1/completions"]


def test_http_error_is_recorded_with_status_and_message():
    def handler(request):
        return httpx.Response(400, json={"error": {"message": "prompt too long", "code": 400}})

    [r], _ = run(TARGET, workload(n=1), httpx.MockTransport(handler))
    assert not r.ok and r.status_code == 400 and r.error == "prompt too long"
    assert r.ttft_s is None and r.tpot_s is None


@pytest.mark.parametrize("parts, error", [
    ([chunk("a"), chunk("b")], "stream ended without [DONE]"),
    ([DONE], "stream had no content chunk"),
    ([chunk("a"), b'data: {"error": {"message": "engine died"}}\n\n', DONE], "engine died"),
])
def test_bad_streams_are_errors(parts, error):
    def handler(request):
        return httpx.Response(200, content=b"".join(parts))

    [r], _ = run(TARGET, workload(n=1), httpx.MockTransport(handler))
    assert r.status_code == 200 and r.error == error


def test_timeout_and_connection_errors():
    server = FakeServer(first_s=1.0)
    target = Target(TARGET.base_url, "tiny", timeout_s=0.1)
    [r], _ = run(target, workload(n=1), server.transport())
    assert r.error == "timed out after 0.1 s" and r.e2e_s < 0.9

    def refuse(request):
        raise httpx.ConnectError("connection refused")

    [r], _ = run(TARGET, workload(n=1), httpx.MockTransport(refuse))
    assert r.error == "ConnectError: connection refused" and r.status_code is None


def test_concurrency_is_capped():
    server = FakeServer(gap_s=0.01)
    target = Target(TARGET.base_url, "tiny", max_in_flight=2)
    results, _ = run(target, workload(n=6), server.transport())
    assert all(r.ok for r in results) and server.max_in_flight == 2


def test_requests_follow_the_schedule():
    results, _ = run(TARGET, workload(n=4, rate=20.0), FakeServer().transport())
    sent = [r.sent_s for r in results]
    assert [r.scheduled_s for r in results] == pytest.approx([0, 0.05, 0.1, 0.15])
    assert all(s >= r.scheduled_s - 1e-3 for s, r in zip(sent, results, strict=True))
    assert sent[-1] < 0.15 + 0.1  # not serialized behind each other


def test_send_one_never_raises_on_garbage():
    def handler(request):
        return httpx.Response(200, content=b"data: nonsense\n\n")

    async def go():
        async with httpx.AsyncClient(base_url="http://x/v1/",
                                     transport=httpx.MockTransport(handler)) as c:
            return await send_one(c, TARGET, BenchRequest(0, 0.0, (1, 2), 3), 0.0)

    r = asyncio.run(go())
    assert r.error.startswith("bad SSE payload")
