"""Prefix-cache isolation: the `cache_salt` every request carries to the engines.

vLLM mixes `cache_salt` into the hash of a prompt's first KV block, so two requests share cached
blocks only when their salts are equal. The router derives the salt from the *authenticated*
tenant, so a tenant can never reuse (or time-probe) another tenant's cached prefixes. A client
may still send its own `cache_salt` to split its own cache further (e.g. per end user); it is
namespaced under the tenant, so equal client salts of two tenants still give different salts.

    salt = sha256("splitserve-cache-salt/v1" | len-prefixed tenant | len-prefixed client salt)

Invariants: deterministic (a tenant's salt is stable across requests, replicas and restarts,
so its own prefixes keep hitting); fields are length-prefixed, so no tenant/client-salt pair can
be crafted to equal another; no client salt (None) and an empty one are distinct.
"""

from __future__ import annotations

import hashlib

from splitserve.router.tenancy.tenants import Tenant

DOMAIN = b"splitserve-cache-salt/v1"  # versioned: changing the derivation must change salts
_NO_CLIENT_SALT = b"\x00"  # marks "none sent", which no length-prefixed string can equal


def _field(value: str) -> bytes:
    # surrogatepass: any string a JSON body can carry (a lone surrogate too) has bytes
    raw = value.encode("utf-8", "surrogatepass")
    return b"\x01" + len(raw).to_bytes(8, "big") + raw


def cache_salt_for(tenant: Tenant | str, client_salt: str | None) -> str:
    """The engine-side cache salt (64 hex chars) for a request of `tenant`."""
    name = tenant if isinstance(tenant, str) else tenant.name
    h = hashlib.sha256(DOMAIN)
    h.update(_field(name))
    h.update(_NO_CLIENT_SALT if client_salt is None else _field(client_salt))
    return h.hexdigest()
