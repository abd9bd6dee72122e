"""Where a request's prompt is prefilled: one rule over live-measured costs (pure, no I/O).

The rule: for each path a request can take, predict its time to first token and the time per
output token of the streams it touches; take the path with the lowest predicted TTFT among those
that keep the TPOT target, or, when none does, the one with the lowest predicted TPOT.

The paths: `remote` (prefill on a prefill replica, hand the KV to a decode replica over NIXL),
`local` (the whole request on a decode replica) and `offload` (the whole request on a prefill
replica). The inputs are measured while serving, never calibrated by hand: each engine's step
cost (fixed, per decoding sequence, per prefilled token: vLLM's own iteration stats,
`splitserve.engine.step_cost`), the handoff's cost against prompt length (measured by the router,
`router/calibration.py`), the work each pool has queued, and the prompt tokens each side is
expected to hold in its prefix cache. The simulator calls the same function with its hardware
profile's figures (`controller/sim/engine.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class PrefillPath(str, Enum):
    """Where a prompt is prefilled (the `reason` label of the decision counter)."""

    REMOTE = "remote"  # prefill pool, then the KV moves to a decode replica
    LOCAL = "local"  # the whole request on a decode replica
    OFFLOAD = "offload"  # the whole request on a prefill replica
    COLOCATED = "colocated"  # no prefill pool deployed
    # several prompts in one request, or prompt logprobs: whole on decode (one engine must run
    # every prompt it answers for)
    MULTI_SEQUENCE = "multi_sequence"

    @property
    def remote(self) -> bool:
        """True when the prompt is prefilled in the prefill pool and its KV moves to decode."""
        return self is PrefillPath.REMOTE

    @property
    def pool(self) -> str:
        """The pool that generates the request's tokens."""
        return "prefill" if self is PrefillPath.OFFLOAD else "decode"


@dataclass(frozen=True)
class EngineCost:
    """One engine's step time: `step_s + per_seq_s * seqs + per_token_s * prefill tokens`, with
    at most `chunk_tokens` tokens scheduled per step (vLLM's `max_num_batched_tokens`)."""

    step_s: float
    per_seq_s: float
    per_token_s: float
    chunk_tokens: int

    def step(self, seqs: int, prefill_tokens: int = 0) -> float:
        """One step with `seqs` decoding sequences and up to a chunk of prefill beside them."""
        chunk = min(prefill_tokens, max(self.chunk_tokens - seqs, 1))
        return self.step_s + self.per_seq_s * seqs + self.per_token_s * chunk

    def prefill_s(self, tokens: int, seqs: int) -> float:
        """Time to prefill `tokens` while `seqs` sequences decode beside them (chunked)."""
        if tokens <= 0:
            return self.step(seqs)
        steps = math.ceil(tokens / max(self.chunk_tokens - seqs, 1))
        return tokens * self.per_token_s + steps * (self.step_s + self.per_seq_s * seqs)


@dataclass(frozen=True)
class HandoffCost:
    """What a remote prefill adds between the prefill and decode's first step: the hop to
    decode and the KV pull of the tokens decode lacks; `fixed_s + per_token_s * tokens`."""

    fixed_s: float
    per_token_s: float

    def __call__(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * max(tokens, 0)


@dataclass(frozen=True)
class PoolView:
    """One pool as the deciding router sees it, per replica.

    streams: sequences decoding on one replica. prefill_tokens: uncached prompt tokens queued
    or prefilling on one replica. cached_tokens: this prompt's tokens expected in the pool's
    prefix cache. wait_s: expected wait for a slot before the request is admitted (0 when one
    is free). cost: the pool's measured step cost.
    """

    cost: EngineCost
    streams: float = 0.0
    prefill_tokens: float = 0.0
    cached_tokens: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True)
class PoolLoad:
    """What one router replica sees of the two pools when it decides (its own traffic only).

    prefill_requests: prompts waiting for or in a remote prefill. prefill_tokens: the prompt
    tokens the prefill pool prefills for it (remote prefills, whole requests sent there) until
    their first token. local_prefill_tokens: the same on the decode pool. decode_streams:
    requests holding or waiting for a decode slot. prefill_streams: whole requests on the
    prefill pool, until they finish.
    """

    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_replicas: int = 1
    local_prefill_tokens: int = 0
    decode_streams: int = 0
    decode_replicas: int = 1
    prefill_streams: int = 0


def pool_views(load: PoolLoad, prefill: EngineCost, decode: EngineCost,
               cached: dict[str, int]) -> dict[str, PoolView]:
    """Per-replica views of both pools for `predict`, from the router's counts, the pools'
    measured step costs and the prompt tokens each pool is expected to hold (`cached`)."""
    p_reps, d_reps = max(load.prefill_replicas, 1), max(load.decode_replicas, 1)
    return {
        "prefill": PoolView(prefill, streams=load.prefill_streams / p_reps,
                            prefill_tokens=load.prefill_tokens / p_reps,
                            cached_tokens=cached.get("prefill", 0)),
        "decode": PoolView(decode, streams=load.decode_streams / d_reps,
                           prefill_tokens=load.local_prefill_tokens / d_reps,
                           cached_tokens=cached.get("decode", 0)),
    }


@dataclass(frozen=True)
class Prediction:
    """A path's predicted time to first token, and the longest gap between tokens it brings:
    its own stream's on the engine that decodes it, or the streams' on the engine that
    prefills its prompt."""

    path: PrefillPath
    ttft_s: float
    tpot_s: float


def predict(prompt_tokens: int, prefill: PoolView, decode: PoolView,
            handoff: HandoffCost, hop_s: float = 0.0) -> list[Prediction]:
    """The three paths' predictions (remote, local, offload) for a prompt of `prompt_tokens`.

    TPOT is the gap between a stream's tokens while the engine prefills beside it (a step with
    a chunk of prompt tokens): streams must keep the target token by token, not on average.
    `hop_s`: the router's hop to an engine and back, paid once on every path; the remote
    path's second hop is in `handoff`.
    """
    p_new = max(prompt_tokens - prefill.cached_tokens, 0)
    d_new = max(prompt_tokens - decode.cached_tokens, 0)
    p_cost, d_cost = prefill.cost, decode.cost
    p_seqs, d_seqs = int(prefill.streams), int(decode.streams)
    p_ahead, d_ahead = int(prefill.prefill_tokens), int(decode.prefill_tokens)
    p_prefill = p_cost.prefill_s(p_ahead + p_new, p_seqs)

    def stalls(cost: EngineCost, seqs: int, tokens: int) -> float:
        """The gap of the streams already on an engine while it prefills `tokens` more."""
        return cost.step(seqs, tokens) if seqs else 0.0

    # Its own stream's gap on the engine that decodes it, beside the prefill queued there (a
    # prefill engine's queue is full chunks whenever it serves remote prefills), and what its
    # new prompt tokens do to the streams of the engine that prefills them.
    joins = d_cost.step(d_seqs + 1, d_ahead)  # decode's step once the request is in its batch
    remote_ttft = hop_s + prefill.wait_s + p_prefill + decode.wait_s + handoff(d_new) + joins
    remote_tpot = max(joins, stalls(p_cost, p_seqs, p_new))
    local_ttft = hop_s + decode.wait_s + d_cost.prefill_s(d_ahead + d_new, d_seqs)
    local_tpot = max(joins, stalls(d_cost, d_seqs, d_new))
    offload_ttft = hop_s + prefill.wait_s + p_prefill
    offload_tpot = max(p_cost.step(p_seqs + 1, p_cost.chunk_tokens),
                       stalls(p_cost, p_seqs, p_new))
    return [
        Prediction(PrefillPath.REMOTE, remote_ttft, remote_tpot),
        Prediction(PrefillPath.LOCAL, local_ttft, local_tpot),
        Prediction(PrefillPath.OFFLOAD, offload_ttft, offload_tpot),
    ]


def choose(predictions: list[Prediction], tpot_slo_s: float | None) -> Prediction:
    """The rule: the lowest predicted TTFT among paths that keep `tpot_slo_s` (None: all do);
    when none does, the lowest predicted TPOT. Ties go to the earlier path in the list."""
    keep = [p for p in predictions if tpot_slo_s is None or p.tpot_s <= tpot_slo_s]
    if keep:
        return min(keep, key=lambda p: p.ttft_s)
    return min(predictions, key=lambda p: (p.tpot_s, p.ttft_s))


def decide(prompt_tokens: int, prefill: PoolView, decode: PoolView, handoff: HandoffCost,
           tpot_slo_s: float | None, hop_s: float = 0.0) -> Prediction:
    """Where this prompt is prefilled, with its predicted TTFT: `choose` over `predict`."""
    return choose(predict(prompt_tokens, prefill, decode, handoff, hop_s), tpot_slo_s)
