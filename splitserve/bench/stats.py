"""Statistics of a run: percentiles, throughput, SLO attainment and goodput (pure).

Goodput follows DistServe: the requests per second that completed *and* met both SLOs,
TTFT <= ttft_ms and TPOT <= tpot_ms (the boundary counts as met). A request with one output
token has no TPOT and is judged on TTFT alone. A failed request never meets the SLO.
Attainment is the fraction of all requests sent (failed ones included) that met it.

TPOT is a request's mean: one long gap between two of its tokens (a prefill chunk of another
request beside its stream) hides in it. `goodput_every_gap_rps` also asks every gap to be
within tpot_ms, which is what splitserve's disaggregation rule keeps (`router/policy.py`) and
what an inter-token latency (ITL) target measures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from splitserve.bench.results import RequestResult

PERCENTILES = (50, 90, 99)
# DistServe reports the highest rate at which at least 90 % of requests meet the SLO.
ATTAINMENT_TARGET = 0.9


@dataclass(frozen=True)
class SLO:
    """Latency targets in milliseconds."""

    ttft_ms: float
    tpot_ms: float


def percentiles(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean, p50, p90, p99 (linear interpolation, as numpy) of `values` x `scale`; None if empty."""
    xs = np.asarray(list(values), dtype=float) * scale
    keys = ["mean", *(f"p{q}" for q in PERCENTILES)]
    if xs.size == 0:
        return dict.fromkeys(keys)
    stats = [float(xs.mean()), *(float(np.percentile(xs, q)) for q in PERCENTILES)]
    return dict(zip(keys, stats, strict=True))


def meets_slo(r: RequestResult, slo: SLO, every_gap: bool = False) -> bool:
    """True when `r` succeeded with TTFT and TPOT within the SLO (boundary included); with
    `every_gap`, also each gap between two of its tokens within tpot_ms."""
    if not r.ok or r.ttft_s is None or r.ttft_s > slo.ttft_ms / 1000:
        return False
    tpot = r.tpot_s
    if tpot is not None and tpot > slo.tpot_ms / 1000:
        return False
    return not every_gap or all(gap <= slo.tpot_ms / 1000 for gap in r.itl_s)


def latency_table(results: Sequence[RequestResult]) -> dict[str, dict[str, float | None]]:
    """Percentiles in ms of TTFT, TPOT, ITL and end-to-end latency over successful requests."""
    ok = [r for r in results if r.ok]
    return {
        "ttft": percentiles((r.ttft_s for r in ok if r.ttft_s is not None), 1000),
        "tpot": percentiles((r.tpot_s for r in ok if r.tpot_s is not None), 1000),
        "itl": percentiles((gap for r in ok for gap in r.itl_s), 1000),
        "e2e": percentiles((r.e2e_s for r in ok if r.e2e_s is not None), 1000),
    }


def error_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Failed requests grouped by `"<status>: <message>"`."""
    keys = (f"{r.status_code}: {r.error}" for r in results if not r.ok)
    return dict(Counter(keys).most_common())


def summarize(results: Sequence[RequestResult], duration_s: float, slo: SLO) -> dict[str, Any]:
    """The summary of one run (the body of `summary.json`, without the config)."""
    ok = [r for r in results if r.ok]
    met = sum(meets_slo(r, slo) for r in results)
    met_every_gap = sum(meets_slo(r, slo, every_gap=True) for r in results)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    return {
        "duration_s": duration_s,
        "requests": {"total": len(results), "succeeded": len(ok), "failed": len(results) - len(ok)},
        "errors": error_counts(results),
        "tokens": {
            "prompt": sum(r.prompt_tokens for r in ok),
            "output": out_tokens,
            "output_requested": sum(r.max_tokens for r in ok),
        },
        "throughput": {"requests_per_s": per_s(len(ok)), "output_tokens_per_s": per_s(out_tokens)},
        "latency_ms": latency_table(results),
        "slo": {
            "ttft_ms": slo.ttft_ms,
            "tpot_ms": slo.tpot_ms,
            "met": met,
            "attainment": met / len(results) if results else 0.0,
            "goodput_rps": per_s(met),
            "met_every_gap": met_every_gap,
            "goodput_every_gap_rps": per_s(met_every_gap),
        },
    }


def sweep_point(rate: float, summary: dict[str, Any]) -> dict[str, Any]:
    """One row of a rate sweep, taken from a run's summary."""
    lat = summary["latency_ms"]
    return {
        "rate": rate,
        "attainment": summary["slo"]["attainment"],
        "goodput_rps": summary["slo"]["goodput_rps"],
        "goodput_every_gap_rps": summary["slo"].get("goodput_every_gap_rps"),
        "throughput_rps": summary["throughput"]["requests_per_s"],
        "output_tokens_per_s": summary["throughput"]["output_tokens_per_s"],
        "failed": summary["requests"]["failed"],
        "ttft_p90_ms": lat["ttft"]["p90"],
        "tpot_p90_ms": lat["tpot"]["p90"],
    }


def max_rate_meeting(
    points: Sequence[dict[str, Any]], target: float = ATTAINMENT_TARGET
) -> float | None:
    """The highest rate of an ascending sweep up to which attainment stays >= target.

    Stops at the first rate that misses (a later lucky rate does not count); None when even the
    lowest rate misses. This is DistServe's "goodput" as a single rate.
    """
    best = None
    for p in sorted(points, key=lambda p: p["rate"]):
        if p["attainment"] < target:
            break
        best = p["rate"]
    return best


def summarize_sweep(
    points: Sequence[dict[str, Any]], target: float = ATTAINMENT_TARGET
) -> dict[str, Any]:
    """The sweep's combined view: per-rate rows and the best rate meeting the target."""
    return {
        "points": sorted(points, key=lambda p: p["rate"]),
        "attainment_target": target,
        "max_rate_meeting_target": max_rate_meeting(points, target),
        "max_goodput_rps": max((p["goodput_rps"] for p in points), default=0.0),
    }
