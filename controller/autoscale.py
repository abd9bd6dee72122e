"""Autoscaling policy: pure functions from a window of pool metrics to a desired replica count.

Policy only; an actuator (Ray Serve, Kubernetes, the simulator) gathers `PoolSample`s every
control period and applies the returned count. State is explicit: each call takes the pool's
frozen state and returns the next one (no globals, no clocks).

    decision, state = slo_policy(window, target, state, params)       # ours
    decision, qstate = queue_policy(window, qtarget, qstate, qparams)  # Ray Serve's default

`slo_policy` sizes prefill for TTFT and decode for TPOT separately, from per-replica capacities
at the SLO (the planner's cost model) and a linear load trend projected one cooldown ahead; it
corrects on observed SLO breaches, ignores warm-up samples of fresh replicas, and holds between
two utilization thresholds (hysteresis) with separate up/down cooldowns. `queue_policy` is the
baseline: Ray Serve 2.60's `replica_queue_length_autoscaling_policy` (ongoing requests per
replica vs. `target_ongoing_requests`, averaged over `look_back_period_s`, with upscale and
downscale delays).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

# --- slo_policy thresholds -----------------------------------------------------------------
# Load is measured in replicas-at-SLO: a pool's per-replica capacity (the planner's) already
# holds its queueing headroom, so utilization 1.0 is the edge of the SLO, not saturation.
# Scale up when projected utilization exceeds this: just before the edge, because replicas
# asked for now arrive only after a start-up time.
UTIL_HIGH = 0.95
# Size every change to this utilization: 20% spare for load noise (a smoothed +-10% sample
# noise stays under UTIL_HIGH with > 3 sigma) and for growth during a replica's start-up.
UTIL_TARGET = 0.8
# Scale down only below this: the band 0.55-0.95 around the target is the hysteresis that
# keeps load noise from flapping replicas (after a downscale utilization lands at 0.8 < 0.95).
UTIL_LOW = 0.55
# Samples averaged for "load now": sqrt(3) less noise, and a doubling still shows in one period
# ((1 + 1 + 2) / 3 x 0.7 = 0.93 > UTIL_HIGH).
SMOOTH_SAMPLES = 3
# The trend is a least-squares line over the window's warm samples, projected one upscale
# cooldown ahead and used through its lower confidence bound: the projection minus this many
# standard errors. Noise then cannot raise it (a noise "slope" comes with a wide band), while a
# clean ramp keeps almost all of its projection.
TREND_CONFIDENCE = 2.0
MIN_TREND_SAMPLES = 4
# A rising load vetoes any scale-down once its slope is this many standard errors above zero
# (a weak test: holding replicas on a hint of growth is cheap).
RISING_T_STAT = 1.0
# Projected utilization above this skips the upscale cooldown: a deficit of 40% is no noise
# (the smoothed load's noise is ~6%), and every period waited adds to a backlog.
UTIL_URGENT = 1.4
# Observed p90 above SLO x this means the capacity estimate is wrong: add replicas regardless.
BREACH_RATIO = 1.0
# Replicas added per breach, as a fraction of the current count (at least one).
BREACH_STEP = 0.25
# No scale-down while observed p90 is above SLO x this (the pool is not idle, just cheap).
DOWN_LATENCY_GUARD = 0.8
# Decode KV usage above this is about to preempt (vLLM recomputes evicted requests): scale up.
KV_HIGH = 0.9


@dataclass(frozen=True)
class PoolSample:
    """One pool's metrics over one control period ending at `t` (seconds).

    `ttft_p90_s`: the pool's own share of time to first token (prefill: queue + prefill;
    colocated: the whole TTFT); `tpot_p90_s`: time per output token. None: no request finished.
    """

    t: float
    ready: int
    starting: int = 0
    arrival_rate: float = 0.0  # requests/s entering the pool
    token_rate: float = 0.0  # prompt tokens/s entering the pool
    out_token_rate: float = 0.0  # output tokens/s the entering requests will need
    queue_depth: int = 0  # requests waiting
    queued_tokens: float = 0.0  # prompt tokens waiting
    running: int = 0
    kv_usage: float = 0.0  # fraction of the pool's KV in use
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None


@dataclass(frozen=True)
class PoolTarget:
    """What one replica sustains at the SLO (the planner's capacity) and the pool's bounds.

    Prefill sets `token_capacity` (prompt tokens/s) and `ttft_s`; decode sets `seq_capacity`
    (concurrent sequences), `out_token_capacity` (output tokens/s at that batch) and `tpot_s`;
    a colocated pool sets all of them.
    """

    token_capacity: float | None = None
    seq_capacity: float | None = None
    out_token_capacity: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    min_replicas: int = 1
    max_replicas: int = 1024
    scale_to_zero: bool = False


@dataclass(frozen=True)
class PolicyParams:
    """Timing of `slo_policy` (seconds and sample counts)."""

    # Metrics are scraped every 5 s (Prometheus' usual 5-15 s); shorter gives noisy p90s.
    control_period_s: float = 5.0
    # Starting replicas already count as capacity, so a short up-cooldown cannot double-scale;
    # it only damps consecutive noisy samples.
    upscale_cooldown_s: float = 15.0
    # No scale-down within 2 minutes of any change: more than twice a GPU replica's start-up
    # (~60 s), so capacity released is not needed again before it could come back.
    downscale_cooldown_s: float = 120.0
    # Samples after a replica becomes ready that are ignored: its first requests pay graph
    # capture, cache warm-up and the NIXL handshake (164 ms vs 27 ms measured on the CPU).
    warmup_samples: int = 2
    # Scale to zero (when allowed) only after this long with no traffic at all.
    idle_to_zero_s: float = 300.0
    # A queued backlog is planned to drain over this long on top of the arrivals: replicas
    # asked for now serve only after their start-up (~60 s for a GPU replica), so sizing to
    # drain it within one period would order replicas that arrive after the backlog is gone.
    backlog_drain_s: float = 60.0


@dataclass(frozen=True)
class PoolState:
    """What `slo_policy` remembers between calls for one pool."""

    last_up_t: float = -math.inf
    last_down_t: float = -math.inf
    cold_from_t: float = -math.inf  # samples with cold_from_t < t <= cold_until_t are warm-up
    cold_until_t: float = -math.inf
    last_ready: int = 0
    idle_since_t: float | None = None  # start of the current stretch with no traffic at all

    @staticmethod
    def fresh(t: float, ready: int, params: PolicyParams) -> PoolState:
        """The state of a pool whose `ready` replicas started at `t`: all still warming up,
        and the start counts as a scale-up (load ramps from zero; no scale-down before the
        downscale cooldown has passed)."""
        until = t + params.warmup_samples * params.control_period_s
        return PoolState(last_up_t=t, cold_from_t=-math.inf, cold_until_t=until, last_ready=ready)


@dataclass(frozen=True)
class PoolDecision:
    """The desired replica count (ready + starting) and why."""

    replicas: int
    reason: str
    load: float = 0.0  # projected load in replica-equivalents at the SLO


def _load_units(s: PoolSample, target: PoolTarget, drain_s: float) -> float:
    """Demand in replicas-at-SLO: prompt tokens/s (plus backlog) and in-flight sequences."""
    units = 0.0
    if target.token_capacity:
        backlog = s.queued_tokens / drain_s
        units += (s.token_rate + backlog) / target.token_capacity
    if target.seq_capacity:
        # In-flight sequences shrink when a pool is over-provisioned (faster steps finish them
        # sooner), so they under-state demand; the output tokens entering do not. The larger
        # of the two also sees a backlog or KV-bound batches.
        seqs = s.running + (s.queue_depth if not target.token_capacity else 0)
        units_seq = seqs / target.seq_capacity
        units_out = s.out_token_rate / target.out_token_capacity if target.out_token_capacity else 0
        units += max(units_seq, units_out)
    return units


def _breach(s: PoolSample, target: PoolTarget) -> float:
    """Worst observed p90 / SLO ratio in one sample (0 when nothing was measured)."""
    ratios = [obs / slo for obs, slo in ((s.ttft_p90_s, target.ttft_s), (s.tpot_p90_s, target.tpot_s))
              if obs is not None and slo]
    return max(ratios, default=0.0)


def trend_at(ts: Sequence[float], ys: Sequence[float], at: float) -> tuple[float, float, float]:
    """Least-squares line through (ts, ys): its value at `at`, that value's standard error,
    and the slope's t statistic (inf for an exact line with a slope, 0 without one)."""
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if n < 3 or sxx == 0:
        return my, math.inf, 0.0
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sxx
    resid = sum((y - my - slope * (t - mt)) ** 2 for t, y in zip(ts, ys))
    s = math.sqrt(resid / (n - 2))
    se_value = s * math.sqrt(1 / n + (at - mt) ** 2 / sxx)
    stderr = s / math.sqrt(sxx)
    tstat = slope / stderr if stderr else (math.inf if slope else 0.0)
    return my + slope * (at - mt), se_value, tstat


def _observe(window: Sequence[PoolSample], state: PoolState, params: PolicyParams):
    """Mark a cold interval when the ready count rose; return (warm samples, new state)."""
    last = window[-1]
    if last.ready > state.last_ready:
        prev_t = window[-2].t if len(window) > 1 else last.t - params.control_period_s
        until = last.t + (params.warmup_samples - 1) * params.control_period_s
        state = replace(state, cold_from_t=prev_t, cold_until_t=until)
    idle_since = None
    if _idle(last):
        idle_since = last.t if state.idle_since_t is None else state.idle_since_t
    state = replace(state, last_ready=last.ready, idle_since_t=idle_since)
    warm = [s for s in window if not state.cold_from_t < s.t <= state.cold_until_t]
    return warm, state


def _idle(s: PoolSample) -> bool:
    return s.arrival_rate == 0 and s.running == 0 and s.queue_depth == 0


def _floor(target: PoolTarget, state: PoolState, now: float, params: PolicyParams) -> int:
    """The fewest replicas allowed now: `min_replicas`, and at least one unless scale-to-zero is
    on and the pool has seen no traffic for `idle_to_zero_s`."""
    idle_long = state.idle_since_t is not None and now - state.idle_since_t >= params.idle_to_zero_s
    if target.scale_to_zero and idle_long:
        return target.min_replicas
    return max(1, target.min_replicas)


def _projected(warm: Sequence[PoolSample], target: PoolTarget, params: PolicyParams):
    """(load for scaling up, load for scaling down or None when rising), replica-equivalents.

    Up: the larger of the smoothed recent load and the trend one cooldown ahead (its lower
    confidence bound). Down: the window's peak load, so a dip inside the window never releases
    capacity; None while the window's slope is positive beyond noise.
    """
    loads = [_load_units(s, target, params.backlog_drain_s) for s in warm]
    now = sum(loads[-SMOOTH_SAMPLES:]) / len(loads[-SMOOTH_SAMPLES:])
    if len(warm) < MIN_TREND_SAMPLES:
        return now, max(loads)
    ahead, se, tstat = trend_at([s.t for s in warm], loads, warm[-1].t + params.upscale_cooldown_s)
    up = max(now, ahead - TREND_CONFIDENCE * se)
    return up, (None if tstat >= RISING_T_STAT else max(loads))


def _desired(current: int, warm: Sequence[PoolSample], target: PoolTarget,
             params: PolicyParams) -> tuple[int, str, float]:
    """The unconstrained decision from capacity, trend and observed SLO breaches."""
    up, down = _projected(warm, target, params)
    last = warm[-1]
    breach = _breach(last, target)
    if current == 0:
        return math.ceil(up / UTIL_TARGET), "from zero", up
    if breach > BREACH_RATIO and last.starting == 0:  # replicas on their way are the remedy
        step = max(1, math.ceil(current * BREACH_STEP))
        return max(current + step, math.ceil(up / UTIL_TARGET)), f"p90 at {breach:.2f}x SLO", up
    if target.seq_capacity and last.kv_usage > KV_HIGH:
        return max(current + 1, math.ceil(up / UTIL_TARGET)), f"KV {last.kv_usage:.0%} used", up
    if up / current > UTIL_HIGH:
        return math.ceil(up / UTIL_TARGET), f"utilization {up / current:.2f} > {UTIL_HIGH}", up
    if down is not None and down / current < UTIL_LOW and breach < DOWN_LATENCY_GUARD:
        return math.ceil(down / UTIL_TARGET), f"utilization {down / current:.2f} < {UTIL_LOW}", up
    return current, "within band", up


def slo_policy(window: Sequence[PoolSample], target: PoolTarget, state: PoolState,
               params: PolicyParams = PolicyParams()) -> tuple[PoolDecision, PoolState]:
    """Desired replicas for one pool from its recent samples (oldest first, newest last).

    Invariants: the result lies in [floor, target.max_replicas]; it is 0 only with
    `scale_to_zero` after `idle_to_zero_s` of no traffic; warm-up samples never raise it; a
    pool at zero with traffic gets replicas at once (nothing there to warm up or cool down).
    """
    last = window[-1]
    current = last.ready + last.starting
    warm, state = _observe(window, state, params)
    if current == 0 and (last.arrival_rate > 0 or last.queue_depth > 0):
        units = _load_units(last, target, params.backlog_drain_s)
        n = min(target.max_replicas, max(1, target.min_replicas, math.ceil(units / UTIL_TARGET)))
        return PoolDecision(n, "traffic at zero replicas", units), replace(state, last_up_t=last.t)
    floor = _floor(target, state, last.t, params)
    if not warm:
        return PoolDecision(min(max(current, floor), target.max_replicas), "warming up"), state
    want, reason, load = _desired(current, warm, target, params)
    if floor == 0 and want <= 1 and _idle(last):
        want, reason = 0, f"idle for {last.t - (state.idle_since_t or last.t):.0f} s"
    want = min(max(want, floor), target.max_replicas)
    urgent = current > 0 and load / current > UTIL_URGENT
    if want > current and last.t - state.last_up_t < params.upscale_cooldown_s and not urgent:
        return PoolDecision(current, f"{reason}; upscale cooldown", load), state
    since_change = last.t - max(state.last_up_t, state.last_down_t)
    if want < current and since_change < params.downscale_cooldown_s:
        return PoolDecision(current, f"{reason}; downscale cooldown", load), state
    if want > current:
        state = replace(state, last_up_t=last.t)
    elif want < current:
        state = replace(state, last_down_t=last.t)
    return PoolDecision(want, reason, load), state


# --- the baseline: Ray Serve's default request-based policy ----------------------------------


@dataclass(frozen=True)
class QueueParams:
    """Ray Serve 2.60 `AutoscalingConfig` defaults (serve/config.py): target_ongoing_requests 2,
    look_back_period_s 30, upscale_delay_s 30, downscale_delay_s 600."""

    target_ongoing_requests: float = 2.0
    look_back_period_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    min_replicas: int = 1
    max_replicas: int = 1024


@dataclass(frozen=True)
class QueueState:
    """Ray Serve's policy state: when the current scale direction was first wanted."""

    direction: int = 0  # +1 wants up, -1 wants down, 0 neither
    since_t: float | None = None


def queue_policy(window: Sequence[PoolSample], params: QueueParams,
                 state: QueueState = QueueState()) -> tuple[PoolDecision, QueueState]:
    """Ray Serve's `replica_queue_length_autoscaling_policy`: desired = ongoing requests
    (running + queued, averaged over the look-back) / target; a change is applied only after
    it has been wanted continuously for the up/down delay. No SLO, no trend, no warm-up."""
    last = window[-1]
    current = last.ready + last.starting
    if last.ready == 0:  # cold start: Serve scales to at least one replica when requests wait
        n = max(current, params.min_replicas, 1 if last.queue_depth or last.arrival_rate else 0)
        return PoolDecision(min(n, params.max_replicas), "cold start"), QueueState()
    recent = [s for s in window if s.t > last.t - params.look_back_period_s]
    ongoing = sum(s.running + s.queue_depth for s in recent) / len(recent)
    want = math.ceil(ongoing / params.target_ongoing_requests - 1e-9)
    want = min(max(want, params.min_replicas), params.max_replicas)
    direction = (want > current) - (want < current)
    if direction == 0:
        return PoolDecision(current, "at target", ongoing), QueueState()
    since = state.since_t if state.direction == direction and state.since_t is not None else last.t
    delay = params.upscale_delay_s if direction > 0 else params.downscale_delay_s
    if last.t - since + 1e-9 >= delay:
        return PoolDecision(want, f"ongoing {ongoing:.1f}", ongoing), QueueState()
    return PoolDecision(current, "waiting out delay", ongoing), QueueState(direction, since)
