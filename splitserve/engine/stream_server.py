"""The engine replica's stream server: each request's response goes to the router over HTTP.

A Ray streaming call costs host CPU per item in both processes (serialization, the core
worker's bookkeeping, an asyncio wake-up each side): one item per streamed chunk made the engine
replica and the router spend several times what vLLM's own server spends per token
(BENCHMARKS.md, "Data plane"). Here the Ray call stays, for what Serve does with it (the
choice of replica, its count of ongoing requests, cancellation, a dead replica's error), but
carries one item only: the address of the request's stream. The bytes, token ids and the
request's figures are frames (`engine/frames.py`) on one HTTP response per request from this
server (aiohttp), read by the router (`router/streams.py`); the call ends once the router read
the stream's end.

Each stream is a capability: its address holds a random id, and only a request's own call
tells the router its address. The server binds the address the replica's peers reach it at
(127.0.0.1 on a one-machine cluster, the node's IP otherwise; the release's NetworkPolicy lets
the release's own pods in).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator

from splitserve.engine import frames
from splitserve.engine.messages import GenerateChunk

log = logging.getLogger("splitserve.engine")

# How long a stream waits for the router to connect before the replica stops keeping its frames
# (the router that asked for it is gone).
CONNECT_TIMEOUT_S = 60.0


class StreamSlot:
    """One request's frames, put by the request's call and sent by the server's handler."""

    def __init__(self) -> None:
        self._frames: collections.deque[bytes] = collections.deque()
        self._arrived = asyncio.Event()
        self.closed = False
        self.connected = asyncio.Event()
        self.finished = asyncio.Event()  # the handler is done: all sent, or the reader left

    def put(self, frame: bytes) -> None:
        """Queue `frame` (never waits: the engine must not wait for a slow reader)."""
        if frame and not self.closed:
            self._frames.append(frame)
            self._arrived.set()

    def close(self) -> None:
        """No more frames: the handler ends the response once the queued ones are sent."""
        self.closed = True
        self._arrived.set()

    async def frames(self) -> AsyncIterator[bytes]:
        """The queued frames, those waiting together joined in one piece, until closed."""
        while True:
            while not self._frames:
                if self.closed:
                    return
                self._arrived.clear()
                await self._arrived.wait()
            out = b"".join(self._frames)
            self._frames.clear()
            yield out

    async def delivered(self, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
        """Wait until the handler sent everything (or its reader left); False when no reader
        connected within `connect_timeout_s`."""
        try:
            await asyncio.wait_for(self.connected.wait(), connect_timeout_s)
        except TimeoutError:
            return False
        await self.finished.wait()
        return True


class StreamServer:
    """An HTTP server in the engine replica's event loop: `GET /streams/{id}` sends one
    request's frames, as the request's call queues them (`open`)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self._slots: dict[str, StreamSlot] = {}
        self._runner = None
        self.opened = 0  # streams opened since the start

    async def start(self) -> None:
        """Bind a free port on `host` and start serving."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/streams/{stream_id}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        self._runner = runner

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def open(self) -> tuple[str, StreamSlot]:
        """A new stream: its address, and the slot its frames go into."""
        stream_id = secrets.token_urlsafe(18)
        self.opened += 1
        slot = self._slots[stream_id] = StreamSlot()
        return f"{self.base_url}/streams/{stream_id}", slot

    def discard(self, url: str) -> None:
        """Forget the stream at `url` (its call ended); a handler sending it finishes."""
        slot = self._slots.pop(url.rsplit("/", 1)[-1], None)
        if slot is not None:
            slot.close()

    @property
    def open_streams(self) -> int:
        """Streams whose calls have not ended (tests: none is left after a request)."""
        return len(self._slots)

    async def _handle(self, request):  # -> aiohttp.web.StreamResponse
        from aiohttp import web

        slot = self._slots.get(request.match_info["stream_id"])
        if slot is None or slot.connected.is_set():
            raise web.HTTPNotFound()
        slot.connected.set()
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        try:
            await response.prepare(request)
            async for data in slot.frames():
                await response.write(data)
            await response.write_eof()
        except ConnectionError:
            log.debug("a stream's reader left before its end")
        finally:
            slot.finished.set()
        return response

    async def stop(self) -> None:
        """Stop serving; streams still open are cut."""
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def over_http(
    server: StreamServer, chunks: AsyncIterator[GenerateChunk], replica: str
) -> AsyncIterator[GenerateChunk]:
    """A worker call's `chunks` sent as frames on a new stream of `server`: yields the stream's
    address, and ends once the reader read the stream to its end (the last chunk's figures in
    its end frame). A failure cuts the stream (no end frame) and is raised; the stream is
    forgotten however the call ends. `replica`: the replica's name, set on what it yields."""
    url, slot = server.open()
    try:
        yield GenerateChunk((), "", replica=replica, stream_url=url)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if chunk.finish_reason is None:
                    slot.put(frames.encode_chunk(chunk))
                    continue
                slot.put(frames.encode_end(chunk))
                slot.close()
                if not await slot.delivered():
                    log.warning("%s: no reader came for the stream of a request", replica)
    finally:
        server.discard(url)
