"""The KV tier's configuration: `kv_tier` validated, mapped to each engine's spec, turned into
vLLM's OffloadingConnector config (kv_transfer/tier.py), composed with NIXL through vLLM's
MultiConnector, and the tier's hits counted from vLLM's connector prefix-cache stats."""

from __future__ import annotations

import pytest
from splitserve.kv_transfer.nixl import nixl_transfer_config
from splitserve.kv_transfer.tier import GIB, engine_transfer_config, tier_transfer_config

from splitserve.config import ConfigError, parse_config
from splitserve.engine.args import engine_kwargs, engine_spec
from splitserve.engine.stats import LatestStats, connector_parts


def test_no_tier_by_default() -> None:
    cfg = parse_config({})
    assert cfg.kv_tier.medium == "none"
    spec = engine_spec(cfg, "decode", "cpu")
    assert (spec.kv_tier, spec.kv_cache_blocks) == ("none", None)
    assert tier_transfer_config(spec.kv_tier, spec.kv_tier_gib) is None
    assert "num_gpu_blocks_override" not in engine_kwargs(spec, "/m")


def test_cpu_tier_is_vllms_cpu_offloading_spec() -> None:
    cfg = parse_config({"kv_tier": {"medium": "cpu", "size_gib": 0.5},
                        "pools": {"decode": {"kv_cache_blocks": 40}}})
    spec = engine_spec(cfg, "decode", "cpu")
    assert engine_kwargs(spec, "/m")["num_gpu_blocks_override"] == 40
    tier = tier_transfer_config(spec.kv_tier, spec.kv_tier_gib, spec.kv_tier_path)
    assert tier == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": GIB // 2}}


def test_disk_tier_is_a_host_pool_in_front_of_vllms_fs_tier() -> None:
    cfg = parse_config({"kv_tier": {"medium": "disk", "size_gib": 1, "path": "/var/kv"}})
    spec = engine_spec(cfg, "prefill", "cpu")
    extra = tier_transfer_config(spec.kv_tier, spec.kv_tier_gib, spec.kv_tier_path,
                                 kv_events=True)["kv_connector_extra_config"]
    assert extra == {
        "cpu_bytes_to_use": GIB, "self_describing_kv_events": True,
        "spec_name": "TieringOffloadingSpec",
        "secondary_tiers": [{"type": "fs", "root_dir": "/var/kv", "enable_kv_events": True}],
    }


@pytest.mark.parametrize(("tier", "message"), [
    ({"medium": "cpu"}, "needs size_gib"),
    ({"medium": "disk", "size_gib": 1}, "needs an absolute path"),
    ({"medium": "disk", "size_gib": 1, "path": "kv"}, "needs an absolute path"),
    ({"medium": "cpu", "size_gib": 1, "path": "/kv"}, "path is for medium disk only"),
    ({"medium": "cpu", "size_gib": 0}, "greater than 0"),
    ({"medium": "nvme", "size_gib": 1}, "medium"),
])
def test_invalid_tiers_are_refused(tier, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"kv_tier": tier})


def test_alone_each_connector_is_the_engines_config() -> None:
    nixl = nixl_transfer_config("decode-1", "cpu", role="decode")
    tier = tier_transfer_config("cpu", 1.0)
    assert engine_transfer_config(None, None) is None
    assert engine_transfer_config(nixl, None) is nixl
    assert engine_transfer_config(None, tier) is tier


def test_with_nixl_a_multiconnector_loads_from_nixl_first() -> None:
    """NIXL first, the tier second; the handoff's role, engine id and failure policy on top,
    and a config vLLM's own MultiConnector splits into its children (each with the engine id)."""
    from types import SimpleNamespace

    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    nixl = nixl_transfer_config("prefill-1", "cpu", role="prefill")
    tier = tier_transfer_config("cpu", 1.0)
    got = engine_transfer_config(nixl, tier)
    assert got["kv_connector"] == "MultiConnector"
    no_id = {k: v for k, v in nixl.items() if k != "engine_id"}
    assert got["kv_connector_extra_config"]["connectors"] == [no_id, tier]
    assert (got["kv_role"], got["engine_id"], got["kv_load_failure_policy"]) == (
        "kv_producer", "prefill-1", "recompute")
    ktc = KVTransferConfig(**got)
    assert ktc.is_kv_producer and not ktc.is_kv_consumer
    children = MultiConnector._get_connector_classes_and_configs(
        SimpleNamespace(kv_transfer_config=ktc))
    assert [cls.__name__[:4] for cls, _ in children] == ["Nixl", "Offl"]
    assert [c.kv_transfer_config.engine_id for _, c in children] == ["prefill-1"] * 2
    assert children[0][1].kv_transfer_config.kv_role == "kv_producer"


def test_tier_hits_are_counted_by_source() -> None:
    """vLLM's connector prefix-cache stats of each step add up per source (host, disk from the
    tier; a NIXL handoff's as vLLM attributes it)."""
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.metrics.stats import PrefixCacheStats

    stats = LatestStats()
    for hits in ({CacheHitSource.HOST: 256}, {CacheHitSource.HOST: 128, CacheHitSource.DISK: 64},
                 {CacheHitSource.EXTERNAL_UNSPECIFIED: 512}):
        step = PrefixCacheStats()
        step.record(num_tokens=1000, num_hits=sum(hits.values()), preempted=False,
                    hits_by_source=hits)
        stats.add_loaded(step)
    stats.add_loaded(None)  # an engine without a connector
    snap = stats.snapshot(role="decode", replica="r", num_unfinished=0)
    assert snap.kv_loaded_tokens == {"host": 384, "disk": 64, "external_unspecified": 512}


def test_multiconnector_stats_reach_the_nixl_counters() -> None:
    """Under the MultiConnector the step's connector stats are per connector class; the NIXL
    part still feeds the transfer counters."""
    nixl = {"transfer_duration": [0.25, 0.5], "bytes_transferred": [100, 300]}
    offload = {"types": {"vllm:kv_offload_load_bytes": "counter"}, "data": {}}
    assert connector_parts({"NixlConnector": nixl, "OffloadingConnector": offload}) == [
        nixl, offload]
    assert connector_parts(nixl) == [nixl]
    assert connector_parts(offload) == [offload]  # the offloading connector alone
    stats = LatestStats()
    for part in connector_parts({"NixlConnector": nixl, "OffloadingConnector": offload}):
        stats.add_connector_stats(part)
    snap = stats.snapshot(role="decode", replica="r", num_unfinished=0)
    assert (snap.kv_transfers, snap.kv_bytes_received, snap.kv_transfer_seconds) == (2, 400, 0.75)
