"""A router replica's stop: refuse new requests, let those in flight finish within a grace
period, then end the rest (SIGTERM or Ctrl-C to `splitserve serve`, `splitserve/launcher.py`).

    launcher ──handle.broadcast("drain", grace_s)──▶ every router replica
        new generation requests      503 `shutting_down` (OpenAI error body, Retry-After)
        /health, /health/ready       503 {"status": "draining"}  (/health/live stays 200)
        requests in flight           run on until the grace period ends; then a stream ends with
                                     an error event, a whole response is a 503; either way its
                                     worker requests are cancelled (the engines are left idle)
        drain() returns              once no request is left: `DrainReport`

A request is in flight from its handler's start until its response is over: the handler holds
it (`hold`), and a stream holds it until its chunk iterator is closed (`guard`). The grace
period is one deadline for every request of the replica; a request still running at the deadline
gets the same cancellation as one past its own deadline (`router/deadline.py`).
Single event loop (the replica's), like the rest of the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TypeVar

from splitserve.router.errors import APIError

T = TypeVar("T")

log = logging.getLogger("splitserve.router")

# After the grace period, how long the ended requests get to close (their error event written,
# their worker requests cancelled) before drain() answers anyway. A cancellation unwinds in
# milliseconds; this only bounds a request stuck in code that ignores cancellation.
ENDED_CLOSE_S = 5.0


def shutting_down() -> APIError:
    """503 for a request refused or ended because the server is stopping."""
    return APIError(
        503,
        "The server is shutting down; retry on another replica or later.",
        type="service_unavailable",
        code="shutting_down",
        headers={"Retry-After": "1"},
    )


@dataclass(frozen=True)
class DrainReport:
    """What one replica's drain did: requests in flight when it began, how many were still
    waiting for a chunk when the grace period ended (ended with an error), and how many had not
    closed `ENDED_CLOSE_S` after that (0 unless something ignores cancellation)."""

    in_flight: int
    ended: int
    left: int


class Drain:
    """One router replica's in-flight requests and its stop. Never raises into its owner except
    `shutting_down()` for a request it refuses or ends."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._deadline: float | None = None  # the event loop's time; None: not draining
        self._waits: set[asyncio.Timeout] = set()  # every guarded wait for a chunk right now
        self._ended = 0  # requests ended at the deadline

    @property
    def draining(self) -> bool:
        """True once `drain` has been called (for good: a replica does not resume)."""
        return self._deadline is not None

    @property
    def in_flight(self) -> int:
        """Requests whose response is not over."""
        return self._in_flight

    def admit(self) -> None:
        """Raise `shutting_down()` once draining; called first by every generation request."""
        if self.draining:
            raise shutting_down()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Count a request while its handler runs."""
        self._enter()
        try:
            yield
        finally:
            self._exit()

    async def guard(self, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
        """`chunks`, counted until closed; a wait for the next chunk that runs past the grace
        period is cancelled and ends the request with `shutting_down()`. Closes `chunks`."""
        self._enter()
        try:
            while True:
                wait = asyncio.timeout_at(self._deadline)
                try:
                    async with wait:
                        self._waits.add(wait)
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not wait.expired():
                        raise
                    self._ended += 1
                    raise shutting_down() from None
                finally:
                    self._waits.discard(wait)
                yield chunk
        finally:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
            finally:
                self._exit()

    async def drain(self, grace_s: float) -> DrainReport:
        """Refuse new requests from now on, wait up to `grace_s` for those in flight, end the
        rest, and answer once they are closed (`ENDED_CLOSE_S` at most). Idempotent: a second
        call keeps the first deadline."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + max(grace_s, 0.0)
            for wait in list(self._waits):
                wait.reschedule(self._deadline)
            log.info("draining: %d requests in flight, %.1f s grace", self._in_flight, grace_s)
        in_flight = self._in_flight
        await self._idle_by(self._deadline)
        if self._in_flight:  # those past the deadline are ending: let them close
            await self._idle_by(self._deadline + ENDED_CLOSE_S)
        if self._ended:
            log.warning("draining: %d requests ended at the end of the grace period", self._ended)
        return DrainReport(in_flight=in_flight, ended=self._ended, left=self._in_flight)

    async def _idle_by(self, when: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(when):
                await self._idle.wait()

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _exit(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

