"""Ray Serve request router that applies splitserve's routing policies to a pool's replicas.

Serve calls `choose_replicas` in the caller's process (the router replica) for every request sent
through a pool's deployment handle. It builds the policy's plain inputs from what Serve already
tracks: each replica's queue length (probed by Serve) and the stats the worker publishes through
`record_routing_stats` (KV usage, running requests, KV capacity, where it publishes its KV
events). The decision itself is the pure policy in `splitserve.router.routing`; this class is
only the adapter. It also keeps the pool's KV-event feed (`routing.kv_feed`, shared with the
dispatcher in this process) subscribed to the pool's current replicas, whatever the policy.

Decode first (`routing.reservations`): the router attaches itself to its pool's reservations in
this process, so that the dispatcher can reserve a replica (`room_view`: the ranking, queue
lengths and KV figures it routes with) before a remote prefill; a request pinned to a replica
(`GenerateRequest.pin_replica`) goes there while it is a candidate, and its reservation is
released once it is routed.

Configured per pool deployment (see `splitserve.app.pool_deployment_options`):
`RequestRouterConfig(request_router_class=PolicyRequestRouter, request_router_kwargs={...})`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from splitserve.config import RoutingConfig
from splitserve.engine.messages import GenerateRequest, LoraOp
from splitserve.router.routing.active_blocks import ActiveBlocks
from splitserve.router.routing.decode_room import DecodeRoom
from splitserve.router.routing.index_size import IndexSizer
from splitserve.router.routing.kv_feed import EventSource, KVEventFeed, pool_feed
from splitserve.router.routing.policies import KVEventsAware, make_policy
from splitserve.router.routing.reservations import RoomView, pool_reservations
from splitserve.router.routing.state import ReplicaState, RoutingRequest, routing_request

# Routing requests remembered between `choose_replicas` and `on_request_routed` (hashed once).
_RECENT = 256


class PolicyRequestRouter(RequestRouter):
    """Ranks a pool's replicas with one of splitserve's policies.

    Without Serve's FIFOMixin: the replica chosen for a request goes to that request (Serve's
    exact match by request id), not to the oldest one waiting, so a ranking made for one
    prompt's cache, or a pinned replica, is not handed to another request.
    """

    def initialize_state(
        self, policy: str = "least_loaded", max_replicas: int | None = None, **routing: Any
    ) -> None:
        """Called once by Serve with `request_router_kwargs`: the policy name, the pool's most
        replicas (caps the prefix index's bound) and the `RoutingConfig` fields."""
        self._cfg = RoutingConfig(**routing)
        deployment = getattr(self, "_deployment_id", None)
        self._feed = (pool_feed(deployment.app_name, deployment.name) if deployment is not None
                      else KVEventFeed("unnamed"))
        self._reservations = pool_reservations(
            *((deployment.app_name, deployment.name) if deployment is not None
              else ("", "unnamed")))
        self.loop: asyncio.AbstractEventLoop | None = None  # Serve's routing loop, once seen
        self._reservations.attach(self)
        self._policy = make_policy(policy, self._cfg, self._feed)
        self._max_replicas = max_replicas
        self._sizer = IndexSizer(
            self._cfg.index_max_blocks, block_size=self._cfg.block_size, max_replicas=max_replicas
        )
        self._feed_sizer: IndexSizer | None = None  # in the engines' block size, once known
        self._recent: dict[int, tuple[PendingRequest, RoutingRequest]] = {}
        self._active = ActiveBlocks()  # the policies' load term, counted as Serve routes

    def _fit_index(self) -> None:
        """Resize the indexes when the pool's reported KV capacity grew (index_size)."""
        capacities = [capacity(r) for r in self.curr_replicas.values()]
        index = getattr(self._policy, "index", None)
        if index is not None and not isinstance(self._policy, KVEventsAware):
            bound = self._sizer.observe(capacities)
            if bound is not None:
                index.resize(bound)
        hasher = self._feed.hasher
        if hasher is not None and (self._feed_sizer is None
                                   or self._feed_sizer.block_size != hasher.block_size):
            self._feed_sizer = IndexSizer(self._cfg.index_max_blocks,
                                          block_size=hasher.block_size,
                                          max_replicas=self._max_replicas)
        if self._feed_sizer is not None:
            bound = self._feed_sizer.observe(capacities)
            if bound is not None:
                self._feed.resize(bound)

    def _sync_feed(self) -> None:
        """Subscribe the pool's feed to the replicas that publish KV events (all of them, not
        only this request's candidates); it forgets the ones gone."""
        sources = {}
        for replica in self.curr_replicas.values():
            source = EventSource.from_stats(replica.routing_stats)
            if source is not None:
                sources[replica.replica_id.unique_id] = source
        self._feed.sync(sources)

    def _routing_request(self, pending: PendingRequest | None) -> RoutingRequest:
        """The policy's view of the request, hashed once per request: for kv_events vLLM's
        hashes (the dispatcher's, when it set them), else the router's own salted chain."""
        seen = self._recent.get(id(pending))
        if seen is not None and seen[0] is pending:
            return seen[1]
        req = pending.args[0] if pending is not None and pending.args else None
        request = self._request_of(req)
        if pending is not None:
            self._recent[id(pending)] = (pending, request)
            while len(self._recent) > _RECENT:
                self._recent.pop(next(iter(self._recent)))
        return request

    def _request_of(self, req: Any) -> RoutingRequest:
        """The policy's view of `req` (hashed here; `_routing_request` remembers it)."""
        if not isinstance(req, GenerateRequest):
            return RoutingRequest(block_hashes=())
        if isinstance(self._policy, KVEventsAware):
            hasher, blocks = self._feed.hasher, req.prompt_blocks
            if blocks is not None and hasher is not None and blocks.block_size == hasher.block_size:
                request = RoutingRequest(block_hashes=blocks.hashes)
            else:
                lora = (req.lora.name, req.lora.path) if req.lora is not None else None
                request = RoutingRequest(block_hashes=self._feed.prompt_hashes(
                    req.prompt_token_ids, req.cache_salt, lora))
        else:
            request = routing_request(
                req.prompt_token_ids, req.cache_salt or "", block_size=self._cfg.block_size
            )
        return request

    def _state(self, replica: RunningReplica) -> ReplicaState:
        stats = replica.routing_stats or {}
        queued = self._replica_queue_len_cache.get(replica.replica_id)
        return ReplicaState(
            replica_id=replica.replica_id.unique_id,
            queue_depth=int(queued if queued is not None else stats.get("num_unfinished", 0)),
            kv_usage=float(stats.get("kv_cache_usage", 0.0)),
            active_blocks=self._active.of(replica.replica_id.unique_id),
        )

    def room_view(self, req: GenerateRequest) -> RoomView | None:
        """Decode first (`routing.reservations`): the pool's replicas that could serve `req` now
        (with its LoRA adapter, if any report it), ranked by the policy, with their slots, KV
        figures and the prompt tokens each holds cached; None before Serve gave any replica."""
        candidates = with_adapter(list(self.curr_replicas.values()), _Pending((req,)))
        if not candidates:
            return None
        request = self._request_of(req)
        states = [self._state(r) for r in candidates]
        ranking = tuple(self._policy.rank(request, states))
        cached: dict[str, int] = {}
        hasher = self._feed.hasher
        if hasher is not None and request.block_hashes and isinstance(self._policy,
                                                                      KVEventsAware):
            held = self._feed.matched_blocks(request.block_hashes, [s.replica_id for s in states])
            cached = {rid: n * hasher.block_size for rid, n in held.items()}
        rooms = tuple(DecodeRoom(
            replica_id=s.replica_id,
            queue_depth=s.queue_depth,
            max_ongoing=getattr(r, "max_ongoing_requests", None),
            kv_usage=fresh_usage(s.kv_usage, self._active.tokens_of(s.replica_id),
                                 capacity(r)),
            kv_capacity_tokens=capacity(r),
        ) for s, r in zip(states, candidates, strict=True))
        return RoomView(ranking, rooms, cached)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Every candidate, best first, one per rank (Serve falls through when one is full).

        A retried request skips the replicas that already failed it, unless no other is left;
        a request with a LoRA adapter goes to the replicas that report it loaded, if any. A
        request pinned to a replica (decode first) has it first while it is a candidate (the
        policy's ranking follows, for Serve to fall through to when it is full); when it is
        gone, the ranking alone decides (the dispatcher counts where the request landed).
        """
        candidate_replicas = with_adapter(avoid_failed(candidate_replicas, pending_request),
                                          pending_request)
        if not candidate_replicas:
            return []
        self.loop = asyncio.get_running_loop()  # room_view is called here (reservations.view)
        self._reservations.attach(self)  # the latest router of the pool in this process
        self._sync_feed()
        self._fit_index()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        request = self._routing_request(pending_request)
        ranked = self._policy.rank(request, [self._state(r) for r in candidate_replicas])
        return [[by_id[rid]] for rid in pinned_first(ranked, pending_request) if rid in by_id]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """Release the request's decode reservation; count its blocks as the replica's load
        until it completes; remember which replica now holds this prompt's blocks
        (prefix_aware)."""
        req = pending_request.args[0] if pending_request.args else None
        pin = getattr(req, "pin_replica", None) if isinstance(req, GenerateRequest) else None
        if pin is not None:
            self._reservations.release(pin.reservation)
        if isinstance(req, GenerateRequest):
            hasher = self._feed.hasher
            block_size = hasher.block_size if hasher is not None else self._cfg.block_size
            self._active.routed(pending_request.metadata.internal_request_id,
                                replica_id.unique_id,
                                len(req.prompt_token_ids), block_size)
        if isinstance(self._policy, KVEventsAware):
            return  # the engine's events will say
        request = self._routing_request(pending_request)
        self._recent.pop(id(pending_request), None)
        if request.block_hashes:
            self._policy.record(replica_id.unique_id, request.block_hashes)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended on its replica (finished, failed or cancelled): its blocks no
        longer load the replica."""
        self._active.completed(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica's cached prefixes and load."""
        super().on_replica_actor_died(replica_id)
        self._policy.forget_replica(replica_id.unique_id)
        self._active.forget_replica(replica_id.unique_id)


def capacity(replica: RunningReplica) -> int:
    """The replica's KV cache in tokens, as its routing stats report it (0: unknown)."""
    return int((replica.routing_stats or {}).get("kv_capacity_tokens", 0))


def fresh_usage(reported: float, active_tokens: int, capacity_tokens: int) -> float:
    """Pure: a replica's KV usage, at least what the prompts routed to it and not completed
    hold (its reported usage is seconds old: a request routed since is not in it yet)."""
    if capacity_tokens <= 0:
        return reported
    return min(max(reported, active_tokens / capacity_tokens), 1.0)


def avoid_failed(
    candidates: list[RunningReplica], pending: PendingRequest | None
) -> list[RunningReplica]:
    """The candidates without the request's `avoid_replicas`, or all of them if none is left."""
    req = pending.args[0] if pending is not None and pending.args else None
    avoid = req.avoid_replicas if isinstance(req, (GenerateRequest, LoraOp)) else ()
    if not avoid:
        return candidates
    kept = [r for r in candidates if r.replica_id.unique_id not in avoid]
    return kept or candidates


def pinned_first(ranked: list[str], pending: PendingRequest | None) -> list[str]:
    """Pure: `ranked` with the request's pinned replica first, when it is among them."""
    req = pending.args[0] if pending is not None and pending.args else None
    pin = req.pin_replica if isinstance(req, GenerateRequest) else None
    if pin is None or pin.replica_id not in ranked:
        return ranked
    return [pin.replica_id, *(rid for rid in ranked if rid != pin.replica_id)]


class _Pending:
    """A request's arguments in the shape of Serve's `PendingRequest` (for `with_adapter`)."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args


def adapter_replicas(
    loaded: dict[str, tuple[int, ...]], lora_id: int | None
) -> list[str] | None:
    """Pure: the replica ids whose `loaded` adapter ids include `lora_id`; None when there is
    no adapter or no replica has it yet (then any replica will do: each loads the adapter from
    the path the request carries, so none can wait for it forever)."""
    if lora_id is None:
        return None
    have = [rid for rid, ids in loaded.items() if lora_id in ids]
    return have or None


def with_adapter(
    candidates: list[RunningReplica], pending: PendingRequest | None
) -> list[RunningReplica]:
    """The candidates that report the request's LoRA adapter loaded, or all of them."""
    req = pending.args[0] if pending is not None and pending.args else None
    lora = getattr(req, "lora", None) if isinstance(req, GenerateRequest) else None
    if lora is None:
        return candidates
    loaded = {r.replica_id.unique_id: tuple((r.routing_stats or {}).get("loras", ()))
              for r in candidates}
    keep = adapter_replicas(loaded, lora.lora_id)
    return candidates if keep is None else [r for r in candidates if r.replica_id.unique_id in keep]
