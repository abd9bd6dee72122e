"""splitserve.controller.autoscale: the SLO policy and Ray Serve's queue baseline, as pure
functions driven by synthetic sample windows (no simulator, no Ray)."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import replace
from itertools import pairwise

import pytest
from splitserve.controller.autoscale import (
    UTIL_TARGET,
    PolicyParams,
    PoolSample,
    PoolState,
    PoolTarget,
    QueueParams,
    QueueState,
    queue_policy,
    slo_policy,
    trend_at,
)

PARAMS = PolicyParams()
PERIOD = PARAMS.control_period_s
CAP = 24_000.0  # prompt tokens/s one prefill replica sustains at the SLO
TARGET = PoolTarget(token_capacity=CAP, ttft_s=0.9, min_replicas=1, max_replicas=100)
# A load step gets its first scale-up in the period that sees it, and the full replica count
# within this many periods (the 3-sample average catches up, then one upscale cooldown).
FULL_REACTION_PERIODS = 4


def sample(t: float, units: float, ready: int, *, ttft: float = 0.2, starting: int = 0,
           queue: int = 0) -> PoolSample:
    """A prefill-pool sample whose load is `units` replicas-at-SLO."""
    rate = units * CAP / 1024
    return PoolSample(t=t, ready=ready, starting=starting, arrival_rate=rate,
                      token_rate=units * CAP, queue_depth=queue, running=int(units > 0),
                      ttft_p90_s=ttft)


STARTUP_PERIODS = 12  # a new replica serves 60 s after it is asked for


class Pool:
    """Drives the policy like a controller would: new replicas start for STARTUP_PERIODS, then
    serve; removals take starting replicas first. `history`: desired counts per period."""

    def __init__(self, ready: int, target: PoolTarget = TARGET, t0: float = 0.0) -> None:
        self.ready, self.target = ready, target
        self.starting: list[float] = []  # times at which starting replicas become ready
        self.state = PoolState.fresh(t0, ready, PARAMS)
        self.window: deque[PoolSample] = deque(maxlen=12)
        self.history: list[int] = []

    def step(self, s: PoolSample) -> int:
        arrived = [t for t in self.starting if t <= s.t]
        self.ready += len(arrived)
        self.starting = [t for t in self.starting if t > s.t]
        self.window.append(replace(s, ready=self.ready, starting=len(self.starting)))
        d, self.state = slo_policy(tuple(self.window), self.target, self.state, PARAMS)
        delta = d.replicas - self.ready - len(self.starting)
        if delta > 0:
            self.starting += [s.t + STARTUP_PERIODS * PERIOD] * delta
        while delta < 0:
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1
            delta += 1
        self.history.append(d.replicas)
        return d.replicas


def run_noisy(noise: float, periods: int = 200, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    pool = Pool(ready=10)
    for k in range(1, periods + 1):
        units = 8.0 * (1 + rng.gauss(0, noise))  # utilization 0.8 at 10 replicas
        pool.step(sample(k * PERIOD, max(units, 0.0), pool.ready, ttft=0.2 + rng.uniform(0, 0.1)))
    return pool.history


def test_steady_noisy_load_never_changes_replicas() -> None:
    history = run_noisy(noise=0.10)
    assert set(history) == {10}, f"replicas changed under 10% noise: {sorted(set(history))}"


def test_heavier_noise_never_oscillates() -> None:
    history = run_noisy(noise=0.20)
    changes = [b - a for a, b in pairwise(history) if b != a]
    reversals = sum(1 for a, b in pairwise(changes) if (a > 0) != (b > 0))
    assert reversals == 0, f"up/down flapping under 20% noise: {changes}"


def test_cold_start_samples_do_not_scale_up() -> None:
    state = PoolState.fresh(0.0, 4, PARAMS)  # replicas just started: warmup_samples are cold
    cold = [sample(PERIOD * k, 12.0, 4, ttft=5.0, queue=500) for k in (1, 2)]
    d, state = slo_policy(tuple(cold), TARGET, state, PARAMS)
    assert d.replicas == 4 and d.reason == "warming up"
    # The same overload once warm is acted upon: the test above can fail.
    warm = cold + [sample(3 * PERIOD, 12.0, 4, ttft=5.0, queue=500)]
    d, _ = slo_policy(tuple(warm), TARGET, state, PARAMS)
    assert d.replicas > 4


def test_a_new_replica_makes_its_first_samples_cold() -> None:
    steady = tuple(sample(PERIOD * k, 2.0, 3) for k in range(1, 7))
    state = replace(PoolState(), last_ready=3, last_up_t=0.0)  # it was asked for at t = 0
    _, state = slo_policy(steady, TARGET, state, PARAMS)
    # A fourth replica came up; its first requests are slow (graph capture, NIXL handshake).
    burst = steady + (sample(7 * PERIOD, 2.0, 4, ttft=4.0),)
    d, state = slo_policy(burst, TARGET, state, PARAMS)
    assert d.replicas == 4
    assert state.cold_until_t >= 7 * PERIOD


def test_load_step_is_met_within_the_stated_periods() -> None:
    pool = Pool(ready=5)
    for k in range(1, 31):  # warm, steady at utilization 0.8
        pool.step(sample(k * PERIOD, 4.0, pool.ready))
    assert pool.ready == 5
    needed = math.ceil(8.0 / UTIL_TARGET)
    for k in range(31, 31 + FULL_REACTION_PERIODS):
        pool.step(sample(k * PERIOD, 8.0, pool.ready))
    after = pool.history[-FULL_REACTION_PERIODS:]
    assert after[0] > 5, after  # the first period already scales up
    assert after[-1] >= needed, after


def test_scale_down_waits_for_the_cooldown_and_stops_at_min_replicas() -> None:
    target = replace(TARGET, min_replicas=3)
    pool = Pool(ready=5, target=target)
    for k in range(1, 11):
        pool.step(sample(k * PERIOD, 9.0, pool.ready))
    up_t = next(k for k, n in enumerate(pool.history, 1) if n > 5) * PERIOD
    for k in range(11, 101):  # load collapses to almost nothing
        pool.step(sample(k * PERIOD, 0.1, pool.ready))
    first_down = next(k for k, (a, b) in enumerate(pairwise(pool.history), 2)
                      if b < a) * PERIOD
    assert first_down - up_t >= PARAMS.downscale_cooldown_s
    assert min(pool.history) == 3


@pytest.mark.parametrize("enabled", [False, True])
def test_scale_to_zero_only_when_enabled(enabled: bool) -> None:
    target = replace(TARGET, min_replicas=0, scale_to_zero=enabled)
    pool = Pool(ready=2, target=target)
    idle_periods = int(PARAMS.idle_to_zero_s / PERIOD) + 30
    for k in range(1, idle_periods):
        pool.step(sample(k * PERIOD, 0.0, pool.ready))
    assert pool.ready == (0 if enabled else 1)
    if enabled:  # not before the idle time has passed
        zero_at = pool.history.index(0) + 1
        assert zero_at * PERIOD >= PARAMS.idle_to_zero_s


def test_traffic_at_zero_replicas_scales_up_at_once() -> None:
    state = replace(PoolState(), last_up_t=0.0, last_ready=0)
    d, _ = slo_policy((sample(PERIOD, 3.0, 0),), replace(TARGET, scale_to_zero=True), state, PARAMS)
    assert d.replicas == math.ceil(3.0 / UTIL_TARGET)


def test_observed_slo_breach_adds_replicas_beyond_the_capacity_model() -> None:
    window = tuple(sample(PERIOD * k, 4.0, 5, ttft=0.3) for k in range(1, 8))
    state = replace(PoolState(), last_ready=5)
    d, _ = slo_policy(window, TARGET, state, PARAMS)
    assert d.replicas == 5  # the model says 5 is right, and latency agrees
    breached = window + (sample(8 * PERIOD, 4.0, 5, ttft=2.0),)
    d, _ = slo_policy(breached, TARGET, state, PARAMS)
    assert d.replicas > 5 and "SLO" in d.reason


def test_upward_trend_is_projected_one_cooldown_ahead() -> None:
    ramp = tuple(sample(PERIOD * k, 2.0 + 0.5 * k, 6) for k in range(1, 9))
    state = replace(PoolState(), last_ready=6)
    d, _ = slo_policy(ramp, TARGET, state, PARAMS)
    # The last three samples average 5.5 units: utilization 0.92 at 6 replicas, inside the band.
    # The clean ramp projects 6.0 + 0.5 x 3 = 7.5 units one 15 s cooldown ahead.
    assert d.replicas == math.ceil(7.5 / UTIL_TARGET)


def test_trend_at_gives_a_value_its_error_and_the_slope_t() -> None:
    value, se, t = trend_at([0, 5, 10, 15], [1, 2, 3, 4], 20)
    assert value == pytest.approx(5.0) and se == 0.0 and t == math.inf
    value, se, t = trend_at([0, 5, 10, 15], [2, 2, 2, 2], 20)
    assert value == pytest.approx(2.0) and t == 0.0
    value, se, t = trend_at([0, 5, 10, 15], [2, 3, 1, 2], 20)
    assert se > 0 and abs(t) < 1


def test_decode_demand_counts_output_tokens_not_only_running_sequences() -> None:
    # An over-provisioned decode pool runs few sequences (fast steps); the output tokens
    # entering still say how many replicas are needed.
    target = PoolTarget(seq_capacity=250, out_token_capacity=10_000, tpot_s=0.1)
    window = tuple(PoolSample(t=PERIOD * k, ready=8, arrival_rate=40, out_token_rate=20_000,
                              running=120, tpot_p90_s=0.01) for k in range(1, 30))
    state = replace(PoolState(), last_ready=8)
    d, _ = slo_policy(window, target, state, PARAMS)
    assert d.replicas == math.ceil(2.0 / UTIL_TARGET)


def queue_window(t_end: float, ongoing: float, ready: int) -> tuple[PoolSample, ...]:
    return tuple(PoolSample(t=t, ready=ready, running=int(ongoing))
                 for t in range(int(t_end) - 25, int(t_end) + 1, 5))


def test_queue_policy_waits_out_the_upscale_delay() -> None:
    params = QueueParams(target_ongoing_requests=2)
    state, decisions = QueueState(), []
    for t in range(5, 60, 5):
        d, state = queue_policy(queue_window(t, 10, 2), params, state)
        decisions.append((t, d.replicas))
    first_up = next(t for t, n in decisions if n > 2)
    assert first_up - 5 >= params.upscale_delay_s
    assert dict(decisions)[first_up] == 5  # ceil(10 ongoing / 2 per replica)


def test_queue_policy_downscale_needs_the_long_delay() -> None:
    params = QueueParams(target_ongoing_requests=2)
    state = QueueState()
    for t in range(5, 600, 5):
        d, state = queue_policy(queue_window(t, 2, 5), params, state)
        assert d.replicas == 5, t
    d, state = queue_policy(queue_window(605, 2, 5), params, state)
    assert d.replicas == 1
