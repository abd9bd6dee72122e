"""What the two block indexes share (`prefix_index`, `kv_index`): block hash -> its holders,
least recently touched first, bounded by `max_blocks`, and the walk that finds each replica's
leading run of a prompt's blocks (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

H = TypeVar("H")  # what an entry holds: the replicas (and, for KV events, their media)


class LRUBlocks(Generic[H]):
    """Block hash -> holders (`_holders`), bounded: past `max_blocks` the least recently
    touched hashes go, `_evicted` is told of each."""

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self.max_blocks = max_blocks
        self._holders: OrderedDict[int, H] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def resize(self, max_blocks: int) -> None:
        """Set a new bound; a smaller one drops the least recently touched entries now."""
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self.max_blocks = max_blocks
        self._evict()

    def _evict(self) -> None:
        while len(self._holders) > self.max_blocks:
            self._evicted(*self._holders.popitem(last=False))

    def _evicted(self, block_hash: int, holders: H) -> None:
        """A hash left the index for the bound (subclasses keep their own views in step)."""


def leading_blocks(block_hashes: Sequence[int], replica_ids: Iterable[str],
                   holds: Callable[[int], Any]) -> dict[str, int]:
    """For each replica, how many leading blocks of the prompt it holds; `holds(h)`: the
    replicas that hold block `h` (anything supporting `in`)."""
    depth = {r: 0 for r in replica_ids}
    alive = set(depth)
    for i, h in enumerate(block_hashes):
        held = holds(h)
        alive = {r for r in alive if r in held}
        if not alive:
            break
        for r in alive:
            depth[r] = i + 1
    return depth
