"""Live decode pace: seconds per output token of a pool's streams, as the router sees them.

Every streamed chunk after a request's first carries `k` tokens after a gap of `g` seconds
since the previous one; a pool's pace over the last `window_s` is the sum of those gaps over
the sum of those tokens, i.e. the time per output token (TPOT) its streams are getting now,
weighted by tokens, coalesced chunks included (`router/coalescing.py`). It is what the
conditional policy compares with the TPOT SLO (`router/policy.py`, the slow-decode rule): a
decode pool slower than its share of the SLO, for whatever reason (more streams than its
engines' step can carry, a shared host's cores taken by other work), hands whole requests to a
prefill pool whose streams are faster.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class PaceMeter:
    """Token-weighted seconds per output token of one pool's chunks over a sliding window.

    `add` is called once per chunk on the request path (O(1) amortized); `pace` reads it.
    With no chunk in the window the pace is 0.0: no stream there, nothing slow.
    """

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.clock = clock
        self._chunks: deque[tuple[float, float, int]] = deque()  # (time, gap_s, tokens)
        self._gap_s = 0.0
        self._tokens = 0

    def add(self, gap_s: float, tokens: int) -> None:
        """A chunk of `tokens` tokens arrived `gap_s` seconds after its stream's previous one."""
        if tokens <= 0 or gap_s < 0:
            return
        self._chunks.append((self.clock(), gap_s, tokens))
        self._gap_s += gap_s
        self._tokens += tokens
        self._expire()

    def pace(self) -> float:
        """Seconds per output token over the window; 0.0 without chunks in it."""
        self._expire()
        return self._gap_s / self._tokens if self._tokens else 0.0

    def _expire(self) -> None:
        horizon = self.clock() - self.window_s
        chunks = self._chunks
        while chunks and chunks[0][0] < horizon:
            _, gap_s, tokens = chunks.popleft()
            self._gap_s -= gap_s
            self._tokens -= tokens
        if not chunks:
            self._gap_s, self._tokens = 0.0, 0  # no float drift across idle periods
