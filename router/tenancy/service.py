"""`Tenancy`: one object per router replica that wires authentication, quotas, the per-pool fair
admission gates, cache salts and usage accounting, and counts every refusal.

A request's path through it (the router calls, in this order):
  1. `tenant = tenancy.authenticate(request.headers.get("authorization"))`   before the body
  2. `salt = tenancy.cache_salt(tenant, client_salt)`                         after parsing
  3. `async with tenancy.request(tenant, prompt_tokens=p, max_tokens=m) as usage:`
         quota reserve; settled with `usage.generated_tokens` on exit, however it exits
  4.     `async with tenancy.admit("prefill" | "decode", tenant, p) as ticket:` per pool hop
             `ticket.add_output(n)` per chunk (decode)                   then `usage.add_output(n)`

Each pool's gate has its own `VTCScheduler`: prefill fairness is by prompt tokens, decode
fairness by prompt and output tokens. All methods run on the replica's event loop only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from splitserve.config import PoolConfig, SplitserveConfig
from splitserve.router.tenancy.admission import FairAdmission, Ticket
from splitserve.router.tenancy.auth import Authenticator
from splitserve.router.tenancy.cache_salt import cache_salt_for
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.quotas import Clock, LocalQuotaLimiter, QuotaBackend, Reservation
from splitserve.router.tenancy.report import quota_fields
from splitserve.router.tenancy.tenants import (
    DEFAULT_TENANT,
    UNAUTHENTICATED,
    Tenant,
    tenants_from_config,
)
from splitserve.router.tenancy.usage import UsageLedger, UsageMetrics
from splitserve.router.tenancy.vtc import ServiceWeights, VTCScheduler


@dataclass
class RequestUsage:
    """Tokens one request used; the caller adds generated tokens as they stream."""

    prompt_tokens: int
    generated_tokens: int = 0

    def add_output(self, tokens: int) -> None:
        """Count `tokens` more generated tokens."""
        self.generated_tokens += max(tokens, 0)


def pool_max_in_flight(cfg: SplitserveConfig, pool: str, replicas: int | None = None) -> int:
    """A gate's capacity: the configured override, else the sequence slots of the pool's
    `replicas` (default: as configured; the autoscaler passes the live count) divided among
    router replicas (each replica gates its own share), at least one."""
    override = {
        "prefill": cfg.tenancy.prefill_max_in_flight,
        "decode": cfg.tenancy.decode_max_in_flight,
    }.get(pool)
    if override is not None:
        return override
    pool_cfg: PoolConfig = cfg.deployed_pools()[pool]
    count = pool_cfg.replicas if replicas is None else replicas
    return max(1, max(count, 1) * pool_cfg.max_num_seqs // cfg.router.replicas)


def admission_gates(cfg: SplitserveConfig) -> dict[str, FairAdmission]:
    """One fair admission gate per deployed pool of `cfg` (a single-model view)."""
    t = cfg.tenancy
    weights = ServiceWeights(prompt=t.prompt_token_weight, output=t.output_token_weight)
    return {
        pool: FairAdmission(
            pool,
            pool_max_in_flight(cfg, pool),
            scheduler=VTCScheduler(weights),
            max_queued=t.max_queued,
            max_queued_per_tenant=t.max_queued_per_tenant,
            timeout_s=t.queue_timeout_s,
        )
        for pool in cfg.deployed_pools()
    }


class Tenancy:
    """The tenancy facade of one router replica (see the module docstring for the call order)."""

    def __init__(
        self,
        *,
        authenticator: Authenticator,
        quotas: QuotaBackend,
        gates: Mapping[str, FairAdmission],
        usage: UsageLedger,
    ) -> None:
        self.authenticator = authenticator
        self.quotas = quotas
        self.gates = dict(gates)
        self.usage = usage

    @classmethod
    def from_config(
        cls,
        cfg: SplitserveConfig,
        *,
        registry: CollectorRegistry | None = None,
        clock: Clock = time.monotonic,
    ) -> Tenancy:
        """Build from the deployment config; `registry`: where the usage counters go."""
        t = cfg.tenancy
        gates = admission_gates(cfg)
        return cls(
            authenticator=Authenticator(tenants_from_config(cfg), open_mode=t.open_mode),
            quotas=LocalQuotaLimiter(share=cfg.router.replicas, clock=clock),
            gates=gates,
            usage=UsageLedger(UsageMetrics(registry) if registry is not None else None),
        )

    def for_model(self, view: SplitserveConfig) -> Tenancy:
        """A sibling for another served model (`SplitserveConfig.model_views`): the same keys,
        quotas and usage ledger (a tenant's quota spans every model), the gates of that model's
        own pools."""
        return Tenancy(authenticator=self.authenticator, quotas=self.quotas,
                       gates=admission_gates(view), usage=self.usage)

    @property
    def tenants(self) -> dict[str, Tenant]:
        """The tenants requests can run as: the configured ones, or `default` in open mode."""
        if self.authenticator.open_mode:
            return {DEFAULT_TENANT.name: DEFAULT_TENANT}
        return dict(self.authenticator.tenants)

    def snapshot(self) -> dict[str, Any]:
        """This replica's usage counters and quota windows, as plain data (see `report.py`)."""
        return {
            "usage": self.usage.snapshot(),
            "quota": {
                name: quota_fields(self.quotas.window(tenant))
                for name, tenant in self.tenants.items()
            },
        }

    def authenticate(self, authorization: str | None) -> Tenant:
        """`Authenticator.authenticate`, counting refusals."""
        try:
            return self.authenticator.authenticate(authorization)
        except TenancyError as err:
            self.usage.record_rejection(err.tenant or UNAUTHENTICATED, err.reason)
            raise

    def cache_salt(self, tenant: Tenant, client_salt: str | None) -> str:
        """`cache_salt_for` (pure; here so the router needs one object)."""
        return cache_salt_for(tenant, client_salt)

    @contextlib.asynccontextmanager
    async def request(
        self, tenant: Tenant, *, prompt_tokens: int, max_tokens: int
    ) -> AsyncIterator[RequestUsage]:
        """Reserve quota for the request's life; settle with what it really used on exit."""
        reservation = await self._reserve(tenant, prompt_tokens + max_tokens)
        usage = RequestUsage(prompt_tokens=prompt_tokens)
        try:
            yield usage
        finally:
            await self.quotas.settle(reservation, usage.prompt_tokens + usage.generated_tokens)
            self.usage.record_tokens(
                tenant.name,
                prompt_tokens=usage.prompt_tokens,
                generated_tokens=usage.generated_tokens,
            )

    async def _reserve(self, tenant: Tenant, tokens: int) -> Reservation:
        try:
            reservation = await self.quotas.reserve(tenant, tokens)
        except TenancyError as err:
            self.usage.record_rejection(tenant.name, err.reason)
            raise
        self.usage.record_request(tenant.name)
        return reservation

    @contextlib.asynccontextmanager
    async def admit(self, pool: str, tenant: Tenant, prompt_tokens: int) -> AsyncIterator[Ticket]:
        """Hold a slot of `pool`'s gate for the body (waits in fair order; 429 / 503)."""
        gate = self.gates[pool]
        start = time.perf_counter()
        try:
            ticket = await gate.acquire(tenant, prompt_tokens)
        except TenancyError as err:
            self.usage.record_rejection(tenant.name, err.reason)
            raise
        self.usage.record_queue_time(pool, tenant.name, time.perf_counter() - start)
        try:
            yield ticket
        finally:
            gate.release(ticket)
