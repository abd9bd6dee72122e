"""The approximate prefix index: longest-prefix matching per replica, LRU bound."""

from __future__ import annotations

import pytest

from splitserve.router.routing.prefix_index import PrefixIndex


def test_matched_blocks_counts_leading_blocks_per_replica() -> None:
    index = PrefixIndex()
    index.record("r1", [1, 2, 3, 4])
    index.record("r2", [1, 2])
    index.record("r3", [9])
    assert index.matched_blocks([1, 2, 3, 5], ["r1", "r2", "r3", "r4"]) == {
        "r1": 3, "r2": 2, "r3": 0, "r4": 0,
    }


def test_a_gap_in_the_chain_ends_the_match() -> None:
    index = PrefixIndex()
    index.record("r1", [1, 3])  # holds block 3 but not block 2
    assert index.matched_blocks([1, 2, 3], ["r1"]) == {"r1": 1}


def test_lookup_does_not_change_the_index() -> None:
    index = PrefixIndex(max_blocks=2)
    index.record("r1", [1, 2])
    index.matched_blocks([1, 2], ["r1"])
    index.record("r1", [3])  # evicts 1, the least recently recorded, despite the lookup
    assert index.matched_blocks([1, 2], ["r1"]) == {"r1": 0}
    assert index.matched_blocks([2, 3], ["r1"]) == {"r1": 2}  # what remains: 2 and 3
    assert len(index) == 2


def test_lru_bound_evicts_least_recently_recorded() -> None:
    index = PrefixIndex(max_blocks=3)
    index.record("r1", [1, 2, 3])
    index.record("r2", [1])  # touches 1
    index.record("r2", [4])  # evicts 2
    assert len(index) == 3
    assert index.matched_blocks([1, 2, 3], ["r1", "r2"]) == {"r1": 1, "r2": 1}


def test_forget_replica() -> None:
    index = PrefixIndex()
    index.record("r1", [1, 2])
    index.record("r2", [1])
    index.forget_replica("r1")
    assert index.matched_blocks([1, 2], ["r1", "r2"]) == {"r1": 0, "r2": 1}
    assert len(index) == 1


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(0)


def test_resize_evicts_least_recently_recorded_down_to_the_new_bound() -> None:
    index = PrefixIndex(max_blocks=10)
    index.record("r1", [1, 2, 3, 4])
    index.record("r2", [1])  # 1 is now the most recently recorded
    index.resize(2)
    assert len(index) == 2 and index.max_blocks == 2
    assert index.matched_blocks([4], ["r1"]) == {"r1": 1}
    assert index.matched_blocks([1], ["r1", "r2"]) == {"r1": 1, "r2": 1}
    assert index.matched_blocks([2], ["r1"]) == {"r1": 0}
    index.resize(5)  # growing keeps everything
    index.record("r1", [7, 8])
    assert len(index) == 4
    with pytest.raises(ValueError):
        index.resize(0)
