"""Admin authentication: the `Authorization` header of an admin endpoint (`GET /v1/usage`).

Admin keys are made and stored like tenant keys (`python -m splitserve.router.tenancy` prints a
key and its hash; only the hash goes into `tenancy.admin_key_hashes`) and checked by the same
constant-time `KeyRing`. They are a ring of their own: an admin key is no tenant's key, so it
cannot run generations, and a tenant key cannot read other tenants' usage.

With no admin key configured, admin endpoints answer 404 `admin_disabled`: they do not exist in
that deployment, and the message says how to switch them on. Pure; never blocks, never does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from splitserve.config import SplitserveConfig
from splitserve.router.errors import APIError
from splitserve.router.tenancy.auth import bearer_token
from splitserve.router.tenancy.errors import invalid_api_key, missing_api_key
from splitserve.router.tenancy.keys import KeyHash, KeyRing

ADMIN = "admin"  # the owner name of admin hashes in their `KeyRing` (never a tenant's name)


def admin_disabled() -> APIError:
    """404: the deployment has no admin key, so its admin endpoints are off."""
    return APIError(
        404,
        "Admin endpoints are off: no admin key is configured. Add the hash of one "
        "(`python -m splitserve.router.tenancy`) to `tenancy.admin_key_hashes`.",
        code="admin_disabled",
    )


class AdminAuth:
    """Checks admin keys; immutable after construction."""

    def __init__(self, stored_hashes: Iterable[str]) -> None:
        self._ring = KeyRing(KeyHash.parse(stored, ADMIN) for stored in stored_hashes)

    @classmethod
    def from_config(cls, cfg: SplitserveConfig) -> AdminAuth:
        """The admin keys of `cfg.tenancy.admin_key_hashes`."""
        return cls(cfg.tenancy.admin_key_hashes)

    @property
    def enabled(self) -> bool:
        """Whether any admin key is configured."""
        return len(self._ring) > 0

    def check(self, authorization: str | None) -> None:
        """Return when the header carries an admin key.

        Raises `APIError`: 404 `admin_disabled` (no admin key configured), 401 `missing_api_key`
        or `invalid_api_key` (code `invalid_api_key`, as for tenants; the key is never echoed).
        """
        if not self.enabled:
            raise admin_disabled()
        token = bearer_token(authorization)
        if token is None:
            raise missing_api_key()
        if not token or self._ring.lookup(token) is None:
            raise invalid_api_key()
