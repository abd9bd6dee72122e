"""Simulation outcomes: SLO attainment, goodput, device-hours, latency percentiles, timeline.

A request counts toward goodput only when it completed with TTFT <= SLO and mean TPOT <= SLO
(DistServe's definition). Requests rejected (too long for any replica), still running when the
simulation stopped, or slower end to end than the router's timeout are failures; every request
is exactly one of completed or failed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from splitserve.controller.sim.engine import DONE, REJECTED

# The router's request timeout (config `router.request_timeout_s` default): slower is a failure.
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class SimResult:
    """What one simulation run achieved."""

    policy: str
    mode: str
    trace: str
    requests: int
    completed: int
    failed: int  # rejected + unfinished + timed out
    slo_attainment: float  # fraction of all requests meeting both SLOs
    goodput_rps: float  # requests/s meeting both SLOs, over the trace duration
    device_hours: float  # devices held (starting, ready, draining) over the trace duration
    mean_devices: float
    goodput_per_device: float
    ttft_p50_s: float
    ttft_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    max_replicas: dict
    wall_s: float
    events: int
    paths: dict = field(default_factory=dict)  # the router policy's decisions, by path

    def to_json(self) -> str:
        """The result as JSON (no timeline)."""
        return json.dumps(asdict(self), indent=2)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def summarize(raw: dict, trace, slo, pools: dict, timeline: list[dict], policy: str,
              mode: str) -> SimResult:
    """Turn a run's per-request arrays into a `SimResult`."""
    arrival, out = trace.arrival_s, trace.output
    status, first, finish = raw["status"], raw["first"], raw["finish"]
    done = status == DONE
    e2e = np.where(done, finish - arrival, np.inf)
    completed = done & (e2e <= REQUEST_TIMEOUT_S)
    ttft = first - arrival
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0)
    good = completed & (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
    duration = trace.spec.duration_s
    device_s = sum(p.device_s for p in pools.values())
    n = len(trace)
    peak = {r: max((row["ready"] + row["starting"] for row in timeline if row["pool"] == r),
                   default=0) for r in pools}
    goodput = float(good.sum()) / duration
    mean_devices = device_s / duration
    return SimResult(
        policy=policy, mode=mode, trace=trace.spec.kind, requests=n,
        completed=int(completed.sum()), failed=int(n - completed.sum()),
        slo_attainment=float(good.mean()) if n else 0.0, goodput_rps=goodput,
        device_hours=device_s / 3600, mean_devices=mean_devices,
        goodput_per_device=goodput / mean_devices if mean_devices else 0.0,
        ttft_p50_s=_pct(ttft[completed], 50), ttft_p90_s=_pct(ttft[completed], 90),
        tpot_p50_s=_pct(tpot[completed], 50), tpot_p90_s=_pct(tpot[completed], 90),
        max_replicas=peak, wall_s=raw["wall_s"], events=raw["events"],
        paths=raw.get("paths", {}),
    )


def failure_breakdown(raw: dict, trace) -> dict[str, int]:
    """Failures by cause: rejected, unfinished, timed out."""
    status = raw["status"]
    e2e = raw["finish"] - trace.arrival_s
    return {
        "rejected": int((status == REJECTED).sum()),
        "unfinished": int((status == 0).sum()),
        "timed_out": int(((status == DONE) & (e2e > REQUEST_TIMEOUT_S)).sum()),
    }


def write_outputs(result: SimResult, timeline: list[dict], out_dir: str | Path) -> list[str]:
    """Write result.json, timeline.json and (with matplotlib) replicas.png; returns notes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{result.trace}-{result.policy}-{result.mode}"
    (out / f"{stem}.json").write_text(result.to_json() + "\n")
    (out / f"{stem}-timeline.json").write_text(json.dumps(timeline) + "\n")
    notes = [f"wrote {out / stem}.json and {stem}-timeline.json"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return notes + ["matplotlib is not installed: no plot (pip install matplotlib)"]
    fig, ax = plt.subplots(figsize=(9, 4))
    roles = sorted({row["pool"] for row in timeline})
    for role in roles:
        rows = [r for r in timeline if r["pool"] == role]
        ax.step([r["t"] for r in rows], [r["ready"] + r["starting"] for r in rows], label=role)
    front_role = "prefill" if "prefill" in roles else roles[0]
    front = [r for r in timeline if r["pool"] == front_role]
    rate = ax.twinx()
    rate.plot([r["t"] for r in front], [r["arrival_rate"] for r in front], color="0.6", lw=0.8,
              ls="--", label="arrivals (req/s)")
    rate.set_ylabel("arrivals (req/s)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("replicas (ready + starting)")
    ax.set_title(f"{stem}: attainment {result.slo_attainment:.1%}, "
                 f"{result.device_hours:.1f} device-hours")
    ax.legend(loc="upper left")
    fig.savefig(out / f"{stem}.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return notes + [f"wrote {out / stem}.png"]
