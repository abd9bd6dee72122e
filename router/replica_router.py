"""Ray Serve request router that applies splitserve's routing policies to a pool's replicas.

Serve calls `choose_replicas` in the caller's process (the router replica) for every request sent
through a pool's deployment handle. It builds the policy's plain inputs from what Serve already
tracks: each replica's queue length (probed by Serve) and the stats the worker publishes through
`record_routing_stats` (KV usage, running requests, KV capacity). The decision itself is the pure policy in
`splitserve.router.routing`; this class is only the adapter.

Configured per pool deployment (see `splitserve.app.pool_deployment_options`):
`RequestRouterConfig(request_router_class=PolicyRequestRouter, request_router_kwargs={...})`.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from splitserve.config import RoutingConfig
from splitserve.engine.messages import GenerateRequest, LoraOp
from splitserve.router.routing.index_size import IndexSizer
from splitserve.router.routing.policies import make_policy
from splitserve.router.routing.state import ReplicaState, RoutingRequest, routing_request


class PolicyRequestRouter(FIFOMixin, RequestRouter):
    """Ranks a pool's replicas with one of splitserve's policies."""

    def initialize_state(
        self, policy: str = "least_loaded", max_replicas: int | None = None, **routing: Any
    ) -> None:
        """Called once by Serve with `request_router_kwargs`: the policy name, the pool's most
        replicas (caps the prefix index's bound) and the `RoutingConfig` fields."""
        self._cfg = RoutingConfig(**routing)
        self._policy = make_policy(policy, self._cfg)
        self._sizer = IndexSizer(
            self._cfg.index_max_blocks, block_size=self._cfg.block_size, max_replicas=max_replicas
        )

    def _fit_index(self) -> None:
        """Resize the prefix index when the pool's reported KV capacity grew (index_size)."""
        index = getattr(self._policy, "index", None)
        if index is None:
            return
        bound = self._sizer.observe([
            int((r.routing_stats or {}).get("kv_capacity_tokens", 0))
            for r in self.curr_replicas.values()
        ])
        if bound is not None:
            index.resize(bound)

    def _routing_request(self, pending: PendingRequest | None) -> RoutingRequest:
        req = pending.args[0] if pending is not None and pending.args else None
        if not isinstance(req, GenerateRequest):
            return RoutingRequest(block_hashes=())
        return routing_request(
            req.prompt_token_ids, req.cache_salt or "", block_size=self._cfg.block_size
        )

    def _state(self, replica: RunningReplica) -> ReplicaState:
        stats = replica.routing_stats or {}
        queued = self._replica_queue_len_cache.get(replica.replica_id)
        return ReplicaState(
            replica_id=replica.replica_id.unique_id,
            queue_depth=int(queued if queued is not None else stats.get("num_unfinished", 0)),
            kv_usage=float(stats.get("kv_cache_usage", 0.0)),
            active_blocks=int(stats.get("active_blocks", 0)),
        )

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Every candidate, best first, one per rank (Serve falls through when one is full).

        A retried request skips the replicas that already failed it, unless no other is left;
        a request with a LoRA adapter goes to the replicas that report it loaded, if any.
        """
        candidate_replicas = with_adapter(avoid_failed(candidate_replicas, pending_request),
                                          pending_request)
        if not candidate_replicas:
            return []
        self._fit_index()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        request = self._routing_request(pending_request)
        ranked = self._policy.rank(request, [self._state(r) for r in candidate_replicas])
        return [[by_id[rid]] for rid in ranked if rid in by_id]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """Remember which replica now holds this prompt's blocks."""
        request = self._routing_request(pending_request)
        if request.block_hashes:
            self._policy.record(replica_id.unique_id, request.block_hashes)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica's cached prefixes."""
        super().on_replica_actor_died(replica_id)
        self._policy.forget_replica(replica_id.unique_id)


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
