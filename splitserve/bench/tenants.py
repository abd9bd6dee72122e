"""Tenants for benchmarks of a multi-tenant deployment: fresh API keys and their config section.

Each tenant gets its own key; the router derives the tenant's cache salt from its name, so two
tenants never share cached blocks even when they send the same prompt.
"""

from __future__ import annotations

from typing import Any

from splitserve.router.tenancy import generate_api_key, hash_api_key

HIGH_QUOTAS = {  # never reached: the quota code runs, nothing is refused
    "requests_per_minute": 10**7,
    "tokens_per_minute": 10**10,
    "max_concurrent_requests": 10**5,
    "max_tokens_per_request": 10**5,
}


def tenant_keys(n: int) -> dict[str, str]:
    """A fresh API key per tenant, by tenant name (`tenant-0` ...)."""
    return {f"tenant-{i}": generate_api_key() for i in range(n)}


def tenants_config(keys: dict[str, str]) -> list[dict[str, Any]]:
    """The `tenants` config section for these keys, with quotas that never refuse."""
    return [
        {"name": name, "api_key_hashes": [hash_api_key(key)], "quotas": HIGH_QUOTAS}
        for name, key in keys.items()
    ]
