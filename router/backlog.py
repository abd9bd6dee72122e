"""The prompt tokens a pool still has to prefill for this router (pure: the caller passes the
clock and the pool's measured prefill rate).

A prompt counts from the moment it is sent until the pool's answer for it comes back (its first
token, or a remote prefill's handoff). Counting it in full for all that time makes a queue that
is half done look twice as long, so the backlog is drained, oldest prompt first, at the rate the
pool's engines prefill (`EngineCost.prefill_rate`, measured while serving). A router sees only
its own traffic: with several router replicas, each drains its share at the full rate, an
optimistic bound the next answer corrects.
"""

from __future__ import annotations

import math
from collections.abc import Hashable


class Backlog:
    """Prompt tokens left to prefill per request in flight, oldest first."""

    def __init__(self) -> None:
        self._left: dict[Hashable, float] = {}  # insertion order: the order prompts were sent
        self._at: float | None = None

    def add(self, key: Hashable, tokens: int, now: float, rate: float) -> None:
        """A prompt of `tokens` was sent to the pool (`rate`: its prefill tokens/s, 0: unknown)."""
        self._drain(now, rate)
        self._left[key] = float(max(tokens, 0))

    def remove(self, key: Hashable, now: float, rate: float) -> None:
        """The pool answered the prompt `key` (or it ended): it no longer counts."""
        self._drain(now, rate)
        self._left.pop(key, None)

    def tokens(self, now: float, rate: float) -> int:
        """The tokens still to prefill at `now`."""
        self._drain(now, rate)
        return math.ceil(sum(self._left.values()) - 1e-6)

    def __len__(self) -> int:
        return len(self._left)

    def _drain(self, now: float, rate: float) -> None:
        if self._at is not None and rate > 0 and now > self._at:
            budget = (now - self._at) * rate
            for key, left in self._left.items():
                if budget <= 0:
                    break
                take = min(left, budget)
                self._left[key] = left - take
                budget -= take
        self._at = now if self._at is None else max(self._at, now)
