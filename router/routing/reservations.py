"""A decode pool's reservations in one router process: decode first, before a remote prefill.

    slots = pool_reservations(app, "decode")          # shared by the dispatcher and the router
    view = await slots.view(req)                      # None: the pool's router is not up yet
    held = slots.reserve(req, view, output_tokens)    # None: no replica has room now
    ... prefill, then send the decode request pinned to held.replica_id ...
    slots.release(held.key)                           # when routed, or the request ends

The pool's request router (`router/replica_router.PolicyRequestRouter`) attaches itself here
(`attach`): it knows the pool's current replicas, Serve's queue lengths, the replicas' routing
stats and the policy's ranking, and gives them as a `RoomView`. The decision is the pure
`decode_room.pick_decode_replica`; this class only adds the reservations this process holds and
records the new one. A reservation is released when its decode request is routed (the request
router's `on_request_routed`), and by the dispatcher when the request's first decode chunk
arrives or the request ends, fails or is cancelled, whichever comes first (`release` is
idempotent), so none outlives its request.

Thread safety: Serve runs the request router on its own event loop thread, apart from the
dispatcher's. `view` asks for the router's view on that loop (between two routing decisions,
so the policy's state is never read while it changes); the other methods take one lock and never
block on I/O; `changed` wakes waiters on any loop.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from splitserve.router.routing.decode_room import DecodeRoom, kv_need, pick_decode_replica
from splitserve.router.routing.per_pool import PerPool

# The request router's loop answers `view` between two routing decisions (microseconds); past
# this it is taken as stuck or gone, and the request is routed as if nothing could be reserved.
VIEW_TIMEOUT_S = 5.0

from splitserve.engine.messages import GenerateRequest


@dataclass(frozen=True)
class RoomView:
    """The pool as its request router sees it now: the policy's ranking for the request (best
    first), each replica's room (without this process's reservations), and the prompt tokens
    each replica holds cached (from the engines' KV events; absent: 0)."""

    ranking: tuple[str, ...]
    rooms: tuple[DecodeRoom, ...]
    cached_tokens: Mapping[str, int] = field(default_factory=dict)


class RoomSource(Protocol):
    """What the pool's request router offers the reservations. `loop`: the event loop it routes
    on (None: call it from any thread)."""

    loop: asyncio.AbstractEventLoop | None

    def room_view(self, req: GenerateRequest) -> RoomView | None:
        """The pool's replicas for `req` now; None when it knows of none yet."""
        ...


@dataclass(frozen=True)
class Reservation:
    """A slot and `tokens` of KV held on `replica_id` for one request (`key`), which holds
    `cached_tokens` of its prompt there."""

    key: str
    replica_id: str
    tokens: int
    cached_tokens: int = 0


class DecodeReservations:
    """One decode pool's reservations in this process, and the request router that sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._source: RoomSource | None = None
        self._held: dict[str, Reservation] = {}
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def attach(self, source: RoomSource) -> None:
        """`source` now routes the pool's requests in this process (the latest one wins: each
        deployment handle has a request router, and the dispatcher's routes the most)."""
        self._source = source

    async def view(self, req: GenerateRequest) -> RoomView | None:
        """The attached request router's view for `req`, taken on its loop; None without one,
        without replicas, or when its loop does not answer (then nothing is reserved and Serve
        routes as it would)."""
        source = self._source
        if source is None:
            return None
        loop = getattr(source, "loop", None)
        if loop is None or loop is asyncio.get_running_loop():
            view = source.room_view(req)
        else:
            async def on_its_loop() -> RoomView | None:
                return source.room_view(req)

            ask = on_its_loop()
            try:
                asked = asyncio.run_coroutine_threadsafe(ask, loop)
            except RuntimeError:  # its loop is closed: the coroutine never runs
                ask.close()
                return None
            try:
                view = await asyncio.wait_for(asyncio.wrap_future(asked), VIEW_TIMEOUT_S)
            except (TimeoutError, RuntimeError):  # stuck, or closed meanwhile
                return None
        return view if view is not None and view.rooms else None

    def reserve(self, req: GenerateRequest, view: RoomView,
                output_tokens: int) -> Reservation | None:
        """Reserve the best-ranked replica with a slot and KV room for `req` (its prompt and
        `output_tokens`), counting the reservations held; None when none has room."""
        n_prompt = len(req.prompt_token_ids)
        need = {room.replica_id: kv_need(n_prompt, view.cached_tokens.get(room.replica_id, 0),
                                         output_tokens) for room in view.rooms}
        with self._lock:
            rooms = [self._with_held(room) for room in view.rooms]
            rid = pick_decode_replica(view.ranking, rooms, need)
            if rid is None:
                return None
            held = Reservation(uuid.uuid4().hex, rid, need[rid], view.cached_tokens.get(rid, 0))
            self._held[held.key] = held
            return held

    def release(self, key: str) -> bool:
        """Give back reservation `key` (False when it was released already); wakes waiters."""
        with self._lock:
            released = self._held.pop(key, None) is not None
        if released:
            self.notify()
        return released

    def held(self) -> dict[str, tuple[int, int]]:
        """Per replica: (reservations, KV tokens) held now."""
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for r in self._held.values():
                n, tokens = out.get(r.replica_id, (0, 0))
                out[r.replica_id] = (n + 1, tokens + r.tokens)
        return out

    def notify(self) -> None:
        """Something freed room (a reservation released, a stream ended): wake the waiters."""
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its waiter is gone
                pass

    async def changed(self, timeout_s: float) -> None:
        """Return at the next `notify` or after `timeout_s`, whichever is first."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def _with_held(self, room: DecodeRoom) -> DecodeRoom:
        n = tokens = 0
        for r in self._held.values():
            if r.replica_id == room.replica_id:
                n, tokens = n + 1, tokens + r.tokens
        return replace(room, reserved_requests=room.reserved_requests + n,
                       reserved_tokens=room.reserved_tokens + tokens)


_POOLS: PerPool[DecodeReservations] = PerPool(DecodeReservations)


def pool_reservations(app: str, deployment: str) -> DecodeReservations:
    """The process's reservations of one decode deployment (made on first use, shared after):
    the pool's request router attaches to it, the dispatcher reserves through it."""
    return _POOLS.get(app, deployment)
