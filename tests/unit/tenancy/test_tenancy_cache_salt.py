"""Cache salts: per tenant, stable, client salts namespaced so no two tenants collide."""

from __future__ import annotations

import re

from splitserve.router.tenancy.cache_salt import cache_salt_for
from splitserve.router.tenancy.tenants import Tenant


def test_same_client_salt_differs_across_tenants() -> None:
    assert cache_salt_for(Tenant("a"), "user-1") != cache_salt_for(Tenant("b"), "user-1")
    assert cache_salt_for(Tenant("a"), None) != cache_salt_for(Tenant("b"), None)


def test_stable_and_accepts_tenant_or_name() -> None:
    salt = cache_salt_for(Tenant("acme", weight=3.0), "u")
    assert salt == cache_salt_for("acme", "u") == cache_salt_for(Tenant("acme"), "u")
    assert re.fullmatch(r"[0-9a-f]{64}", salt)
    # pinned: a change of derivation must be deliberate (it empties every tenant's cache)
    assert cache_salt_for("acme", None) == (
        "8d557cca44b366451fc7aac506555350"
        "a93541b82b1f688ab7b8bd64f5f0327a"
    )


def test_client_salt_splits_a_tenant_cache() -> None:
    salts = {cache_salt_for("acme", s) for s in (None, "", "u1", "u2")}
    assert len(salts) == 4  # None and "" are distinct too


def test_boundary_cannot_be_shifted_between_tenant_and_client_salt() -> None:
    assert cache_salt_for("ab", "c") != cache_salt_for("a", "bc")
    assert cache_salt_for("a", "") != cache_salt_for("a\x00", None)


def test_client_cannot_pick_another_tenants_salt() -> None:
    victim = cache_salt_for("victim", None)
    attempts = [None, "", "victim", victim, "\x00victim"]
    assert victim not in {cache_salt_for("attacker", s) for s in attempts}
