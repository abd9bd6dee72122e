"""Tenants from the config and from a tenants file (a Secret mount)."""

from __future__ import annotations

import pytest

from splitserve.config import ConfigError, parse_config
from splitserve.router.tenancy.keys import hash_api_key
from splitserve.router.tenancy.tenants import (
    QuotaLimits,
    Tenant,
    load_tenants_file,
    tenants_from_config,
)

HASH = hash_api_key("sk-ss-x", salt="deploy-salt")


def test_config_tenant_becomes_frozen_tenant() -> None:
    cfg = parse_config(
        {
            "tenants": [
                {
                    "name": "acme",
                    "weight": 2,
                    "priority": 1,
                    "api_key_hashes": [HASH],
                    "quotas": {"requests_per_minute": 60, "max_concurrent_requests": 4},
                }
            ]
        }
    )
    assert tenants_from_config(cfg) == {
        "acme": Tenant(
            name="acme",
            weight=2.0,
            priority=1,
            enabled=True,
            quotas=QuotaLimits(requests_per_minute=60, max_concurrent_requests=4),
            api_key_hashes=(HASH,),
        )
    }


@pytest.mark.parametrize("wrapped", [False, True])
def test_tenants_file_is_merged(tmp_path, wrapped: bool) -> None:
    entry = f"- name: filed\n  api_key_hashes: ['{HASH}']\n  enabled: false\n"
    text = f"tenants:\n{entry}" if wrapped else entry
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    cfg = parse_config({"tenants": [{"name": "inline"}], "tenancy": {"tenants_file": str(path)}})
    tenants = tenants_from_config(cfg)
    assert list(tenants) == ["inline", "filed"]
    assert tenants["filed"].enabled is False and tenants["filed"].api_key_hashes == (HASH,)


def test_name_in_both_sources_is_an_error(tmp_path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("- name: a\n")
    cfg = parse_config({"tenants": [{"name": "a"}], "tenancy": {"tenants_file": str(path)}})
    with pytest.raises(ConfigError, match="'a' is defined twice"):
        tenants_from_config(cfg)


def test_bad_file_entry_names_location_but_not_the_value(tmp_path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("- name: a\n  api_key_hashes: ['sk-ss-pasted-by-mistake']\n")
    with pytest.raises(ConfigError) as exc:
        load_tenants_file(path)
    assert "0.api_key_hashes.0" in str(exc.value)
    assert "pasted-by-mistake" not in str(exc.value)


def test_missing_or_empty_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read tenants file"):
        load_tenants_file(tmp_path / "absent.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_tenants_file(empty) == ()


@pytest.mark.parametrize("name", ["-", "  "])
def test_reserved_or_blank_names_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="empty or reserved"):
        tenants_from_config(parse_config({"tenants": [{"name": name}]}))
