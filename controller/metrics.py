"""The autoscaling controller's Prometheus metrics (its own registry and `/metrics` port).

    metrics = ControllerMetrics()
    metrics.observe_decision(pool, ready=2, starting=0, target=2, desired=3, load=2.6, scaled=True)
    metrics.serve(port)              # `observability.controller_metrics_port`; optional

  splitserve_controller_replicas{pool,state}      ready / starting / desired replicas
  splitserve_controller_load_replicas{pool}       the policy's projected load, in replicas
  splitserve_controller_decisions_total{pool,action}   every control step: up / down / hold
  splitserve_controller_scalings_total{pool,direction} decisions applied: up / down

The decision's reason is free text (it holds numbers), so it is logged, never a label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

ACTIONS = ("up", "down", "hold")


def action_of(target: int, desired: int) -> str:
    """A decision's direction against the count Serve is already moving to."""
    if desired > target:
        return "up"
    return "down" if desired < target else "hold"


class ControllerMetrics:
    """Replica counts and scaling decisions of the live controller (`controller.live`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.replicas = Gauge(
            "splitserve_controller_replicas",
            "Replicas of a pool: ready, starting, and desired (the last decision).",
            ["pool", "state"],
            registry=r,
        )
        self.load = Gauge(
            "splitserve_controller_load_replicas",
            "The policy's projected load of a pool, in replicas at the SLO.",
            ["pool"],
            registry=r,
        )
        self.decisions = Counter(
            "splitserve_controller_decisions",
            "Control-step decisions per pool: up, down or hold.",
            ["pool", "action"],
            registry=r,
        )
        self.scalings = Counter(
            "splitserve_controller_scalings",
            "Decisions the actuator applied (the pool's replica count changed), by direction.",
            ["pool", "direction"],
            registry=r,
        )

    def observe_decision(
        self, pool: str, *, ready: int, starting: int, target: int, desired: int, load: float,
        scaled: bool,
    ) -> None:
        """One control step's decision for `pool` (`target`: Serve's count before it)."""
        self.replicas.labels(pool=pool, state="ready").set(ready)
        self.replicas.labels(pool=pool, state="starting").set(starting)
        self.replicas.labels(pool=pool, state="desired").set(desired)
        self.load.labels(pool=pool).set(load)
        action = action_of(target, desired)
        self.decisions.labels(pool=pool, action=action).inc()
        if scaled and action != "hold":
            self.scalings.labels(pool=pool, direction=action).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve `/metrics` on `port` from a daemon thread (prometheus_client's server)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
