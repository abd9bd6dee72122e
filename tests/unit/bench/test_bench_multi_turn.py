"""The multi-turn conversation workload: seeded generation, growing histories, tenants' distinct
prefixes, the working-set figure, and the closed-loop replay's prompts (against a fake server)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from splitserve.bench.multi_turn import (
    Conversation,
    MultiTurnSpec,
    build_conversations,
    history_tokens,
    turn_prompt,
    working_set,
)
from splitserve.bench.multi_turn_replay import (
    measured_working_set,
    replay_conversations,
    summarize_turns,
)
from splitserve.bench.workload import LengthSpec
from tests.unit.bench.bench_fakes import FakeServer, reply_ids


def spec(**kw) -> MultiTurnSpec:
    base = {
        "users": 30, "tenants": 3, "turns": LengthSpec.parse("2-5"),
        "system_len": LengthSpec.parse("40-80"), "message_len": LengthSpec.parse("5-20"),
        "reply_len": LengthSpec.parse("3-8"), "arrival_rate": 4.0, "think_s": 0.5,
        "max_context": 2048, "seed": 0,
    }
    return MultiTurnSpec(**{**base, **kw})


def fake_replies(conv: Conversation) -> list[tuple[int, ...]]:
    return [tuple(range(100 + j, 100 + j + n)) for j, n in enumerate(conv.reply_lens)]


def test_same_seed_same_conversations_other_seed_differs():
    a, b, c = (build_conversations(spec()), build_conversations(spec()),
               build_conversations(spec(seed=1)))
    assert a == b
    assert [x.messages for x in a] != [x.messages for x in c]
    assert [x.arrival_s for x in a] != [x.arrival_s for x in c]


def test_one_users_conversation_does_not_depend_on_the_number_of_users():
    few, many = build_conversations(spec(users=5)), build_conversations(spec(users=40))
    assert [c.messages for c in few] == [c.messages for c in many[:5]]


def test_each_turn_extends_the_previous_prompt_and_reply():
    for conv in build_conversations(spec()):
        replies = fake_replies(conv)
        prev = None
        for turn in range(conv.turns):
            prompt = turn_prompt(conv, turn, replies)
            assert prompt[: len(conv.system)] == conv.system
            assert prompt[-len(conv.messages[turn]):] == conv.messages[turn]
            if prev is not None:
                head = prev + replies[turn - 1]
                assert prompt[: len(head)] == head and len(prompt) > len(head)
            assert len(prompt) + conv.reply_lens[turn] == history_tokens(conv, turn + 1)
            prev = prompt


def test_turn_prompt_needs_the_earlier_replies():
    conv = next(c for c in build_conversations(spec()) if c.turns >= 2)
    with pytest.raises(ValueError):
        turn_prompt(conv, 1, [])
    with pytest.raises(IndexError):
        turn_prompt(conv, conv.turns, fake_replies(conv))


def test_tenants_share_their_system_prompt_and_no_prefix_with_others():
    convs = build_conversations(spec(users=60))
    systems = {c.tenant: c.system for c in convs}
    assert len(systems) == 3
    assert all(c.system == systems[c.tenant] for c in convs)
    firsts = {s[:8] for s in systems.values()}  # no two tenants start alike
    assert len(firsts) == 3


def test_every_turn_fits_the_context_and_long_conversations_are_cut():
    s = spec(turns=LengthSpec.parse("20"), message_len=LengthSpec.parse("30"), max_context=400)
    convs = build_conversations(s)
    assert all(history_tokens(c, c.turns) <= 400 for c in convs)
    assert all(c.turns < 20 for c in convs)
    # the next turn (30-token message, reply of at most 8) might not have fitted
    assert all(history_tokens(c, c.turns) + 30 + 8 > 400 for c in convs)
    assert all(len(c.think_s) == c.turns - 1 for c in convs)


def test_arrivals_poisson_or_all_at_once():
    convs = build_conversations(spec())
    times = [c.arrival_s for c in convs]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert {c.arrival_s for c in build_conversations(spec(arrival_rate=math.inf))} == {0.0}


def test_working_set_all_at_once_without_thinking_is_every_history():
    s = spec(arrival_rate=math.inf, think_s=0.0)
    convs = build_conversations(s)
    ws = working_set(convs)
    assert ws.total_tokens == sum(history_tokens(c, c.turns) for c in convs)
    assert ws.peak_live_tokens == ws.total_tokens
    systems = {c.tenant: len(c.system) for c in convs}
    shared = sum(len(c.system) for c in convs) - sum(systems.values())
    assert ws.peak_live_unique_tokens == ws.total_tokens - shared
    assert ws.exceeds(ws.peak_live_unique_tokens - 1) and not ws.exceeds(ws.total_tokens)


def test_working_set_of_users_one_after_another_is_the_largest_history():
    s = spec(arrival_rate=0.001, think_s=0.0)  # ~1000 s apart, each over at once
    convs = build_conversations(s)
    ws = working_set(convs)
    assert ws.peak_live_tokens == max(history_tokens(c, c.turns) for c in convs)
    assert ws.peak_live_unique_tokens == ws.peak_live_tokens


def test_working_set_counts_the_history_held_at_each_moment():
    sys_ = tuple(range(10, 20))
    a = Conversation(0, 0, 0.0, sys_, ((1,) * 5, (2,) * 5), (4, 4), (10.0,))
    b = Conversation(1, 0, 5.0, sys_, ((3,) * 7,), (2,), ())
    # t=0: a holds 10+5+4=19; t=5: + b's 10+7+2=19 (b ends at once); t=10: a's 28
    ws = working_set([a, b])
    assert (ws.total_tokens, ws.peak_live_tokens, ws.peak_live_unique_tokens) == (47, 38, 28)


def test_replay_sends_each_turn_with_the_servers_reply_and_the_tenants_key():
    convs = build_conversations(spec(users=6, arrival_rate=math.inf, think_s=0.0))
    server = FakeServer()
    keys = {"tenant-0": "k0", "tenant-1": "k1", "tenant-2": "k2"}
    turns, _ = asyncio.run(replay_conversations(
        "http://fake/v1", "m", keys, convs, transport=server.transport()))
    assert len(turns) == sum(c.turns for c in convs) == len(server.bodies)
    by_prompt = {tuple(b["prompt"]): (b, auth) for b, auth in zip(server.bodies, server.auth)}
    for conv in convs:
        replies: list[tuple[int, ...]] = []
        for turn in range(conv.turns):
            prompt = turn_prompt(conv, turn, replies)
            body, auth = by_prompt[prompt]  # the server saw exactly this history
            assert body["return_token_ids"] and body["max_tokens"] == conv.reply_lens[turn]
            assert auth == f"Bearer k{conv.tenant}"
            replies.append(tuple(reply_ids(list(prompt), conv.reply_lens[turn])))
    summary = summarize_turns(turns)
    assert summary["failed"] == 0 and summary["turns"] == len(turns)
    assert [t.turn for t in turns if t.user == convs[0].user] == list(range(convs[0].turns))
    measured = measured_working_set(convs, turns)
    assert measured.total_tokens == working_set(convs).total_tokens
    assert 0 < measured.peak_live_unique_tokens <= measured.peak_live_tokens
    assert measured_working_set(convs, turns[:1]).total_tokens == turns[0].result.prompt_tokens \
        + turns[0].result.max_tokens


def test_spec_rejects_bad_values():
    with pytest.raises(ValueError):
        spec(users=0)
    with pytest.raises(ValueError):
        spec(arrival_rate=0.0)
    with pytest.raises(ValueError):
        replace(spec(), token_range=(5, 5))


def test_bench_cli_options_describe_the_workload():
    import argparse

    from splitserve.bench.cli import add_arguments
    from splitserve.bench.multi_turn_cli import spec_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--workload", "multi_turn", "--users", "7", "--turns", "2-3",
                         "--think-s", "0", "--max-context", "900", "--seed", "3"])
    s = spec_from_args(args, tenants=2)
    assert (s.users, s.tenants, str(s.turns), s.think_s, s.max_context, s.seed) == (
        7, 2, "2-3", 0.0, 900, 3)
    assert len(build_conversations(s)) == 7
