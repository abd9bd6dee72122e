"""The prompt tokens a pool still has to prefill for this router, and the rate it answers them
at (pure: the caller passes the clock and the pool's modelled prefill rate).

A prompt counts from the moment it is sent until the pool's answer for it comes back (its first
token, or a remote prefill's handoff). Counting it in full for all that time makes a queue that
is half done look twice as long, so the backlog drains, oldest prompt first, at the rate the pool
answers prompts: measured over the recent answers (`served_rate`: each answer's tokens over the
time since the later of its sending and the answer before it, so a pool that sat idle is not
charged for it, less the hop's own overhead for a prompt that waited behind none), or, before
enough answers, the engines' step model (`EngineCost.prefill_rate`). The measured rate holds
what the step model does not: a prefill engine that also serves KV reads and whole requests, a
busy host. A router sees only its own traffic: with several
router replicas, each drains its share at the rate its answers come.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

# Recent answers the served rate is measured over, and the fewest it is trusted with.
WINDOW = 32
MIN_ANSWERS = 4


class Backlog:
    """Prompt tokens left to prefill per request in flight, oldest first."""

    def __init__(self, window: int = WINDOW) -> None:
        self._left: dict[Hashable, float] = {}  # insertion order: the order prompts were sent
        self._sent: dict[Hashable, tuple[int, float]] = {}  # tokens, when sent
        self._at: float | None = None
        self._answered_at: float | None = None
        self._served: deque[tuple[int, float]] = deque(maxlen=window)  # tokens, seconds

    def add(self, key: Hashable, tokens: int, now: float, rate: float) -> None:
        """A prompt of `tokens` was sent to the pool (`rate`: its modelled prefill tokens/s,
        0: unknown)."""
        self._drain(now, rate)
        self._left[key] = float(max(tokens, 0))
        self._sent[key] = (max(tokens, 0), now)

    def answered(self, key: Hashable, now: float, rate: float, hop_s: float = 0.0) -> None:
        """The pool answered the prompt `key`: it no longer counts, and its time is a sample of
        the rate the pool answers at. `hop_s`: the measured overhead of a call to the pool,
        left out of a prompt that waited for no other answer (behind one, the hop overlaps
        the prompt before)."""
        sent = self._sent.get(key)
        if sent is not None:
            tokens, at = sent
            start = at if self._answered_at is None else max(at, self._answered_at)
            own_hop = hop_s if start == at else 0.0
            self._served.append((tokens, max(now - start - own_hop, 0.0)))
            self._answered_at = now if self._answered_at is None else max(self._answered_at, now)
        self.remove(key, now, rate)

    def remove(self, key: Hashable, now: float, rate: float) -> None:
        """The prompt `key` ended without an answer (failed, cancelled), or was answered."""
        self._drain(now, rate)
        self._left.pop(key, None)
        self._sent.pop(key, None)

    def served_rate(self) -> float | None:
        """The tokens/s the pool answered the recent prompts at; None before `MIN_ANSWERS`."""
        if len(self._served) < MIN_ANSWERS:
            return None
        seconds = sum(s for _, s in self._served)
        return sum(t for t, _ in self._served) / seconds if seconds > 0 else None

    def tokens(self, now: float, rate: float) -> int:
        """The tokens still to prefill at `now`."""
        self._drain(now, rate)
        return math.ceil(sum(self._left.values()) - 1e-6)

    def __len__(self) -> int:
        return len(self._left)

    def _drain(self, now: float, rate: float) -> None:
        speed = self.served_rate() or rate
        if self._at is not None and speed > 0 and now > self._at:
            budget = (now - self._at) * speed
            for key, left in self._left.items():
                if budget <= 0:
                    break
                take = min(left, budget)
                self._left[key] = left - take
                budget -= take
        self._at = now if self._at is None else max(self._at, now)
