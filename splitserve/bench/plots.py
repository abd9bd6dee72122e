"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed).

- `plot_latency_cdfs`: CDFs of TTFT and TPOT of one run, SLOs as dashed lines.
- `plot_sweeps`: SLO attainment and goodput against request rate, one line per series
  (one series for `--sweep-rates`; one per deployment in `scripts/bench_disagg.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from splitserve.bench.results import RequestResult  # noqa: E402
from splitserve.bench.stats import SLO  # noqa: E402


def _cdf(ax: Any, values_ms: Sequence[float], slo_ms: float, title: str) -> None:
    xs = np.sort(np.asarray(values_ms, dtype=float))
    if xs.size:
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.axvline(slo_ms, color="tab:red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set(title=title, xlabel="ms", ylabel="fraction of requests", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")


def plot_latency_cdfs(results: Sequence[RequestResult], slo: SLO, path: Path) -> Path:
    """Write the TTFT and TPOT CDFs of the successful requests to `path`."""
    ok = [r for r in results if r.ok]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    _cdf(left, [r.ttft_s * 1000 for r in ok if r.ttft_s is not None], slo.ttft_ms, "TTFT")
    _cdf(right, [r.tpot_s * 1000 for r in ok if r.tpot_s is not None], slo.tpot_ms, "TPOT")
    fig.suptitle(f"latency CDFs ({len(ok)}/{len(results)} requests ok)")
    return _save(fig, path)


def plot_sweeps(
    series: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str = ""
) -> Path:
    """Write attainment-vs-rate and goodput-vs-rate panels; `series` maps a label to sweep rows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, points in series.items():
        rows = sorted(points, key=lambda p: p["rate"])
        rates = [p["rate"] for p in rows]
        left.plot(rates, [p["attainment"] * 100 for p in rows], marker="o", label=label)
        right.plot(rates, [p["goodput_rps"] for p in rows], marker="o", label=label)
    left.axhline(90, color="tab:gray", linestyle=":", label="90 %")
    left.set(title="SLO attainment", xlabel="request rate (req/s)", ylabel="%", ylim=(0, 102))
    right.set(title="goodput", xlabel="request rate (req/s)", ylabel="req/s meeting SLO")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
