"""The live controller's pure parts: router signals, their merge into pool samples, Serve replica
counts, policy targets from a config, and one control step applied through an actuator.

The real Ray Serve path (a load step adds a replica, a drain removes it) is
tests/e2e/test_autoscaling.py.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
from splitserve.controller.live import PoolController, _add
from splitserve.controller.serve_actuator import PoolCounts, pool_counts
from splitserve.controller.signals import PoolReport, merge_reports, p90
from splitserve.controller.targets import control_spec_for_config
from splitserve.router.signals import SignalRecorder
from splitserve.router.tenancy.admission import FairAdmission
from splitserve.router.tenancy.service import pool_max_in_flight
from splitserve.router.tenancy.tenants import Tenant

from splitserve.app import pool_deployment_options, serve_config, serve_run_options
from splitserve.config import load_config

AUTO = {"autoscaling": {"policy": "slo", "control_period_s": 3600, "max_replicas": 3}}


def cfg(**overrides):
    return load_config(None).with_overrides(**overrides)


def auto_cfg(**overrides):
    from splitserve.config import parse_config

    data = load_config(None).model_dump(mode="json")
    data.update(AUTO)
    return parse_config(data, "<test>").with_overrides(**overrides)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# ---- signals -------------------------------------------------------------------------------


def test_p90_nearest_rank() -> None:
    assert p90([]) is None
    assert p90([5.0]) == 5.0
    assert p90([float(i) for i in range(1, 11)]) == 9.0
    assert p90([float(i) for i in range(1, 101)]) == 90.0


def test_recorder_counts_one_period_and_starts_the_next() -> None:
    clock = Clock()
    rec = SignalRecorder(["prefill", "decode"], clock=clock)
    rec.arrival("decode", 100, 20)
    rec.arrival("decode", 300, 10)
    rec.first_token("decode", 0.25)
    rec.finished("decode", 1.9, 20)  # 19 gaps -> 0.1 s per token
    rec.finished("decode", 5.0, 1)  # one token: no TPOT
    gates = {"decode": SimpleNamespace(queued=3, in_flight=7)}
    clock.t += 2.0
    reports = rec.snapshot(gates)
    d = reports["decode"]
    assert (d.arrivals, d.prompt_tokens, d.output_tokens) == (2, 400, 30)
    assert (d.queue_depth, d.running, d.queued_tokens) == (3, 7, 600)  # 3 x mean prompt 200
    assert d.ttft_s == (0.25,) and d.tpot_s == pytest.approx((0.1,))
    assert d.period_s == 2.0
    assert reports["prefill"].arrivals == 0 and reports["prefill"].queue_depth == 0
    clock.t += 1.0
    again = rec.snapshot(gates)["decode"]
    assert (again.arrivals, again.ttft_s, again.tpot_s, again.period_s) == (0, (), (), 1.0)


def test_merge_sums_router_replicas_and_takes_p90_over_all_samples() -> None:
    a = PoolReport(t=1, period_s=5, arrivals=10, prompt_tokens=1000, output_tokens=200,
                   queue_depth=2, queued_tokens=50, running=4, ttft_s=(0.1,) * 9,
                   tpot_s=(0.02, 0.03))
    b = PoolReport(t=1, period_s=5, arrivals=5, prompt_tokens=500, output_tokens=100,
                   queue_depth=1, queued_tokens=25, running=2, ttft_s=(2.0,), tpot_s=(0.5,))
    s = merge_reports([a, b], t=7.0, period_s=5.0, ready=2, starting=1)
    assert (s.t, s.ready, s.starting) == (7.0, 2, 1)
    assert s.arrival_rate == 3.0 and s.token_rate == 300.0 and s.out_token_rate == 60.0
    assert (s.queue_depth, s.queued_tokens, s.running) == (3, 75.0, 6)
    assert s.ttft_p90_s == 0.1  # 10 samples: the 9th smallest
    assert s.tpot_p90_s == 0.5
    empty = merge_reports([], t=1.0, period_s=5.0, ready=1)
    assert empty.arrival_rate == 0 and empty.ttft_p90_s is None and empty.tpot_p90_s is None


def test_two_reports_of_one_router_add_up_gauges_from_the_newer() -> None:
    a = PoolReport(t=1, period_s=2, arrivals=3, queue_depth=9, running=1, ttft_s=(0.1,))
    b = PoolReport(t=3, period_s=2, arrivals=4, queue_depth=0, running=5, ttft_s=(0.2,))
    both = _add(a, b)
    assert (both.arrivals, both.period_s, both.queue_depth, both.running) == (7, 4, 0, 5)
    assert both.ttft_s == (0.1, 0.2) and _add(None, b) is b


# ---- Serve counts and options --------------------------------------------------------------


def test_pool_counts_from_replica_states() -> None:
    assert pool_counts({"RUNNING": 2, "STARTING": 1, "STOPPING": 1}, None) == PoolCounts(2, 1, 3)
    # asked for 3 but Serve has not created the third yet: it counts as starting
    assert pool_counts({"RUNNING": 2}, 3) == PoolCounts(2, 1, 3)
    # scaling down: the target is below ready; nothing is starting
    assert pool_counts({"RUNNING": 2, "STOPPING": 1}, 1) == PoolCounts(2, 0, 1)


def test_serve_options_turn_on_the_external_scaler_and_drain_only_with_autoscaling() -> None:
    plain, auto = cfg(), auto_cfg(**{"autoscaling.drain_timeout_s": 90})
    assert serve_run_options(plain)["external_scaler_enabled"] is False
    assert serve_run_options(auto) == {"name": "splitserve", "route_prefix": "/",
                                       "external_scaler_enabled": True}
    assert pool_deployment_options(auto, "decode", "cpu")["graceful_shutdown_timeout_s"] == 90
    assert pool_deployment_options(plain, "decode", "cpu")["graceful_shutdown_timeout_s"] == 30
    app = serve_config(auto, "cpu")["applications"][0]
    assert app["external_scaler_enabled"] is True


# ---- targets -------------------------------------------------------------------------------


def test_control_spec_for_a_disaggregated_config() -> None:
    c = auto_cfg(**{"slo.tpot_ms": 50, "autoscaling.min_replicas": 1})
    spec = control_spec_for_config(c)
    assert spec.policy == "ours" and spec.params.control_period_s == 3600
    assert set(spec.targets) == {"prefill", "decode"}
    assert spec.targets["decode"].tpot_s == 0.05 and spec.targets["decode"].seq_capacity > 0
    assert spec.targets["prefill"].token_capacity > 0 and spec.targets["prefill"].ttft_s < 1.0
    assert all(t.max_replicas == 3 for t in spec.targets.values())
    q = spec.queue["decode"]
    assert q.target_ongoing_requests > 0 and q.upscale_delay_s == c.autoscaling.upscale_cooldown_s


def test_control_spec_for_colocated_and_queue_policy() -> None:
    spec = control_spec_for_config(auto_cfg(mode="colocated", **{"autoscaling.policy": "queue",
                                            "autoscaling.target_ongoing_requests": 4}))
    assert spec.policy == "queue" and set(spec.queue) == {"decode"}
    assert spec.queue["decode"].target_ongoing_requests == 4
    assert set(spec.targets) == {"decode"} and spec.targets["decode"].token_capacity > 0


def test_control_spec_needs_an_autoscaling_section() -> None:
    with pytest.raises(ValueError, match="no autoscaling section"):
        control_spec_for_config(cfg())


# ---- gates follow the replica count ----------------------------------------------------------


def test_gate_capacity_follows_replicas_and_resize_admits_waiters() -> None:
    c = cfg(**{"pools.decode.max_num_seqs": 4})
    assert pool_max_in_flight(c, "decode") == 4
    assert pool_max_in_flight(c, "decode", 3) == 12

    async def scenario() -> tuple[int, int]:
        gate = FairAdmission("decode", max_in_flight=1)
        t = Tenant(name="a")
        first = await gate.acquire(t, 10)
        waiter = asyncio.ensure_future(gate.acquire(t, 10))
        await asyncio.sleep(0)
        queued_before = gate.queued
        gate.resize(2)
        second = await asyncio.wait_for(waiter, 1.0)
        gate.release(first)
        gate.release(second)
        return queued_before, gate.queued

    assert asyncio.run(scenario()) == (1, 0)
    with pytest.raises(ValueError):
        FairAdmission("decode", max_in_flight=1).resize(0)


# ---- one control step through an actuator -----------------------------------------------------


class RecordingActuator:
    """Stands in for Ray Serve in this unit test: holds counts, records scale calls."""

    def __init__(self, counts: dict[str, PoolCounts]) -> None:
        self.now = counts
        self.calls: list[tuple[str, int]] = []

    def counts(self) -> dict[str, PoolCounts]:
        return self.now

    def scale(self, pool: str, replicas: int) -> bool:
        self.calls.append((pool, replicas))
        return True

    def forget(self, pool: str, ready: int) -> None:
        pass


def test_step_scales_a_breaching_pool_and_answers_ready_counts() -> None:
    c = auto_cfg(**{"slo.tpot_ms": 10, "autoscaling.warmup_samples": 0,
                    "autoscaling.upscale_cooldown_s": 0})
    ctl = PoolController(c.model_dump(mode="json"), "splitserve")
    try:
        ctl.actuator = RecordingActuator({"prefill": PoolCounts(1, 0, 1),
                                          "decode": PoolCounts(1, 0, 1)})
        slow = PoolReport(t=0, period_s=1, arrivals=4, prompt_tokens=400, output_tokens=400,
                          running=4, ttft_s=(0.1,), tpot_s=(0.05,) * 4)  # 5x the TPOT SLO
        ctl.controller = None
        assert ctl.report("router-1", {"decode": slow}) == {}
        assert ctl.step() is True
        # Up from 1 (how far depends on the CPU profile's decode cost); prefill untouched.
        ((pool, up),) = ctl.actuator.calls
        assert pool == "decode" and up >= 2
        decode = [h for h in ctl.history() if h["pool"] == "decode"][-1]
        assert decode["scaled"] and "SLO" in decode["reason"] and decode["replicas"] == up
        assert ctl.report("router-1", {}) == {"prefill": 1, "decode": 1}
        ctl.actuator.now = {}
        assert ctl.step() is False  # the application is gone
    finally:
        ctl.shutdown()


def test_no_reports_is_no_load() -> None:
    s = merge_reports([], t=0.0, period_s=5.0, ready=2)
    assert s.running == 0 and not math.isnan(s.arrival_rate)
