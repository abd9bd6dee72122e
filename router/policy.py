"""Where a request's prompt is prefilled: one rule over live-measured costs (pure, no I/O).

The rule: for each path a request can take, predict its time to first token and the pace of
the streams it touches (the longest gap between two tokens, and the mean time per output token);
take the path with the lowest predicted TTFT among those that keep both SLOs (TTFT, and every
gap within the TPOT target); when none does, among those that keep the TPOT target on average;
when none does, the one with the lowest mean TPOT.

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
    # several prompts in one request, beam search or prompt logprobs: whole on decode (one
    # engine must run every prompt it answers for)
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

    def prefill_rate(self, seqs: int) -> float:
        """Prompt tokens prefilled per second in full chunks beside `seqs` decoding sequences."""
        chunk = max(self.chunk_tokens - seqs, 1)
        return chunk / self.step(seqs, chunk)


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
    tokens the prefill pool has still to prefill for it (remote prefills, whole requests sent
    there), drained at the rate the pool answers (`router/backlog.py`), in the step model's
    tokens (scaled by the model's rate over the measured one). local_prefill_tokens: the same
    on the decode pool. decode_streams: requests on the decode pool's engines (prefilling
    there or decoding), not those still in a remote prefill. prefill_streams: the same for whole
    requests on the prefill pool.
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
    """A path's predicted time to first token and what it does to token pace: `gap_s`, the
    longest gap between two tokens it brings (its own stream's on the engine that decodes it,
    or that of the streams on the engine that prefills its prompt, while it prefills), and
    `tpot_s`, the same streams' mean time per output token with its prefill spread over them."""

    path: PrefillPath
    ttft_s: float
    gap_s: float
    tpot_s: float


@dataclass(frozen=True)
class Targets:
    """The deployment's SLOs (`slo.ttft_ms`, `slo.tpot_ms`) in seconds; None: no target."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def predict(prompt_tokens: int, prefill: PoolView, decode: PoolView, handoff: HandoffCost,
            hop_s: float = 0.0, output_tokens: int = 256,
            stream_tokens: int | None = None) -> list[Prediction]:
    """The three paths' predictions (remote, local, offload) for a prompt of `prompt_tokens`.

    `output_tokens`: this request's output (its `max_tokens`); `stream_tokens`: the typical
    output of the streams already running (None: the same), over which a prefill's stall is
    spread for their mean TPOT. `hop_s`: the router's hop to an engine and back, paid once on
    every path; the remote path's second hop is in `handoff`.
    """
    own, others = max(output_tokens, 1), max(stream_tokens or output_tokens, 1)
    p_new = max(prompt_tokens - prefill.cached_tokens, 0)
    d_new = max(prompt_tokens - decode.cached_tokens, 0)
    p_cost, d_cost = prefill.cost, decode.cost
    p_seqs, d_seqs = int(prefill.streams), int(decode.streams)
    p_ahead, d_ahead = int(prefill.prefill_tokens), int(decode.prefill_tokens)
    p_prefill = p_cost.prefill_s(p_ahead + p_new, p_seqs)

    def pace(cost: EngineCost, seqs: int, queued: int, new: int, tokens: int,
             own_stream: bool) -> tuple[float, float]:
        """(gap, mean TPOT) of the streams on an engine that prefills `new` more tokens
        behind `queued` (with `own_stream`: the request's own stream of `tokens` joins them)."""
        if not seqs and not own_stream:
            return 0.0, 0.0
        n = seqs + own_stream
        stall = (queued + new) * cost.per_token_s
        return cost.step(n, queued + new), cost.step(n) + stall / tokens

    def worst(*paces: tuple[float, float]) -> tuple[float, float]:
        return max(g for g, _ in paces), max(t for _, t in paces)

    def busy(cost: EngineCost, seqs: int, queued: int) -> float:
        """The rest of the step a busy engine is in when the request arrives: half of one."""
        return 0.5 * cost.step(seqs, queued) if seqs or queued else 0.0

    p_start = prefill.wait_s + busy(p_cost, p_seqs, p_ahead)
    d_start = decode.wait_s + busy(d_cost, d_seqs, d_ahead)
    # decode's step once the request is in its batch (the handoff's measured latency holds the
    # rest: it is measured up to that step, `router/calibration.py`)
    joins = d_cost.step(d_seqs + 1, d_ahead)
    remote_ttft = hop_s + p_start + p_prefill + decode.wait_s + handoff(d_new) + joins
    remote = worst(pace(d_cost, d_seqs, d_ahead, 0, own, True),
                   pace(p_cost, p_seqs, p_ahead, p_new, others, False))
    local_ttft = hop_s + d_start + d_cost.prefill_s(d_ahead + d_new, d_seqs)
    local = worst(pace(d_cost, d_seqs, d_ahead, 0, own, True),
                  pace(d_cost, d_seqs, d_ahead, d_new, others, False))
    offload_ttft = hop_s + p_start + p_prefill
    # a stream on a prefill engine shares its steps with full chunks of the remote prefills
    # that engine is there for
    offload = worst(pace(p_cost, p_seqs, max(p_ahead, p_cost.chunk_tokens), 0, own, True),
                    pace(p_cost, p_seqs, p_ahead, p_new, others, False))
    return [
        Prediction(PrefillPath.REMOTE, remote_ttft, *remote),
        Prediction(PrefillPath.LOCAL, local_ttft, *local),
        Prediction(PrefillPath.OFFLOAD, offload_ttft, *offload),
    ]


def choose(predictions: list[Prediction], targets: Targets) -> Prediction:
    """The rule: the lowest predicted TTFT among the paths that keep both targets (TTFT, and
    every gap within the TPOT target); else among those whose streams keep the TPOT target on
    average (a request that would miss its TTFT costs more than one slow step of others);
    else the lowest mean TPOT. Ties go to the earlier path in the list."""
    ttft, tpot = targets.ttft_s, targets.tpot_s
    both = [p for p in predictions if (ttft is None or p.ttft_s <= ttft)
            and (tpot is None or p.gap_s <= tpot)]
    if both:
        return min(both, key=lambda p: p.ttft_s)
    paced = [p for p in predictions if tpot is None or p.tpot_s <= tpot]
    if paced:
        return min(paced, key=lambda p: p.ttft_s)
    return min(predictions, key=lambda p: (p.tpot_s, p.ttft_s))


def decide(prompt_tokens: int, prefill: PoolView, decode: PoolView, handoff: HandoffCost,
           targets: Targets, hop_s: float = 0.0, output_tokens: int = 256,
           stream_tokens: int | None = None) -> Prediction:
    """Where this prompt is prefilled, with its predictions: `choose` over `predict`."""
    return choose(predict(prompt_tokens, prefill, decode, handoff, hop_s, output_tokens,
                          stream_tokens), targets)
