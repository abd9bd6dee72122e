"""router/drain.py: a router replica's stop on plain asyncio streams (no Ray, no engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from splitserve.router.drain import Drain, DrainReport
from splitserve.router.errors import APIError


class Source:
    """A chunk stream the test paces: yields one chunk per `release()`, records its close."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.sent = 0
        self.closed = asyncio.Event()
        self._go = asyncio.Queue[None]()

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._go.put_nowait(None)

    async def __call__(self) -> AsyncIterator[int]:
        try:
            while self.sent < self.chunks:
                await self._go.get()
                self.sent += 1
                yield self.sent
        finally:
            self.closed.set()


async def _read(chunks: AsyncIterator[int]) -> tuple[list[int], APIError | None]:
    got: list[int] = []
    try:
        async for c in chunks:
            got.append(c)
    except APIError as err:
        return got, err
    return got, None


def _assert_shutting_down(err: APIError | None) -> None:
    assert err is not None
    assert err.status == 503
    assert err.code == "shutting_down"
    assert "shutting down" in err.message
    assert err.body()["error"]["type"] == "service_unavailable"


def test_admits_until_draining_then_refuses_with_503():
    async def run() -> None:
        drain = Drain()
        drain.admit()  # not draining: no error
        assert not drain.draining
        report = await drain.drain(30.0)  # nothing in flight: answers at once
        assert report == DrainReport(in_flight=0, ended=0, left=0)
        assert drain.draining
        with pytest.raises(APIError) as err:
            drain.admit()
        _assert_shutting_down(err.value)

    asyncio.run(run())


def test_stream_that_finishes_within_the_grace_period_is_untouched():
    async def run() -> None:
        drain, src = Drain(), Source(chunks=3)
        reader = asyncio.create_task(_read(drain.guard(src())))
        src.release()
        await asyncio.sleep(0)
        draining = asyncio.create_task(drain.drain(3600.0))
        await asyncio.sleep(0)
        assert not draining.done() and drain.in_flight == 1
        src.release(2)
        got, err = await reader
        assert (got, err) == ([1, 2, 3], None)
        assert await draining == DrainReport(in_flight=1, ended=0, left=0)

    asyncio.run(run())


def test_stream_past_the_grace_period_ends_with_503_and_is_closed():
    async def run() -> None:
        drain, src = Drain(), Source(chunks=100)
        reader = asyncio.create_task(_read(drain.guard(src())))
        src.release(2)
        while src.sent < 2:
            await asyncio.sleep(0)
        report = await drain.drain(0.05)  # the source never sends its third chunk
        got, err = await reader
        assert got == [1, 2]
        _assert_shutting_down(err)
        assert src.closed.is_set()  # the worker side is cancelled, not left running
        assert report == DrainReport(in_flight=1, ended=1, left=0)
        assert drain.in_flight == 0

    asyncio.run(run())


def test_a_handler_holds_the_drain_until_it_returns():
    async def run() -> None:
        drain = Drain()
        release = asyncio.Event()

        async def handler() -> None:
            with drain.hold():
                await release.wait()

        task = asyncio.create_task(handler())
        await asyncio.sleep(0)
        draining = asyncio.create_task(drain.drain(3600.0))
        await asyncio.sleep(0)
        assert drain.in_flight == 1 and not draining.done()
        release.set()
        await task
        assert (await draining).in_flight == 1

    asyncio.run(run())


def test_stream_started_after_the_deadline_ends_at_once():
    """A request admitted just before the drain that reaches its stream after the grace period
    (reading its body, queued for admission) is ended, not served past the deadline."""

    async def run() -> None:
        drain, src = Drain(), Source(chunks=1)
        await drain.drain(0.0)
        got, err = await _read(drain.guard(src()))
        assert got == []
        _assert_shutting_down(err)
        assert src.closed.is_set()

    asyncio.run(run())


def test_a_second_drain_keeps_the_first_deadline():
    async def run() -> None:
        drain, src = Drain(), Source(chunks=100)
        reader = asyncio.create_task(_read(drain.guard(src())))
        src.release()
        first = asyncio.create_task(drain.drain(0.05))
        await asyncio.sleep(0)
        second = await drain.drain(3600.0)  # would wait an hour if it moved the deadline
        assert second.ended == 1
        assert (await first).ended == 1
        _assert_shutting_down((await reader)[1])

    asyncio.run(run())


def test_a_timeout_of_the_stream_itself_is_not_a_shutdown():
    async def run() -> None:
        drain = Drain()

        async def failing() -> AsyncIterator[int]:
            yield 1
            raise TimeoutError("the stream's own")

        with pytest.raises(TimeoutError, match="the stream's own"):
            await _read(drain.guard(failing()))
        assert drain.in_flight == 0

    asyncio.run(run())
