"""Authentication: the `Authorization` header in, a `Tenant` (or a 401/403 `TenancyError`) out.

Called once per request, before the body is parsed, so an unauthenticated client costs the
router one header check. Never blocks, never does I/O.

Open mode: with no tenants configured and `tenancy.open_mode` on (the default), every request is
served as `DEFAULT_TENANT` and any header is ignored (OpenAI clients always send some key). As
soon as one tenant is configured, open mode is off and every request needs a valid key. With no
tenants and open mode off, every request is refused (a locked deployment).
"""

from __future__ import annotations

from collections.abc import Mapping

from splitserve.router.tenancy.errors import invalid_api_key, missing_api_key, tenant_disabled
from splitserve.router.tenancy.keys import KeyHash, KeyRing
from splitserve.router.tenancy.tenants import DEFAULT_TENANT, Tenant

BEARER = "bearer"  # the scheme name is case-insensitive (RFC 9110 section 11.1)


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>`; None when there is none; "" for another scheme."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != BEARER:
        return ""
    return token.strip() or None


class Authenticator:
    """Maps an `Authorization` header to its tenant; immutable after construction."""

    def __init__(self, tenants: Mapping[str, Tenant], *, open_mode: bool = True) -> None:
        self._tenants = dict(tenants)
        self.open_mode = open_mode and not self._tenants
        self._ring = KeyRing(
            KeyHash.parse(stored, t.name)
            for t in self._tenants.values()
            for stored in t.api_key_hashes
        )

    @property
    def tenants(self) -> Mapping[str, Tenant]:
        """The configured tenants by name (empty in open mode)."""
        return dict(self._tenants)

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant whose key the header carries.

        Raises `TenancyError`: 401 `missing_api_key` (no header or no token), 401
        `invalid_api_key` (unknown key or another scheme), 403 `tenant_disabled`.
        """
        if self.open_mode:
            return DEFAULT_TENANT
        token = bearer_token(authorization)
        if token is None:
            raise missing_api_key()
        name = self._ring.lookup(token) if token else None
        if name is None:
            raise invalid_api_key()
        tenant = self._tenants[name]
        if not tenant.enabled:
            raise tenant_disabled(name)
        return tenant
