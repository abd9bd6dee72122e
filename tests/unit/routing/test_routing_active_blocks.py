"""The active blocks a router counts per replica: added when a request is routed, removed when
it completes, bounded, and dropped with a replica that is gone."""

from __future__ import annotations

from splitserve.router.routing.active_blocks import ActiveBlocks


def test_a_request_counts_its_blocks_until_it_completes():
    active = ActiveBlocks()
    active.routed("r1", "a", tokens=33, block_size=16)  # 3 blocks (the last one partial)
    active.routed("r2", "a", tokens=16, block_size=16)
    active.routed("r3", "b", tokens=1, block_size=16)
    assert (active.of("a"), active.of("b"), active.of("c")) == (4, 1, 0)
    active.completed("r1")
    active.completed("r1")  # a second report changes nothing
    active.completed("unknown")
    assert active.of("a") == 1


def test_a_request_routed_again_moves_its_blocks():
    active = ActiveBlocks()
    active.routed("r1", "a", tokens=32, block_size=16)
    active.routed("r1", "b", tokens=32, block_size=16)  # Serve retried it elsewhere
    assert (active.of("a"), active.of("b")) == (0, 2)


def test_the_oldest_request_is_dropped_beyond_the_bound():
    active = ActiveBlocks(max_tracked=2)
    for i in range(3):
        active.routed(f"r{i}", "a", tokens=16, block_size=16)
    assert active.of("a") == 2
    active.completed("r0")  # already dropped
    assert active.of("a") == 2


def test_a_replica_gone_takes_its_requests_with_it():
    active = ActiveBlocks()
    active.routed("r1", "a", tokens=16, block_size=16)
    active.routed("r2", "b", tokens=16, block_size=16)
    active.forget_replica("a")
    assert (active.of("a"), active.of("b")) == (0, 1)
    active.completed("r1")
    assert active.of("b") == 1
