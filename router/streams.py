"""Read a worker call's response from the engine replica's stream server instead of its items.

A call made with `GenerateRequest.http_stream` yields the address of its response's stream
(`GenerateChunk.stream_url`), and ends after the router read the stream's end
(`engine/stream_server.py`). `relayed` turns such a call back into the chunks a call without it
yields, so that the dispatcher reads both alike: the frames of the stream (`engine/frames.py`),
the request's figures on the last. Frames that arrived together come as one chunk.

A stream that stops without its end frame was cut: the replica failed, or the request was
cancelled there. The call then says why (its error is raised); a call that ends without an
error after a cut stream raises `WorkerError` naming the replica, which the dispatcher treats
as the replica's failure (a decode migration, when nothing was relayed yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from splitserve.engine.frames import FrameDecoder, FrameError
from splitserve.engine.messages import GenerateChunk, WorkerError

log = logging.getLogger("splitserve.router")

# Waiting for a stream server to accept the connection (a replica that does not is failing).
CONNECT_TIMEOUT_S = 10.0
# What one read of a stream asks for at most.
READ_BYTES = 1 << 16


class StreamCut(Exception):
    """A stream ended before its end frame (`reachable`: the replica's server answered)."""

    def __init__(self, message: str, *, reachable: bool) -> None:
        super().__init__(message)
        self.reachable = reachable


class StreamClient:
    """An HTTP client of the engine replicas' stream servers: one aiohttp session, made in
    the event loop of its first read, its connections kept open between requests."""

    def __init__(self) -> None:
        self._session: Any = None

    def _client(self):  # -> aiohttp.ClientSession
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
            )
        return self._session

    async def chunks(self, url: str, replica: str) -> AsyncIterator[GenerateChunk]:
        """The chunks of the stream at `url`, sent by `replica`; raises `StreamCut` when it
        ends before its end frame."""
        import aiohttp

        decoder = FrameDecoder(replica)
        try:
            async with self._client().get(url) as response:
                try:
                    if response.status != 200:
                        raise StreamCut(f"the stream answered {response.status}",
                                        reachable=True)
                    content = response.content
                    while True:
                        data = await content.read(READ_BYTES)
                        if not data:
                            break
                        decoded = decoder.feed(data)
                        for chunk in decoded.chunks:
                            yield chunk
                        if decoded.ended:
                            # the body's own end follows at once; read, the connection is
                            # kept for the next stream (released unread, it would be closed)
                            await content.read()
                            return
                finally:
                    if not decoder.ended:  # closed early: the replica's handler sees it go
                        response.close()
        except aiohttp.ClientConnectionError as err:  # a connect timeout is one too
            unreachable = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
            raise StreamCut(f"{type(err).__name__}: {err}",
                            reachable=not isinstance(err, unreachable)) from None
        except FrameError as err:
            raise StreamCut(str(err), reachable=True) from None
        raise StreamCut("the stream ended before its end frame", reachable=True)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


async def relayed(call: Any, client: StreamClient) -> AsyncIterator[GenerateChunk]:
    """The chunks of worker `call` (a Serve streaming response of `GenerateChunk`s): items as
    they come, and a streamed response's chunks read from its stream with `client` in their
    place.

    A stream read to its end ends the iterator at once: the call, which ends by itself once
    its replica saw the stream read, is drained in the background (its end is not waited for,
    nor cancelled). The caller still owns `call` otherwise (cancels it when it closes this
    iterator before the end).
    """
    async for item in call:
        if item.stream_url is None:
            yield item
            continue
        replica_id = item.replica.split("#")[-1]  # Serve's replica id, as WorkerError names it
        try:
            async for chunk in client.chunks(item.stream_url, item.replica):
                yield chunk
            _drain_later(call)
            return
        except StreamCut as cut:
            if not cut.reachable:  # the replica's server is not there: its call cannot help
                raise WorkerError(replica_id,
                                  f"its response stream is unreachable ({cut})") from None
            failure = cut
        # The replica ended the stream: its call ends too, with the reason if it failed.
        async for _ in call:
            pass
        raise WorkerError(replica_id, f"its response stream was cut ({failure})")


_DRAINING: set[asyncio.Task] = set()


async def _drain(call: Any) -> None:
    try:
        async for _ in call:
            pass
    except Exception as err:  # noqa: BLE001 - the response was whole; its call's end is moot
        log.debug("a call ended with %s after its stream was read whole", type(err).__name__)


def _drain_later(call: Any) -> None:
    """Read what is left of `call` (its end) in a task of its own."""
    task = asyncio.get_running_loop().create_task(_drain(call))
    _DRAINING.add(task)
    task.add_done_callback(_DRAINING.discard)
