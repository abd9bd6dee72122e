"""Replica choice within a pool: round-robin, least-loaded, prefix-cache-aware (approximate, or
precise from the engines' KV events).

Every policy ranks the candidates best first (`rank`); `choose_replica` takes the first. A rank,
not just a winner, is what Serve's `RequestRouter.choose_replicas` wants: when the first replica
is full, Serve tries the next. After the request is sent, `record(replica_id, block_hashes)`
tells the policy where it went (only the prefix-aware policy keeps that).

Prefix-aware, in the spirit of Dynamo's KV router:

    cost(r) = overlap_weight * uncached_blocks(r) + active_blocks(r)

where `uncached_blocks` = the prompt's full blocks minus the leading blocks the index says r
holds. Lowest cost wins; ties go to the shorter queue, then lower KV usage, then the id. A hard
balance guard keeps a hot prefix from piling onto one replica: a replica whose queue exceeds
both `balance_factor` x the shortest queue and the shortest queue + `balance_min_gap` is
overloaded and ranked after every other replica (by queue length), whatever it holds.

`kv_events` is the same cost and guard over what the engines report they hold (their vLLM KV
events, `kv_index` / `kv_feed`) instead of what the router sent where; its request's block
hashes are vLLM's own (`vllm_hash`), in the engines' block size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from splitserve.config import RoutingConfig
from splitserve.router.routing.index_size import index_max_blocks
from splitserve.router.routing.kv_index import KVIndex
from splitserve.router.routing.prefix_index import DEFAULT_MAX_BLOCKS, PrefixIndex
from splitserve.router.routing.state import ReplicaState, RoutingRequest

# SGLang's cache-aware router uses a similar two-part test: a relative one (so busy pools keep
# some stickiness) and an absolute one (so a queue of 1 vs 0 is not called an imbalance).
DEFAULT_BALANCE_FACTOR = 2.0
DEFAULT_BALANCE_MIN_GAP = 8
# One uncached block costs as much as one active decode block: both are a block of KV work.
DEFAULT_OVERLAP_WEIGHT = 1.0


class RoutingPolicy(Protocol):
    """Ranks a pool's replicas for one request; may learn from where requests went."""

    name: str

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaState]) -> list[str]:
        """Replica ids, best first; every candidate exactly once."""
        ...

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """The request with these block hashes was sent to `replica_id`."""
        ...

    def forget_replica(self, replica_id: str) -> None:
        """The replica is gone."""
        ...


class BlockIndex(Protocol):
    """What the prefix-aware cost reads: per replica, the prompt's leading blocks it holds."""

    def matched_blocks(
        self, block_hashes: Sequence[int], replica_ids: Iterable[str]
    ) -> dict[str, int]:
        """For each replica, how many leading blocks of the prompt it holds."""
        ...


def _load_key(r: ReplicaState) -> tuple[int, float, str]:
    return (r.queue_depth, r.kv_usage, r.replica_id)


class RoundRobin:
    """Cycles through the replicas in id order, one step per request."""

    name = "round_robin"

    def __init__(self) -> None:
        self._cursor = 0

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaState]) -> list[str]:
        """The id-sorted replicas rotated by the cursor; advances the cursor."""
        ids = sorted(r.replica_id for r in replicas)
        if not ids:
            return []
        start = self._cursor % len(ids)
        self._cursor += 1
        return ids[start:] + ids[:start]

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """Nothing to learn."""

    def forget_replica(self, replica_id: str) -> None:
        """Nothing to forget."""


class LeastLoaded:
    """The shortest queue first; ties by lower KV usage, then id."""

    name = "least_loaded"

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaState]) -> list[str]:
        """Replicas by (queue depth, KV usage, id)."""
        return [r.replica_id for r in sorted(replicas, key=_load_key)]

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """Nothing to learn."""

    def forget_replica(self, replica_id: str) -> None:
        """Nothing to forget."""


class PrefixAware:
    """Lowest `overlap_weight * uncached_blocks + active_blocks`, with a balance guard."""

    name = "prefix_aware"

    def __init__(
        self,
        index: BlockIndex | None = None,
        *,
        overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
        balance_factor: float = DEFAULT_BALANCE_FACTOR,
        balance_min_gap: int = DEFAULT_BALANCE_MIN_GAP,
    ) -> None:
        self.index = index if index is not None else PrefixIndex(DEFAULT_MAX_BLOCKS)
        self._turn = 0  # rotates ties, so new prefixes spread over equally idle replicas
        self.overlap_weight = overlap_weight
        self.balance_factor = balance_factor
        self.balance_min_gap = balance_min_gap

    def overloaded(self, replica: ReplicaState, least_queue: int) -> bool:
        """Is this replica's queue too far above the shortest to be worth its cache?"""
        q = replica.queue_depth
        return q > least_queue + self.balance_min_gap and q > self.balance_factor * least_queue

    def costs(self, request: RoutingRequest, replicas: Sequence[ReplicaState]) -> dict[str, float]:
        """Each replica's cost for this request (lower is better)."""
        held = self.index.matched_blocks(request.block_hashes, (r.replica_id for r in replicas))
        return {
            r.replica_id: self.overlap_weight * (request.num_blocks - held[r.replica_id])
            + r.active_blocks
            for r in replicas
        }

    def rank(self, request: RoutingRequest, replicas: Sequence[ReplicaState]) -> list[str]:
        """Balanced replicas by (cost, load), then overloaded ones by load."""
        if not replicas:
            return []
        least = min(r.queue_depth for r in replicas)
        cost = self.costs(request, replicas)
        fine = [r for r in replicas if not self.overloaded(r, least)]
        hot = [r for r in replicas if self.overloaded(r, least)]
        ids = sorted(r.replica_id for r in replicas)
        turn, self._turn = self._turn, self._turn + 1
        rotated = {rid: (i - turn) % len(ids) for i, rid in enumerate(ids)}
        fine.sort(
            key=lambda r: (cost[r.replica_id], r.queue_depth, r.kv_usage, rotated[r.replica_id])
        )
        hot.sort(key=_load_key)
        return [r.replica_id for r in (*fine, *hot)]

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """Remember the blocks sent to `replica_id`."""
        self.index.record(replica_id, block_hashes)

    def forget_replica(self, replica_id: str) -> None:
        """Drop the replica from the index."""
        self.index.forget_replica(replica_id)


class KVEventsAware(PrefixAware):
    """`PrefixAware`'s cost and balance guard over the engines' reported blocks.

    `index`: the pool's `kv_feed.KVEventFeed` (or a bare `KVIndex` in tests), kept by the
    engines' KV events; the request's `block_hashes` must be vLLM's, in the engines' block size.
    Sending a request teaches it nothing: the engine's events will say what it stored.
    """

    name = "kv_events"

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """Nothing: the engine reports what it stored."""

    def forget_replica(self, replica_id: str) -> None:
        """Nothing: the feed drops a replica that is gone (its events stop with it)."""


def choose_replica(
    policy: RoutingPolicy, request: RoutingRequest, replicas: Sequence[ReplicaState]
) -> str:
    """The best replica id under `policy`; ValueError when there is none to choose from."""
    if not replicas:
        raise ValueError("no replicas to choose from")
    return policy.rank(request, replicas)[0]


def make_policy(
    name: str, cfg: RoutingConfig = RoutingConfig(), index: BlockIndex | None = None
) -> RoutingPolicy:
    """A fresh policy by config name ("round_robin", "least_loaded", "prefix_aware",
    "kv_events").

    The prefix-aware policy's index starts at `cfg.index_max_blocks`, or with "auto" at the
    bound for a capacity not yet known; its owner resizes it once the engines report theirs
    (`index_size.index_max_blocks`, `PrefixIndex.resize`). `index`: the KV-event index the
    kv_events policy reads (its pool's `KVEventFeed`; None: a fresh empty `KVIndex`)."""
    if name == RoundRobin.name:
        return RoundRobin()
    if name == LeastLoaded.name:
        return LeastLoaded()
    if name == PrefixAware.name:
        return PrefixAware(
            PrefixIndex(index_max_blocks(
                cfg.index_max_blocks, engine_kv_tokens=0, replicas=0, max_replicas=None,
                block_size=cfg.block_size,
            )),
            overlap_weight=cfg.overlap_weight,
            balance_factor=cfg.balance_factor,
            balance_min_gap=cfg.balance_min_gap,
        )
    if name == KVEventsAware.name:
        return KVEventsAware(
            index if index is not None else KVIndex(index_max_blocks(
                cfg.index_max_blocks, engine_kv_tokens=0, replicas=0, max_replicas=None,
                block_size=cfg.block_size,
            )),
            overlap_weight=cfg.overlap_weight,
            balance_factor=cfg.balance_factor,
            balance_min_gap=cfg.balance_min_gap,
        )
    raise ValueError(f"unknown routing policy {name!r}")


def pool_policies(cfg: RoutingConfig, pools: Iterable[str]) -> Mapping[str, RoutingPolicy]:
    """One policy per pool ("prefill", "decode"), as the config names them."""
    return {pool: make_policy(getattr(cfg, pool), cfg) for pool in pools}
