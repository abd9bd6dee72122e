"""The async load generator: send a workload to an OpenAI-compatible `/v1/completions`.

Each request is sent at its arrival offset (open loop: a slow server does not slow the
arrivals), at most `max_in_flight` at once (a request past that waits for a slot; its latency
counts from when it is actually sent). Every request streams, asks for usage, and sets
`ignore_eos` so that it produces exactly `max_tokens` tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from splitserve.bench.results import RequestResult
from splitserve.bench.sse import SSEDecoder, error_text, parse_completion_event
from splitserve.bench.workload import BenchRequest


@dataclass(frozen=True)
class Target:
    """Where to send: an OpenAI base URL (ending in /v1) and the model id to ask for."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 300.0  # whole-request limit, streaming included
    max_in_flight: int = 256

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.timeout_s <= 0:
            raise ValueError("max_in_flight must be >= 1 and timeout_s > 0")


def completion_body(
    model: str, req: BenchRequest, *, return_token_ids: bool = False
) -> dict[str, Any]:
    """The JSON body of one streamed completion with an exact output length (and the generated
    ids in its chunks when `return_token_ids`)."""
    body = {
        "model": model,
        "prompt": list(req.prompt),
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM extension: generate exactly max_tokens
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if return_token_ids:
        body["return_token_ids"] = True  # vLLM extension: each chunk's token ids
    return body


async def _read_stream(
    resp: httpx.Response, rec: RequestResult, sent: float, token_ids: list[int] | None
) -> None:
    """Consume the SSE body, timing each chunk with choices (and appending its ids to
    `token_ids` unless None); sets `rec.error` on a bad stream."""
    decoder, last, done = SSEDecoder(), None, False
    async for data in resp.aiter_bytes():
        now = time.perf_counter()
        for payload in decoder.feed(data):
            event = parse_completion_event(payload)
            if event.error is not None:
                rec.error = event.error
                return
            done = done or event.done
            if event.usage:
                rec.output_tokens = event.usage.get("completion_tokens")
            if event.content:
                if token_ids is not None:
                    token_ids.extend(event.token_ids)
                rec.chunks += 1
                if last is None:
                    rec.ttft_s = now - sent
                else:
                    rec.itl_s.append(now - last)
                last = now
    if not done:
        rec.error = "stream ended without [DONE]"
    elif rec.ttft_s is None:
        rec.error = "stream had no content chunk"


async def send_one(
    client: httpx.AsyncClient, target: Target, req: BenchRequest, t0: float,
    *, token_ids: list[int] | None = None,
) -> RequestResult:
    """Send `req` now and measure it; never raises for HTTP or stream failures.

    `token_ids`: a list to receive the generated ids (the request then asks for them).
    """
    rec = RequestResult(req.index, req.arrival_s, len(req.prompt), req.max_tokens)
    sent = time.perf_counter()
    rec.sent_s = sent - t0
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.stream(
                "POST", "completions",
                json=completion_body(target.model, req, return_token_ids=token_ids is not None),
            ) as resp:
                rec.status_code = resp.status_code
                if resp.status_code != 200:
                    rec.error = _http_error(await resp.aread())
                else:
                    await _read_stream(resp, rec, sent, token_ids)
    except TimeoutError:
        rec.error = f"timed out after {target.timeout_s:g} s"
    except httpx.HTTPError as err:
        rec.error = f"{type(err).__name__}: {err}"
    rec.e2e_s = time.perf_counter() - sent
    return rec


def _http_error(body: bytes) -> str:
    """The error message of a non-200 response body."""
    try:
        return error_text(json.loads(body))
    except ValueError:
        return body.decode("utf-8", errors="replace")[:300] or "(empty body)"


def make_client(
    target: Target, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An AsyncClient for `target` with a connection pool as large as the concurrency limit."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    limits = httpx.Limits(
        max_connections=target.max_in_flight, max_keepalive_connections=target.max_in_flight
    )
    return httpx.AsyncClient(
        base_url=target.base_url.rstrip("/") + "/",
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(target.timeout_s),
        transport=transport,
    )


async def run_requests(
    target: Target,
    requests: Sequence[BenchRequest],
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestResult], float]:
    """Send the workload on its schedule; returns the results in request order and the run's
    duration (first send to last completion) in seconds."""
    slots = asyncio.Semaphore(target.max_in_flight)
    async with make_client(target, transport) as client:
        t0 = time.perf_counter()

        async def one(req: BenchRequest) -> RequestResult:
            delay = req.arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with slots:
                return await send_one(client, target, req, t0)

        results = await asyncio.gather(*(one(r) for r in requests))
        return list(results), time.perf_counter() - t0


async def warm_up(
    target: Target,
    requests: Sequence[BenchRequest],
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestResult]:
    """Send `requests` one after another, unmeasured (first-request costs: handshakes, caches)."""
    async with make_client(target, transport) as client:
        t0 = time.perf_counter()
        return [await send_one(client, target, r, t0) for r in requests]
