"""The multi-turn conversation workload (pure, no I/O): users of several tenants, each holding a
conversation whose every turn resends the whole history so far.

    convs = build_conversations(MultiTurnSpec(users=200, tenants=4, ...))
    prompt = turn_prompt(convs[0], 2, replies)   # replies: the ids the server generated

A conversation is a tenant's system prompt, then per turn a new user message and the
assistant's reply. Turn i's prompt is

    system + (message_0 + reply_0) + ... + (message_{i-1} + reply_{i-1}) + message_i

in token ids, so that turn i's prompt extends turn i-1's prompt + reply exactly: a server that
kept turn i-1's KV (prompt and generated tokens) serves turn i's history from its prefix cache.
Replies are the ids the server actually generated (greedy, `ignore_eos`: exactly `max_tokens`
of them), which the closed-loop replay (`multi_turn_replay`) feeds back; the generator fixes
everything else from the seed: system prompts (one per tenant, drawn independently, so tenants
share no prefix), messages, reply lengths, user arrivals (Poisson) and think times between a
reply and the next turn (exponential). A conversation ends before a turn whose prompt + reply
would pass `max_context` tokens.

`working_set` states the conversations' KV footprint under the nominal schedule (no service
time: user i is live from its arrival to its last turn), to compare with an engine's KV
capacity.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.bench.workload import DEFAULT_TOKEN_RANGE, LengthSpec


@dataclass(frozen=True)
class MultiTurnSpec:
    """What the users do; the seed fixes all of it (token ids are drawn from `token_range`)."""

    users: int
    tenants: int
    turns: LengthSpec  # turns per conversation (before the `max_context` cut)
    system_len: LengthSpec  # each tenant's system prompt
    message_len: LengthSpec  # each new user message
    reply_len: LengthSpec  # max_tokens of each turn (the reply's exact length)
    arrival_rate: float  # users per second (Poisson); math.inf: all at once
    think_s: float  # mean think time between a reply and the user's next turn (exponential)
    max_context: int  # prompt + reply of a turn stay within this many tokens
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or self.tenants < 1:
            raise ValueError("users and tenants must be >= 1")
        if not self.arrival_rate > 0 or self.think_s < 0:
            raise ValueError("arrival_rate must be > 0 (inf: all at once) and think_s >= 0")
        low, high = self.token_range
        if not 0 <= low < high:
            raise ValueError(f"token_range {self.token_range} must satisfy 0 <= low < high")
        for spec in (self.turns, self.system_len, self.message_len, self.reply_len):
            spec.check()


@dataclass(frozen=True)
class Conversation:
    """One user's conversation: its tenant, when it starts, and what the user will say.

    `think_s[i]` is the pause before turn i + 1 (after turn i's reply); `reply_lens[i]` is turn
    i's max_tokens. Every turn fits `max_context` (see `turn_prompt_len`).
    """

    user: int
    tenant: int
    arrival_s: float
    system: tuple[int, ...]
    messages: tuple[tuple[int, ...], ...]
    reply_lens: tuple[int, ...]
    think_s: tuple[float, ...]

    @property
    def turns(self) -> int:
        """Number of turns."""
        return len(self.messages)


def _ids(rng: np.random.Generator, low: int, high: int, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(low, high, size=n))


def turn_prompt_len(system: int, messages: Sequence[int], replies: Sequence[int], turn: int) -> int:
    """Prompt tokens of turn `turn` given the lengths of the system prompt, messages, replies."""
    return system + sum(messages[: turn + 1]) + sum(replies[:turn])


def _conversation(
    spec: MultiTurnSpec, user: int, tenant: int, arrival_s: float, system: tuple[int, ...],
    rng: np.random.Generator,
) -> Conversation:
    """User `user`'s conversation, cut before the first turn that would not fit max_context."""
    low, high = spec.token_range
    n = int(spec.turns.sample(rng, 1)[0])
    msg_lens = [int(x) for x in spec.message_len.sample(rng, n)]
    reply_lens = [int(x) for x in spec.reply_len.sample(rng, n)]
    thinks = rng.standard_exponential(n) * spec.think_s
    fits = 0
    while fits < n and (
        turn_prompt_len(len(system), msg_lens, reply_lens, fits) + reply_lens[fits]
        <= spec.max_context
    ):
        fits += 1
    messages = tuple(_ids(rng, low, high, k) for k in msg_lens[:fits])
    return Conversation(
        user, tenant, arrival_s, system, messages, tuple(reply_lens[:fits]),
        tuple(float(t) for t in thinks[: max(fits - 1, 0)]),
    )


def build_conversations(spec: MultiTurnSpec) -> list[Conversation]:
    """Every user's conversation, in arrival order; identical for identical specs. A user whose
    first turn does not fit `max_context` is left out (raise `max_context` or shorten)."""
    low, high = spec.token_range
    rng = np.random.default_rng([spec.seed, 30])
    systems = [_ids(rng, low, high, int(k)) for k in spec.system_len.sample(rng, spec.tenants)]
    owners = rng.integers(0, spec.tenants, spec.users)
    if math.isinf(spec.arrival_rate):
        arrivals = np.zeros(spec.users)
    else:
        gaps = rng.standard_exponential(spec.users - 1) / spec.arrival_rate
        arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    convs = []
    for user in range(spec.users):
        tenant = int(owners[user])
        conv = _conversation(
            spec, user, tenant, float(arrivals[user]), systems[tenant],
            np.random.default_rng([spec.seed, 31, user]),
        )
        if conv.turns:
            convs.append(conv)
    return convs


def turn_prompt(conv: Conversation, turn: int, replies: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Turn `turn`'s prompt: the system prompt, every earlier turn's message and reply (the
    server's ids, `replies[j]` for turn j), then this turn's message."""
    if not 0 <= turn < conv.turns:
        raise IndexError(f"conversation {conv.user} has {conv.turns} turns, not {turn + 1}")
    if len(replies) < turn:
        raise ValueError(f"turn {turn} needs the replies of turns 0..{turn - 1}")
    out = list(conv.system)
    for j in range(turn):
        out += conv.messages[j]
        out += replies[j]
    out += conv.messages[turn]
    return tuple(out)


def history_tokens(conv: Conversation, turns_done: int) -> int:
    """Tokens of the conversation after `turns_done` turns (prompt and reply of the last), under
    nominal reply lengths; the system prompt alone before any turn."""
    done = min(turns_done, conv.turns)
    return len(conv.system) + sum(map(len, conv.messages[:done])) + sum(conv.reply_lens[:done])


def turn_times(conv: Conversation) -> list[float]:
    """Nominal send time of each turn: arrival, then the think times (no service time)."""
    return [conv.arrival_s + float(t) for t in np.concatenate([[0.0], np.cumsum(conv.think_s)])]


@dataclass(frozen=True)
class WorkingSet:
    """The KV footprint of a workload in tokens (see `working_set`)."""

    total_tokens: int  # every conversation's full history, summed
    peak_live_tokens: int  # the most, at one moment, summed over live conversations
    peak_live_unique_tokens: int  # the same, a tenant's system prompt counted once

    def exceeds(self, capacity_tokens: int) -> bool:
        """True when the live conversations' distinct tokens outgrow `capacity_tokens`."""
        return self.peak_live_unique_tokens > capacity_tokens


def working_set(
    convs: Sequence[Conversation],
    starts: Sequence[Sequence[float]] | None = None,
    ends: Sequence[float] | None = None,
) -> WorkingSet:
    """The workload's working set: a conversation is live from its first turn to its end and
    holds the history through its latest turn; "unique" counts each tenant's system prompt once
    while any of its conversations is live (what one prefix cache holding every live
    conversation would keep).

    Default: the nominal schedule (`turn_times`; a conversation ends at its last turn). A
    measured schedule gives each conversation's turn send times (`starts[k]`, the turns actually
    sent) and end (`ends[k]`, e.g. its last reply).
    """
    if starts is None:
        starts = [turn_times(c) for c in convs]
    if ends is None:
        ends = [times[-1] if len(times) else 0.0 for times in starts]
    events: list[tuple[float, int, int, int]] = []  # (time, order, conv index, turns done)
    for k, times in enumerate(starts):
        if not len(times):
            continue
        events += [(float(t), 0, k, turn + 1) for turn, t in enumerate(times)]
        events.append((float(ends[k]), 1, k, -1))  # after the turns of the same moment
    heapq.heapify(events)
    held = [0] * len(convs)
    live_per_tenant: dict[int, int] = {}
    system_len = {c.tenant: len(c.system) for c in convs}
    live = unique = peak = peak_unique = 0
    while events:
        t, _, k, done = heapq.heappop(events)
        conv = convs[k]
        if done < 0:
            live -= held[k]
            unique -= held[k] - len(conv.system)
            live_per_tenant[conv.tenant] -= 1
            if not live_per_tenant[conv.tenant]:
                unique -= system_len[conv.tenant]
            held[k] = 0
        else:
            if held[k] == 0:
                live_per_tenant[conv.tenant] = live_per_tenant.get(conv.tenant, 0) + 1
                if live_per_tenant[conv.tenant] == 1:
                    unique += system_len[conv.tenant]
                unique -= len(conv.system)  # added back with the history below
            now = history_tokens(conv, done)
            live += now - held[k]
            unique += now - held[k]
            held[k] = now
        if done >= 0 and (not events or events[0][:2] != (t, 0)):
            # after a moment's turns, before the ends at that moment: a last turn counts
            peak, peak_unique = max(peak, live), max(peak_unique, unique)
    total = sum(
        history_tokens(c, len(times)) for c, times in zip(convs, starts, strict=True) if len(times)
    )
    return WorkingSet(total, peak, peak_unique)
