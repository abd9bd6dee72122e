"""A prompt's block hashes exactly as vLLM computes them, so the router can look them up in
the index the engines' KV events build (`kv_index`).

vLLM hashes each full block of `block_size` tokens as `hash_fn((parent, tokens, extra_keys))`
(`vllm.v1.core.kv_cache_utils.hash_block_tokens`), chained from `NONE_HASH`. With the sha256
algorithms (vLLM's default, `prefix_caching_hash_algo`) `NONE_HASH` comes from a fixed seed
(`resolve_none_hash_seed`; PYTHONHASHSEED overrides it in the engines and here alike), so any
process computes the engines' hashes from the token ids. The extra keys scope the hashes: the
request's `cache_salt` enters the first block (one tenant's blocks never match another's) and a
LoRA adapter (name, path) every block. Multimodal inputs and prompt embeddings enter the
engine's extra keys too; the router does not reproduce those, so such prompts match no block
and are routed by load alone. The xxhash algorithms draw a random seed per process:
no router can reproduce them, so `PromptHasher` refuses them.

KV events publish a hash as its last 8 bytes, big-endian, as an int
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, on by default); `external_hash` does the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# vLLM's algorithms whose NONE_HASH seed is fixed (vllm.v1.core.kv_cache_utils)
REPRODUCIBLE_ALGOS = ("sha256", "sha256_cbor")


def external_hash(block_hash: bytes | int) -> int:
    """A block hash as KV events publish it: the low 64 bits of the big-endian digest."""
    if isinstance(block_hash, int):
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


@dataclass(frozen=True)
class PromptHasher:
    """vLLM's block hashes of a prompt for engines of one `block_size` and hash `algo`.

    Pure apart from importing vLLM's hash functions; cheap to build (one hash for the seed).
    """

    block_size: int
    algo: str = "sha256"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if self.algo not in REPRODUCIBLE_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo {self.algo!r} uses a random seed per "
                             f"engine; KV-event routing needs one of {REPRODUCIBLE_ALGOS}")
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

        fn = get_hash_fn_by_name(self.algo)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_none", fn(resolve_none_hash_seed(fn)))

    def hashes(
        self, token_ids: Sequence[int], cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> tuple[int, ...]:
        """One external hash per full block of `token_ids` (a partial last block is not cached
        by the engine, so it has none). `lora`: the adapter's (name, path), as the engine's
        `LoRARequest` has them."""
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        parent: Any = self._none  # type: ignore[attr-defined]
        lora_keys: tuple[Any, ...] = (("lora", *lora),) if lora is not None else ()
        out: list[int] = []
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            salt = (("cache_salt", cache_salt),) if start == 0 and cache_salt else ()
            extra = lora_keys + salt or None
            parent = hash_block_tokens(self._fn, parent,  # type: ignore[attr-defined]
                                       token_ids[start : start + bs], extra)
            out.append(external_hash(parent))
        return tuple(out)
