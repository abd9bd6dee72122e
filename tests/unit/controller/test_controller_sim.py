"""splitserve.controller.sim: traces, the decode step clock, and whole runs (determinism,
conservation, event counts, and the SLO policy against Ray Serve's queue policy)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from splitserve.controller.planner import Slo
from splitserve.controller.sim import Scenario, TraceSpec, build, make_trace, run_scenario
from splitserve.controller import control as control_module
from splitserve.controller.autoscale import UTIL_TARGET, PoolSample, PoolState, PoolTarget
from splitserve.controller.control import Controller, ControlSpec, with_upstream_demand
from splitserve.controller.sim.replica import Replica

# Small enough for seconds, large enough for bursts: base 20 req/s (~60 at the peak) of
# Llama-3-8B on H100s, 30 minutes with two 3x bursts.
BURSTY = TraceSpec("bursty", base_rate=20, duration_s=1800, seed=0)


def test_traces_are_deterministic_and_follow_their_rate() -> None:
    a, b = make_trace(BURSTY), make_trace(BURSTY)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output, b.output)
    assert not np.array_equal(a.arrival_s[:100], make_trace(replace(BURSTY, seed=1)).arrival_s[:100])
    assert a.peak_rate == pytest.approx(3 * 20)
    expected = np.trapezoid(a.rate(np.linspace(0, 1800, 10_001)), dx=0.18)
    assert len(a) == pytest.approx(expected, rel=0.03)
    assert np.all(np.diff(a.arrival_s) >= 0)
    assert a.prompt.mean() == pytest.approx(1024, rel=0.05)
    assert np.all(a.prompt + a.output <= BURSTY.max_model_len)


class LinearCost:
    """A toy cost model: 10 ms per sequence per step."""

    def decode_step_s(self, batch: float, context: float) -> float:
        return 0.01 * batch


class Firsts:
    def __init__(self) -> None:
        self.first: dict[int, float] = {}

    def first_token(self, req: int, t: float) -> None:
        self.first[req] = t


def test_step_clock_matches_per_token_arithmetic() -> None:
    pool, cost = Firsts(), LinearCost()
    rep = Replica(0, pool, 0.0)
    prompts, outputs = [100, 100, 100], [10, 20, 30]
    for req in range(3):
        rep.join(req, prompts[req], outputs[req])
    rep.retime(cost)
    finished = {}
    while rep.n:
        t = rep.next_finish_t()
        rep.advance(t)
        for req in rep.pop_finished(prompts, outputs):
            finished[req] = t
        rep.retime(cost)
    # 10 steps at batch 3 (30 ms), 10 at batch 2 (20 ms), 10 at batch 1 (10 ms).
    assert finished == pytest.approx({0: 0.3, 1: 0.5, 2: 0.6})
    assert pool.first == pytest.approx({0: 0.03, 1: 0.03, 2: 0.03})
    assert rep.kv_used == 0 and rep.ctx_base == 0


def small(policy: str, **kw) -> Scenario:
    return Scenario(policy=policy, **{"trace": BURSTY, **kw})


def test_runs_are_deterministic() -> None:
    scn = small("ours", trace=replace(BURSTY, duration_s=600))
    (a, tl_a), (b, tl_b) = run_scenario(scn), run_scenario(scn)
    strip = lambda r: {k: v for k, v in json.loads(r.to_json()).items() if k != "wall_s"}
    assert strip(a) == strip(b)
    assert tl_a == tl_b


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_every_request_completes_or_is_counted_failed(mode: str) -> None:
    # One replica per pool, no autoscaling, three times the load, and only 5 s to drain:
    # most requests cannot finish, and every one must still be accounted for.
    scn = small("fixed-peak", mode=mode, trace=replace(BURSTY, kind="steady", duration_s=120,
                                                       base_rate=100))
    sim, _, trace = build(scn)
    for pool in sim.pools.values():
        while len(pool.replicas) > 1:
            pool.retire(pool.replicas[-1], 0.0)
        pool.routable = list(pool.replicas)
    sim.end_t = trace.spec.duration_s + 5
    raw = sim.run()
    status = raw["status"]
    done = status == 1
    assert 0 < done.sum() < len(trace)
    assert np.all(np.isfinite(raw["finish"][done])) and np.all(np.isnan(raw["finish"][~done]))
    assert np.all(raw["first"][done] >= trace.arrival_s[done])
    assert np.all(raw["finish"][done] >= raw["first"][done])


def test_result_counts_add_up_and_events_stay_per_request() -> None:
    result, timeline = run_scenario(small("ours", trace=replace(BURSTY, duration_s=900)))
    assert result.completed + result.failed == result.requests
    assert result.failed == 0
    # O(1) events per request (prefill batch, transfer, decode join and finish), never per token.
    assert result.events < 6 * result.requests
    assert {row["pool"] for row in timeline} == {"prefill", "decode"}


def test_the_controller_calls_the_real_policy_every_period(monkeypatch) -> None:
    calls = []
    real = control_module.slo_policy

    def spy(window, target, state, params):
        calls.append(window[-1].t)
        return real(window, target, state, params)

    monkeypatch.setattr(control_module, "slo_policy", spy)
    run_scenario(small("ours", trace=replace(BURSTY, duration_s=120)))
    period = Scenario(trace=BURSTY).params.control_period_s
    assert len(calls) >= 2 * int(120 / period)  # both pools, every period of the trace
    assert calls[0] == period


def test_ours_beats_the_queue_policy_on_a_bursty_trace() -> None:
    ours, _ = run_scenario(small("ours"))
    queue, _ = run_scenario(small("queue"))
    peak, _ = run_scenario(small("fixed-peak"))
    assert ours.slo_attainment > queue.slo_attainment + 0.05
    assert ours.device_hours < queue.device_hours
    assert ours.device_hours < peak.device_hours  # autoscaling saves devices off the peak...
    assert peak.slo_attainment > 0.99  # ...which the planner sized for


def test_a_tight_slo_lowers_attainment() -> None:
    loose, _ = run_scenario(small("fixed-peak", trace=replace(BURSTY, duration_s=300)))
    tight, _ = run_scenario(small("fixed-peak", trace=replace(BURSTY, duration_s=300),
                                  slo=Slo(ttft_s=0.05, tpot_s=0.1)))
    assert tight.slo_attainment < loose.slo_attainment
    assert math.isclose(loose.slo_attainment, 1.0, abs_tol=0.01)


# --- decode demand counted where requests enter (control.with_upstream_demand) ---------------


def test_decode_demand_includes_what_enters_the_prefill_pool() -> None:
    prefill = PoolSample(t=5.0, ready=4, out_token_rate=9000.0, queue_depth=500)
    decode = PoolSample(t=5.0, ready=2, out_token_rate=3000.0, running=100)
    raised = with_upstream_demand({"prefill": prefill, "decode": decode})
    assert raised["decode"].out_token_rate == 9000.0 and raised["decode"].running == 100
    assert raised["prefill"] is prefill
    # Steady state (decode already sees as much) and colocated pools are left alone.
    calm = {"prefill": replace(prefill, out_token_rate=2000.0), "decode": decode}
    assert with_upstream_demand(calm) == calm
    assert with_upstream_demand({"colocated": decode}) == {"colocated": decode}


def test_a_backlogged_prefill_pool_no_longer_hides_a_burst_from_decode() -> None:
    # Decode has sequences for 2 replicas at the SLO and as many output tokens entering it;
    # the prefill pool takes three times that (its backlog holds the rest back from decode).
    target = PoolTarget(seq_capacity=100, out_token_capacity=1000.0, tpot_s=0.1)
    spec = ControlSpec("ours", targets={"prefill": PoolTarget(token_capacity=1e9, ttft_s=1.0),
                                        "decode": target})
    ctl = Controller(spec, {"prefill": 4, "decode": 3})
    ctl.states = {role: PoolState(last_ready=n) for role, n in (("prefill", 4), ("decode", 3))}
    for k in range(1, 4):
        decisions = ctl.step({
            "prefill": PoolSample(t=5.0 * k, ready=4, out_token_rate=6000.0),
            "decode": PoolSample(t=5.0 * k, ready=3, out_token_rate=2000.0, running=200),
        })
    assert decisions["decode"].replicas >= math.ceil(6000 / 1000 / UTIL_TARGET)
    # Without the upstream term the same decode samples are within its band.
    alone = Controller(spec, {"decode": 3})
    alone.states = {"decode": PoolState(last_ready=3)}
    for k in range(1, 4):
        d = alone.step({"decode": PoolSample(t=5.0 * k, ready=3, out_token_rate=2000.0,
                                             running=200)})
    assert d["decode"].replicas == 3
