"""Which replica of a pool serves a request: pure policies over plain replica state.

    request = routing_request(token_ids, cache_salt, block_size=cfg.router.routing.block_size)
    replica = choose_replica(policy, request, replicas)      # or policy.rank(...) for Serve
    policy.record(replica, request.block_hashes)             # once it was sent there

Modules: state (ReplicaState, RoutingRequest), block_hash (salted chained block hashes),
prefix_index (approximate LRU index of blocks per replica), index_size (the index's bound from
the pools' KV capacity), policies (the three policies), decode_room (decode first: the decode
replica with a slot and KV room for a request, pure) and reservations (the replicas this router
process reserved before remote prefills).
"""

from splitserve.router.routing.block_hash import DEFAULT_BLOCK_SIZE, block_hashes
from splitserve.router.routing.decode_room import (
    DecodeRoom,
    kv_need,
    pick_decode_replica,
    reserved_output,
)
from splitserve.router.routing.index_size import auto_index_blocks, index_max_blocks
from splitserve.router.routing.policies import (
    LeastLoaded,
    PrefixAware,
    RoundRobin,
    RoutingPolicy,
    choose_replica,
    make_policy,
    pool_policies,
)
from splitserve.router.routing.prefix_index import PrefixIndex
from splitserve.router.routing.reservations import (
    DecodeReservations,
    Reservation,
    RoomView,
    pool_reservations,
)
from splitserve.router.routing.state import ReplicaState, RoutingRequest, routing_request

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DecodeReservations",
    "DecodeRoom",
    "LeastLoaded",
    "PrefixAware",
    "PrefixIndex",
    "ReplicaState",
    "Reservation",
    "RoomView",
    "RoundRobin",
    "RoutingPolicy",
    "RoutingRequest",
    "auto_index_blocks",
    "block_hashes",
    "choose_replica",
    "index_max_blocks",
    "kv_need",
    "make_policy",
    "pick_decode_replica",
    "pool_policies",
    "pool_reservations",
    "reserved_output",
    "routing_request",
]
