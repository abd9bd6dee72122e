"""Admin keys: a ring of their own, constant-time like tenant keys; 404 when none is set."""

from __future__ import annotations

import pytest

from splitserve.config import ConfigError, parse_config
from splitserve.router.errors import APIError
from splitserve.router.tenancy.admin import AdminAuth
from splitserve.router.tenancy.keys import hash_api_key

ADMIN_KEY, TENANT_KEY = "sk-ss-admin-key", "sk-ss-tenant-key"


def _auth() -> AdminAuth:
    cfg = parse_config(
        {
            "tenants": [{"name": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)]}],
            "tenancy": {"admin_key_hashes": [hash_api_key(ADMIN_KEY)]},
        }
    )
    return AdminAuth.from_config(cfg)


def _refusal(auth: AdminAuth, header: str | None) -> APIError:
    with pytest.raises(APIError) as exc:
        auth.check(header)
    return exc.value


def test_the_admin_key_passes() -> None:
    auth = _auth()
    assert auth.enabled
    auth.check(f"Bearer {ADMIN_KEY}")
    auth.check(f"bearer   {ADMIN_KEY}  ")


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "didn't provide an API key"),
        ("Bearer ", "didn't provide an API key"),
        ("Bearer sk-ss-wrong", "Incorrect API key"),
        (f"Bearer {TENANT_KEY}", "Incorrect API key"),  # a tenant key is not an admin key
        (f"Basic {ADMIN_KEY}", "Incorrect API key"),
    ],
)
def test_no_or_wrong_admin_key_is_401(header: str | None, reason: str) -> None:
    err = _refusal(_auth(), header)
    assert err.status == 401
    assert err.code == "invalid_api_key"
    assert reason in err.message
    assert ADMIN_KEY not in err.message and "wrong" not in err.message
    assert err.headers["WWW-Authenticate"] == "Bearer"


def test_no_admin_key_configured_is_404() -> None:
    auth = AdminAuth.from_config(parse_config({}))
    assert not auth.enabled
    err = _refusal(auth, f"Bearer {ADMIN_KEY}")
    assert err.status == 404
    assert err.code == "admin_disabled"
    assert "tenancy.admin_key_hashes" in err.message


def test_a_plain_key_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"tenancy": {"admin_key_hashes": [ADMIN_KEY]}})
    assert "admin_key_hashes" in str(exc.value)
