"""Write and print results: `summary.json`, `requests.jsonl`, `sweep.json`, a text table.

Layout of an output directory:

    OUT/summary.json        config + statistics of the run (see `stats.summarize`)
    OUT/requests.jsonl      one `RequestResult` per line, in request order
    OUT/latency_cdf.png     CDFs of TTFT and TPOT with the SLOs marked

With `--sweep-rates`, each rate gets `OUT/rate-<r>/` with the files above, and OUT holds
`sweep.json` (per-rate rows, best rate meeting the attainment target) and `sweep.png`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitserve.bench.results import RequestResult


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as strings ("inf"), so that the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> Path:
    """Write `data` as indented strict JSON; creates the parent directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")
    return path


def write_requests(path: Path, results: Sequence[RequestResult]) -> Path:
    """Write one JSON line per request."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(json_safe(r.to_json()), allow_nan=False) for r in results)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def read_requests(path: Path) -> list[RequestResult]:
    """Read back a `requests.jsonl`."""
    return [RequestResult.from_json(json.loads(line)) for line in path.read_text().splitlines()]


def rate_dir_name(rate: float) -> str:
    """The sub-directory of one rate in a sweep: rate-0.5, rate-4, rate-inf."""
    return f"rate-{rate:g}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable table of one run."""
    req, thr, slo = summary["requests"], summary["throughput"], summary["slo"]
    lines = [
        f"requests {req['succeeded']}/{req['total']} ok, {req['failed']} failed, "
        f"{summary['duration_s']:.2f} s",
        f"throughput {thr['requests_per_s']:.2f} req/s, {thr['output_tokens_per_s']:.1f} tok/s",
        f"SLO ttft<={slo['ttft_ms']:g} ms tpot<={slo['tpot_ms']:g} ms: attainment "
        f"{slo['attainment']:.1%}, goodput {slo['goodput_rps']:.2f} req/s",
        f"{'ms':<6}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}",
    ]
    for name, row in summary["latency_ms"].items():
        cells = "".join(f"{_fmt(row[k]):>9}" for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"{name:<6}{cells}")
    lines += [f"error x{n}: {msg}" for msg, n in list(summary["errors"].items())[:5]]
    return "\n".join(lines)


def format_sweep(sweep: dict[str, Any]) -> str:
    """A table of a rate sweep: one line per rate."""
    lines = [f"{'rate':>7}{'attain':>9}{'goodput':>9}{'req/s':>8}{'ttft p90':>10}{'tpot p90':>10}"]
    for p in sweep["points"]:
        lines.append(
            f"{p['rate']:>7g}{p['attainment']:>9.1%}{p['goodput_rps']:>9.2f}"
            f"{p['throughput_rps']:>8.2f}{_fmt(p['ttft_p90_ms']):>10}{_fmt(p['tpot_p90_ms']):>10}"
        )
    best = sweep["max_rate_meeting_target"]
    lines.append(
        f"max rate with attainment >= {sweep['attainment_target']:.0%}: "
        f"{'none' if best is None else f'{best:g} req/s'}"
    )
    return "\n".join(lines)
