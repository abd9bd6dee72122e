"""API keys: generation, salted hashes, constant-time lookup over the whole ring."""

from __future__ import annotations

import hmac
import re

import pytest

from splitserve.config import API_KEY_HASH_PATTERN
from splitserve.router.tenancy import keys as keys_mod
from splitserve.router.tenancy.keys import KeyHash, KeyRing, generate_api_key, hash_api_key


def test_generated_keys_are_random_and_prefixed() -> None:
    a, b = generate_api_key(), generate_api_key()
    assert a != b
    assert a.startswith("sk-ss-") and len(a) == len("sk-ss-") + 43


def test_hash_format_matches_config_pattern() -> None:
    stored = hash_api_key("sk-ss-secret")
    assert re.match(API_KEY_HASH_PATTERN, stored)
    scheme, salt, digest = stored.split("$")
    assert (scheme, len(salt), len(digest)) == ("sha256", 32, 64)
    assert "sk-ss-secret" not in stored


def test_per_key_salt_makes_equal_keys_hash_differently() -> None:
    assert hash_api_key("k") != hash_api_key("k")


def test_fixed_salt_is_stable_and_salt_matters() -> None:
    one = hash_api_key("k", salt="deploy-salt")
    assert one == hash_api_key("k", salt="deploy-salt")
    assert one != hash_api_key("k", salt="other-salt")
    assert one.startswith("sha256$deploy-salt$")


@pytest.mark.parametrize("salt", ["short", "has space!", "x" * 129])
def test_bad_salt_refused(salt: str) -> None:
    with pytest.raises(ValueError, match="salt"):
        hash_api_key("k", salt=salt)


def test_empty_key_refused() -> None:
    with pytest.raises(ValueError):
        hash_api_key("")


def test_parse_refuses_plain_key_without_echoing_it() -> None:
    with pytest.raises(ValueError) as exc:
        KeyHash.parse("sk-ss-plaintext", "acme")
    assert "sk-ss-plaintext" not in str(exc.value)


def _ring() -> KeyRing:
    return KeyRing(
        [
            KeyHash.parse(hash_api_key("key-a"), "a"),
            KeyHash.parse(hash_api_key("key-b1"), "b"),
            KeyHash.parse(hash_api_key("key-b2", salt="shared-salt"), "b"),
        ]
    )


def test_lookup_finds_owner_or_none() -> None:
    ring = _ring()
    assert ring.lookup("key-a") == "a"
    assert ring.lookup("key-b1") == "b"
    assert ring.lookup("key-b2") == "b"
    assert ring.lookup("key-c") is None
    assert ring.lookup("key-a ") is None


@pytest.mark.parametrize("key", ["key-a", "key-b2", "nobody"])
def test_lookup_compares_every_hash_in_constant_time(monkeypatch, key: str) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(x, y):
        calls.append((x, y))
        return real(x, y)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    ring = _ring()
    ring.lookup(key)
    assert len(calls) == len(ring) == 3  # no early exit, whichever key matched


def test_one_hmac_per_distinct_salt(monkeypatch) -> None:
    count = 0
    real = keys_mod._digest

    def counting(salt, key):
        nonlocal count
        count += 1
        return real(salt, key)

    ring = KeyRing(
        KeyHash.parse(hash_api_key(f"k{i}", salt="deploy-salt"), f"t{i}") for i in range(50)
    )
    monkeypatch.setattr(keys_mod, "_digest", counting)
    assert ring.lookup("k7") == "t7"
    assert count == 1


def test_same_hash_for_two_tenants_refused() -> None:
    stored = hash_api_key("k")
    with pytest.raises(ValueError, match="share an API key hash"):
        KeyRing([KeyHash.parse(stored, "a"), KeyHash.parse(stored, "b")])
