"""A request's deadline over its chunk stream (`router.request_timeout_s`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from splitserve.router.errors import deadline_exceeded

T = TypeVar("T")


async def within_deadline(chunks: AsyncIterator[T], timeout_s: float) -> AsyncIterator[T]:
    """`chunks` until `timeout_s` after the first `anext`; then `APIError` 504.

    The wait that runs past the deadline is cancelled, so the request's own clean-up runs at
    once (its worker requests are cancelled, its gate slots and quota released); the iterator is
    closed however this one ends.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise deadline_exceeded(timeout_s) from None
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
