"""Adaptive token coalescing (router/coalescing.py): the pure rule, and the dispatcher asking
the engine for it per request from the load of the pool the request runs on (fake pool
handles, as in test_dispatch_load; real gates, tenancy and metrics)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from splitserve.config import StreamingConfig, parse_config
from splitserve.engine.messages import GenerateChunk
from splitserve.router.coalescing import stream_interval
from splitserve.router.dispatch import Dispatcher
from splitserve.router.metrics import RouterMetrics
from splitserve.router.tenancy import Tenancy

from test_dispatch_load import _drain, _Gated, _req


@pytest.mark.parametrize(
    ("streams", "expected"),
    [(0, 1), (1, 1), (8, 1), (8.5, 2), (16, 2), (17, 3), (24, 3), (25, 4), (1000, 4)],
)
def test_tokens_per_chunk_grow_with_streams_per_replica_up_to_the_cap(streams, expected):
    assert stream_interval(streams, StreamingConfig()) == expected


def test_one_token_per_chunk_when_coalescing_is_off_or_the_threshold_is_high():
    assert stream_interval(500, StreamingConfig(max_tokens_per_chunk=1)) == 1
    assert stream_interval(63, StreamingConfig(chunks_per_step=64)) == 1
    assert stream_interval(65, StreamingConfig(chunks_per_step=64, max_tokens_per_chunk=8)) == 2


def test_the_settings_are_checked():
    with pytest.raises(ValidationError):
        StreamingConfig(max_tokens_per_chunk=0)
    with pytest.raises(ValidationError):
        StreamingConfig(chunks_per_step=0)
    cfg = parse_config({"router": {"streaming": {"max_tokens_per_chunk": 2}}})
    assert cfg.router.streaming == StreamingConfig(max_tokens_per_chunk=2, chunks_per_step=8)


def _colocated(replicas: int, **streaming):
    cfg = parse_config({"mode": "colocated", "router": {"streaming": streaming}})
    decode = _Gated([GenerateChunk(token_ids=(1, 2), text="ab", finish_reason="length")])
    metrics = RouterMetrics()
    d = Dispatcher({"decode": decode}, cfg.disaggregation, metrics, Tenancy.from_config(cfg),
                   replicas={"decode": replicas}, streaming=cfg.router.streaming)
    return d, decode, metrics


def _count(metrics, tokens_per_chunk: int) -> float:
    return metrics.registry.get_sample_value(
        "splitserve_stream_intervals_total", {"tokens_per_chunk": str(tokens_per_chunk)}
    ) or 0.0


@pytest.mark.parametrize("replicas", [1, 2])
def test_each_request_gets_the_interval_of_the_streams_already_on_its_pool(replicas):
    """With 2 chunks per step: requests 1-2 (per replica) stream token by token, the next two
    get 2 tokens per chunk, then 3; a second replica halves the streams per replica."""

    async def body():
        d, decode, metrics = _colocated(replicas, chunks_per_step=2, max_tokens_per_chunk=3)
        out: list = []
        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(_drain(d, _req(10, i), out)))
            while len(decode.requests) <= i:  # each one in flight before the next starts
                await asyncio.sleep(0)
        decode.release.set()
        await asyncio.gather(*tasks)
        assert out == [(1, 2)] * 6  # the fake's chunks pass through unchanged
        return [r.stream_interval for r in decode.requests], metrics

    intervals, metrics = asyncio.run(asyncio.wait_for(body(), 10))
    if replicas == 1:
        assert intervals == [1, 1, 2, 2, 3, 3]
    else:
        assert intervals == [1, 1, 1, 1, 2, 2]
    for n in (1, 2, 3):
        assert _count(metrics, n) == intervals.count(n)


def test_an_idle_pool_streams_every_token_at_once():
    async def body():
        d, decode, metrics = _colocated(1)
        decode.release.set()
        await _drain(d, _req(10), [])
        return decode.requests[0].stream_interval, _count(metrics, 1)

    assert asyncio.run(asyncio.wait_for(body(), 10)) == (1, 1.0)
