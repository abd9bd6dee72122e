"""`within_deadline`: a request past `router.request_timeout_s` ends with a 504 and its own
clean-up (worker cancel, gate and quota release) runs at once."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.router.deadline import TIMEOUT_HEADER, request_timeout, within_deadline
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
    assert "router.request_timeout_s" in err.message and "0.2 s" in err.message


def test_a_consumer_that_stops_early_closes_the_source():
    log: list[str] = []

    async def run():
        stream = within_deadline(_source([0, 0, 0], log), 5)
        assert await anext(stream) == 0
        await stream.aclose()

    asyncio.run(run())
    assert log == ["closed"]


def test_a_client_can_shorten_its_deadline_never_lengthen_it():
    assert request_timeout(600, None) == 600
    assert request_timeout(600, "2.5") == 2.5
    assert request_timeout(600, "9000") == 600


@pytest.mark.parametrize("header", ["0", "-1", "soon", "nan", "inf", ""])
def test_a_bad_timeout_header_is_a_400_naming_it(header):
    with pytest.raises(APIError) as info:
        request_timeout(600, header)
    assert (info.value.status, info.value.param) == (400, TIMEOUT_HEADER)
