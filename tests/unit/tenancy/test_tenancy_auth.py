"""Authentication: 401 / 403 with OpenAI bodies, constant-time compare, open mode."""

from __future__ import annotations

import hmac
import json

import pytest

from splitserve.router.tenancy.auth import Authenticator, bearer_token
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.keys import hash_api_key
from splitserve.router.tenancy.tenants import DEFAULT_TENANT, Tenant

KEY_A, KEY_OFF = "sk-ss-alpha", "sk-ss-off"


def _auth(open_mode: bool = True) -> Authenticator:
    return Authenticator(
        {
            "acme": Tenant("acme", weight=2.0, api_key_hashes=(hash_api_key(KEY_A),)),
            "off": Tenant("off", enabled=False, api_key_hashes=(hash_api_key(KEY_OFF),)),
        },
        open_mode=open_mode,
    )


def _refused(auth: Authenticator, header: str | None) -> TenancyError:
    with pytest.raises(TenancyError) as exc:
        auth.authenticate(header)
    return exc.value


def test_valid_key_gives_its_tenant() -> None:
    tenant = _auth().authenticate(f"Bearer {KEY_A}")
    assert tenant.name == "acme" and tenant.weight == 2.0


def test_scheme_is_case_insensitive_and_spaces_trimmed() -> None:
    assert _auth().authenticate(f"  bearer   {KEY_A} ").name == "acme"


@pytest.mark.parametrize("header", [None, "", "   ", "Bearer", "Bearer   "])
def test_missing_key_is_401(header: str | None) -> None:
    err = _refused(_auth(), header)
    assert (err.status, err.type, err.code, err.reason) == (
        401, "invalid_request_error", "invalid_api_key", "missing_api_key",
    )
    assert err.headers == {"WWW-Authenticate": "Bearer"}


@pytest.mark.parametrize("header", ["Bearer sk-ss-wrong", f"Basic {KEY_A}", f"Bearer {KEY_A}x"])
def test_wrong_key_is_401_without_echo(header: str) -> None:
    err = _refused(_auth(), header)
    assert (err.status, err.code, err.reason) == (401, "invalid_api_key", "invalid_api_key")
    assert "sk-ss" not in err.message


def test_401_body_is_openai_shaped() -> None:
    response = _refused(_auth(), "Bearer nope").response()
    assert response.status_code == 401
    body = json.loads(response.body)
    assert body == {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def test_disabled_tenant_is_403() -> None:
    err = _refused(_auth(), f"Bearer {KEY_OFF}")
    assert (err.status, err.code, err.reason, err.tenant) == (
        403, "tenant_disabled", "tenant_disabled", "off",
    )


def test_compare_digest_is_what_decides(monkeypatch) -> None:
    calls = 0
    real = hmac.compare_digest

    def spy(a, b):
        nonlocal calls
        calls += 1
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    auth = _auth()
    auth.authenticate(f"Bearer {KEY_A}")
    assert calls == 2  # both stored hashes compared, match or not


def test_open_mode_without_tenants_ignores_header() -> None:
    auth = Authenticator({}, open_mode=True)
    assert auth.open_mode
    assert auth.authenticate(None) is DEFAULT_TENANT
    assert auth.authenticate("Bearer unused") is DEFAULT_TENANT


def test_open_mode_is_off_once_tenants_exist() -> None:
    auth = _auth(open_mode=True)
    assert not auth.open_mode
    assert _refused(auth, None).status == 401


def test_no_tenants_and_open_mode_off_refuses_everyone() -> None:
    auth = Authenticator({}, open_mode=False)
    assert _refused(auth, "Bearer anything").status == 401


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Token abc") == ""
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None
