"""The `GET /v1/usage` report: per-replica snapshots in, one JSON-able report out. Pure.

Each router replica takes a snapshot of its tenancy state (`Tenancy.snapshot`):

    {"usage": UsageLedger.snapshot(), "quota": {tenant: QuotaWindow fields}}

`usage_report` sums the snapshots of every replica (the usage board collects them) into

    {"object": "usage", "scope": "cluster" | "replica", "replicas": N,
     "tenants": {name: {"requests", "prompt_tokens", "completion_tokens", "total_tokens",
                        "rejections": {reason: n}, "quota": {...} | None}}}

Counters are cumulative since each replica started; a replica not heard from for `FRESH_S`
(scaled down or dead) keeps its counts in the total but not its quota state, which is gone with
it. Every configured tenant is listed (zeros when idle), plus any other name the ledgers hold
(`-`: refusals before a tenant was known).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from splitserve.router.errors import APIError
from splitserve.router.tenancy.quotas import QuotaWindow
from splitserve.router.tenancy.tenants import Tenant

# Replicas publish every second; ten missed publications means the replica is gone.
FRESH_S = 10.0
_COUNTERS = ("requests", "prompt_tokens", "generated_tokens")


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One router replica's tenancy state, `age_s` seconds old."""

    usage: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    quota: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    age_s: float = 0.0

    @classmethod
    def of(cls, snapshot: Mapping[str, Any], age_s: float = 0.0) -> ReplicaSnapshot:
        """From `Tenancy.snapshot()`'s plain dict."""
        return cls(snapshot.get("usage", {}), snapshot.get("quota", {}), age_s)


def tenant_not_found(name: str) -> APIError:
    """404 for `?tenant=` naming no configured tenant and no counted one."""
    return APIError(404, f"No tenant `{name}`.", param="tenant", code="tenant_not_found")


def merge_usage(usages: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Ledger snapshots summed per tenant (counters added, rejections added per reason)."""
    total: dict[str, dict[str, Any]] = {}
    for usage in usages:
        for name, u in usage.items():
            t = total.setdefault(name, {**{c: 0 for c in _COUNTERS}, "rejections": {}})
            for c in _COUNTERS:
                t[c] += u.get(c, 0)
            for reason, n in u.get("rejections", {}).items():
                t["rejections"][reason] = t["rejections"].get(reason, 0) + n
    return total


def _add(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def merge_quota(windows: Iterable[Mapping[str, Any]]) -> QuotaWindow:
    """Replicas' `QuotaWindow`s of one tenant summed: in-flight requests and what is left."""
    in_flight, requests, tokens = 0, None, None
    for w in windows:
        in_flight += w.get("in_flight", 0)
        requests = _add(requests, w.get("requests_available"))
        tokens = _add(tokens, w.get("tokens_available"))
    return QuotaWindow(in_flight, requests, tokens)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _quota_entry(tenant: Tenant, window: QuotaWindow) -> dict[str, Any]:
    q = tenant.quotas
    return {
        "requests_per_minute": q.requests_per_minute,
        "requests_available": _round(window.requests_available),
        "tokens_per_minute": q.tokens_per_minute,
        "tokens_available": _round(window.tokens_available),
        "max_concurrent_requests": q.max_concurrent_requests,
        "in_flight": window.in_flight,
        "max_tokens_per_request": q.max_tokens_per_request,
    }


def _tenant_entry(usage: Mapping[str, Any] | None, quota: dict[str, Any] | None) -> dict:
    u = usage or {}
    prompt, completion = u.get("prompt_tokens", 0), u.get("generated_tokens", 0)
    return {
        "requests": u.get("requests", 0),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "rejections": dict(sorted(u.get("rejections", {}).items())),
        "quota": quota,
    }


def usage_report(
    snapshots: Iterable[ReplicaSnapshot],
    tenants: Mapping[str, Tenant],
    *,
    scope: str,
    only: str | None = None,
) -> dict[str, Any]:
    """The report (module docstring). `tenants`: the configured ones; `only`: one tenant's
    entry, or `tenant_not_found` (404) when no tenant has that name."""
    snaps = list(snapshots)
    usage = merge_usage(s.usage for s in snaps)
    fresh = [s for s in snaps if s.age_s <= FRESH_S]
    names = [*tenants, *sorted(n for n in usage if n not in tenants)]
    if only is not None:
        if only not in names:
            raise tenant_not_found(only)
        names = [only]
    entries = {}
    for name in names:
        tenant = tenants.get(name)
        quota = None
        if tenant is not None:
            window = merge_quota(s.quota[name] for s in fresh if name in s.quota)
            quota = _quota_entry(tenant, window)
        entries[name] = _tenant_entry(usage.get(name), quota)
    return {"object": "usage", "scope": scope, "replicas": len(snaps), "tenants": entries}


def quota_fields(window: QuotaWindow) -> dict[str, Any]:
    """A `QuotaWindow` as the plain dict a snapshot carries."""
    return asdict(window)
