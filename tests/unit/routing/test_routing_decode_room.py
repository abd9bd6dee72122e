"""Decode first: the pure choice of a decode replica with a slot and KV room (decode_room), and
the process's reservations over it (reservations)."""

from __future__ import annotations

import asyncio

from splitserve.router.routing.decode_room import (
    DecodeRoom,
    kv_need,
    pick_decode_replica,
    reserved_output,
)
from splitserve.router.routing.reservations import DecodeReservations, RoomView

from splitserve.engine.messages import GenerateRequest, Sampling

CAPACITY = 10_000  # KV tokens per replica


def _room(rid: str, **kw) -> DecodeRoom:
    return DecodeRoom(rid, **{"queue_depth": 1, "max_ongoing": 8,
                              "kv_capacity_tokens": CAPACITY, **kw})


def test_kv_need_counts_the_uncached_prompt_and_the_output():
    assert kv_need(1000, 0, 100) == 1100
    assert kv_need(1000, 640, 100) == 460
    assert kv_need(100, 640, 10) == 10  # a cache longer than the prompt saves at most the prompt


def test_reserved_output_is_the_budget_capped_by_the_measured_mean():
    assert reserved_output(256, None) == 256  # nothing measured: the whole budget
    assert reserved_output(256, 40) == 40
    assert reserved_output(16, 40) == 16


def test_the_best_ranked_replica_with_room_wins():
    rooms = [_room("a"), _room("b")]
    need = {"a": 500, "b": 500}
    assert pick_decode_replica(["b", "a"], rooms, need) == "b"
    assert pick_decode_replica(["a", "b"], rooms, need) == "a"


def test_a_replica_without_kv_room_is_passed_over():
    rooms = [_room("a", kv_usage=0.96), _room("b", kv_usage=0.5)]
    need = {"a": 500, "b": 500}  # a has 400 free tokens
    assert pick_decode_replica(["a", "b"], rooms, need) == "b"


def test_the_cached_prefix_can_make_the_room():
    rooms = [_room("a", kv_usage=0.96), _room("b", kv_usage=0.99)]
    # a holds most of the prompt: it needs only 300 more tokens, which fit its 400 free
    assert pick_decode_replica(["b", "a"], rooms, {"a": 300, "b": 1100}) == "a"


def test_reservations_take_room_and_slots():
    assert pick_decode_replica(["a"], [_room("a", reserved_tokens=9_600)], {"a": 500}) is None
    assert pick_decode_replica(["a"], [_room("a", queue_depth=6, reserved_requests=2)],
                               {"a": 1}) is None
    assert pick_decode_replica(["a"], [_room("a", queue_depth=6, reserved_requests=1)],
                               {"a": 1}) == "a"


def test_none_when_no_replica_has_room():
    rooms = [_room("a", kv_usage=1.0), _room("b", queue_depth=8)]
    assert pick_decode_replica(["a", "b"], rooms, {"a": 1, "b": 1}) is None


def test_an_idle_replica_and_an_unreported_capacity_count_as_room():
    # nothing running nor reserved: stale usage must not starve it
    assert pick_decode_replica(["a"], [_room("a", queue_depth=0, kv_usage=1.0)],
                               {"a": 50_000}) == "a"
    assert pick_decode_replica(["a"], [_room("a", kv_capacity_tokens=0, kv_usage=1.0)],
                               {"a": 500}) == "a"


def test_ids_outside_the_rooms_are_skipped():
    assert pick_decode_replica(["gone", "a"], [_room("a")], {"a": 1}) == "a"
    assert pick_decode_replica([], [_room("a")], {"a": 1}) is None


class _Source:
    """A pool's request router as the reservations see it."""

    def __init__(self, view: RoomView | None, loop=None) -> None:
        self.view = view
        self.loop = loop

    def room_view(self, req: GenerateRequest) -> RoomView | None:
        return self.view


def _req(n: int) -> GenerateRequest:
    return GenerateRequest("r", tuple(range(n)), Sampling(max_tokens=4))


def test_reservations_count_until_released():
    slots = DecodeReservations("decode")
    assert asyncio.run(slots.view(_req(10))) is None  # no request router attached yet
    view = RoomView(("a", "b"), (_room("a"), _room("b")), {"a": 200})
    slots.attach(_Source(view))
    first = slots.reserve(_req(4_000), asyncio.run(slots.view(_req(4_000))), output_tokens=100)
    assert (first.replica_id, first.tokens, first.cached_tokens) == ("a", 3_900, 200)
    second = slots.reserve(_req(4_000), view, output_tokens=100)
    assert second.replica_id == "a"  # 10 000 - 3 900 leaves room for 3 900 more
    third = slots.reserve(_req(4_000), view, output_tokens=100)
    assert third.replica_id == "b"  # a is full with what this router reserved there
    assert slots.held() == {"a": (2, 7_800), "b": (1, 4_100)}
    assert slots.release(first.key) and not slots.release(first.key)
    assert slots.held() == {"a": (1, 3_900), "b": (1, 4_100)}


def test_a_view_without_replicas_reserves_nothing():
    slots = DecodeReservations("decode")
    slots.attach(_Source(RoomView((), ())))
    assert asyncio.run(slots.view(_req(10))) is None


def test_a_release_wakes_a_waiter_on_another_thread():
    slots = DecodeReservations("decode")
    slots.attach(_Source(RoomView(("a",), (_room("a"),))))
    held = slots.reserve(_req(10), asyncio.run(slots.view(_req(10))), output_tokens=1)

    async def run():
        waiting = asyncio.create_task(slots.changed(timeout_s=60))
        await asyncio.sleep(0)
        await asyncio.to_thread(slots.release, held.key)  # like Serve's router thread
        await asyncio.wait_for(waiting, 10)

    asyncio.run(run())


def test_the_view_is_taken_on_the_request_routers_loop():
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    seen = []

    class _OnLoop(_Source):
        def room_view(self, req):
            seen.append(threading.current_thread())
            return super().room_view(req)

    slots = DecodeReservations("decode")
    slots.attach(_OnLoop(RoomView(("a",), (_room("a"),)), loop=loop))
    try:
        assert asyncio.run(slots.view(_req(10))).ranking == ("a",)
        assert seen == [thread]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    loop.close()
    assert asyncio.run(slots.view(_req(10))) is None  # its loop is gone: nothing to ask
