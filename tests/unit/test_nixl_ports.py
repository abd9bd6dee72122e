"""NIXL side-channel ports: free, and never from the kernel's ephemeral range.

A port from the ephemeral range (what bind(0) returns) can be handed to an outgoing connection
before the engine binds it; the engine then hangs at start-up ("Address already in use").
"""

from __future__ import annotations

import random
import socket

import pytest
from splitserve.kv_transfer import nixl
from splitserve.kv_transfer.nixl import (
    LOWEST_PORT,
    ephemeral_port_range,
    free_port_block,
    port_block_bases,
)


def test_bases_lie_below_the_ephemeral_range():
    first, last = port_block_bases(2, (32768, 60999))
    assert (first, last) == (LOWEST_PORT, 32766)  # last block is 32766..32767


def test_bases_go_above_when_there_is_no_room_below():
    assert port_block_bases(1, (5000, 50000)) == (50001, 65535)


def test_bases_anywhere_when_the_range_covers_everything():
    assert port_block_bases(4, (1024, 65535)) == (1024, 65532)


def test_ephemeral_range_read_from_file_or_default(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_port_range(str(f)) == (40000, 50000)
    assert ephemeral_port_range(str(tmp_path / "missing")) == nixl.DEFAULT_EPHEMERAL_RANGE


def test_free_block_is_outside_the_ephemeral_range():
    low, high = ephemeral_port_range()
    for seed in range(20):
        base = free_port_block("127.0.0.1", 3, rng=random.Random(seed))
        assert not (low <= base + 2 and base <= high)
        for port in range(base, base + 3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # every port of the block is bindable


class _Scripted(random.Random):
    """Returns the given ports in order from randint."""

    def __init__(self, picks):
        super().__init__(0)
        self.picks = list(picks)

    def randint(self, a, b):
        pick = self.picks.pop(0)
        assert a <= pick <= b
        return pick


def _bindable_pair() -> int:
    first, last = port_block_bases(2, ephemeral_port_range())
    rng = random.Random(7)
    for _ in range(100):
        p = rng.randint(first, last - 3)
        if all(nixl._is_free("127.0.0.1", p + i) for i in range(4)):
            return p
    pytest.skip("no free ports to test with")


def test_a_block_with_a_busy_port_is_skipped():
    base = _bindable_pair()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 1))  # the second port of the first pick is taken
        busy.listen()
        assert free_port_block("127.0.0.1", 2, rng=_Scripted([base, base + 2])) == base + 2


def test_no_free_block_raises():
    base = _bindable_pair()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        with pytest.raises(RuntimeError, match="no block of 1 free ports"):
            free_port_block("127.0.0.1", 1, attempts=3, rng=_Scripted([base] * 3))
