"""The multi-turn comparison's pure parts: configuration overrides (and skipping the ones this
build cannot validate), pooling rounds, the TTFT ratio and the table."""

from __future__ import annotations

from splitserve.bench.multi_turn_compare import (
    CONFIGURATIONS,
    check_configurations,
    combine,
    configuration_overrides,
    format_comparison,
    ttft_ratio,
)
from splitserve.config import load_config


def test_overrides_route_the_given_pool():
    assert configuration_overrides("round_robin", "decode", 128, 1.0) == {
        "router.routing.decode": "round_robin"}
    assert configuration_overrides("prefix_aware", "prefill", 128, 1.0) == {
        "router.routing.prefill": "prefix_aware", "router.routing.block_size": 128}
    assert configuration_overrides("kv_events+tier", "decode", 128, 0.5) == {
        "router.routing.decode": "kv_events", "kv_tier.medium": "cpu", "kv_tier.size_gib": 0.5}


def test_configurations_that_validate_and_the_reason_for_the_others():
    base = load_config(None).with_overrides(mode="colocated")
    ok, skipped = check_configurations(base, list(CONFIGURATIONS), "decode", 128, 0.5)
    assert {"round_robin", "prefix_aware", "kv_events"} <= set(ok)
    assert ok["prefix_aware"].router.routing.decode == "prefix_aware"
    assert ok["prefix_aware"].router.routing.block_size == 128
    assert ok["round_robin"].router.routing.decode == "round_robin"
    assert set(ok) | set(skipped) == set(CONFIGURATIONS) and not set(ok) & set(skipped)
    assert not skipped
    tier = ok["kv_events+tier"]
    assert (tier.kv_tier.medium, tier.kv_tier.size_gib) == ("cpu", 0.5)
    assert tier.router.routing.decode == "kv_events"
    assert ok["kv_events"].kv_tier.medium == "none"


def test_a_configuration_the_base_refuses_is_skipped_with_the_configs_message():
    base = load_config(None).with_overrides(**{"router.routing.kv_events": False,
                                               "router.routing.decode": "round_robin",
                                               "router.routing.prefill": "round_robin"})
    ok, skipped = check_configurations(base, ["round_robin", "kv_events"], "decode", 128, 1.0)
    assert list(ok) == ["round_robin"]
    assert "router.routing.kv_events: true" in skipped["kv_events"]


def run(ttfts, follow, hits, queried, failed=0, loaded=None):
    return {"ttft_ms_all": ttfts, "ttft_ms_follow_up": follow, "failed": failed,
            "ttft_ms": {"mean": sum(ttfts) / len(ttfts)},
            "cache": {"hit_tokens": hits, "queried_tokens": queried,
                      "loaded_tokens": loaded or {}}}


def test_combine_pools_every_rounds_turns_and_counters():
    c = combine([run([100.0, 300.0], [300.0], 10, 100, loaded={"host": 20}),
                 run([200.0], [], 30, 100, failed=1, loaded={"host": 10, "disk": 10})])
    assert c["turns"] == 3 and c["failed"] == 1 and c["rounds"] == 2
    assert c["ttft_ms"]["mean"] == 200.0 and c["ttft_follow_up_ms"]["mean"] == 300.0
    assert c["hit_rate"] == 0.2 and c["loaded_rate"] == 0.2
    assert c["round_mean_ttft_ms"] == [200.0, 200.0]


def test_ratio_and_table():
    combined = {"round_robin": combine([run([300.0], [300.0], 0, 10)]),
                "kv_events+tier": combine([run([90.0], [90.0], 9, 10)])}
    assert ttft_ratio(combined, "kv_events+tier", "round_robin") == 0.3
    assert ttft_ratio(combined, "kv_events", "round_robin") is None
    table = format_comparison(combined, {"kv_events": "not built"})
    assert "mean TTFT kv_events+tier / round_robin: 0.300" in table
    assert "skipped kv_events: not built" in table


def test_cache_delta_counts_hits_and_tier_loads_per_replica():
    from types import SimpleNamespace as S

    from splitserve.bench.engine_counters import cache_delta

    def stats(q, h, loaded):
        return {"engine": S(prefix_cache_queries=q, prefix_cache_hits=h,
                            kv_loaded_tokens=loaded), "routing": None}

    before = {"a": stats(100, 10, {"host": 5}), "b": stats(0, 0, {})}
    after = {"a": stats(300, 60, {"host": 25}), "b": stats(100, 40, {"disk": 7})}
    d = cache_delta(before, after)
    assert (d["queried_tokens"], d["hit_tokens"], d["hit_rate"]) == (300, 90, 0.3)
    assert d["loaded_tokens"] == {"host": 20, "disk": 7}
    assert d["per_replica"]["a"]["loaded_tokens"] == {"host": 20}
