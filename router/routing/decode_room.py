"""Decode first: which decode replica can take a request, decided before its remote prefill.

    rooms = [DecodeRoom("r1", queue_depth=3, max_ongoing=64, kv_usage=0.4,
                        kv_capacity_tokens=524_288, reserved_requests=1, reserved_tokens=900)]
    need = kv_need(prompt_tokens=1536, cached_tokens=512, output_tokens=128)
    replica = pick_decode_replica(ranking, rooms, need)     # None: no replica has room

The rule: walk the pool's policy ranking (best first) and take the first replica that has a
slot and KV room for the request. A slot: its requests in flight (Serve's queue length) plus the
reservations this router holds on it stay under Serve's `max_ongoing_requests`. KV room: its free
KV (capacity x (1 - usage), as the engine last reported, minus this router's reservations there)
holds the prompt's tokens it lacks (the prompt minus its cached prefix there) plus the output
tokens reserved. A replica with nothing running and nothing reserved always has room (vLLM
runs a request that fits its context on an empty engine; stale usage figures must not starve an
idle replica), and so does one whose capacity is not reported yet (0: unknown). None when no
replica qualifies: the request then waits instead of prefilling a KV cache nobody can take.

The output share (`reserved_output`): a stream's KV grows one token a step up to its output
budget; reserving the whole budget of every request (a request without `max_tokens` gets what
its context leaves) would refuse requests an engine can run, since vLLM admits on the prompt and
preempts a stream whose growth finds no room. So the reservation is the budget capped by the
mean output length measured so far (what a stream holds on average), or the whole budget
before any stream ended.

Pure: plain values in, a replica id out; the reservations' owner (`reservations`) and the
pool's request router (`router/replica_router.py`) gather the inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeRoom:
    """One decode replica's slots and KV as this router sees them.

    `queue_depth`: requests sent to it and not finished (Serve's queue-length cache, or the
    engine's unfinished count). `max_ongoing`: Serve's `max_ongoing_requests` (None: no limit
    known). `kv_usage`: the fraction of its KV cache in use (0..1) and `kv_capacity_tokens`
    its whole KV cache in tokens (0: unknown), both from its last routing stats.
    `reserved_requests`, `reserved_tokens`: what this router reserved there and has not yet
    routed.
    """

    replica_id: str
    queue_depth: int = 0
    max_ongoing: int | None = None
    kv_usage: float = 0.0
    kv_capacity_tokens: int = 0
    reserved_requests: int = 0
    reserved_tokens: int = 0

    def has_slot(self) -> bool:
        """Is a request slot free, counting this router's reservations?"""
        return self.max_ongoing is None or (
            self.queue_depth + self.reserved_requests < self.max_ongoing)

    def free_kv_tokens(self) -> int | None:
        """KV tokens free for a new request after the reservations (None: capacity unknown)."""
        if self.kv_capacity_tokens <= 0:
            return None
        usage = min(max(self.kv_usage, 0.0), 1.0)
        return int(self.kv_capacity_tokens * (1.0 - usage)) - self.reserved_tokens

    def has_room(self, need_tokens: int) -> bool:
        """Can it take a request needing `need_tokens` of KV now (slot and KV room)?"""
        if not self.has_slot():
            return False
        if self.queue_depth == 0 and self.reserved_requests == 0:
            return True  # idle: the engine runs what fits its context
        free = self.free_kv_tokens()
        return free is None or need_tokens <= free


def reserved_output(max_tokens: int, mean_output: int | None) -> int:
    """The output tokens to reserve KV for: the budget, capped by the mean output length
    measured so far (None: none measured yet, the whole budget)."""
    budget = max(max_tokens, 0)
    return budget if mean_output is None else min(budget, max(mean_output, 0))


def kv_need(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> int:
    """The KV tokens a request takes on a replica: the prompt tokens it does not hold yet
    (pulled from prefill or computed there) plus the output tokens reserved."""
    return max(prompt_tokens - max(cached_tokens, 0), 0) + max(output_tokens, 0)


def pick_decode_replica(
    ranking: Sequence[str], rooms: Iterable[DecodeRoom], need_tokens: dict[str, int]
) -> str | None:
    """The best-ranked replica with a slot and KV room for the request, or None.

    `ranking`: the pool's policy ranking of the replicas, best first (ids not in `rooms` are
    skipped). `need_tokens`: per replica, the KV tokens the request takes there (`kv_need`;
    it differs per replica by the prefix each one holds).
    """
    by_id = {room.replica_id: room for room in rooms}
    for rid in ranking:
        room = by_id.get(rid)
        if room is not None and room.has_room(need_tokens.get(rid, 0)):
            return rid
    return None
