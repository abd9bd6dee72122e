"""How many block hashes a pool's prefix index may hold (`routing.index_max_blocks`).

An index entry helps only while its block can still be in some engine's prefix cache, so with
`index_max_blocks: auto` the bound follows the pool's KV capacity:

    bound = ceil(INDEX_SLACK * replicas * engine_kv_tokens / block_size)

`engine_kv_tokens`: one engine's KV cache in tokens, as the engine reports it (vLLM's
`num_gpu_blocks * block_size`; on the CPU that is `VLLM_CPU_KVCACHE_SPACE` / bytes per block,
block size 128). `block_size`: the *routing* block size (`routing.block_size`, 16 by default),
since the index holds one hash per routing block, not per engine block. `replicas`: the
replicas the index covers, at most the pool's `max_replicas` (autoscaling) or `replicas`.

Worked figures (323 bytes per entry, `scripts/measure_prefix_index.py`): the default CPU
deployment (1 GiB of KV per engine on the tiny model = 524,288 tokens, 1 replica) gets 65,536
entries, about 20 MiB; a GPU pool of 8 replicas with 458,752 tokens each (Llama-3-8B on an
80 GB GPU at 0.9 utilisation) gets 458,752 entries, about 141 MiB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

# The engines evict least recently *used* blocks; the index evicts least recently *recorded*
# ones and cannot see the engines' hits, so it may hold blocks an engine already dropped and
# miss ones it kept. Twice the capacity keeps every block an engine can still hold, at a few
# hundred bytes an entry.
INDEX_SLACK = 2.0
# The bound while no engine has reported its capacity yet (or never will, e.g. a fake pool):
# the old fixed default, about 330 MiB per index when full.
UNKNOWN_CAPACITY_MAX_BLOCKS = 1 << 20

IndexMaxBlocks = int | Literal["auto"]


def auto_index_blocks(
    engine_kv_tokens: int, replicas: int, *, block_size: int, slack: float = INDEX_SLACK
) -> int:
    """Pure: the index bound for `replicas` engines of `engine_kv_tokens` tokens each, in
    routing blocks of `block_size` tokens, times `slack`; at least 1."""
    if engine_kv_tokens < 0 or replicas < 0 or block_size < 1 or slack <= 0:
        raise ValueError("capacity and replicas must be >= 0, block_size >= 1, slack > 0")
    return max(1, math.ceil(slack * replicas * engine_kv_tokens / block_size))


def index_max_blocks(
    setting: IndexMaxBlocks,
    *,
    engine_kv_tokens: int,
    replicas: int,
    max_replicas: int | None,
    block_size: int,
) -> int:
    """Pure: the bound the index gets now. An explicit integer `setting` wins. With "auto":
    `UNKNOWN_CAPACITY_MAX_BLOCKS` until an engine reported `engine_kv_tokens` (0: not yet),
    then `auto_index_blocks` over `replicas` engines, capped at `max_replicas` (None: no cap)."""
    if setting != "auto":
        return int(setting)
    if engine_kv_tokens <= 0:
        return UNKNOWN_CAPACITY_MAX_BLOCKS
    covered = max(1, replicas if max_replicas is None else min(replicas, max_replicas))
    return auto_index_blocks(engine_kv_tokens, covered, block_size=block_size)


class IndexSizer:
    """The bound of one pool's index as its replicas report their KV capacity.

    Its inputs only grow: the largest capacity any engine reported and the most replicas seen
    at once, so a replica that has not reported yet, or a scale-down, does not evict entries
    the index may need again. (The first report does shrink the bound, from the
    unknown-capacity one to the pool's.) `observe` is called per routing decision; it is cheap
    (one pass over the replicas' figures) and returns a bound only when it changed.
    """

    def __init__(
        self, setting: IndexMaxBlocks, *, block_size: int, max_replicas: int | None = None
    ) -> None:
        self.setting = setting
        self.block_size = block_size
        self.max_replicas = max_replicas
        self.kv_tokens = 0
        self.replicas = 0
        self.bound = self._bound()

    def _bound(self) -> int:
        return index_max_blocks(
            self.setting, engine_kv_tokens=self.kv_tokens, replicas=self.replicas,
            max_replicas=self.max_replicas, block_size=self.block_size,
        )

    def observe(self, kv_capacity_tokens: Sequence[int]) -> int | None:
        """One look at the pool: each current replica's reported KV tokens (0: not reported).
        Returns the new bound when it changed, else None."""
        if self.setting != "auto":
            return None
        self.kv_tokens = max(self.kv_tokens, max(kv_capacity_tokens, default=0))
        self.replicas = max(self.replicas, len(kv_capacity_tokens))
        bound = self._bound()
        if bound == self.bound:
            return None
        self.bound = bound
        return bound
