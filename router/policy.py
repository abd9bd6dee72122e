"""Pure routing decisions (no Ray, no I/O): unit-tested in milliseconds.

Conditional disaggregation decides, per request, where its prompt is prefilled: in the prefill
pool (remote, the KV then moves to decode over NIXL) or on the decode worker itself (local).

1. A prompt with fewer uncached tokens than `min_remote_prompt_tokens` prefills locally on the
   decode worker (`short`): the handoff's fixed cost (the KV pull and a second hop, about 256
   prompt tokens' worth of prefill on the CPU engine, `handoff_cost_tokens`) outweighs the
   prefill it would move (BENCHMARKS.md, session 13). With `short_prompts_either_pool` (off by default: on two CPU cores it
   cost more than it gained, BENCHMARKS.md session 12) the whole request runs instead on the pool
   with less work ahead of its first token, as on two colocated engines (`short` on decode,
   `short_offload` on prefill; ties stay on decode).
2. With `max_prefill_queue` prefills already waiting or running, the prompt prefills locally.
3. With `spill_to_decode` on, the prompt prefills locally when that is the faster path: when
   the prefill pool's backlog per replica (uncached prompt tokens waiting or being prefilled)
   plus the handoff's own cost (`handoff_cost_tokens`: the KV pull and the second hop, in prompt
   tokens' worth of time) exceeds the decode pool's backlog per replica (the prompts decode is
   prefilling itself, plus `decode_stream_cost_tokens` for each stream it is decoding). So a
   decode pool with spare capacity takes prompts itself, as a colocated engine would (what wins
   on prefill-heavy load), the prefill pool takes them once decode is busier, and a decode pool
   busy streaming keeps its steps free of prefill (what wins on decode-heavy load).

Before all of these, a request whose output is short (`max_tokens` at most `short_output_tokens`)
runs whole, prefill and decode, on the pool with less work ahead of its first token, as on two
colocated engines: its few decode steps cost either pool little, while a remote prefill would
make it wait in two queues (the prefill engine's, then the decode engine's) and pay the handoff.
On long prompts with short outputs this keeps both engines prefilling, as colocation does,
where the remote path left the decode engine prefilling the spilled half of the prompts behind
its own queue (BENCHMARKS.md, session 10). Ties and a full prefill queue stay on decode. A request
without `max_tokens` counts as long.

Then the slow-decode rule, off by default (`slow_decode_tpot_fraction` 0): while the decode
pool's streams get their tokens slower than that fraction of the TPOT SLO (their live pace,
`router/pace.py`) and slower than the prefill pool's own streams, the prefill pool has fewer
streams per replica, and the prefill queue is not full, the whole request (prefill and decode)
runs on a prefill replica (`slow_decode`): a decode pool carries every stream that colocated
engines would share, and the prefill engine is a full engine whose spare capacity could decode
too. On two CPU cores it cost more than it gained (BENCHMARKS.md, session 12): the prefill
engine's streams stall behind the remote prefills it also runs.

Then, with `offload_to_prefill` on, the whole request (prefill and decode) runs on
a prefill replica when the decode pool is the bottleneck: when the decode pool's streams per
replica (at `decode_stream_cost_tokens` each) exceed the prefill pool's whole work per replica
(its prefill backlog plus its own streams) by more than `offload_margin_tokens`. A prefill
engine is a full engine: on decode-heavy load an idle prefill pool would otherwise leave its
cores unused while every stream shares the decode engines. The rule looks at decode's streams
only, not at the prompts it prefills itself, so that prompts keep going to the prefill pool
while decode is busy prefilling; and the margin keeps the prefill pool mostly free for prefills.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from splitserve.config import DisaggregationConfig


class PrefillPath(str, Enum):
    """Where a prompt is prefilled, and why (the `reason` label of the decision counter)."""

    REMOTE = "remote"
    SHORT = "short"  # too few uncached tokens for a handoff: whole on decode
    SHORT_OFFLOAD = "short_offload"  # ... whole on prefill (the less loaded pool)
    QUEUE_FULL = "queue_full"  # max_prefill_queue prefills in flight
    SPILL = "spill"  # prefilling on decode is the faster path
    COLOCATED = "colocated"  # no prefill pool deployed
    OFFLOAD = "offload"  # the whole request runs on a prefill replica: decode is the bottleneck
    SHORT_OUTPUT = "short_output"  # a short output runs whole on decode (the less loaded pool)
    SHORT_OUTPUT_OFFLOAD = "short_output_offload"  # ... whole on prefill (the less loaded pool)
    SLOW_DECODE = "slow_decode"  # whole on prefill: decode's streams are slower than the limit
    # several output sequences (n, beam search) or prompts in one request: whole on decode, one
    # prefill on one engine for all of them (vLLM's server hands off one prompt's KV)
    MULTI_SEQUENCE = "multi_sequence"

    @property
    def remote(self) -> bool:
        """True when the prompt is prefilled in the prefill pool and its KV moves to decode."""
        return self is PrefillPath.REMOTE

    @property
    def pool(self) -> str:
        """The pool that generates the request's tokens."""
        return "prefill" if self in _WHOLE_ON_PREFILL else "decode"


_WHOLE_ON_PREFILL = frozenset(
    {PrefillPath.OFFLOAD, PrefillPath.SHORT_OUTPUT_OFFLOAD, PrefillPath.SLOW_DECODE,
     PrefillPath.SHORT_OFFLOAD}
)


@dataclass(frozen=True)
class PoolLoad:
    """What one router replica sees of the two pools when it decides (its own traffic only).

    prefill_requests: prefills waiting at or admitted through the prefill gate.
    prefill_tokens: the uncached prompt tokens of those.
    local_prefill_tokens: prompt tokens of requests prefilling on decode, until their first token.
    decode_streams: requests waiting at or admitted through the decode gate.
    prefill_streams: whole requests offloaded to the prefill pool, until they finish.
    decode_pace_s, prefill_pace_s: seconds per output token each pool's streams are getting now
        (`router/pace.py`); 0.0 without recent tokens.
    """

    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_replicas: int = 1
    local_prefill_tokens: int = 0
    decode_streams: int = 0
    decode_replicas: int = 1
    prefill_streams: int = 0
    decode_pace_s: float = 0.0
    prefill_pace_s: float = 0.0


def prefill_backlog(load: PoolLoad, cfg: DisaggregationConfig) -> float:
    """Token-equivalents of work ahead of a new remote prefill, per prefill replica."""
    work = load.prefill_tokens + load.prefill_streams * cfg.decode_stream_cost_tokens
    return work / max(load.prefill_replicas, 1)


def decode_backlog(load: PoolLoad, cfg: DisaggregationConfig) -> float:
    """Token-equivalents of work ahead of a new local prefill, per decode replica."""
    work = load.local_prefill_tokens + load.decode_streams * cfg.decode_stream_cost_tokens
    return work / max(load.decode_replicas, 1)


def decode_stream_load(load: PoolLoad, cfg: DisaggregationConfig) -> float:
    """The decode pool's streams per replica, in token-equivalents."""
    return load.decode_streams * cfg.decode_stream_cost_tokens / max(load.decode_replicas, 1)


def _prefill_less_loaded(load: PoolLoad, cfg: DisaggregationConfig) -> bool:
    """A whole request would start sooner on prefill: less work ahead there, room in its queue."""
    return load.prefill_requests < cfg.max_prefill_queue and (
        prefill_backlog(load, cfg) < decode_backlog(load, cfg)
    )


def slow_decode(load: PoolLoad, cfg: DisaggregationConfig, tpot_slo_s: float | None) -> bool:
    """True when decode's streams are slower than the limit and than the prefill pool's, and
    the prefill pool has fewer streams per replica (a burst that arrives before the paces move
    then alternates between the pools instead of landing on prefill all at once)."""
    if not tpot_slo_s or cfg.slow_decode_tpot_fraction <= 0:
        return False
    limit = cfg.slow_decode_tpot_fraction * tpot_slo_s
    fewer = (load.prefill_streams / max(load.prefill_replicas, 1)
             < load.decode_streams / max(load.decode_replicas, 1))
    return load.decode_pace_s > limit and load.prefill_pace_s < load.decode_pace_s and fewer


def prefill_path(
    *,
    prompt_tokens: int,
    expected_cached_tokens: int,
    load: PoolLoad,
    cfg: DisaggregationConfig,
    max_tokens: int | None = None,
    tpot_slo_s: float | None = None,
) -> PrefillPath:
    """Where this prompt prefills (see the module docstring for the rule).

    max_tokens: the request's output limit; None (no limit given) counts as a long output.
    tpot_slo_s: the deployment's TPOT target (`slo.tpot_ms`); None turns the slow-decode rule off.
    """
    if max_tokens is not None and max_tokens <= cfg.short_output_tokens:
        if _prefill_less_loaded(load, cfg):
            return PrefillPath.SHORT_OUTPUT_OFFLOAD
        return PrefillPath.SHORT_OUTPUT
    if load.prefill_requests < cfg.max_prefill_queue and slow_decode(load, cfg, tpot_slo_s):
        return PrefillPath.SLOW_DECODE
    if (
        cfg.offload_to_prefill
        and load.prefill_requests < cfg.max_prefill_queue
        and decode_stream_load(load, cfg) > prefill_backlog(load, cfg) + cfg.offload_margin_tokens
    ):
        return PrefillPath.OFFLOAD
    uncached = max(prompt_tokens - expected_cached_tokens, 0)
    if uncached < cfg.min_remote_prompt_tokens:
        if cfg.short_prompts_either_pool and _prefill_less_loaded(load, cfg):
            return PrefillPath.SHORT_OFFLOAD
        return PrefillPath.SHORT
    if load.prefill_requests >= cfg.max_prefill_queue:
        return PrefillPath.QUEUE_FULL
    if cfg.spill_to_decode and (
        prefill_backlog(load, cfg) + cfg.handoff_cost_tokens > decode_backlog(load, cfg)
    ):
        return PrefillPath.SPILL
    return PrefillPath.REMOTE
