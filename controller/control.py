"""The control step shared by the live controller (`controller.live`) and the simulator: every
control period it feeds each pool's sample window to the policy functions of
`splitserve.controller.autoscale` and returns the desired replica counts.

Policies: "ours" (`slo_policy`), "queue" (`queue_policy`, Ray Serve's default) and
"fixed-peak" (no scaling; the pools start sized for the trace's peak).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from splitserve.controller.autoscale import (
    PolicyParams,
    PoolDecision,
    PoolSample,
    PoolState,
    PoolTarget,
    QueueParams,
    QueueState,
    queue_policy,
    slo_policy,
)

POLICIES = ("ours", "queue", "fixed-peak")
# Samples kept per pool: one minute at the default 5 s period, enough for a trend fit and
# longer than Ray Serve's 30 s look-back.
WINDOW_SAMPLES = 12


@dataclass(frozen=True)
class ControlSpec:
    """Which policy runs and its per-pool targets (`PoolTarget` for ours, `QueueParams` for the
    queue baseline)."""

    policy: str
    params: PolicyParams = field(default_factory=PolicyParams)
    targets: Mapping[str, PoolTarget] = field(default_factory=dict)
    queue: Mapping[str, QueueParams] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}; known: {', '.join(POLICIES)}")


def with_upstream_demand(samples: Mapping[str, PoolSample]) -> Mapping[str, PoolSample]:
    """The samples with the decode pool's entering output tokens raised to the prefill pool's.

    Every request entering the prefill pool reaches decode one TTFT later, so the output tokens
    it will need are decode's demand already. Counted only where they reach decode, a burst is
    hidden while the prefill pool is backlogged (decode sees prefill's throughput, not the
    arrivals) and decode starts its replicas only after prefill has caught up: a second
    start-up in series. In steady state the two rates agree and nothing changes.
    """
    prefill, decode = samples.get("prefill"), samples.get("decode")
    if prefill is None or decode is None or prefill.out_token_rate <= decode.out_token_rate:
        return samples
    return {**samples, "decode": replace(decode, out_token_rate=prefill.out_token_rate)}


class Controller:
    """Holds each pool's sample window and policy state between control periods."""

    def __init__(self, spec: ControlSpec, ready: Mapping[str, int]) -> None:
        self.spec = spec
        self.windows = {role: deque(maxlen=WINDOW_SAMPLES) for role in ready}
        self.states: dict[str, PoolState | QueueState] = {
            role: PoolState.fresh(0.0, n, spec.params) if spec.policy == "ours" else QueueState()
            for role, n in ready.items()
        }

    @property
    def period_s(self) -> float:
        """Seconds between two control steps."""
        return self.spec.params.control_period_s

    def step(self, samples: Mapping[str, PoolSample]) -> dict[str, PoolDecision]:
        """One control period: the decision for every pool (fixed-peak: keep the count)."""
        out = {}
        if self.spec.policy == "ours":
            samples = with_upstream_demand(samples)
        for role, sample in samples.items():
            window = self.windows[role]
            window.append(sample)
            if self.spec.policy == "ours":
                d, self.states[role] = slo_policy(
                    tuple(window), self.spec.targets[role], self.states[role], self.spec.params
                )
            elif self.spec.policy == "queue":
                d, self.states[role] = queue_policy(
                    tuple(window), self.spec.queue[role], self.states[role]
                )
            else:
                d = PoolDecision(sample.ready + sample.starting, "fixed")
            out[role] = d
        return out
