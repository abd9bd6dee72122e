"""Request traces: arrival times and prompt / output lengths, generated with a seeded RNG.

    trace = make_trace(TraceSpec("bursty", base_rate=800, duration_s=900, seed=1))

Arrivals are a non-homogeneous Poisson process (thinning, vectorized); lengths are log-normal
with the given means, clipped to the context. The same spec always gives the same trace.
`replay_trace` wraps given requests (a recorded benchmark's schedule) instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TRACE_KINDS = ("steady", "bursty", "diurnal")
# Log-normal spreads of prompt and output lengths: chat traces (ShareGPT-like) have a
# coefficient of variation around 0.6-1 for both.
PROMPT_SIGMA = 0.6
OUTPUT_SIGMA = 0.8
MIN_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class TraceSpec:
    """What to generate. `base_rate` is the steady rate, the bursty trace's floor and the
    diurnal trace's peak (requests/s)."""

    kind: str
    base_rate: float
    duration_s: float
    prompt_mean: int = 1024
    output_mean: int = 256
    max_model_len: int = 8192
    seed: int = 0
    burst_factor: float = 3.0  # bursty: peak rate / base rate
    burst_every_s: float = 900.0  # bursty: mean gap between burst starts
    burst_ramp_s: float = 30.0  # bursty: ramp up and ramp down each
    burst_hold_s: float = 120.0  # bursty: time at the peak
    diurnal_floor: float = 0.25  # diurnal: trough rate / peak rate

    def __post_init__(self) -> None:
        if self.kind not in TRACE_KINDS:
            raise ValueError(f"trace kind {self.kind!r}; known: {', '.join(TRACE_KINDS)}")
        if self.base_rate <= 0 or self.duration_s <= 0:
            raise ValueError("trace: base_rate and duration_s must be positive")


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; request i is (arrival_s[i], prompt[i], output[i]).
    `cached[i]`: the leading prompt tokens already in the prefill engine's prefix cache (they
    cost no compute; None: none are)."""

    spec: TraceSpec
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    burst_starts: tuple[float, ...] = ()
    cached: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        """The intended arrival rate at time(s) `t`."""
        return rate_at(self.spec, np.asarray(t, dtype=float), self.burst_starts)

    @property
    def peak_rate(self) -> float:
        """The highest intended rate over the trace."""
        grid = np.linspace(0.0, self.spec.duration_s, 4001)
        return float(self.rate(grid).max())


def burst_schedule(spec: TraceSpec) -> tuple[float, ...]:
    """Start times of the bursts: every `burst_every_s` with +-30% seeded jitter."""
    if spec.kind != "bursty":
        return ()
    rng = np.random.default_rng([spec.seed, 1])
    starts, t = [], spec.burst_every_s / 2
    while t < spec.duration_s:
        starts.append(float(t))
        t += spec.burst_every_s * rng.uniform(0.7, 1.3)
    return tuple(starts)


def rate_at(spec: TraceSpec, t: np.ndarray, burst_starts: tuple[float, ...] = ()) -> np.ndarray:
    """Arrival rate (requests/s) of `spec` at times `t` (vectorized)."""
    if spec.kind == "steady":
        return np.full_like(t, spec.base_rate)
    if spec.kind == "diurnal":
        phase = (1 - np.cos(2 * math.pi * t / spec.duration_s)) / 2  # 0 at the ends, 1 mid-way
        return spec.base_rate * (spec.diurnal_floor + (1 - spec.diurnal_floor) * phase)
    lift = np.zeros_like(t)
    ramp, hold = spec.burst_ramp_s, spec.burst_hold_s
    for s in burst_starts:
        x = t - s
        up = np.clip(x / ramp, 0, 1)
        down = np.clip((ramp + hold + ramp - x) / ramp, 0, 1)
        lift = np.maximum(lift, np.minimum(up, down))
    return spec.base_rate * (1 + (spec.burst_factor - 1) * lift)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)


def make_trace(spec: TraceSpec) -> Trace:
    """Generate the trace of `spec` (deterministic in `spec.seed`)."""
    rng = np.random.default_rng(spec.seed)
    starts = burst_schedule(spec)
    grid = np.linspace(0.0, spec.duration_s, 4001)
    peak = float(rate_at(spec, grid, starts).max())
    n = rng.poisson(peak * spec.duration_s)
    t = np.sort(rng.uniform(0.0, spec.duration_s, n))
    keep = rng.uniform(0.0, peak, n) < rate_at(spec, t, starts)
    t = t[keep]
    out_cap = spec.max_model_len // 2
    output = np.clip(_lognormal(rng, spec.output_mean, OUTPUT_SIGMA, len(t)), 1, out_cap)
    prompt_cap = spec.max_model_len - output
    prompt = np.clip(_lognormal(rng, spec.prompt_mean, PROMPT_SIGMA, len(t)), MIN_PROMPT_TOKENS,
                     prompt_cap)
    return Trace(spec, t, prompt.astype(np.int64), output.astype(np.int64), starts)


def replay_trace(arrival_s, prompt, output, rate: float, cached=None) -> Trace:
    """A trace of given requests (a recorded benchmark's schedule), in arrival order: exact
    arrival times and lengths, nothing drawn. `rate` is the nominal request rate (req/s);
    `cached` optional prompt tokens per request that hit the prefix cache."""
    t = np.asarray(arrival_s, dtype=float)
    order = np.argsort(t, kind="stable")
    t = t[order]
    cols = [np.asarray(x, dtype=np.int64)[order] for x in (prompt, output)]
    if len(t) == 0 or np.any(cols[0] < 1) or np.any(cols[1] < 1):
        raise ValueError("replay_trace: needs at least one request, lengths >= 1")
    hits = None if cached is None else np.asarray(cached, dtype=np.int64)[order]
    if hits is not None and np.any((hits < 0) | (hits >= cols[0])):
        raise ValueError("replay_trace: cached tokens must lie in [0, prompt)")
    spec = TraceSpec("steady", base_rate=rate, duration_s=max(float(t[-1]), 1e-6),
                     prompt_mean=int(cols[0].mean()), output_mean=int(cols[1].mean()),
                     max_model_len=int((cols[0] + cols[1]).max()))
    return Trace(spec, t, cols[0], cols[1], (), hits)
