"""A pool's prompt backlog drains oldest first at the pool's measured prefill rate, so a queue
that is partly done counts what is left of it, not every prompt in full."""

from __future__ import annotations

import pytest
from splitserve.router.backlog import Backlog
from splitserve.router.policy import EngineCost


def test_the_oldest_prompt_drains_first_and_an_answered_one_stops_counting():
    b = Backlog()
    b.add("a", 1000, now=0.0, rate=1000.0)
    b.add("b", 500, now=0.5, rate=1000.0)  # "a" has 500 left
    assert b.tokens(0.5, 1000.0) == 1000
    assert b.tokens(1.0, 1000.0) == 500  # "a" done, "b" untouched
    assert b.tokens(1.2, 1000.0) == 300
    b.remove("b", now=1.2, rate=1000.0)
    assert b.tokens(1.2, 1000.0) == 0 and len(b) == 1  # "a" counts 0 until it is answered
    b.remove("a", now=1.2, rate=1000.0)
    assert len(b) == 0


def test_an_unmeasured_rate_counts_every_prompt_in_full_and_idle_time_is_no_credit():
    b = Backlog()
    b.add("a", 700, now=0.0, rate=0.0)
    assert b.tokens(100.0, 0.0) == 700  # no rate: nothing drains
    b.remove("a", now=100.0, rate=1000.0)
    b.add("b", 300, now=200.0, rate=1000.0)  # an empty backlog banks nothing while idle
    assert b.tokens(200.0, 1000.0) == 300
    assert b.tokens(200.1, 1000.0) == 200


def test_a_clock_that_goes_back_drains_nothing():
    b = Backlog()
    b.add("a", 100, now=5.0, rate=1000.0)
    assert b.tokens(4.0, 1000.0) == 100
    assert b.tokens(5.05, 1000.0) == 50


def test_the_prefill_rate_is_full_chunks_beside_the_decoding_sequences():
    cost = EngineCost(step_s=0.001, per_seq_s=0.001, per_token_s=1e-4, chunk_tokens=2048)
    assert cost.prefill_rate(0) == 2048 / (0.001 + 0.2048)
    # 48 sequences take 48 of the chunk's tokens and add their per-sequence cost
    assert cost.prefill_rate(48) == 2000 / (0.001 + 0.048 + 0.2)


def test_the_served_rate_is_measured_from_answers_without_the_idle_time_between_them():
    b = Backlog()
    assert b.served_rate() is None
    # four prompts of 1000 tokens, answered 0.5 s apart back to back: 2000 tokens/s
    for i in range(4):
        b.add(i, 1000, now=0.0, rate=10_000.0)
    for i in range(4):
        b.answered(i, now=0.5 * (i + 1), rate=10_000.0)
    assert b.served_rate() == pytest.approx(2000.0)
    # an idle minute, then one prompt answered 0.5 s after it was sent: idle is not charged
    b.add("late", 1000, now=62.0, rate=10_000.0)
    b.answered("late", now=62.5, rate=10_000.0)
    assert b.served_rate() == pytest.approx(2000.0)
    # a prompt that failed is no sample
    b.add("failed", 1000, now=70.0, rate=10_000.0)
    b.remove("failed", now=90.0, rate=10_000.0)
    assert b.served_rate() == pytest.approx(2000.0) and len(b) == 0


def test_once_measured_the_backlog_drains_at_the_served_rate_not_the_model_s():
    b = Backlog()
    for i in range(4):
        b.add(i, 100, now=float(i), rate=1e6)
        b.answered(i, now=i + 0.1, rate=1e6)  # 1000 tokens/s served
    b.add("q", 500, now=10.0, rate=1e6)
    assert b.tokens(10.2, 1e6) == 300  # 0.2 s at 1000 tokens/s, not at the model's 1e6


def test_the_hop_s_overhead_is_left_out_of_a_prompt_that_waited_behind_none():
    b = Backlog()
    for i in range(4):  # each alone: 0.15 s answers of which 0.05 s are the hop
        b.add(i, 1000, now=10.0 * i, rate=0.0)
        b.answered(i, now=10.0 * i + 0.15, rate=0.0, hop_s=0.05)
    assert b.served_rate() == pytest.approx(10_000.0)
    b.add("a", 1000, now=50.0, rate=0.0)
    b.add("b", 1000, now=50.0, rate=0.0)
    b.answered("a", now=50.15, rate=0.0, hop_s=0.05)
    b.answered("b", now=50.25, rate=0.0, hop_s=0.05)  # behind "a": 0.1 s, no hop taken off
    assert b.served_rate() == pytest.approx(10_000.0)
