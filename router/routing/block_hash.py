"""Chained block hashes of a prompt, scoped by the tenant's cache salt.

The prompt is cut into full blocks of `block_size` tokens (a partial last block is never cached
by the engines, so it is not hashed). Block i's hash covers block i's tokens *and* block i-1's
hash, so equal hashes mean equal whole prefixes. The chain is seeded with the cache salt: the
same tokens under two salts (two tenants) share no hash at all, mirroring vLLM, which mixes
`cache_salt` into its first block's hash.

Hashes are 64-bit (blake2b, 8 bytes): the index is approximate anyway, and at a million blocks a
collision has odds of about 1 in 30 million, costing at worst one less well-placed request.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

DEFAULT_BLOCK_SIZE = 16  # vLLM's default GPU KV block size
HASH_BYTES = 8
SEED_DOMAIN = b"splitserve-prefix/v1"  # versioned: a new derivation must not match old hashes


def _seed(cache_salt: str) -> bytes:
    return hashlib.blake2b(SEED_DOMAIN + cache_salt.encode(), digest_size=HASH_BYTES).digest()


def block_hashes(
    token_ids: Sequence[int], cache_salt: str, *, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[int, ...]:
    """One 64-bit hash per full block of `token_ids`, chained from a seed of `cache_salt`."""
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    parent = _seed(cache_salt)
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        h = hashlib.blake2b(parent, digest_size=HASH_BYTES)
        h.update(struct.pack(f"<{block_size}Q", *block))
        parent = h.digest()
        out.append(int.from_bytes(parent, "big"))
    return tuple(out)
