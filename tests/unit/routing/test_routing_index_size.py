"""The prefix index's bound from the pools' KV capacity (`index_max_blocks: auto`)."""

from __future__ import annotations

import pytest

from splitserve.router.routing.index_size import (
    INDEX_SLACK,
    UNKNOWN_CAPACITY_MAX_BLOCKS,
    IndexSizer,
    auto_index_blocks,
    index_max_blocks,
)

CPU_KV_TOKENS = 524_288  # the tiny model's 1 GiB CPU KV cache: 4096 engine blocks of 128


def test_auto_bound_is_slack_times_pool_capacity_in_routing_blocks() -> None:
    # 524,288 tokens = 32,768 routing blocks of 16, times 2 for the slack
    assert INDEX_SLACK == 2.0
    assert auto_index_blocks(CPU_KV_TOKENS, 1, block_size=16) == 65_536
    assert auto_index_blocks(CPU_KV_TOKENS, 3, block_size=16) == 3 * 65_536
    # with routing blocks as large as the engine's, 8x fewer entries cover the same tokens
    assert auto_index_blocks(CPU_KV_TOKENS, 1, block_size=128) == 8_192


def test_auto_bound_rounds_up_and_is_never_zero() -> None:
    assert auto_index_blocks(10, 1, block_size=16) == 2  # 1.25 rounds up
    assert auto_index_blocks(0, 4, block_size=16) == 1
    assert auto_index_blocks(100, 1, block_size=16, slack=1.0) == 7


@pytest.mark.parametrize("args", [(-1, 1, 16, 2.0), (1, -1, 16, 2.0), (1, 1, 0, 2.0),
                                  (1, 1, 16, 0.0)])
def test_auto_bound_rejects_nonsense(args) -> None:
    tokens, replicas, block, slack = args
    with pytest.raises(ValueError):
        auto_index_blocks(tokens, replicas, block_size=block, slack=slack)


def test_explicit_setting_overrides_auto() -> None:
    assert index_max_blocks(
        5000, engine_kv_tokens=CPU_KV_TOKENS, replicas=8, max_replicas=8, block_size=16
    ) == 5000


def test_auto_without_a_reported_capacity_uses_the_fallback() -> None:
    assert index_max_blocks(
        "auto", engine_kv_tokens=0, replicas=2, max_replicas=4, block_size=16
    ) == UNKNOWN_CAPACITY_MAX_BLOCKS


def test_auto_caps_replicas_at_the_pools_max() -> None:
    capped = index_max_blocks(
        "auto", engine_kv_tokens=CPU_KV_TOKENS, replicas=10, max_replicas=4, block_size=16
    )
    assert capped == 4 * 65_536
    assert index_max_blocks(
        "auto", engine_kv_tokens=CPU_KV_TOKENS, replicas=10, max_replicas=None, block_size=16
    ) == 10 * 65_536
    # no replica seen yet still sizes for one
    assert index_max_blocks(
        "auto", engine_kv_tokens=CPU_KV_TOKENS, replicas=0, max_replicas=4, block_size=16
    ) == 65_536


def test_sizer_resizes_once_an_engine_reports_and_when_the_pool_grows() -> None:
    sizer = IndexSizer("auto", block_size=16, max_replicas=3)
    assert sizer.bound == UNKNOWN_CAPACITY_MAX_BLOCKS
    assert sizer.observe([0, 0]) is None  # nobody reported yet
    assert sizer.observe([CPU_KV_TOKENS, 0]) == 2 * 65_536  # two replicas, one reported
    assert sizer.observe([CPU_KV_TOKENS, CPU_KV_TOKENS]) is None  # nothing changed
    assert sizer.observe([CPU_KV_TOKENS] * 3) == 3 * 65_536
    assert sizer.observe([CPU_KV_TOKENS] * 5) is None  # max_replicas caps it
    assert sizer.bound == 3 * 65_536


def test_sizer_never_shrinks_on_scale_down_or_a_missing_report() -> None:
    sizer = IndexSizer("auto", block_size=16)
    assert sizer.observe([CPU_KV_TOKENS] * 2) == 2 * 65_536
    assert sizer.observe([CPU_KV_TOKENS]) is None
    assert sizer.observe([0, 0]) is None
    assert sizer.bound == 2 * 65_536


def test_sizer_keeps_an_explicit_setting() -> None:
    sizer = IndexSizer(7, block_size=16, max_replicas=4)
    assert sizer.bound == 7
    assert sizer.observe([CPU_KV_TOKENS] * 4) is None
    assert sizer.bound == 7
