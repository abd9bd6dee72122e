"""The usage board and a replica's publisher, with a fake board handle (no Ray)."""

from __future__ import annotations

import asyncio
from typing import Any

from splitserve.router.usage_board import UsageBoard, UsagePublisher


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: Any):
        async def call():
            return self.fn(*args)

        return call()


class FakeHandle:
    """Looks like a Ray actor handle of a `UsageBoard`: `handle.method.remote(...)` awaits."""

    def __init__(self, board: UsageBoard, broken: bool = False) -> None:
        self.board, self.broken = board, broken

    def __getattr__(self, name: str) -> _Method:
        def call(*args: Any):
            if self.broken:
                raise RuntimeError("board died")
            return getattr(self.board, name)(*args)

        return _Method(call)


def test_board_keeps_the_latest_snapshot_per_replica() -> None:
    clock = FakeClock()
    board = UsageBoard(clock)
    board.publish("r1", {"n": 1})
    clock.now = 2.0
    board.publish("r2", {"n": 5})
    board.publish("r1", {"n": 2})
    clock.now = 3.0
    assert sorted(board.snapshots(), key=lambda e: e[0]["n"]) == [({"n": 2}, 1.0), ({"n": 5}, 1.0)]


def test_collect_publishes_first_then_reads_every_replica() -> None:
    board = UsageBoard()
    board.publish("other", {"usage": {"a": {"requests": 4}}, "quota": {}})
    mine = {"usage": {"a": {"requests": 1}}, "quota": {}}
    pub = UsagePublisher(lambda: mine, "me", board=lambda: FakeHandle(board))
    snaps, scope = asyncio.run(pub.collect())
    assert scope == "cluster"
    assert sorted(s.usage["a"]["requests"] for s in snaps) == [1, 4]


def test_an_unreachable_board_falls_back_to_this_replica_and_is_looked_up_again() -> None:
    board = UsageBoard()
    handles = [FakeHandle(board, broken=True), FakeHandle(board)]
    lookups: list[FakeHandle] = []

    def lookup() -> FakeHandle:
        lookups.append(handles[len(lookups)])
        return lookups[-1]

    mine = {"usage": {"a": {"requests": 1}}, "quota": {}}
    pub = UsagePublisher(lambda: mine, "me", board=lookup)
    snaps, scope = asyncio.run(pub.collect())
    assert scope == "replica" and [s.usage for s in snaps] == [mine["usage"]]
    snaps, scope = asyncio.run(pub.collect())  # a fresh lookup reaches the restarted board
    assert scope == "cluster" and len(lookups) == 2


def test_start_publishes_in_the_background() -> None:
    board = UsageBoard()
    pub = UsagePublisher(lambda: {"usage": {}, "quota": {}}, "me",
                         board=lambda: FakeHandle(board), interval_s=0.01)

    async def run() -> None:
        assert pub.loop.start()
        assert pub.loop.start()  # idempotent
        for _ in range(200):
            if board.snapshots():
                return
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert len(board.snapshots()) == 1


def test_a_silent_board_times_out_to_this_replica() -> None:
    class Silent:
        """Every call waits an hour."""

        def __getattr__(self, name: str):
            return type("M", (), {"remote": staticmethod(lambda *a: asyncio.sleep(3600))})

    mine = {"usage": {}, "quota": {}}
    pub = UsagePublisher(lambda: mine, "me", board=Silent, timeout_s=0.05)
    snaps, scope = asyncio.run(pub.collect())
    assert scope == "replica" and len(snaps) == 1
