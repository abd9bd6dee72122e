"""A request's deadline over its chunk stream (`router.request_timeout_s`, or shorter when the
client asks for it with the `x-splitserve-timeout-s` header)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from splitserve.router.errors import bad_request, deadline_exceeded

T = TypeVar("T")

TIMEOUT_HEADER = "x-splitserve-timeout-s"


def request_timeout(configured_s: float, header: str | None) -> float:
    """The request's deadline in seconds: the configured one, or the client's
    `x-splitserve-timeout-s` when that is shorter (a client can shorten its deadline, never
    lengthen it). A header that is not a positive number of seconds is a 400."""
    if header is None:
        return configured_s
    try:
        asked = float(header)
    except ValueError:
        asked = float("nan")
    if not asked > 0 or asked == float("inf"):
        raise bad_request(
            f"{TIMEOUT_HEADER} must be a positive number of seconds, not {header[:40]!r}",
            param=TIMEOUT_HEADER,
        )
    return min(configured_s, asked)


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
