"""A token bucket: the per-minute limits' arithmetic, pure and clock-free (time is passed in).

A limit of L per minute is a bucket of capacity L refilled at L/60 per second: a full minute's
budget may be spent at once, and an empty bucket is full again 60 s later. Taking more than the
level is allowed (the level goes negative) so that a request that used more than it reserved is
still charged; later requests then wait for the debt to refill.
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_MINUTE = 60.0


@dataclass
class TokenBucket:
    """Invariants: `level <= capacity`; `stamp` never moves backwards (a clock that does is
    treated as standing still)."""

    capacity: float
    refill_per_s: float
    level: float
    stamp: float

    @classmethod
    def per_minute(cls, limit: float, now: float) -> TokenBucket:
        """A full bucket for `limit` per minute."""
        return cls(capacity=limit, refill_per_s=limit / SECONDS_PER_MINUTE, level=limit, stamp=now)

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.refill_per_s)
            self.stamp = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds from `now` until `amount` can be taken (0 when it can be now).

        An amount over the capacity needs a full bucket (and then drives it negative), so that
        it is admitted at the right average rate instead of never.
        """
        self._refill(now)
        deficit = min(amount, self.capacity) - self.level
        return 0.0 if deficit <= 0 else deficit / self.refill_per_s

    def available(self, now: float) -> float:
        """The level at `now` (what may be taken at once; negative while in debt)."""
        self._refill(now)
        return self.level

    def take(self, amount: float, now: float) -> None:
        """Spend `amount` (the level may go negative)."""
        self._refill(now)
        self.level -= amount

    def give(self, amount: float, now: float) -> None:
        """Return `amount` (an over-reservation), up to the capacity."""
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)
