"""Closed-loop replay of the multi-turn workload against an OpenAI-compatible `/v1/completions`.

    turns, duration = asyncio.run(replay_conversations(base_url, model, keys, convs))

Each user starts at its arrival offset, sends turn 0, waits for the whole reply, thinks
(`Conversation.think_s`), then sends the next turn with the history so far (`turn_prompt`):
closed loop per user, open loop across users. Prompts are token ids and replies are read back
as token ids (`return_token_ids`, greedy, `ignore_eos`), so every turn's prompt extends the
previous turn's prompt + reply byte for byte. A failed turn ends its conversation (its history
would be unknown); the failure is recorded. Each tenant's requests carry its own API key (the
router derives the tenant's cache salt from it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from splitserve.bench.client import Target, make_client, send_one
from splitserve.bench.multi_turn import Conversation, WorkingSet, turn_prompt, working_set
from splitserve.bench.results import RequestResult
from splitserve.bench.workload import BenchRequest


@dataclass(frozen=True)
class TurnResult:
    """One turn's measurement: whose turn it was, and the request's `RequestResult`."""

    user: int
    tenant: str
    turn: int
    history_tokens: int  # tokens of this prompt that the previous turn sent or received
    result: RequestResult

    def to_json(self) -> dict[str, Any]:
        """One line of `turns.jsonl`."""
        return {"user": self.user, "tenant": self.tenant, "turn": self.turn,
                "history_tokens": self.history_tokens, **self.result.to_json()}


async def _converse(
    conv: Conversation, tenant: str, client: httpx.AsyncClient, target: Target, t0: float,
    out: list[TurnResult],
) -> None:
    """Play one user's conversation (see the module docstring), appending to `out`."""
    delay = conv.arrival_s - (time.perf_counter() - t0)
    if delay > 0:
        await asyncio.sleep(delay)
    replies: list[tuple[int, ...]] = []
    history = 0
    for turn in range(conv.turns):
        if turn:
            await asyncio.sleep(conv.think_s[turn - 1])
        prompt = turn_prompt(conv, turn, replies)
        req = BenchRequest(conv.user * 1000 + turn, time.perf_counter() - t0, prompt,
                           conv.reply_lens[turn])
        ids: list[int] = []
        rec = await send_one(client, target, req, t0, token_ids=ids)
        if rec.ok and len(ids) != req.max_tokens:
            rec.error = f"reply has {len(ids)} token ids, expected {req.max_tokens}"
        out.append(TurnResult(conv.user, tenant, turn, history, rec))
        if not rec.ok:
            return
        replies.append(tuple(ids))
        history = len(prompt) + len(ids)


async def replay_conversations(
    base_url: str,
    model: str,
    keys: Mapping[str, str | None],
    convs: Sequence[Conversation],
    *,
    timeout_s: float = 300.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[TurnResult], float]:
    """Replay `convs` (tenant i of a conversation is the i-th of `keys`, by insertion order);
    returns every turn's result ordered by (user, turn) and the run's duration in seconds.

    `base_url` ends in /v1; `keys` maps tenant names to API keys (None: no key sent).
    """
    names = list(keys)
    targets = {t: Target(base_url, model, api_key=k, timeout_s=timeout_s) for t, k in keys.items()}
    clients = {t: make_client(target, transport) for t, target in targets.items()}
    out: list[TurnResult] = []
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(
            _converse(c, names[c.tenant], clients[names[c.tenant]], targets[names[c.tenant]],
                      t0, out)
            for c in convs
        ))
        duration = time.perf_counter() - t0
    finally:
        for c in clients.values():
            await c.aclose()
    return sorted(out, key=lambda r: (r.user, r.turn)), duration


def measured_working_set(
    convs: Sequence[Conversation], turns: Sequence[TurnResult]
) -> WorkingSet:
    """`working_set` under the replay's own schedule: each conversation from its first send to
    its last reply, holding the history of the turns it completed (a failed turn ends it)."""
    done: dict[int, list[TurnResult]] = {}
    for t in sorted(turns, key=lambda t: (t.user, t.turn)):
        if t.result.ok and t.result.sent_s is not None and t.result.e2e_s is not None:
            done.setdefault(t.user, []).append(t)
    starts = [[t.result.sent_s for t in done.get(c.user, [])] for c in convs]
    ends = [
        (rows[-1].result.sent_s + rows[-1].result.e2e_s) if (rows := done.get(c.user)) else 0.0
        for c in convs
    ]
    return working_set(convs, starts, ends)


def summarize_turns(turns: Sequence[TurnResult]) -> dict[str, Any]:
    """TTFT statistics of a replay: every turn, the first turns, and the follow-up turns (whose
    history a server may hold), with counts of turns and failures."""
    from splitserve.bench.stats import percentiles

    ok = [t for t in turns if t.result.ok and t.result.ttft_s is not None]

    def ttft(rows: Sequence[TurnResult]) -> dict[str, float | None]:
        return percentiles((t.result.ttft_s for t in rows), 1000)

    return {
        "turns": len(turns),
        "failed": len(turns) - len(ok),
        "errors": sorted({t.result.error for t in turns if not t.result.ok}),
        "prompt_tokens": sum(t.result.prompt_tokens for t in ok),
        "ttft_ms": ttft(ok),
        "ttft_first_turn_ms": ttft([t for t in ok if t.turn == 0]),
        "ttft_follow_up_ms": ttft([t for t in ok if t.turn > 0]),
        "e2e_ms": percentiles((t.result.e2e_s for t in ok), 1000),
    }
