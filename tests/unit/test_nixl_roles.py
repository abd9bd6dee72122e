"""NIXL `kv_role` per pool: kv_producer for prefill engines, kv_consumer for decode engines
(vLLM 0.32 deprecates kv_both). Checked against vLLM's own KVTransferConfig; no engine starts."""

from __future__ import annotations

import pytest
from vllm.config import KVTransferConfig

from splitserve.kv_transfer.nixl import KV_ROLES, kv_role, nixl_transfer_config


@pytest.mark.parametrize(("pool", "role", "producer", "consumer"), [
    ("prefill", "kv_producer", True, False),
    ("decode", "kv_consumer", False, True),
])
def test_each_pool_gets_its_role(pool, role, producer, consumer) -> None:
    kwargs = nixl_transfer_config(f"{pool}-0", "cuda", 12, role=pool)
    assert kwargs["kv_role"] == role
    cfg = KVTransferConfig(**kwargs)  # vLLM validates the role here
    assert (cfg.is_kv_producer, cfg.is_kv_consumer) == (producer, consumer)
    assert cfg.kv_connector == "NixlConnector" and cfg.engine_id == f"{pool}-0"
    assert cfg.kv_connector_extra_config == {"kv_lease_duration": 12}
    assert cfg.kv_load_failure_policy == "recompute"


def test_no_pool_keeps_kv_both() -> None:
    # A caller that does not say which pool its engine serves keeps the old (deprecated) role.
    assert nixl_transfer_config("e", "cpu")["kv_role"] == "kv_both"
    assert kv_role(None) == "kv_both"


def test_unknown_pool_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown pool"):
        kv_role("router")


def test_roles_cover_the_two_pools_and_kv_both_is_not_used() -> None:
    assert KV_ROLES == {"prefill": "kv_producer", "decode": "kv_consumer"}
    assert "kv_both" not in KV_ROLES.values()
