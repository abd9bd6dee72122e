"""`FairAdmission`: an asyncio gate in front of one pool, serving waiters in VTC order.

    gate = FairAdmission("decode", max_in_flight=64)
    async with gate.admit(tenant, prompt_tokens) as ticket:   # may wait; may raise 429 / 503
        async for chunk in pool_stream:
            ticket.add_output(len(chunk.token_ids))            # charges the tenant as it goes

Invariants (each holds after every call returns or suspends):
  - at most `max_in_flight` requests hold a slot;
  - a slot is free only when nobody waits (every release hands it straight to the next waiter
    that `VTCScheduler.pick` chooses);
  - at most `max_queued` waiters in all and `max_queued_per_tenant` per tenant: a request that
    would exceed either is refused at once with 429 `queue_full`, so no unbounded pile-up;
  - a waiter gets its slot or, after `timeout_s`, a 503 `queue_timeout`; a waiter that is
    cancelled (client gone) leaves the queue, and a slot granted to it is given back.

One gate per pool (prefill, decode) per router replica; the gate never does I/O. Single event
loop only: it is not thread-safe, like everything else in a Serve replica's request path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from splitserve.router.tenancy.errors import queue_full, queue_timeout
from splitserve.router.tenancy.tenants import Tenant
from splitserve.router.tenancy.vtc import QueueEntry, VTCScheduler

# A full queue drains as requests finish; one second is a short, polite client back-off.
QUEUE_FULL_RETRY_AFTER_S = 1.0
# After a timeout the pool is saturated; ask the client to wait as long as a fresh queue turn.
TIMEOUT_RETRY_AFTER_S = 1.0


@dataclass
class Ticket:
    """A held slot. `add_output` charges generated tokens to the tenant's fair-share counter."""

    tenant: str
    prompt_tokens: int
    _scheduler: VTCScheduler = field(repr=False)
    output_tokens: int = 0
    released: bool = False

    def add_output(self, tokens: int) -> None:
        """Report `tokens` more generated tokens (call per chunk or once at the end)."""
        if tokens > 0:
            self.output_tokens += tokens
            self._scheduler.charge(self.tenant, output_tokens=tokens)


class FairAdmission:
    """Caps in-flight requests to a pool; orders the waiters by weighted fair share."""

    def __init__(
        self,
        pool: str,
        max_in_flight: int,
        *,
        scheduler: VTCScheduler | None = None,
        max_queued: int = 1024,
        max_queued_per_tenant: int = 256,
        timeout_s: float = 30.0,
    ) -> None:
        if max_in_flight < 1 or max_queued < 1 or max_queued_per_tenant < 1 or timeout_s <= 0:
            raise ValueError("FairAdmission limits must be positive")
        self.pool = pool
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.max_queued_per_tenant = max_queued_per_tenant
        self.timeout_s = timeout_s
        self.scheduler = scheduler if scheduler is not None else VTCScheduler()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Slots held now."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Waiters now."""
        return len(self.scheduler)

    @contextlib.asynccontextmanager
    async def admit(
        self, tenant: Tenant, cost_estimate: int, priority: int | None = None
    ) -> AsyncIterator[Ticket]:
        """Wait for a slot and this request's turn; hold it for the `async with` body.

        `cost_estimate`: the prompt tokens, charged to the tenant when it is picked. `priority`:
        the class (default: the tenant's). Raises `TenancyError` 429 `queue_full` at once, or
        503 `queue_timeout` after `timeout_s`. The slot is released however the body exits.
        """
        ticket = await self.acquire(tenant, cost_estimate, priority)
        try:
            yield ticket
        finally:
            self.release(ticket)

    async def acquire(
        self, tenant: Tenant, cost_estimate: int, priority: int | None = None
    ) -> Ticket:
        """`admit` without the context manager: pair every returned ticket with `release`."""
        if self.queued >= self.max_queued or (
            self.scheduler.queued(tenant.name) >= self.max_queued_per_tenant
        ):
            raise queue_full(self.pool, QUEUE_FULL_RETRY_AFTER_S)
        granted: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        entry = self.scheduler.enqueue(
            tenant.name,
            cost_estimate,
            weight=tenant.weight,
            priority=tenant.priority if priority is None else priority,
            payload=granted,
        )
        self._dispatch()
        if granted.done():  # a free slot: no wait, no suspension
            return granted.result()
        try:
            await asyncio.wait({granted}, timeout=self.timeout_s)
        except asyncio.CancelledError:
            self._abandon(entry, granted)
            raise
        if not granted.done():
            self._abandon(entry, granted)
            raise queue_timeout(self.pool, self.timeout_s, TIMEOUT_RETRY_AFTER_S)
        return granted.result()

    def resize(self, max_in_flight: int) -> None:
        """Change the slot count (the pool was scaled). More slots go to waiters at once; with
        fewer, requests holding slots keep them and new ones wait until in-flight drops."""
        if max_in_flight < 1:
            raise ValueError("FairAdmission.resize: max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiters in scheduler order."""
        while self._in_flight < self.max_in_flight:
            entry = self.scheduler.pick()
            if entry is None:
                return
            self._in_flight += 1
            entry.payload.set_result(Ticket(entry.tenant, entry.prompt_tokens, self.scheduler))

    def _abandon(self, entry: QueueEntry, granted: asyncio.Future[Ticket]) -> None:
        if granted.done():  # the slot was handed over just before the timeout or cancellation
            self.release(granted.result())
        else:
            self.scheduler.remove(entry)
            granted.cancel()

    def release(self, ticket: Ticket) -> None:
        """Give the ticket's slot to the next waiter. Idempotent per ticket."""
        if ticket.released:
            return
        ticket.released = True
        self._in_flight -= 1
        self._dispatch()
