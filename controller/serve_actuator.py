"""The Ray Serve pool actuator: reads and sets a pool deployment's replica count.

It implements `k8s_actuator.PoolActuator` (`current`, `scale`) for an application deployed with
`external_scaler_enabled=True` (`splitserve.app.serve_run_options` sets it when the config has
an `autoscaling` section). `scale` is Serve's external-scaler call, the one behind the
dashboard's `POST /api/v1/applications/{app}/deployments/{name}/scale`: a count-only change,
so the replicas that stay are not restarted. A removed replica drains: Serve stops routing to
it and waits up to its `graceful_shutdown_timeout_s` for its requests to finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Replica states that will become RUNNING without another decision.
STARTING_STATES = ("STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION")


@dataclass(frozen=True)
class PoolCounts:
    """A pool deployment's replicas: serving now, on their way, and Serve's target."""

    ready: int
    starting: int
    target: int


def pool_counts(replica_states: dict[str, int], target: int | None) -> PoolCounts:
    """`PoolCounts` from a deployment's replica-state counts and the last target set (pure).

    A replica asked for but not yet created shows in no state; it counts as starting, so the
    policy does not ask for it twice.
    """
    ready = replica_states.get("RUNNING", 0)
    starting = sum(replica_states.get(s, 0) for s in STARTING_STATES)
    if target is not None:
        starting = max(starting, target - ready)
    return PoolCounts(ready, starting, ready + starting if target is None else target)


class ServePoolActuator:
    """Scales the pool deployments of one Serve application (call from inside the cluster)."""

    def __init__(self, app_name: str, pools: tuple[str, ...]) -> None:
        self.app_name = app_name
        self.pools = pools
        self._targets: dict[str, int] = {}
        self._controller: Any = None

    def counts(self) -> dict[str, PoolCounts]:
        """Each pool's counts from `serve.status()`; a missing application gives {}."""
        from ray import serve

        app = serve.status().applications.get(self.app_name)
        if app is None:
            return {}
        out = {}
        for pool in self.pools:
            dep = app.deployments.get(pool)
            if dep is not None:
                out[pool] = pool_counts(dict(dep.replica_states), self._targets.get(pool))
        return out

    def current(self) -> dict[str, int]:
        """`PoolActuator.current`: each pool's replica target."""
        return {pool: c.target for pool, c in self.counts().items()}

    def scale(self, pool: str, replicas: int) -> bool:
        """`PoolActuator.scale`: set `pool`'s replica count; False if it already had it."""
        import ray
        from ray.serve._private.common import DeploymentID

        if self._targets.get(pool) == replicas:
            return False
        ray.get(self._serve_controller().update_deployment_replicas.remote(
            DeploymentID(name=pool, app_name=self.app_name), replicas))
        self._targets[pool] = replicas
        return True

    def forget(self, pool: str, ready: int) -> None:
        """Drop the remembered target once `ready` reached it (Serve's state is the truth)."""
        if self._targets.get(pool) == ready:
            del self._targets[pool]

    def _serve_controller(self) -> Any:
        import ray
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        if self._controller is None:
            self._controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return self._controller
