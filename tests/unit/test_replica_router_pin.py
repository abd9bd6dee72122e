"""Decode first in the pool's request router (`router/replica_router.py`): it offers the
dispatcher its view of the replicas (`room_view`), sends a pinned request to its replica while
that one is a candidate, and releases the request's reservation once it is routed. No Ray: the
router is built without Serve's constructor and given fake running replicas."""

from __future__ import annotations

import asyncio
from collections import namedtuple
from types import SimpleNamespace

from router_fakes import policy_router

from splitserve.router.routing.reservations import DecodeReservations

from splitserve.engine.messages import GenerateRequest, ReplicaPin, Sampling

ReplicaId = namedtuple("ReplicaId", "unique_id")  # hashable, like Serve's ReplicaID


def _router(policy: str = "least_loaded"):
    router = policy_router({"mode": "colocated", "pools": {"decode": {"replicas": 2}},
                            "router": {"routing": {"decode": policy}}})
    router._reservations = DecodeReservations("test")  # not the process-wide one
    router._reservations.attach(router)
    return router


def _replica(rid: str, usage: float = 0.0, running: int = 0):
    stats = {"kv_capacity_tokens": 10_000, "kv_cache_usage": usage, "num_unfinished": running}
    return SimpleNamespace(replica_id=ReplicaId(rid), routing_stats=stats,
                           max_ongoing_requests=8)


def _set(router, *replicas) -> list:
    router._replicas = {r.replica_id: r for r in replicas}
    return list(replicas)


def _req(pin: ReplicaPin | None = None) -> GenerateRequest:
    return GenerateRequest("r", tuple(range(100)), Sampling(max_tokens=4), pin_replica=pin)


def _choose(router, candidates, req):
    ranks = asyncio.run(router.choose_replicas(candidates, SimpleNamespace(args=(req,))))
    return [rank[0].replica_id.unique_id for rank in ranks]


def test_room_view_gives_the_ranking_slots_and_kv_figures():
    router = _router()
    _set(router, _replica("a", usage=0.5, running=3), _replica("b", usage=0.1, running=1))
    view = router.room_view(_req())
    assert view.ranking == ("b", "a")  # least loaded first
    room = {r.replica_id: r for r in view.rooms}["a"]
    assert (room.queue_depth, room.max_ongoing, room.kv_usage, room.kv_capacity_tokens) == (
        3, 8, 0.5, 10_000)
    _set(router)
    assert router.room_view(_req()) is None  # Serve gave no replica yet


def test_a_pinned_request_goes_to_its_replica_first():
    router = _router()
    candidates = _set(router, _replica("a", running=5), _replica("b"))
    assert _choose(router, candidates, _req()) == ["b", "a"]
    assert _choose(router, candidates, _req(ReplicaPin("a", "k"))) == ["a", "b"]


def test_a_pin_to_a_replica_gone_falls_back_to_the_ranking():
    router = _router()
    candidates = _set(router, _replica("a", running=5), _replica("b"))
    assert _choose(router, candidates, _req(ReplicaPin("gone", "k"))) == ["b", "a"]


def test_routing_releases_the_reservation():
    router = _router()
    _set(router, _replica("a"), _replica("b"))
    slots = router._reservations
    held = slots.reserve(_req(), asyncio.run(slots.view(_req())), output_tokens=4)
    assert slots.held() == {held.replica_id: (1, 104)}
    pending = SimpleNamespace(args=(_req(ReplicaPin(held.replica_id, held.key)),),
                              metadata=SimpleNamespace(internal_request_id="i-1"))
    router.on_request_routed(pending, ReplicaId(held.replica_id), None)
    assert slots.held() == {}


def test_room_view_counts_the_prefix_each_replica_holds():
    from splitserve.router.routing.vllm_hash import PromptHasher

    router = _router("kv_events")
    _set(router, _replica("a"), _replica("b"))
    feed = router._feed
    feed.hasher = PromptHasher(16)
    req = _req()  # 100 tokens: 6 full blocks
    feed.index.store("b", feed.prompt_hashes(req.prompt_token_ids, None)[:4])
    view = router.room_view(req)
    assert view.cached_tokens == {"a": 0, "b": 64}
    assert view.ranking[0] == "b"  # the policy prefers the replica holding the prefix


def test_room_view_counts_what_was_routed_since_the_replica_last_reported():
    """A replica's KV usage comes with its routing stats, seconds old: the prompts routed to it
    since (and not completed) count in its room at once."""
    from splitserve.router.replica_router import fresh_usage

    router = _router()
    a, b = _set(router, _replica("a", usage=0.1), _replica("b", usage=0.1))
    req = GenerateRequest("big", tuple(range(5000)), Sampling(max_tokens=4))
    pending = SimpleNamespace(args=(req,), metadata=SimpleNamespace(internal_request_id="i-9"))
    router.on_request_routed(pending, ReplicaId("a"), None)
    rooms = {room.replica_id: room for room in router.room_view(_req()).rooms}
    assert rooms["a"].kv_usage > 0.5 and rooms["b"].kv_usage == 0.1  # 5,000 of 10,000 tokens
    router.on_request_completed(ReplicaId("a"), "i-9")
    rooms = {room.replica_id: room for room in router.room_view(_req()).rooms}
    assert rooms["a"].kv_usage == 0.1
    assert fresh_usage(0.3, 1000, 0) == 0.3  # capacity unknown: as reported
    assert fresh_usage(0.3, 50_000, 10_000) == 1.0
