"""The live pace meter (router/pace.py): token-weighted seconds per output token over a window."""

from __future__ import annotations

import pytest

from splitserve.router.pace import PaceMeter


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_pace_is_gaps_over_tokens_within_the_window():
    clock = _Clock()
    m = PaceMeter(window_s=2.0, clock=clock)
    assert m.pace() == 0.0  # nothing seen: nothing slow
    m.add(0.04, 1)
    m.add(0.20, 4)  # a coalesced chunk of 4 tokens after 200 ms: 50 ms per token
    assert m.pace() == pytest.approx(0.24 / 5)
    clock.t += 1.5
    m.add(0.09, 1)
    assert m.pace() == pytest.approx(0.33 / 6)
    clock.t += 0.6  # the first two chunks are now older than the window
    assert m.pace() == pytest.approx(0.09)
    clock.t += 5
    assert m.pace() == 0.0  # the pool went quiet: the pace resets, no drift left behind


def test_empty_or_negative_chunks_are_ignored_and_the_window_must_be_positive():
    m = PaceMeter(clock=_Clock())
    m.add(0.5, 0)  # a chunk without tokens (a finish reason alone)
    m.add(-0.1, 1)
    assert m.pace() == 0.0
    with pytest.raises(ValueError, match="window_s"):
        PaceMeter(window_s=0)
