"""A request that is over only when its handler has answered AND the chunk stream it wrapped, if
that was started, is closed: a streamed response outlives its handler. Shared by the tracing
root span (router/tracing.py) and the request log (router/request_log.py).

Subclasses implement `_end` (called once, when both are done) and may override the hooks
`_on_chunk`, `_on_stream_error` and `_on_stream_closed`; their `answered` calls `_release`.
Single event loop, like the rest of the request path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from splitserve.engine.messages import GenerateChunk


class RequestEnd:
    """Counts the two holds (handler, stream) and ends the request once both are released."""

    def __init__(self) -> None:
        self._holds = 1  # the handler's; a started stream adds one
        self._cancelled = False  # the client went away (stream closed early, handler cancelled)

    def stream(self, chunks: AsyncIterator[GenerateChunk]) -> AsyncIterator[GenerateChunk]:
        """`chunks`, observed; the request is not over until this is closed."""
        return self._stream(chunks)

    async def _stream(self, chunks: AsyncIterator[GenerateChunk]) -> AsyncIterator[GenerateChunk]:
        self._holds += 1
        try:
            async for chunk in chunks:
                self._on_chunk(chunk)
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            self._cancelled = True
            raise
        except BaseException as err:
            self._on_stream_error(err)
            raise
        finally:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
            finally:
                self._on_stream_closed()
                self._release()

    def _on_chunk(self, chunk: GenerateChunk) -> None:
        """One chunk passed through the stream."""

    def _on_stream_error(self, err: BaseException) -> None:
        """The stream raised `err` (not a cancellation)."""

    def _on_stream_closed(self) -> None:
        """The stream is closed, however it ended (before the hold is released)."""

    def _release(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self._end()

    def _end(self) -> None:
        raise NotImplementedError
