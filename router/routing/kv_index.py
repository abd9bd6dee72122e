"""A precise index of which replica holds which KV blocks, built from the engines' KV events.

Each engine publishes vLLM's KV cache events (`vllm.distributed.kv_events`): `BlockStored` when
full blocks enter its prefix cache, `BlockRemoved` when it evicts them, `AllBlocksCleared` when
it drops them all. `KVIndex.apply` folds one replica's events, in the order the engine published
them, into block hash -> {replica: the media holding it}. The medium is the tier the event names
("GPU" for the engine's own KV cache, even on the CPU; "CPU" or "STORAGE" for an offloading
tier), so the index can say which tier holds a prefix.

Tenant scoping needs nothing here: vLLM mixes the request's `cache_salt` into the first block's
hash, so one tenant's chain never shares a hash with another's (`vllm_hash.PromptHasher`).

Invariants: `len(index) <= max_blocks` (least recently stored hashes go first, a safety bound:
removals already keep the index at what the engines hold); `matched_blocks` never changes the
index; a replica matches a prefix of length k only if it holds each of the first k hashes.
Not thread-safe: the feed (`kv_feed`) serialises access.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from splitserve.router.routing.lru_blocks import LRUBlocks, leading_blocks
from splitserve.router.routing.vllm_hash import external_hash

DEFAULT_MAX_BLOCKS = 1 << 20
# What vLLM names the engine's own KV cache in its events (vllm.distributed.kv_events.MEDIUM_GPU),
# and the medium of an event that names none.
ENGINE_MEDIUM = "GPU"


class KVIndex(LRUBlocks[dict[str, set[str]]]):
    """Block hash -> {replica id: media holding it}, from each replica's KV events."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        super().__init__(max_blocks)
        self._by_replica: dict[str, set[int]] = {}

    def replicas(self) -> list[str]:
        """The replicas holding at least one block."""
        return sorted(r for r, held in self._by_replica.items() if held)

    def blocks_of(self, replica_id: str) -> int:
        """How many distinct blocks `replica_id` holds (any medium)."""
        return len(self._by_replica.get(replica_id, ()))

    def apply(self, replica_id: str, events: Iterable[Any]) -> None:
        """Fold `replica_id`'s events (vLLM's `BlockStored`, `BlockRemoved`,
        `AllBlocksCleared`, in publication order) into the index; other kinds are ignored."""
        for event in events:
            kind = type(event).__name__
            if kind == "BlockStored":
                self.store(replica_id, event.block_hashes, event.medium)
            elif kind == "BlockRemoved":
                self.remove(replica_id, event.block_hashes, event.medium)
            elif kind == "AllBlocksCleared":
                self.forget_replica(replica_id)

    def store(self, replica_id: str, hashes: Sequence[int | bytes],
              medium: str | None = None) -> None:
        """`replica_id` now holds these blocks in `medium` (None: the engine's KV cache)."""
        medium = medium or ENGINE_MEDIUM
        mine = self._by_replica.setdefault(replica_id, set())
        for raw in hashes:
            h = external_hash(raw)
            holders = self._holders.get(h)
            if holders is None:
                holders = self._holders[h] = {}
            holders.setdefault(replica_id, set()).add(medium)
            mine.add(h)
            self._holders.move_to_end(h)
        self._evict()

    def remove(self, replica_id: str, hashes: Sequence[int | bytes],
               medium: str | None = None) -> None:
        """`replica_id` dropped these blocks from `medium`; other media keep theirs."""
        medium = medium or ENGINE_MEDIUM
        for raw in hashes:
            h = external_hash(raw)
            media = self._holders.get(h, {}).get(replica_id)
            if media is None:
                continue
            media.discard(medium)
            if not media:
                self._drop(h, replica_id)

    def _drop(self, h: int, replica_id: str) -> None:
        holders = self._holders[h]
        del holders[replica_id]
        self._by_replica[replica_id].discard(h)
        if not holders:
            del self._holders[h]

    def _evicted(self, block_hash: int, holders: dict[str, set[str]]) -> None:
        for replica_id in holders:
            self._by_replica[replica_id].discard(block_hash)

    def forget_replica(self, replica_id: str) -> None:
        """Drop everything `replica_id` holds (it is gone, or cleared its cache)."""
        for h in self._by_replica.pop(replica_id, set()):
            holders = self._holders.get(h)
            if holders is not None:
                holders.pop(replica_id, None)
                if not holders:
                    del self._holders[h]

    def matched_blocks(
        self, block_hashes: Sequence[int], replica_ids: Iterable[str],
        media: Collection[str] | None = None,
    ) -> dict[str, int]:
        """For each replica, how many leading blocks of the prompt it holds (0 if none), in any
        of `media` (None: any medium)."""
        def holds(h: int) -> Collection[str]:
            holders = self._holders.get(h, {})
            if media is None:
                return holders
            return {r for r, held in holders.items() if not held.isdisjoint(media)}

        return leading_blocks(block_hashes, replica_ids, holds)

    def prefix_media(self, block_hashes: Sequence[int], replica_id: str) -> list[frozenset[str]]:
        """The media holding each leading block of the prompt on `replica_id`, up to the first
        block it lacks (which tier a cached prefix would be loaded from)."""
        out: list[frozenset[str]] = []
        for h in block_hashes:
            media = self._holders.get(h, {}).get(replica_id)
            if not media:
                break
            out.append(frozenset(media))
        return out
