"""The plain inputs of a routing decision: one request, and each candidate replica's load.

Policies read nothing else, so every decision is a pure function of these values (plus the
policy's own small state: a round-robin cursor, the prefix index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from splitserve.router.routing.block_hash import DEFAULT_BLOCK_SIZE, block_hashes


@dataclass(frozen=True)
class ReplicaState:
    """One replica as the router sees it.

    `queue_depth`: requests sent and not finished (waiting + running). `kv_usage`: fraction of
    the KV cache in use, 0..1 (from its routing stats, seconds old). `active_blocks`: KV blocks
    of the requests this router sent it that have not completed (`active_blocks.py`).
    """

    replica_id: str
    queue_depth: int = 0
    kv_usage: float = 0.0
    active_blocks: int = 0


@dataclass(frozen=True)
class RoutingRequest:
    """A request as the policies see it: its tokens' block hashes, scoped by its cache salt."""

    block_hashes: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        """Full blocks of the prompt."""
        return len(self.block_hashes)


def routing_request(
    token_ids: Sequence[int], cache_salt: str, *, block_size: int = DEFAULT_BLOCK_SIZE
) -> RoutingRequest:
    """Hash the prompt once (the same hashes serve `choose` and `record`)."""
    return RoutingRequest(block_hashes=block_hashes(token_ids, cache_salt, block_size=block_size))
