"""Salted chained block hashes."""

from __future__ import annotations

import pytest

from splitserve.router.routing.block_hash import block_hashes

TOKENS = list(range(100, 164))  # 4 blocks of 16


def test_one_hash_per_full_block_only() -> None:
    assert len(block_hashes(TOKENS, "s")) == 4
    assert len(block_hashes(TOKENS[:47], "s")) == 2  # the partial third block is not hashed
    assert block_hashes(TOKENS[:15], "s") == ()
    assert len(block_hashes(TOKENS, "s", block_size=8)) == 8


def test_deterministic_64_bit() -> None:
    hashes = block_hashes(TOKENS, "s")
    assert hashes == block_hashes(list(TOKENS), "s") == block_hashes(tuple(TOKENS), "s")
    assert all(0 <= h < 2**64 for h in hashes) and len(set(hashes)) == 4


def test_shared_prefix_shares_leading_hashes_only() -> None:
    other = TOKENS[:32] + [7] + TOKENS[33:]
    a, b = block_hashes(TOKENS, "s"), block_hashes(other, "s")
    assert a[:2] == b[:2]
    assert a[2] != b[2] and a[3] != b[3]  # chained: a change poisons every later block


def test_same_block_at_another_position_hashes_differently() -> None:
    repeated = TOKENS[:16] * 2
    h = block_hashes(repeated, "s")
    assert h[0] != h[1]


def test_salts_give_disjoint_hashes() -> None:
    a = set(block_hashes(TOKENS, "tenant-a"))
    b = set(block_hashes(TOKENS, "tenant-b"))
    assert a and b and a.isdisjoint(b)


def test_bad_block_size() -> None:
    with pytest.raises(ValueError):
        block_hashes(TOKENS, "s", block_size=0)
