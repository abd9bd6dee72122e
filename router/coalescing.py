"""Adaptive token coalescing: how many tokens each streamed chunk of a request carries (pure).

A chunk costs host CPU at every hop (the engine replica's output handling, Ray's streaming
generator to the router, the router, the HTTP proxy, the SSE encoding), whatever the number of
tokens in it. An engine decoding `s` streams emits `s` chunks per step when every token is its
own chunk, so on a host whose cores the engines share (this project's CPU deployments; any
GPU host short of cores) that per-chunk cost grows with load and takes CPU from the engines.

The rule: a request starting when its pool has `s` streams per replica (this one included) gets
`ceil(s / chunks_per_step)` tokens per chunk, at most `max_tokens_per_chunk`. Up to
`chunks_per_step` streams nothing changes (every token streams at once); beyond it the engine's
chunks per step stay near `chunks_per_step`. vLLM sends a request's first token and its last
chunk at once whatever the interval, so TTFT and end-to-end latency do not grow; what a client
sees is tokens arriving in bursts of up to the interval, at the same average rate.
"""

from __future__ import annotations

import math

from splitserve.config import StreamingConfig


def stream_interval(streams_per_replica: float, cfg: StreamingConfig) -> int:
    """Tokens per streamed chunk for a request starting at this load (>= 1)."""
    wanted = math.ceil(max(streams_per_replica, 0.0) / cfg.chunks_per_step)
    return max(1, min(cfg.max_tokens_per_chunk, wanted))
