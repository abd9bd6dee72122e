"""An approximate index of which replica holds which prompt blocks, bounded by LRU.

The router cannot see the engines' caches; it remembers what it *sent* where (`record`), as
Dynamo's approximate KV router does. Entries age out least-recently-recorded first once the
index holds `max_blocks` hashes, which roughly tracks the engines' own LRU eviction.

Invariants: `len(index) <= max_blocks`; `matched_blocks` never changes the index; a replica
matches a prefix of length k only if it holds each of the first k hashes of the chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from splitserve.router.routing.lru_blocks import LRUBlocks, leading_blocks

# About 16 M tokens of prefixes at 16 tokens a block; about 330 bytes per entry. Deployments
# size it from the pools' KV capacity instead (`index_size`, `routing.index_max_blocks: auto`).
DEFAULT_MAX_BLOCKS = 1 << 20


class PrefixIndex(LRUBlocks[set[str]]):
    """Block hash -> the replicas it was sent to, least recently recorded first."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        super().__init__(max_blocks)

    def record(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """Note that `replica_id` now holds these blocks (it was sent the prompt)."""
        for h in block_hashes:
            holders = self._holders.get(h)
            if holders is None:
                holders = self._holders[h] = set()
            holders.add(replica_id)
            self._holders.move_to_end(h)
        self._evict()

    def matched_blocks(
        self, block_hashes: Sequence[int], replica_ids: Iterable[str]
    ) -> dict[str, int]:
        """For each replica, how many leading blocks of the prompt it holds (0 if none)."""
        return leading_blocks(block_hashes, replica_ids, lambda h: self._holders.get(h, ()))

    def forget_replica(self, replica_id: str) -> None:
        """Drop a replica that is gone (its cache went with it). O(index size)."""
        for h in [h for h, holders in self._holders.items() if replica_id in holders]:
            holders = self._holders[h]
            holders.discard(replica_id)
            if not holders:
                del self._holders[h]
