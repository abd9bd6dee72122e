"""PolicyRequestRouter's prefix index bound: from the config's request-router kwargs and the
replicas' reported KV capacity (`router/replica_router.py`, `routing/index_size.py`). No Ray:
the router is built without Serve's constructor and given fake running replicas."""

from __future__ import annotations

import asyncio
from collections import namedtuple
from types import SimpleNamespace

from router_fakes import policy_router

from splitserve.router.routing.index_size import UNKNOWN_CAPACITY_MAX_BLOCKS

CPU_KV_TOKENS = 524_288
ReplicaId = namedtuple("ReplicaId", "unique_id")  # hashable, like Serve's ReplicaID


def _router(routing: dict, replicas: int = 2, autoscaling: dict | None = None):
    return policy_router({"mode": "colocated", "pools": {"decode": {"replicas": replicas}},
                          "router": {"routing": routing}, "autoscaling": autoscaling})


def _replica(rid: str, kv_tokens: int | None):
    stats = {} if kv_tokens is None else {"kv_capacity_tokens": kv_tokens, "num_unfinished": 0}
    return SimpleNamespace(replica_id=ReplicaId(rid), routing_stats=stats)


def _set_replicas(router, *replicas) -> None:
    router._replicas = {r.replica_id.unique_id: r for r in replicas}


def test_auto_bound_follows_the_reported_capacity() -> None:
    router = _router({"decode": "prefix_aware"})
    index = router._policy.index
    assert index.max_blocks == UNKNOWN_CAPACITY_MAX_BLOCKS
    _set_replicas(router, _replica("a", None), _replica("b", None))
    asyncio.run(router.choose_replicas(list(router._replicas.values())))
    assert index.max_blocks == UNKNOWN_CAPACITY_MAX_BLOCKS  # nobody reported yet
    _set_replicas(router, _replica("a", CPU_KV_TOKENS), _replica("b", None))
    asyncio.run(router.choose_replicas(list(router._replicas.values())))
    assert index.max_blocks == 2 * 2 * CPU_KV_TOKENS // 16  # 2 replicas x slack 2


def test_the_pools_max_replicas_caps_the_bound() -> None:
    router = _router({"decode": "prefix_aware"}, replicas=1)
    _set_replicas(router, *(_replica(f"r{i}", CPU_KV_TOKENS) for i in range(3)))
    router._fit_index()
    assert router._policy.index.max_blocks == 2 * CPU_KV_TOKENS // 16  # max_replicas = 1


def test_autoscaling_max_replicas_caps_the_bound() -> None:
    router = _router({"decode": "prefix_aware"}, autoscaling={"max_replicas": 2})
    _set_replicas(router, *(_replica(f"r{i}", CPU_KV_TOKENS) for i in range(3)))
    router._fit_index()
    assert router._policy.index.max_blocks == 2 * 2 * CPU_KV_TOKENS // 16


def test_an_explicit_bound_is_kept() -> None:
    router = _router({"decode": "prefix_aware", "index_max_blocks": 4096})
    _set_replicas(router, _replica("a", CPU_KV_TOKENS))
    router._fit_index()
    assert router._policy.index.max_blocks == 4096


def test_policies_without_an_index_ignore_capacity() -> None:
    router = _router({"decode": "least_loaded"})
    _set_replicas(router, _replica("a", CPU_KV_TOKENS))
    router._fit_index()  # nothing to resize, no error
    assert not hasattr(router._policy, "index")


def _publishing(monkeypatch, rid: str, *hash_batches):
    """A replica whose engine side is vLLM's own ZMQ publisher with these stored batches."""
    import time

    from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

    from splitserve.router.routing.kv_feed import EventSource

    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    pub = ZmqEventPublisher(0, endpoint="tcp://*:0", replay_endpoint="tcp://*:0", topic="kv")
    for hashes in hash_batches:
        pub.publish(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=16,
            lora_id=None, medium="GPU", lora_name=None)]))
    cfg = pub.get_publisher_config()
    source = EventSource(cfg.endpoint, cfg.replay_endpoint, 16)
    stats = {"kv_capacity_tokens": CPU_KV_TOKENS, "num_unfinished": 0,
             "kv_events": source.to_stats()}
    return pub, SimpleNamespace(replica_id=ReplicaId(rid), routing_stats=stats)


def test_kv_events_routes_to_the_replica_whose_engine_reports_the_prompt(monkeypatch) -> None:
    """The pool's feed follows the replicas' advertised publishers; the policy ranks by what
    they report; the request's hashes are the dispatcher's (`prompt_blocks`), in the engines'
    block size and hash, and the feed's index is sized in that block size."""
    import time

    from splitserve.engine.messages import GenerateRequest, PromptBlocks
    from splitserve.router.routing.vllm_hash import PromptHasher

    tokens = list(range(100, 164))  # 4 blocks of 16
    hashes = PromptHasher(16).hashes(tokens, "salt")
    pub_a, a = _publishing(monkeypatch, "a")
    pub_b, b = _publishing(monkeypatch, "b", hashes[:3])
    router = _router({"decode": "kv_events"})
    try:
        _set_replicas(router, a, b)
        req = GenerateRequest.completion("r1", tokens, 4)
        req = GenerateRequest(**{**req.__dict__, "cache_salt": "salt",
                                 "prompt_blocks": PromptBlocks(16, hashes)})
        pending = SimpleNamespace(args=[req])
        deadline = time.monotonic() + 30
        while router._policy.index.matched_blocks(hashes, ["b"])["b"] < 3:
            asyncio.run(router.choose_replicas([a, b], pending))  # syncs the feed
            assert time.monotonic() < deadline, "the feed never replayed b's events"
            time.sleep(0.05)
        ranked = asyncio.run(router.choose_replicas([a, b], SimpleNamespace(args=[req])))
        assert [r[0].replica_id.unique_id for r in ranked] == ["b", "a"]
        assert router._policy.index.index.max_blocks == 2 * 2 * CPU_KV_TOKENS // 16
        _set_replicas(router, a)  # b is gone: the feed forgets it
        asyncio.run(router.choose_replicas([a], pending))
        deadline = time.monotonic() + 30
        while router._policy.index.index.replicas():
            assert time.monotonic() < deadline, "b's blocks outlived it"
            time.sleep(0.05)
    finally:
        router._policy.index.close()
        pub_a.shutdown()
        pub_b.shutdown()


def _routed(router, replica: str, request_id: str, prompt: int, max_tokens: int) -> None:
    from splitserve.engine.messages import GenerateRequest

    req = GenerateRequest.completion(request_id, list(range(prompt)), max_tokens)
    pending = SimpleNamespace(args=[req],
                              metadata=SimpleNamespace(internal_request_id=request_id))
    router.on_request_routed(pending, ReplicaId(replica), None)


def test_routed_requests_load_their_replica_until_serve_reports_them_completed() -> None:
    """The prefix policies' load term is counted as Serve routes and completes requests (no
    stale engine stats): a new prompt, cached nowhere, goes to the replica with fewer active
    blocks, even when the busy one's reported KV usage is still 0."""
    router = _router({"decode": "prefix_aware"})
    a, b = _replica("a", CPU_KV_TOKENS), _replica("b", CPU_KV_TOKENS)
    _set_replicas(router, a, b)
    _routed(router, "a", "r1", prompt=128, max_tokens=28)  # 8 prompt blocks of 16
    assert router._state(a).active_blocks == 8 and router._state(b).active_blocks == 0
    ranked = asyncio.run(router.choose_replicas([a, b]))
    assert [r[0].replica_id.unique_id for r in ranked] == ["b", "a"]
    router.on_request_completed(ReplicaId("a"), "r1")
    assert router._state(a).active_blocks == 0
    _routed(router, "b", "r2", prompt=16, max_tokens=0)
    router._replica_id_set, router._queue_len_gauge_last_update = set(), {}  # Serve's own
    router.on_replica_actor_died(ReplicaId("b"))
    assert router._state(b).active_blocks == 0
