"""Per-tenant quotas: requests/minute, tokens/minute, concurrent requests, tokens per request.

Protocol (who calls what, when):
  1. `reserve(tenant, tokens)` once per request, after tokenizing and before admission, with
     `tokens = prompt_tokens + max_tokens` (the most the request can use). It raises a
     `TenancyError` (429 with Retry-After, or 400 when the request can never fit) and reserves
     nothing, or reserves one request, `tokens` tokens and one concurrency slot, all at once.
  2. `settle(reservation, actual_tokens)` exactly once when the request ends, however it ends,
     with prompt + generated tokens actually used (0 if it never reached a worker). The
     difference to the reservation goes back to (or, if larger, comes out of) the TPM bucket and
     the concurrency slot is freed. A second settle of the same reservation is ignored.

Limits per minute are token buckets (`buckets.py`): a minute's budget may be spent at once, an
empty bucket is full again after 60 s, and Retry-After is the time until the bucket holds enough.
A request larger than a bucket's capacity waits for a full bucket and then drives it negative, so
per-replica shares smaller than one request still admit it at the right average rate.

Design note - where quota state lives. Chosen: in the router replica (`LocalQuotaLimiter`),
each replica enforcing `limit / router_replicas` (`share`). Why: no extra network hop or shared
actor on every request's critical path, no single point of failure, and Serve's proxy spreads
requests over router replicas roughly evenly, so the per-replica split is close to the global
limit. Cost: a tenant whose traffic lands unevenly is throttled a little early, and concurrency
limits round down per replica. The alternative, one shared Ray actor holding the buckets, is
exact but adds an actor call (about a millisecond) per request and a bottleneck; it fits behind
the same async `QuotaBackend` interface (`reserve` / `settle`) without touching callers.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from splitserve.router.tenancy.buckets import TokenBucket
from splitserve.router.tenancy.errors import (
    CONCURRENCY,
    RPM,
    TPM,
    rate_limited,
    request_too_large,
)
from splitserve.router.tenancy.tenants import QuotaLimits, Tenant

Clock = Callable[[], float]

# A concurrency slot frees when some request ends, which the limiter cannot foresee; one second
# is a short retry for a client that is only slightly over its limit.
CONCURRENCY_RETRY_AFTER_S = 1.0


@dataclass(frozen=True)
class Reservation:
    """What `reserve` took for one request; pass it back to `settle` exactly once."""

    id: int
    tenant: str
    tokens: int


class QuotaBackend(Protocol):
    """Where quota state lives: in this process, or (later) in a shared Ray actor."""

    async def reserve(self, tenant: Tenant, tokens: int) -> Reservation:
        """Reserve one request and `tokens` tokens, or raise `TenancyError` (nothing reserved)."""
        ...

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Reconcile with the tokens actually used and free the concurrency slot. Idempotent."""
        ...

    def window(self, tenant: Tenant) -> QuotaWindow:
        """The tenant's quota state now, for reports (never blocks, changes nothing)."""
        ...


@dataclass(frozen=True)
class QuotaWindow:
    """A tenant's quota state now, in one replica (None: that limit is off).

    `requests_available` / `tokens_available`: what the tenant's per-minute buckets would admit
    at once (negative while a request that used more than it reserved is being paid back).
    """

    in_flight: int = 0
    requests_available: float | None = None
    tokens_available: float | None = None


@dataclass
class _TenantState:
    """One tenant's buckets in this replica (None: that limit is off)."""

    rpm: TokenBucket | None
    tpm: TokenBucket | None
    max_concurrent: int | None
    in_flight: int = 0
    open: dict[int, Reservation] = field(default_factory=dict)


def _concurrency_share(limit: int | None, share: int) -> int | None:
    # Round down so that N replicas together never exceed the limit; but never below one.
    return None if limit is None else max(1, limit // share)


class LocalQuotaLimiter:
    """In-process `QuotaBackend`; the sync `try_reserve` / `settle_now` are its pure core."""

    def __init__(self, *, share: int = 1, clock: Clock = time.monotonic) -> None:
        if share < 1:
            raise ValueError("share must be at least 1")
        self.share = share
        self._clock = clock
        self._state: dict[str, _TenantState] = {}
        self._ids = itertools.count(1)

    def _tenant_state(self, name: str, limits: QuotaLimits) -> _TenantState:
        state = self._state.get(name)
        if state is None:
            now = self._clock()
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            state = self._state[name] = _TenantState(
                rpm=None if rpm is None else TokenBucket.per_minute(rpm / self.share, now),
                tpm=None if tpm is None else TokenBucket.per_minute(tpm / self.share, now),
                max_concurrent=_concurrency_share(limits.max_concurrent_requests, self.share),
            )
        return state

    def in_flight(self, tenant: str) -> int:
        """Reserved, unsettled requests of `tenant` in this replica."""
        state = self._state.get(tenant)
        return 0 if state is None else state.in_flight

    def window(self, tenant: Tenant) -> QuotaWindow:
        """`QuotaBackend.window`: this replica's share; full buckets for a tenant not seen yet."""
        limits = tenant.quotas
        state = self._state.get(tenant.name)
        if state is None:
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            return QuotaWindow(
                requests_available=None if rpm is None else rpm / self.share,
                tokens_available=None if tpm is None else tpm / self.share,
            )
        now = self._clock()
        return QuotaWindow(
            in_flight=state.in_flight,
            requests_available=None if state.rpm is None else state.rpm.available(now),
            tokens_available=None if state.tpm is None else state.tpm.available(now),
        )

    def try_reserve(self, tenant: Tenant, tokens: int) -> Reservation:
        """Reserve or raise (see the module protocol). Never blocks."""
        limits = tenant.quotas
        _check_size(tenant.name, limits, tokens)
        state = self._tenant_state(tenant.name, limits)
        now = self._clock()
        waits: list[tuple[float, str, int]] = []
        if state.max_concurrent is not None and state.in_flight >= state.max_concurrent:
            waits.append((CONCURRENCY_RETRY_AFTER_S, CONCURRENCY, state.max_concurrent))
        if state.rpm is not None:
            waits.append((state.rpm.wait_s(1, now), RPM, limits.requests_per_minute or 0))
        if state.tpm is not None:
            waits.append((state.tpm.wait_s(tokens, now), TPM, limits.tokens_per_minute or 0))
        wait, reason, limit = max(waits, default=(0.0, "", 0), key=lambda w: w[0])
        if wait > 0:
            raise rate_limited(tenant.name, reason, limit, wait)
        if state.rpm is not None:
            state.rpm.take(1, now)
        if state.tpm is not None:
            state.tpm.take(tokens, now)
        state.in_flight += 1
        reservation = Reservation(id=next(self._ids), tenant=tenant.name, tokens=tokens)
        state.open[reservation.id] = reservation
        return reservation

    def settle_now(self, reservation: Reservation, actual_tokens: int) -> bool:
        """Settle (see the module protocol); False when it was already settled."""
        state = self._state.get(reservation.tenant)
        if state is None or state.open.pop(reservation.id, None) is None:
            return False
        state.in_flight -= 1
        if state.tpm is not None:
            now = self._clock()
            delta = reservation.tokens - max(actual_tokens, 0)
            if delta >= 0:
                state.tpm.give(delta, now)
            else:
                state.tpm.take(-delta, now)
        return True

    async def reserve(self, tenant: Tenant, tokens: int) -> Reservation:
        """`QuotaBackend.reserve`."""
        return self.try_reserve(tenant, tokens)

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """`QuotaBackend.settle`."""
        self.settle_now(reservation, actual_tokens)


def _check_size(tenant: str, limits: QuotaLimits, tokens: int) -> None:
    """400 for a request no quota state could ever admit (a 429 would invite futile retries)."""
    if limits.max_tokens_per_request is not None and tokens > limits.max_tokens_per_request:
        raise request_too_large(tenant, tokens, limits.max_tokens_per_request, "tokens per request")
    if limits.tokens_per_minute is not None and tokens > limits.tokens_per_minute:
        raise request_too_large(
            tenant, tokens, limits.tokens_per_minute, "tokens per minute (TPM)"
        )


def output_allowance(limits: QuotaLimits, prompt_tokens: int, room: int, choices: int = 1) -> int:
    """Output tokens per choice a request that names no `max_tokens` may use: what the context
    leaves (`room`), or less where the tenant's per-request or per-minute token limit ends it
    first (OpenAI clients usually leave `max_tokens` out: reserving the whole context would
    refuse them under a limit they would never reach). At least 1: a prompt over a limit on its
    own is then refused as too large, naming the limit."""
    allowance = room
    for limit in (limits.max_tokens_per_request, limits.tokens_per_minute):
        if limit is not None:
            allowance = min(allowance, (limit - prompt_tokens) // max(choices, 1))
    return max(allowance, 1)
