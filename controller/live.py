"""The live autoscaling controller: one Ray actor per cluster, beside the Serve application.

    router replicas --PoolReport every period--> PoolController --scale--> ServePoolActuator
                    <--pool replica counts------

Every `autoscaling.control_period_s` the actor merges the latest reports of all router replicas
into one `PoolSample` per pool (`controller.signals.merge_reports`, with the ready and starting
counts from Serve), runs the configured policy through the same `controller.control.Controller`
step the simulator runs, and applies each changed count through the actuator. Decisions are
kept (`history`) and logged. The actor is named (`CONTROLLER_NAME`) and detached, so it outlives
the router replica that created it; it exits by itself once the application is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

from splitserve.controller.control import Controller
from splitserve.controller.metrics import ControllerMetrics
from splitserve.controller.serve_actuator import ServePoolActuator
from splitserve.controller.signals import PoolReport, merge_reports
from splitserve.controller.targets import control_spec_for_config

CONTROLLER_NAME = "splitserve-controller"
# The actor's Ray namespace, whatever the namespace of the job that looks it up.
CONTROLLER_NAMESPACE = "splitserve"
# Control periods without the application before the actor exits (the app was deleted).
GONE_PERIODS = 3
# Reports older than this many periods are dropped (their router replica is gone).
STALE_PERIODS = 3
HISTORY = 2048

log = logging.getLogger("splitserve.controller")


class PoolController:
    """Reads pool signals, decides replica counts, actuates. Methods are thread-safe."""

    def __init__(self, config: dict, app_name: str) -> None:
        from splitserve.config import SplitserveConfig
        from splitserve.logs import configure_logging

        cfg = SplitserveConfig.model_validate(config)
        configure_logging(cfg.observability.log_format, cfg.observability.log_level)
        self.spec = control_spec_for_config(cfg)
        self.pools = tuple(cfg.deployed_pools())
        self.actuator = ServePoolActuator(app_name, self.pools)
        self.metrics = ControllerMetrics()
        if cfg.observability.controller_metrics_port is not None:
            self.metrics.serve(cfg.observability.controller_metrics_port)
        self.controller: Controller | None = None
        self._reports: dict[str, tuple[float, dict[str, PoolReport]]] = {}
        self._history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._thread.start()

    # ---- called by router replicas and tests --------------------------------------------

    def report(self, source: str, reports: dict[str, PoolReport]) -> dict[str, int]:
        """Store `source`'s latest reports; answer each pool's ready replica count."""
        with self._lock:
            # Reports since the last step add up: a router may report more often than we step.
            prev = self._reports.get(source)
            merged = dict(reports)
            if prev is not None:
                merged = {pool: _add(prev[1].get(pool), r) for pool, r in reports.items()}
            self._reports[source] = (time.monotonic(), merged)
            return dict(self._counts)

    def history(self) -> list[dict[str, Any]]:
        """Every decision so far (oldest first): time, pool, sample, replicas, reason."""
        with self._lock:
            return list(self._history)

    def metrics_text(self) -> bytes:
        """This controller's Prometheus exposition (what its `/metrics` port serves)."""
        return self.metrics.render()

    def shutdown(self) -> None:
        """Stop the control loop."""
        self._stop.set()

    # ---- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        period = self.spec.params.control_period_s
        gone = 0
        while not self._stop.wait(period):
            try:
                gone = 0 if self.step() else gone + 1
            except Exception:
                log.exception("autoscaling step failed")
            if gone >= GONE_PERIODS:
                log.info("application gone; autoscaling controller exits")
                import ray

                ray.kill(ray.get_runtime_context().current_actor)

    def step(self) -> bool:
        """One control period; False when the application does not exist (nothing done)."""
        counts = self.actuator.counts()
        if not counts:
            return False
        now = time.monotonic()
        period = self.spec.params.control_period_s
        with self._lock:
            fresh = {s: r for s, (at, r) in self._reports.items() if now - at < STALE_PERIODS * period}
            self._reports = {}
            self._counts = {pool: c.ready for pool, c in counts.items()}
        if self.controller is None:
            self.controller = Controller(self.spec, {p: c.ready for p, c in counts.items()})
        samples = {
            pool: merge_reports((r[pool] for r in fresh.values() if pool in r), t=now,
                                period_s=period, ready=c.ready, starting=c.starting)
            for pool, c in counts.items()
        }
        decisions = self.controller.step(samples)
        for pool, decision in decisions.items():
            c = counts[pool]
            self.actuator.forget(pool, c.ready)
            changed = decision.replicas != c.target and self.actuator.scale(pool, decision.replicas)
            entry = {"t": now, "pool": pool, "ready": c.ready, "starting": c.starting,
                     "replicas": decision.replicas, "reason": decision.reason,
                     "scaled": changed, "sample": asdict(samples[pool])}
            with self._lock:
                self._history.append(entry)
            self.metrics.observe_decision(
                pool, ready=c.ready, starting=c.starting, target=c.target,
                desired=decision.replicas, load=decision.load, scaled=bool(changed),
            )
            if changed:
                log.info("scale %s %d -> %d: %s", pool, c.target, decision.replicas, decision.reason)
        return True


def _add(a: PoolReport | None, b: PoolReport) -> PoolReport:
    """Two consecutive reports of one router replica as one (gauges from the newer)."""
    if a is None:
        return b
    return PoolReport(
        t=b.t, period_s=a.period_s + b.period_s, arrivals=a.arrivals + b.arrivals,
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        output_tokens=a.output_tokens + b.output_tokens, queue_depth=b.queue_depth,
        queued_tokens=b.queued_tokens, running=b.running, ttft_s=a.ttft_s + b.ttft_s,
        tpot_s=a.tpot_s + b.tpot_s,
    )


def get_controller() -> Any:
    """The running controller actor's handle (raises ValueError when there is none)."""
    import ray

    return ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)


def ensure_controller(cfg, app_name: str) -> Any:
    """The controller actor for `cfg` (with an `autoscaling` section), started if absent.

    Every router replica calls this at start; the first creates it, the others get it. It
    takes no CPU (Ray's accounting) and is detached: it lives until the application is gone.
    """
    import ray

    actor = ray.remote(PoolController).options(
        name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE, get_if_exists=True, lifetime="detached", num_cpus=0,
        max_concurrency=16,
    )
    return actor.remote(cfg.model_dump(mode="json"), app_name)
