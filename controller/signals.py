"""Pool signals: what router replicas observe per pool, and their merge into a `PoolSample` (pure).

Each router replica counts, per pool and per report period, the requests and tokens that
entered the pool and the latencies of those that finished, and reads its admission gate's queue
and in-flight counts (`router.signals.SignalRecorder`). It sends a `PoolReport` to the
controller every period; the controller merges the reports of all router replicas with the
pool's replica counts into the `PoolSample` that the autoscaling policy reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from splitserve.controller.autoscale import PoolSample

# Latency samples one report carries per pool: a p90 over more adds nothing, and the report
# stays small when a router replica serves thousands of requests per period.
MAX_LATENCY_SAMPLES = 512


@dataclass(frozen=True)
class PoolReport:
    """One router replica's view of one pool over `period_s` seconds ending at `t`.

    Counters cover the period; `queue_depth`, `queued_tokens` and `running` are the gate's
    state at `t`. `ttft_s`: the pool's own share of time to first token, one per request that
    got its first token in the period (prefill: gate queue + prefill until the handoff;
    decode or colocated: until the first token). `tpot_s`: time per output token of each
    request that finished in the period with two tokens or more.
    """

    t: float
    period_s: float
    arrivals: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0  # max_tokens of the entering requests: the decode work they bring
    queue_depth: int = 0
    queued_tokens: int = 0
    running: int = 0
    ttft_s: tuple[float, ...] = field(default_factory=tuple)
    tpot_s: tuple[float, ...] = field(default_factory=tuple)


def p90(values: Sequence[float]) -> float | None:
    """The 90th percentile (nearest rank), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def merge_reports(reports: Iterable[PoolReport], *, t: float, period_s: float, ready: int,
                  starting: int = 0, kv_usage: float = 0.0) -> PoolSample:
    """One `PoolSample` from the reports of every router replica for one pool and period.

    Rates are totals over `period_s`; queue and running counts add up across router
    replicas (each gates its own share); latency percentiles are over all their samples.
    """
    reports = list(reports)
    ttfts = [x for r in reports for x in r.ttft_s]
    tpots = [x for r in reports for x in r.tpot_s]
    return PoolSample(
        t=t,
        ready=ready,
        starting=starting,
        arrival_rate=sum(r.arrivals for r in reports) / period_s,
        token_rate=sum(r.prompt_tokens for r in reports) / period_s,
        out_token_rate=sum(r.output_tokens for r in reports) / period_s,
        queue_depth=sum(r.queue_depth for r in reports),
        queued_tokens=float(sum(r.queued_tokens for r in reports)),
        running=sum(r.running for r in reports),
        kv_usage=kv_usage,
        ttft_p90_s=p90(ttfts),
        tpot_p90_s=p90(tpots),
    )
