"""`within_deadline`: a request past `router.request_timeout_s` ends with a 504 and its own
clean-up (worker cancel, gate and quota release) runs at once."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.router.deadline import within_deadline
from splitserve.router.errors import APIError


def _source(delays: list[float], log: list[str]):
    async def gen():
        try:
            for i, d in enumerate(delays):
                await asyncio.sleep(d)
                yield i
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        finally:
            log.append("closed")

    return gen()


def test_a_request_within_its_deadline_is_untouched():
    log: list[str] = []

    async def run():
        return [c async for c in within_deadline(_source([0, 0.01, 0], log), 5)]

    assert asyncio.run(run()) == [0, 1, 2]
    assert log == ["closed"]


def test_past_the_deadline_the_wait_is_cancelled_and_a_504_raised():
    log: list[str] = []
    got: list[int] = []

    async def run():
        async for c in within_deadline(_source([0, 0, 30], log), 0.2):
            got.append(c)

    with pytest.raises(APIError) as info:
        asyncio.run(run())
    assert got == [0, 1]  # what came before the deadline was delivered
    assert log == ["cancelled", "closed"]  # the worker wait was cancelled, not left running
    err = info.value
    assert (err.status, err.code, err.type) == (504, "request_timeout", "timeout_error")
    assert "router.request_timeout_s" in err.message


def test_a_consumer_that_stops_early_closes_the_source():
    log: list[str] = []

    async def run():
        stream = within_deadline(_source([0, 0, 0], log), 5)
        assert await anext(stream) == 0
        await stream.aclose()

    asyncio.run(run())
    assert log == ["closed"]
