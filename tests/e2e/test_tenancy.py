"""Multi-tenant API end to end with the real `openai` client: keys, quotas, cache isolation, and
the admin usage endpoint (`GET /v1/usage`).

One colocated deployment with eight tenants and an admin key. Quota windows are a minute, so recovery after the
window is covered by the unit tests with a fake clock (tests/unit/tenancy), not here.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from splitserve.router.tenancy import generate_api_key, hash_api_key
from tests.conftest import running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
KEYS = {
    name: generate_api_key()
    for name in ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
}
ADMIN_KEY = generate_api_key()
LONG_PROMPT = "Every tenant has a key, a quota, and a fair share of the machines. " * 40


@pytest.fixture(scope="module")
def deployment():
    tenants = [
        {"name": "alice", "api_key_hashes": [hash_api_key(KEYS["alice"])]},
        {"name": "bob", "api_key_hashes": [hash_api_key(KEYS["bob"])], "enabled": False},
        {
            "name": "carol",
            "api_key_hashes": [hash_api_key(KEYS["carol"])],
            "quotas": {"requests_per_minute": 2},
        },
        {
            "name": "dave",
            "api_key_hashes": [hash_api_key(KEYS["dave"])],
            "quotas": {"tokens_per_minute": 400},
        },
        {"name": "erin", "api_key_hashes": [hash_api_key(KEYS["erin"])]},
        # frank, grace and heidi are used only by the /v1/usage tests, so their counts are exact
        {"name": "frank", "api_key_hashes": [hash_api_key(KEYS["frank"])]},
        {"name": "grace", "api_key_hashes": [hash_api_key(KEYS["grace"])]},
        {
            "name": "heidi",
            "api_key_hashes": [hash_api_key(KEYS["heidi"])],
            "quotas": {"requests_per_minute": 1},
        },
    ]
    cfg = test_config(
        mode="colocated",
        tenants=tenants,
        **{"tenancy.admin_key_hashes": [hash_api_key(ADMIN_KEY)]},
    )
    with running_deployment(cfg) as base:
        yield base


def _client(base: str, tenant: str | None, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/v1", api_key=key or (KEYS[tenant] if tenant else "none"), max_retries=0
    )


def _chat(client: openai.OpenAI, content: str = "hi", max_tokens: int = 4):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens
    )


def test_valid_key_is_served(deployment):
    assert _chat(_client(deployment, "alice")).usage.completion_tokens == 4


def test_missing_and_wrong_keys_are_401(deployment):
    r = httpx.post(f"{deployment}/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError) as exc:
        _chat(_client(deployment, None, key="sk-ss-not-a-real-key"))
    assert exc.value.status_code == 401
    assert exc.value.response.json()["error"]["type"] == "invalid_request_error"


def test_disabled_tenant_is_403(deployment):
    with pytest.raises(openai.PermissionDeniedError) as exc:
        _chat(_client(deployment, "bob"))
    assert exc.value.status_code == 403


def test_requests_per_minute_is_429_with_retry_after(deployment):
    carol = _client(deployment, "carol")
    _chat(carol)
    _chat(carol)
    with pytest.raises(openai.RateLimitError) as exc:
        _chat(carol)
    retry_after = int(exc.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert exc.value.response.json()["error"]["param"] is None
    # another tenant is unaffected by carol's limit
    assert _chat(_client(deployment, "alice")).usage.completion_tokens == 4


def test_tokens_per_minute_is_429_with_retry_after(deployment):
    dave = _client(deployment, "dave")
    first = _chat(dave, "tokens " * 40, max_tokens=100)  # reserves prompt + 100 of 400
    assert first.usage.total_tokens <= 400
    with pytest.raises(openai.RateLimitError) as exc:
        for _ in range(5):
            _chat(dave, "tokens " * 40, max_tokens=100)
    assert int(exc.value.response.headers["retry-after"]) >= 1


def test_prefix_cache_is_isolated_between_tenants(deployment):
    """alice's cached prefix is invisible to erin; a repeat within alice hits it."""
    alice = _client(deployment, "alice")

    def cached(client) -> int:
        r = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1)
        details = r.usage.prompt_tokens_details
        return details.cached_tokens if details else 0

    assert cached(alice) == 0
    assert cached(alice) > 0  # same tenant: the prefix is reused
    assert cached(_client(deployment, "erin")) == 0  # another tenant: no hit on alice's blocks


def test_client_salt_cannot_reach_another_tenant(deployment):
    """A client-chosen cache_salt is namespaced under its tenant."""

    def cached(tenant: str) -> int:
        r = _client(deployment, tenant).completions.create(
            model=MODEL,
            prompt=LONG_PROMPT + " salted",
            max_tokens=1,
            extra_body={"cache_salt": "shared-salt"},
        )
        details = r.usage.prompt_tokens_details
        return details.cached_tokens if details else 0

    assert cached("alice") == 0
    assert cached("erin") == 0  # same client salt, different tenant: no hit
    assert cached("erin") > 0  # ...while erin's own repeat hits


def test_usage_counters_per_tenant(deployment):
    text = httpx.get(f"{deployment}/metrics").text
    assert 'splitserve_tenant_requests_total{tenant="alice"}' in text
    assert 'reason="rpm"' in text


def _usage(base: str, key: str | None = ADMIN_KEY, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/v1/usage", headers=headers, params=params, timeout=30)


def test_usage_endpoint_needs_the_admin_key(deployment):
    for key in (None, "sk-ss-not-the-admin-key", KEYS["alice"]):  # a tenant key is not enough
        r = _usage(deployment, key)
        assert r.status_code == 401, key
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert _usage(deployment).status_code == 200


def test_usage_endpoint_counts_what_the_api_returned(deployment):
    frank, grace = _client(deployment, "frank"), _client(deployment, "grace")
    answers = [_chat(frank, "one", max_tokens=3), _chat(frank, "two words", max_tokens=5)]
    stream = frank.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "three"}], max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    )
    answers.append([c for c in stream if c.usage is not None][-1])
    answers.append(grace.completions.create(model=MODEL, prompt="grace", max_tokens=6))
    r = _usage(deployment)
    assert r.status_code == 200
    report = r.json()
    assert report["object"] == "usage"
    assert report["scope"] == "cluster" and report["replicas"] == 1  # through the usage board
    for name, mine in (("frank", answers[:3]), ("grace", answers[3:])):
        entry = report["tenants"][name]
        assert entry["requests"] == len(mine)
        assert entry["prompt_tokens"] == sum(a.usage.prompt_tokens for a in mine)
        assert entry["completion_tokens"] == sum(a.usage.completion_tokens for a in mine)
        assert entry["total_tokens"] == sum(a.usage.total_tokens for a in mine)
        assert entry["rejections"] == {}
        assert entry["quota"]["in_flight"] == 0
    assert report["tenants"]["frank"]["completion_tokens"] == 3 + 5 + 4
    only = _usage(deployment, tenant="grace").json()
    assert list(only["tenants"]) == ["grace"]
    assert only["tenants"]["grace"] == report["tenants"]["grace"]
    missing = _usage(deployment, tenant="nobody")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "tenant_not_found"


def test_usage_endpoint_counts_a_429_under_its_reason(deployment):
    heidi = _client(deployment, "heidi")
    served = _chat(heidi)
    with pytest.raises(openai.RateLimitError):
        _chat(heidi)
    entry = _usage(deployment, tenant="heidi").json()["tenants"]["heidi"]
    assert entry["requests"] == 1
    assert entry["completion_tokens"] == served.usage.completion_tokens
    assert entry["rejections"] == {"rpm": 1}
    assert entry["quota"]["requests_per_minute"] == 1
    assert entry["quota"]["requests_available"] < 1  # the minute's one request is spent
    # refusals before a tenant is known are counted under "-"
    httpx.post(f"{deployment}/v1/completions", json={"model": MODEL, "prompt": "x"})
    anonymous = _usage(deployment, tenant="-").json()["tenants"]["-"]
    assert anonymous["rejections"]["missing_api_key"] >= 1
    assert anonymous["quota"] is None
