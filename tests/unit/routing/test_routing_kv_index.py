"""The KV-event index: vLLM's events applied in order, media, eviction, replica removal, and
tenant scoping through the cache salt in vLLM's own block hashes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from splitserve.router.routing.kv_index import KVIndex
from splitserve.router.routing.policies import KVEventsAware, make_policy
from splitserve.router.routing.state import ReplicaState, RoutingRequest
from splitserve.router.routing.vllm_hash import PromptHasher, external_hash
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


def stored(hashes, medium="GPU", parent=None):
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent, token_ids=[],
                       block_size=4, lora_id=None, medium=medium, lora_name=None)


def removed(hashes, medium="GPU"):
    return BlockRemoved(block_hashes=list(hashes), medium=medium)


def test_events_in_order_store_then_remove() -> None:
    index = KVIndex()
    index.apply("r1", [stored([1, 2, 3]), stored([4], parent=3), removed([3])])
    index.apply("r2", [stored([1, 2])])
    assert index.matched_blocks([1, 2, 3, 4], ["r1", "r2", "r3"]) == {"r1": 2, "r2": 2, "r3": 0}
    index.apply("r1", [stored([3])])  # stored again: the chain is whole once more
    assert index.matched_blocks([1, 2, 3, 4], ["r1"]) == {"r1": 4}
    index.apply("r1", [removed([1]), stored([1])])  # order matters: last event wins
    assert index.matched_blocks([1], ["r1"]) == {"r1": 1}
    index.apply("r1", [stored([1]), removed([1])])
    assert index.matched_blocks([1], ["r1"]) == {"r1": 0}


def test_all_blocks_cleared_forgets_only_that_replica() -> None:
    index = KVIndex()
    index.apply("r1", [stored([1, 2])])
    index.apply("r2", [stored([1, 2])])
    index.apply("r1", [AllBlocksCleared()])
    assert index.matched_blocks([1, 2], ["r1", "r2"]) == {"r1": 0, "r2": 2}
    assert index.replicas() == ["r2"]


def test_removing_a_block_another_replica_holds_keeps_theirs() -> None:
    index = KVIndex()
    index.apply("r1", [stored([1])])
    index.apply("r2", [stored([1]), removed([1]), removed([7])])  # 7 was never stored: no-op
    assert index.matched_blocks([1], ["r1", "r2"]) == {"r1": 1, "r2": 0}
    assert len(index) == 1


def test_media_are_kept_per_block() -> None:
    """An offloading tier reports its own medium: a block evicted from the engine's memory but
    kept on the CPU tier is still held, and the index says where."""
    index = KVIndex()
    index.apply("r1", [stored([1, 2, 3]), stored([1, 2], medium="CPU"), removed([1, 2])])
    assert index.prefix_media([1, 2, 3], "r1") == [frozenset({"CPU"})] * 2 + [frozenset({"GPU"})]
    assert index.matched_blocks([1, 2, 3], ["r1"]) == {"r1": 3}  # any medium
    assert index.matched_blocks([1, 2, 3], ["r1"], media={"GPU"}) == {"r1": 0}
    assert index.matched_blocks([1, 2, 3], ["r1"], media={"CPU"}) == {"r1": 2}
    index.apply("r1", [removed([1], medium="CPU")])
    assert index.matched_blocks([1, 2, 3], ["r1"]) == {"r1": 0}


def test_lru_bound_evicts_least_recently_stored() -> None:
    index = KVIndex(max_blocks=3)
    index.apply("r1", [stored([1, 2, 3])])
    index.apply("r2", [stored([1])])  # stored again: 1 is the most recent now
    index.apply("r2", [stored([4])])  # evicts 2
    assert len(index) == 3
    assert index.matched_blocks([1, 2], ["r1"]) == {"r1": 1}
    assert index.blocks_of("r1") == 2  # 1 and 3
    index.resize(1)
    assert len(index) == 1 and index.matched_blocks([4], ["r2"]) == {"r2": 1}
    assert index.blocks_of("r1") == 0
    with pytest.raises(ValueError):
        index.resize(0)


def test_forget_replica_drops_its_blocks_and_no_one_elses() -> None:
    index = KVIndex()
    index.apply("r1", [stored([1, 2])])
    index.apply("r2", [stored([2, 3])])
    index.forget_replica("r1")
    index.forget_replica("never-seen")
    assert index.matched_blocks([1], ["r1"]) == {"r1": 0}
    assert index.matched_blocks([2, 3], ["r1", "r2"]) == {"r1": 0, "r2": 2}
    assert len(index) == 2 and index.replicas() == ["r2"]


def test_bytes_hashes_are_read_like_int_ones() -> None:
    """With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 the events carry the digest's bytes."""
    digest = bytes(range(32))
    index = KVIndex()
    index.apply("r1", [stored([digest])])
    assert index.matched_blocks([external_hash(digest)], ["r1"]) == {"r1": 1}


TOKENS = list(range(3, 3 + 40))


def test_tenants_never_share_a_block() -> None:
    """vLLM's hashes of the same tokens under two cache salts share no block, so one tenant's
    stored blocks never match another's prompt (and an unsalted prompt matches neither)."""
    hasher = PromptHasher(block_size=8)
    a, b, none = (hasher.hashes(TOKENS, s) for s in ("tenant-a", "tenant-b", None))
    assert len(a) == len(b) == len(none) == 5
    assert not set(a) & set(b) and not set(a) & set(none)
    index = KVIndex()
    index.apply("r1", [stored(a)])
    index.apply("r2", [stored(b)])
    assert index.matched_blocks(a, ["r1", "r2"]) == {"r1": 5, "r2": 0}
    assert index.matched_blocks(b, ["r1", "r2"]) == {"r1": 0, "r2": 5}
    assert index.matched_blocks(none, ["r1", "r2"]) == {"r1": 0, "r2": 0}


def test_prompt_hasher_matches_vllms_request_hasher() -> None:
    """The router's hashes are the engine's: vLLM's own request block hasher over the same
    tokens, salt and LoRA adapter, with NONE_HASH set up as the engine does."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    hasher = PromptHasher(block_size=8)
    for salt, lora in ((None, None), ("t1", None), ("t1", ("ad", "/adapters/ad"))):
        request = SimpleNamespace(
            block_hashes=[], num_tokens=len(TOKENS), all_token_ids=TOKENS, mm_features=[],
            cache_salt=salt, prompt_embeds=None,
            lora_request=None if lora is None else SimpleNamespace(
                lora_name=lora[0], lora_path=lora[1]),
        )
        expected = [external_hash(h) for h in get_request_block_hasher(8, fn)(request)]
        assert list(hasher.hashes(TOKENS, salt, lora)) == expected


def test_prompt_hasher_refuses_a_random_seed_algorithm() -> None:
    with pytest.raises(ValueError, match="random seed"):
        PromptHasher(block_size=16, algo="xxhash")


def test_kv_events_policy_ranks_by_reported_blocks_with_the_balance_guard() -> None:
    index = KVIndex()
    policy = make_policy("kv_events", index=index)
    assert isinstance(policy, KVEventsAware)
    index.apply("b", [stored([1, 2, 3])])
    request = RoutingRequest(block_hashes=(1, 2, 3, 4))
    idle = [ReplicaState("a"), ReplicaState("b")]
    assert policy.rank(request, idle) == ["b", "a"]
    policy.record("a", (1, 2, 3, 4))  # sending teaches nothing: the events will say
    assert policy.rank(request, idle) == ["b", "a"]
    busy = [ReplicaState("a", queue_depth=0), ReplicaState("b", queue_depth=20)]
    assert policy.rank(request, busy) == ["a", "b"]  # overloaded: its cache does not win
