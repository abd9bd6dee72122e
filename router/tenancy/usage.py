"""Per-tenant usage accounting: a pure `UsageLedger`, optionally mirrored to Prometheus.

The ledger counts, per tenant: admitted requests, prompt and generated tokens, and rejections by
reason (`errors.py` reasons). `snapshot()` is a plain dict for an admin endpoint or a test.
`UsageMetrics` registers the same counters in a `CollectorRegistry` (the router's own), labelled
by tenant (and reason); tenant names come from the config, so the label set stays bounded.
Rejections before authentication are counted under the tenant `UNAUTHENTICATED`.
"""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from splitserve.router.tenancy.tenants import UNAUTHENTICATED

__all__ = ["UNAUTHENTICATED", "UsageLedger", "UsageMetrics"]

_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class UsageMetrics:
    """Prometheus counters of tenant usage, in the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "splitserve_tenant_requests", "Admitted requests by tenant.", ["tenant"], registry=r
        )
        self.prompt_tokens = Counter(
            "splitserve_tenant_prompt_tokens", "Prompt tokens by tenant.", ["tenant"], registry=r
        )
        self.generation_tokens = Counter(
            "splitserve_tenant_generation_tokens", "Generated tokens by tenant.", ["tenant"],
            registry=r,
        )
        self.rejections = Counter(
            "splitserve_tenant_rejections", "Refused requests by tenant and reason.",
            ["tenant", "reason"], registry=r,
        )
        self.queue_time = Histogram(
            "splitserve_request_queue_time_seconds",
            "Time a request waited in a pool's admission gate before it got a slot.",
            ["pool", "tenant"], buckets=_QUEUE_BUCKETS, registry=r,
        )


@dataclass
class _Usage:
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    rejections: Tally[str] = field(default_factory=Tally)


class UsageLedger:
    """Counts per tenant in this router replica; mirrors each count to `metrics` if given."""

    def __init__(self, metrics: UsageMetrics | None = None) -> None:
        self.metrics = metrics
        self._usage: dict[str, _Usage] = {}

    def _of(self, tenant: str) -> _Usage:
        return self._usage.setdefault(tenant, _Usage())

    def record_request(self, tenant: str) -> None:
        """One request admitted (passed authentication and quotas)."""
        self._of(tenant).requests += 1
        if self.metrics:
            self.metrics.requests.labels(tenant=tenant).inc()

    def record_tokens(self, tenant: str, *, prompt_tokens: int, generated_tokens: int) -> None:
        """Tokens a finished (or aborted) request actually used."""
        usage = self._of(tenant)
        usage.prompt_tokens += prompt_tokens
        usage.generated_tokens += generated_tokens
        if self.metrics:
            self.metrics.prompt_tokens.labels(tenant=tenant).inc(prompt_tokens)
            self.metrics.generation_tokens.labels(tenant=tenant).inc(generated_tokens)

    def record_rejection(self, tenant: str, reason: str) -> None:
        """One refused request and why (e.g. "rpm", "queue_full", "invalid_api_key")."""
        self._of(tenant).rejections[reason] += 1
        if self.metrics:
            self.metrics.rejections.labels(tenant=tenant, reason=reason).inc()

    def record_queue_time(self, pool: str, tenant: str, seconds: float) -> None:
        """A request waited `seconds` in `pool`'s gate, then got its slot (metrics only)."""
        if self.metrics:
            self.metrics.queue_time.labels(pool=pool, tenant=tenant).observe(seconds)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """`{tenant: {"requests", "prompt_tokens", "generated_tokens", "rejections": {...}}}`,
        rejections by reason; a copy."""
        return {
            name: {
                "requests": u.requests,
                "prompt_tokens": u.prompt_tokens,
                "generated_tokens": u.generated_tokens,
                "rejections": dict(u.rejections),
            }
            for name, u in self._usage.items()
        }
