"""Pure routing decisions (no Ray, no I/O): unit-tested in milliseconds."""

from __future__ import annotations

from splitserve.config import DisaggregationConfig


def prefill_remotely(
    *,
    prompt_tokens: int,
    expected_cached_tokens: int,
    prefill_in_flight: int,
    cfg: DisaggregationConfig,
) -> bool:
    """Conditional disaggregation: send this prompt's prefill to the prefill pool?

    Remote prefill pays a fixed handoff; it is worth it only for enough uncached prompt tokens,
    and only while the prefill pool is not already backed up (then the decode worker's own
    prefill is the faster path).
    """
    uncached = max(prompt_tokens - expected_cached_tokens, 0)
    if uncached < cfg.min_remote_prompt_tokens:
        return False
    return prefill_in_flight < cfg.max_prefill_queue
