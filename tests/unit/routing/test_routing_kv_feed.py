"""The KV-event feed against vLLM's own ZMQ publisher (no engine): subscription, replay of the
history a new router missed, sequence gaps, a replica that is gone. And the pure sequencing
rule (`kv_order`) it applies."""

from __future__ import annotations

import time

import pytest
from splitserve.router.routing.kv_feed import EventSource, KVEventFeed
from splitserve.router.routing.kv_order import Sequencer, Step
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher

WAIT_S = 30  # a bound for the feed's thread to catch up, never a measurement


def test_sequencer_applies_in_order_and_skips_what_it_has() -> None:
    seq = Sequencer()
    assert seq.live(0) is Step.REPLAY  # never synchronised: replay from 0 first
    assert seq.replay_from() == 0
    assert [seq.replayed(s) for s in (0, 1)] == [Step.APPLY, Step.APPLY]
    seq.replay_ended()
    assert seq.live(1) is Step.SKIP  # already applied from the replay
    assert seq.live(2) is Step.APPLY
    assert seq.live(4) is Step.REPLAY and seq.replay_from() == 3  # 3 was missed
    assert seq.replayed(3) is Step.APPLY and seq.replayed(4) is Step.APPLY
    assert seq.live(4) is Step.SKIP and seq.live(5) is Step.APPLY


def test_sequencer_resets_when_the_publisher_lost_the_history() -> None:
    seq = Sequencer()
    seq.replay_ended()  # nothing published yet
    assert seq.live(0) is Step.APPLY
    assert seq.live(9) is Step.REPLAY and seq.replay_from() == 1
    assert seq.replayed(7) is Step.RESET  # 1..6 are gone from the buffer: rebuild
    assert seq.replayed(8) is Step.APPLY and seq.live(9) is Step.APPLY


def test_sequencer_takes_the_stream_when_no_replay_answers() -> None:
    seq = Sequencer()
    assert seq.live(5) is Step.REPLAY
    assert seq.give_up_gap(5) is Step.APPLY and seq.live(6) is Step.APPLY


def _stored(*hashes: int) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[],
                       block_size=16, lora_id=None, medium="GPU", lora_name=None)


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")  # what the engine host sets
    pubs: list[ZmqEventPublisher] = []

    def make(buffer_steps: int = 10_000) -> tuple[ZmqEventPublisher, EventSource]:
        pub = ZmqEventPublisher(0, endpoint="tcp://*:0", replay_endpoint="tcp://*:0",
                                buffer_steps=buffer_steps, topic="kv")
        pubs.append(pub)
        cfg = pub.get_publisher_config()
        return pub, EventSource(cfg.endpoint, cfg.replay_endpoint, 16)

    yield make
    for pub in pubs:
        pub.shutdown()


def _publish(pub: ZmqEventPublisher, *events) -> None:
    pub.publish(KVEventBatch(ts=time.time(), events=list(events)))


def _until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"feed never got {what}")
        time.sleep(0.05)


def test_a_new_feed_replays_the_history_then_follows_live(publisher) -> None:
    pub, source = publisher()
    _publish(pub, _stored(1, 2))
    _publish(pub, _stored(3), BlockRemoved(block_hashes=[2], medium="GPU"))
    feed = KVEventFeed("test")
    try:
        feed.sync({"r1": source})
        assert feed.hasher is not None and feed.hasher.block_size == 16
        _until(lambda: feed.matched_blocks([1, 3], ["r1"]) == {"r1": 2}
               and feed.index.blocks_of("r1") == 2, "the replayed history")
        _publish(pub, _stored(2))
        _until(lambda: feed.matched_blocks([1, 2, 3], ["r1"]) == {"r1": 3}, "a live batch")
        assert feed.cached_tokens([1, 2, 3, 4]) == 3 * 16
    finally:
        feed.close()


def test_a_restarted_router_rebuilds_what_a_lost_history_allows(publisher) -> None:
    """The publisher keeps 2 batches: a router that subscribes later knows the blocks those
    batches stored, not the older ones (the index under-counts, never over-counts)."""
    pub, source = publisher(buffer_steps=2)
    for h in (1, 2, 3, 4):
        _publish(pub, _stored(h))
    feed = KVEventFeed("test")
    try:
        feed.sync({"r1": source})
        _until(lambda: feed.index.blocks_of("r1") == 2, "the buffered batches")
        assert feed.matched_blocks([3, 4], ["r1"]) == {"r1": 2}
        assert feed.matched_blocks([1, 2], ["r1"]) == {"r1": 0}
        _publish(pub, _stored(5))
        _until(lambda: feed.index.blocks_of("r1") == 3, "the live batch after the replay")
    finally:
        feed.close()


def test_a_replica_that_is_gone_is_forgotten(publisher) -> None:
    (pub1, src1), (pub2, src2) = publisher(), publisher()
    _publish(pub1, _stored(1))
    _publish(pub2, _stored(1))
    feed = KVEventFeed("test")
    try:
        feed.sync({"r1": src1, "r2": src2})
        _until(lambda: feed.matched_blocks([1], ["r1", "r2"]) == {"r1": 1, "r2": 1}, "both")
        feed.sync({"r2": src2})
        _until(lambda: feed.index.replicas() == ["r2"], "r1 dropped")
        _publish(pub1, _stored(9))  # a straggler of the gone replica changes nothing
        _publish(pub2, _stored(2))
        _until(lambda: feed.index.blocks_of("r2") == 2, "r2's live batch")
        assert feed.index.blocks_of("r1") == 0
    finally:
        feed.close()


def test_event_source_round_trips_through_routing_stats() -> None:
    src = EventSource("tcp://10.0.0.5:4000", "tcp://10.0.0.5:4001", 128, "sha256_cbor")
    assert EventSource.from_stats({"kv_events": src.to_stats()}) == src
    assert EventSource.from_stats({"kv_events": None}) is None
    assert EventSource.from_stats(None) is None
