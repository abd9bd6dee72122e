"""Direct streaming, the router's side (`router.direct_streaming`; `engine/routed.py`).

The router is Ray Serve's ingress request router: for each request HAProxy POSTs the client's
body (and its `Authorization`, as Serve's session header) to `/internal/route`, where the router
authenticates, validates, admits and picks the decode replica, then answers with that replica
and a `Verdict` header; HAProxy sends the request there and the replica answers the client
itself. No token crosses the router.

Between the route and the response's end the request's admission (the tenant's quota
reservation, its slot in the pool's fair gate, the drain count, its LoRA adapter's use) is a
`Lease` held here under a random ticket. The replica's `Settlement` closes it with what the
request used; a lease nobody settles (its replica was lost) expires after the request's
deadline and is closed then, charged for its prompt only: nothing stays allocated.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from splitserve.engine.messages import GenerateRequest
from splitserve.engine.routed import Settlement
from splitserve.router.tenancy.admission import Ticket
from splitserve.router.tenancy.service import RequestUsage

log = logging.getLogger("splitserve.router.direct")

# A lease outlives its request's deadline by this much before it is taken as lost (the
# settlement of a request that ended at its deadline is still on its way).
SETTLE_GRACE_S = 30.0


@dataclass
class Lease:
    """A directly served request's admission, held until its settlement."""

    stack: contextlib.AsyncExitStack  # closing it releases everything the request holds
    usage: RequestUsage
    ticket: Ticket
    pool: str
    expires_at: float  # monotonic
    on_settled: Callable[[Settlement | None], None] = field(default=lambda s: None)
    replica: str | None = None  # the replica it was routed to, once picked


class Leases:
    """The open leases of one router replica, by ticket."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._open: dict[str, Lease] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, lease: Lease) -> str:
        """Hold `lease`; returns its ticket (unguessable: the settlement is its only key)."""
        key = secrets.token_hex(16)
        self._open[key] = lease
        return key

    def peek(self, key: str) -> Lease | None:
        """The lease of `key`, still held (None: unknown, or already closed)."""
        return self._open.get(key)

    def take(self, key: str) -> Lease | None:
        """The lease of `key`, no longer held (None: unknown, or already closed)."""
        return self._open.pop(key, None)

    def expired(self) -> list[Lease]:
        """The leases past their expiry, no longer held. Every lease of a replica lives as long
        (the deadline plus the grace), so they expire in the order they were added: the look
        stops at the first one still valid (called on every route, it must not scan them all)."""
        now = self.clock()
        gone = []
        for key, lease in self._open.items():
            if lease.expires_at > now:
                break
            gone.append(key)
        return [self._open.pop(k) for k in gone]


async def settle(lease: Lease, settlement: Settlement | None) -> None:
    """Close `lease` with what its request used: its output tokens to the tenant's quota, usage
    and fair share; a request that never ran as a generation is charged nothing; a lost one
    (None) its prompt only."""
    if settlement is not None and settlement.generated:
        lease.usage.add_output(settlement.output_tokens)
        lease.ticket.add_output(settlement.output_tokens)
    elif settlement is not None:
        lease.usage.prompt_tokens = 0
    try:
        lease.on_settled(settlement)
    finally:
        await lease.stack.aclose()


async def close_expired(leases: Leases) -> int:
    """Close the leases nobody settled in time (logged); returns how many."""
    lost = leases.expired()
    for lease in lost:
        log.warning("direct streaming: no settlement from %s replica %s of a request of "
                    "tenant %s before its deadline; closing its admission", lease.pool,
                    lease.replica or "(not picked)", lease.ticket.tenant)
        await settle(lease, None)
    return len(lost)


async def pick_replica(handle: Any, req: GenerateRequest | None) -> str:
    """The full replica id (Serve's `ReplicaID.to_full_id_str`, the key of HAProxy's replica
    map) of the pool replica `handle`'s request router picks for `req` (None: any), without
    reserving a slot there: the request goes through HAProxy, not through the handle (Ray
    Serve LLM's `LLMRouter` does the same)."""
    args = (req,) if req is not None else ()
    async with handle.choose_replica(*args, _reserve=False) as selection:
        return selection._replica.replica_id.to_full_id_str()
