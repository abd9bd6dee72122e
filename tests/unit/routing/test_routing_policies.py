"""Routing policies: round-robin, least-loaded, prefix-aware with balance guard and tenant scope."""

from __future__ import annotations

import pytest

from splitserve.config import RoutingConfig
from splitserve.router.routing.index_size import UNKNOWN_CAPACITY_MAX_BLOCKS
from splitserve.router.routing.policies import (
    LeastLoaded,
    PrefixAware,
    RoundRobin,
    choose_replica,
    make_policy,
    pool_policies,
)
from splitserve.router.routing.prefix_index import PrefixIndex
from splitserve.router.routing.state import ReplicaState, routing_request

PROMPT = list(range(1000, 1000 + 16 * 8))  # 8 full blocks
SALT_A, SALT_B = "salt-tenant-a", "salt-tenant-b"


def _replicas(
    *queues: int, kv: tuple[float, ...] = (), active: tuple[int, ...] = ()
) -> list[ReplicaState]:
    return [
        ReplicaState(
            f"r{i}",
            queue_depth=q,
            kv_usage=kv[i] if kv else 0.0,
            active_blocks=active[i] if active else 0,
        )
        for i, q in enumerate(queues)
    ]


def test_round_robin_cycles_in_id_order_whatever_the_input_order() -> None:
    rr, req = RoundRobin(), routing_request(PROMPT, SALT_A)
    replicas = _replicas(0, 0, 0)
    picks = [choose_replica(rr, req, replicas[::-1] if i % 2 else replicas) for i in range(6)]
    assert picks == ["r0", "r1", "r2", "r0", "r1", "r2"]
    assert rr.rank(req, replicas) == ["r0", "r1", "r2"]  # a full rotation, each once


def test_least_loaded_picks_shortest_queue_then_lowest_kv() -> None:
    ll, req = LeastLoaded(), routing_request(PROMPT, SALT_A)
    assert choose_replica(ll, req, _replicas(5, 2, 9)) == "r1"
    assert choose_replica(ll, req, _replicas(2, 2, 9, kv=(0.9, 0.3, 0.0))) == "r1"
    assert ll.rank(req, _replicas(3, 1, 2)) == ["r1", "r2", "r0"]


def test_prefix_aware_prefers_the_longest_cached_prefix() -> None:
    policy = PrefixAware(PrefixIndex())
    full = routing_request(PROMPT, SALT_A)
    half = routing_request(PROMPT[: 16 * 4], SALT_A)
    policy.record("r1", half.block_hashes)
    policy.record("r2", full.block_hashes)
    replicas = _replicas(3, 2, 4)  # r2 holds all 8 blocks despite the longest queue
    assert choose_replica(policy, full, replicas) == "r2"
    assert policy.rank(full, replicas) == ["r2", "r1", "r0"]
    assert policy.costs(full, replicas) == {"r0": 8, "r1": 4, "r2": 0}


def test_prefix_aware_without_a_hit_falls_back_to_load() -> None:
    policy = PrefixAware(PrefixIndex())
    req = routing_request(PROMPT, SALT_A)
    assert choose_replica(policy, req, _replicas(4, 1, 2)) == "r1"


def test_prefix_aware_skips_a_holder_overloaded_beyond_the_balance_factor() -> None:
    policy = PrefixAware(PrefixIndex(), balance_factor=2.0, balance_min_gap=8)
    req = routing_request(PROMPT, SALT_A)
    policy.record("r0", req.block_hashes)
    assert choose_replica(policy, req, _replicas(10, 4)) == "r0"  # 10 <= 2 x 4: still sticky
    assert choose_replica(policy, req, _replicas(12, 4)) == "r0"  # gap 8 is not above 8
    assert choose_replica(policy, req, _replicas(13, 4)) == "r1"  # 13 > 8 and gap 9 > 8
    assert policy.rank(req, _replicas(13, 4, 20)) == ["r1", "r0", "r2"]  # hot ones last, by load


def test_active_decode_blocks_outweigh_a_short_prefix() -> None:
    policy = PrefixAware(PrefixIndex(), overlap_weight=1.0)
    req = routing_request(PROMPT, SALT_A)
    policy.record("r0", req.block_hashes[:2])  # saves 2 blocks ...
    replicas = _replicas(1, 1, active=(10, 0))  # ... but holds 10 active blocks
    assert choose_replica(policy, req, replicas) == "r1"  # cost 6 + 10 vs 8 + 0


def test_same_tokens_under_another_tenant_salt_find_no_prefix() -> None:
    policy = PrefixAware(PrefixIndex())
    mine = routing_request(PROMPT, SALT_A)
    theirs = routing_request(PROMPT, SALT_B)
    assert set(mine.block_hashes).isdisjoint(theirs.block_hashes)
    policy.record("r0", mine.block_hashes)
    replicas = _replicas(3, 0)
    assert choose_replica(policy, mine, replicas) == "r0"
    assert choose_replica(policy, theirs, replicas) == "r1"  # no hit across tenants: by load
    assert policy.costs(theirs, replicas) == {"r0": 8, "r1": 8}


def test_forget_replica_drops_its_prefixes() -> None:
    policy = PrefixAware(PrefixIndex())
    req = routing_request(PROMPT, SALT_A)
    policy.record("r0", req.block_hashes)
    policy.forget_replica("r0")
    assert choose_replica(policy, req, _replicas(3, 0)) == "r1"


def test_choose_replica_needs_candidates() -> None:
    with pytest.raises(ValueError):
        choose_replica(LeastLoaded(), routing_request(PROMPT, SALT_A), [])


def test_make_policy_from_config() -> None:
    cfg = RoutingConfig(decode="least_loaded", index_max_blocks=7, balance_factor=3.0)
    policies = pool_policies(cfg, ["prefill", "decode"])
    assert isinstance(policies["prefill"], PrefixAware)
    assert policies["prefill"].index.max_blocks == 7 and policies["prefill"].balance_factor == 3.0
    assert isinstance(policies["decode"], LeastLoaded)
    assert isinstance(make_policy("round_robin"), RoundRobin)
    # auto: the bound for an unknown capacity until the engines report theirs
    assert make_policy("prefix_aware").index.max_blocks == UNKNOWN_CAPACITY_MAX_BLOCKS
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")


def test_prefix_aware_spreads_new_prefixes_over_idle_replicas():
    """No cache anywhere and equal load: successive requests do not all pick the same replica."""
    from splitserve.router.routing.policies import PrefixAware
    from splitserve.router.routing.state import ReplicaState, routing_request

    policy = PrefixAware()
    idle = [ReplicaState("a"), ReplicaState("b")]
    firsts = [policy.rank(routing_request([i] * 32, "salt"), idle)[0] for i in range(4)]
    assert set(firsts) == {"a", "b"}
