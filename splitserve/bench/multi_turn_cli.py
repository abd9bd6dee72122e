"""`splitserve bench --workload multi_turn`: replay seeded multi-tenant conversations against one
endpoint, and the options it shares with `scripts/bench_routing.py --part multi_turn`.

    splitserve bench --workload multi_turn --base-url http://127.0.0.1:8000/v1 \\
        --users 50 --turns 3-6 --system-len 300-600 --message-len 50-150 --reply-len 16-32 \\
        --user-rate 2 --think-s 5 [--tenant-keys KEY0,KEY1] --out bench-results/mt

Tenants: one per `--tenant-keys` key (each request carries its tenant's key; the router derives
the tenant's cache salt from it), or `--tenants` tenants without keys (an open-mode server: the
tenants differ in their system prompts only). Writes OUT/summary.json (TTFT of every turn, of
first turns and follow-up turns; the working set) and OUT/turns.jsonl (one line per turn).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from splitserve.bench.multi_turn import MultiTurnSpec, build_conversations, working_set
from splitserve.bench.workload import DEFAULT_TOKEN_RANGE, LengthSpec


def add_multi_turn_arguments(p: argparse.ArgumentParser, *, tenants: bool = True) -> None:
    """The workload's options (`tenants=False`: the caller defines `--tenants` itself)."""
    g = p.add_argument_group("multi_turn workload")
    g.add_argument("--users", type=int, default=50, help="conversations (default %(default)s)")
    if tenants:
        g.add_argument("--tenants", type=int, default=2, help="without --tenant-keys")
    g.add_argument("--turns", default="3-6", help="turns per conversation (LOW-HIGH, N, M:S)")
    g.add_argument("--system-len", default="300-600", help="system prompt tokens per tenant")
    g.add_argument("--message-len", default="50-150", help="new user tokens per turn")
    g.add_argument("--reply-len", default="16-32", help="reply tokens per turn (max_tokens)")
    g.add_argument("--user-rate", type=float, default=2.0, help="users/s arriving (Poisson)")
    g.add_argument("--think-s", type=float, default=5.0, help="mean think time between turns")
    g.add_argument("--max-context", type=int, default=2048,
                   help="a turn's prompt + reply stay within this (the model's max_model_len)")


def spec_from_args(args: argparse.Namespace, tenants: int, max_context: int | None = None,
                   token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE) -> MultiTurnSpec:
    """The seeded workload the options describe (ValueError on bad values)."""
    return MultiTurnSpec(
        users=args.users, tenants=tenants, turns=LengthSpec.parse(args.turns),
        system_len=LengthSpec.parse(args.system_len),
        message_len=LengthSpec.parse(args.message_len),
        reply_len=LengthSpec.parse(args.reply_len), arrival_rate=args.user_rate,
        think_s=args.think_s, max_context=max_context or args.max_context,
        token_range=token_range, seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Replay the conversations against `--base-url`, print and write the summary; exit status
    as `splitserve bench` (1 when every turn failed, 2 on bad arguments)."""
    from splitserve.bench.multi_turn_replay import (
        measured_working_set,
        replay_conversations,
        summarize_turns,
    )
    from splitserve.bench.report import json_safe, write_json

    keys: dict[str, str | None]
    if args.tenant_keys:
        keys = {f"tenant-{i}": k.strip() for i, k in enumerate(args.tenant_keys.split(","))}
    else:
        keys = {f"tenant-{i}": args.api_key for i in range(args.tenants)}
    try:
        spec = spec_from_args(args, len(keys), token_range=(args.token_low, args.token_high))
    except ValueError as err:
        print(f"splitserve bench: {err}", file=sys.stderr)
        return 2
    convs = build_conversations(spec)
    nominal = working_set(convs)
    print(f"bench multi_turn {args.base_url} model={args.model} {len(convs)} conversations, "
          f"{sum(c.turns for c in convs)} turns, {len(keys)} tenants; working set (nominal): "
          f"peak {nominal.peak_live_tokens} tokens live, {nominal.peak_live_unique_tokens} "
          f"distinct", flush=True)
    turns, duration = asyncio.run(replay_conversations(
        args.base_url, args.model, keys, convs, timeout_s=args.timeout_s))
    summary: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("func", "tenant_keys",
                                                                    "api_key")},
        "duration_s": duration,
        **summarize_turns(turns),
        "working_set_nominal": vars(nominal),
        "working_set_measured": vars(measured_working_set(convs, turns)),
    }
    out = Path(args.out or f"bench-results/{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}")
    write_json(out / "summary.json", summary)
    (out / "turns.jsonl").write_text(
        "".join(json.dumps(json_safe(t.to_json())) + "\n" for t in turns))
    print(format_turns(summary))
    print(f"wrote {out}")
    return 1 if turns and summary["failed"] == len(turns) else 0


def format_turns(summary: dict[str, Any]) -> str:
    """A short table of a replay's TTFT (ms) by kind of turn."""
    head = f"turns {summary['turns']}, failed {summary['failed']}, {summary['duration_s']:.1f} s"
    lines = [head, f"{'TTFT ms':<12}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}"]
    for label, key in (("all", "ttft_ms"), ("first turn", "ttft_first_turn_ms"),
                       ("follow-up", "ttft_follow_up_ms")):
        row = summary[key]
        lines.append(f"{label:<12}" + "".join(
            "        -" if row[q] is None else f"{row[q]:>9.1f}"
            for q in ("mean", "p50", "p90", "p99")))
    lines += [f"error: {e}" for e in summary["errors"][:5]]
    return "\n".join(lines)
