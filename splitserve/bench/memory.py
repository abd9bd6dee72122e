"""Memory of a soak run (pure): per-process RSS table and the flatness rule.

A sample is `{"t_s": seconds since the load started, "rss": {process label: bytes}}`. The rule
judges growth over the *second half* of the run (from the first sample at or after half the
run's duration to the last one), not from the start: caches that fill once per new input shape
(oneDNN matmul primitives keyed by the token count, allocator pools sized by it) make a process
grow quickly at first and then level off, which is bounded warm-up, not a leak; a leak grows at
the same rate all the way, so it still shows in the second half (a linear leak of 2x the limit
over the run grows by about the limit in its second half). Start, end and peak are reported
alongside, so that warm-up growth stays visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MIB = 2**20


def judged_from(samples: Sequence[dict[str, Any]], fraction: float = 0.5) -> int:
    """Index of the first sample at or after `fraction` of the run's duration."""
    if not samples:
        raise ValueError("no samples")
    cut = samples[0]["t_s"] + fraction * (samples[-1]["t_s"] - samples[0]["t_s"])
    return next(i for i, s in enumerate(samples) if s["t_s"] >= cut)


def memory_table(samples: Sequence[dict[str, Any]], fraction: float = 0.5) -> list[dict[str, Any]]:
    """Per process present in the first and last samples: start, judged-from, end and peak RSS
    (MiB), growth over the whole run and over the judged part (fractions)."""
    first, last = samples[0]["rss"], samples[-1]["rss"]
    mid = samples[judged_from(samples, fraction)]["rss"]
    rows = []
    for name in sorted(first):
        if name not in last:
            continue
        base = mid.get(name, first[name])
        peak = max(s["rss"].get(name, 0) for s in samples)
        rows.append({
            "process": name,
            "start_mib": round(first[name] / MIB, 1),
            "judged_from_mib": round(base / MIB, 1),
            "end_mib": round(last[name] / MIB, 1),
            "peak_mib": round(peak / MIB, 1),
            "growth": round(last[name] / first[name] - 1, 4),
            "judged_growth": round(last[name] / base - 1, 4),
        })
    return rows


def grew(rows: Sequence[dict[str, Any]], max_growth: float) -> list[dict[str, Any]]:
    """The rows whose judged growth exceeds `max_growth` (the soak fails if any)."""
    return [r for r in rows if r["judged_growth"] > max_growth]
