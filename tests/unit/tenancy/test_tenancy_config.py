"""The config fields tenancy and routing added: defaults, validation, round trip."""

from __future__ import annotations

import pytest
import yaml

from splitserve.config import ConfigError, dump_config, load_config, parse_config
from splitserve.router.tenancy.keys import hash_api_key


def test_defaults_keep_the_old_behaviour() -> None:
    cfg = load_config(None)
    assert cfg.tenants == ()
    assert cfg.tenancy.open_mode is True and cfg.tenancy.tenants_file is None
    assert cfg.router.routing.block_size == 16
    routing = cfg.router.routing
    assert (routing.prefill, routing.decode) == ("kv_events", "kv_events")


def test_tenant_fields_parse() -> None:
    stored = hash_api_key("k")
    cfg = parse_config(
        {
            "tenants": [
                {
                    "name": "a",
                    "priority": 2,
                    "enabled": False,
                    "api_key_hashes": [stored],
                    "quotas": {"tokens_per_minute": 10, "max_tokens_per_request": 5},
                }
            ]
        }
    )
    t = cfg.tenants[0]
    assert (t.priority, t.enabled, t.api_key_hashes) == (2, False, (stored,))
    assert t.quotas.tokens_per_minute == 10 and t.quotas.requests_per_minute is None


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"tenants": [{"name": "a", "api_key_hashes": ["sk-x"]}]}, "tenants.0.api_key_hashes.0"),
        ({"tenants": [{"name": "a", "quotas": {"requests_per_minute": 0}}]}, "tenants.0.quotas"),
        ({"tenants": [{"name": "a", "quotas": {"rpm": 5}}]}, "tenants.0.quotas.rpm: unknown key"),
        ({"tenancy": {"queue_timeout_s": 0}}, "tenancy.queue_timeout_s"),
        ({"router": {"routing": {"prefill": "random"}}}, "router.routing.prefill"),
        ({"router": {"routing": {"balance_factor": 0.5}}}, "router.routing.balance_factor"),
    ],
)
def test_bad_values_named(doc: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(doc)


def test_dump_round_trips_with_new_sections() -> None:
    cfg = parse_config(
        {
            "tenants": [
                {
                    "name": "a",
                    "api_key_hashes": [hash_api_key("k")],
                    "quotas": {"requests_per_minute": 3},
                }
            ],
            "tenancy": {"max_queued": 8, "decode_max_in_flight": 4},
            "router": {"routing": {"decode": "least_loaded", "block_size": 32}},
        }
    )
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg
