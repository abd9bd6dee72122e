"""Cluster-scale discrete-event simulator of splitserve: router, prefill and decode pools, KV
transfer, and the controller running the real autoscaling policies."""

from splitserve.controller.control import POLICIES, Controller, ControlSpec
from splitserve.controller.sim.fixed import FixedDeployment, fixed_from_config, run_fixed
from splitserve.controller.sim.report import SimResult, summarize, write_outputs
from splitserve.controller.sim.scenario import Scenario, build, run_scenario
from splitserve.controller.sim.trace import TRACE_KINDS, Trace, TraceSpec, make_trace, replay_trace

__all__ = [
    "POLICIES", "TRACE_KINDS", "ControlSpec", "Controller", "FixedDeployment", "Scenario",
    "SimResult", "Trace", "TraceSpec", "build", "fixed_from_config", "make_trace", "replay_trace",
    "run_fixed", "run_scenario", "summarize", "write_outputs",
]
