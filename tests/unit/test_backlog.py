"""A pool's prompt backlog drains oldest first at the pool's measured prefill rate, so a queue
that is partly done counts what is left of it, not every prompt in full."""

from __future__ import annotations

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
