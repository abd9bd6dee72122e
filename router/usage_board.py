"""The usage board: one actor per router deployment that holds every router replica's latest
tenancy snapshot, so that `GET /v1/usage` answers with cluster totals whichever replica serves it.

    replica ──publish(replica_id, Tenancy.snapshot()) every PUBLISH_INTERVAL_S──▶ UsageBoard
    GET /v1/usage: publish own snapshot, then snapshots() ──▶ report.usage_report (sums them)

The board is a Serve deployment-scoped actor (`deployment_actor_config`, declared on the router
deployment): Serve starts it with the deployment, restarts it if it dies, and removes it with the
application. Snapshots are cumulative, so the board keeps only the latest per replica and a
restarted board is whole again one interval later (a replica that died meanwhile is lost, as its
Prometheus counters are). Other replicas' figures are at most about one interval old.

If the board cannot be reached, the endpoint falls back to this replica's own counters and says
so (`"scope": "replica"`); it never fails because of the board.

With `observability.router_metrics_port`, replicas also send their Prometheus families, and the
board serves them all on that port (`router/metrics_export.py`). The board runs on the Ray head
node, so that port has one fixed place (the head pod's port `router-metrics` in the chart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from splitserve.router.metrics_export import MetricsExport
from splitserve.router.periodic import Periodic
from splitserve.router.tenancy.report import ReplicaSnapshot

log = logging.getLogger("splitserve.router")

BOARD = "usage_board"  # the deployment-scoped actor's name
# One small actor call per replica per second: cheap, and fresh enough for an admin report.
PUBLISH_INTERVAL_S = 1.0
# The board answers from memory in microseconds; two seconds means it is gone or restarting.
BOARD_TIMEOUT_S = 2.0
# Ray's resource that only the head node has: the board (and the metrics port it may serve) is on
# the head whatever node a router replica runs on.
HEAD_NODE = {"node:__internal_head__": 0.001}


class UsageBoard:
    """The latest snapshot of each router replica (`UsageBoardActor` runs it as a Ray actor)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[str, tuple[dict[str, Any], float]] = {}
        self.metrics = MetricsExport(clock)

    def publish(
        self, replica: str, snapshot: dict[str, Any], families: list[Any] | None = None
    ) -> None:
        """Replace `replica`'s snapshot (snapshots are cumulative, so the latest is all of it)
        and, when given, its Prometheus families."""
        self._latest[replica] = (snapshot, self._clock())
        if families is not None:
            self.metrics.publish(replica, families)

    def serve_metrics(self, port: int, host: str) -> None:
        """Serve every replica's families on `host:port` (idempotent)."""
        self.metrics.serve(port, host)

    def snapshots(self) -> list[tuple[dict[str, Any], float]]:
        """Every replica's latest snapshot with its age in seconds."""
        now = self._clock()
        return [(snap, now - at) for snap, at in self._latest.values()]


UsageBoardActor = ray.remote(num_cpus=0)(UsageBoard)


def deployment_actor_config() -> Any:
    """The router deployment's `deployment_actors` entry for the board."""
    from ray.serve.config import DeploymentActorConfig

    return DeploymentActorConfig(
        name=BOARD, actor_class=UsageBoardActor,
        actor_options={"num_cpus": 0, "resources": HEAD_NODE},
    )


def _lookup_board() -> Any:
    from ray import serve

    return serve.get_deployment_actor(BOARD)


class UsagePublisher:
    """This replica's side of the board: publishes in the background, collects for a report.

    `board`: returns the board's actor handle (looked up again after any failure, since Serve
    may have restarted the board). `families` and `metrics_at` (port, host): also publish this
    replica's Prometheus families and have the board serve them there. Runs on the replica's
    event loop only.
    """

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        replica: str,
        *,
        board: Callable[[], Any] = _lookup_board,
        interval_s: float = PUBLISH_INTERVAL_S,
        timeout_s: float = BOARD_TIMEOUT_S,
        families: Callable[[], list[Any]] | None = None,
        metrics_at: tuple[int, str] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.replica = replica
        self.families = families
        self.metrics_at = metrics_at
        self._lookup = board
        self._board: Any = None
        self._exporting = False  # the current board serves the metrics port
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.loop = Periodic("usage publish", self.publish, interval_s)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            if self._board is None:
                self._board = self._lookup()
            reply = asyncio.ensure_future(getattr(self._board, method).remote(*args))
            try:
                # Not `wait_for`: on Python 3.11 it can swallow a cancellation that races with
                # the reply, and this runs in a task that must stop when the replica does.
                await asyncio.wait({reply}, timeout=self.timeout_s)
            finally:
                reply.cancel()  # no-op when it has answered
            if reply.cancelled():
                raise TimeoutError(f"the usage board did not answer within {self.timeout_s}s")
            return reply.result()
        except BaseException:
            self._board = None  # a stale handle: look the board up again next time
            self._exporting = False  # a restarted board serves nothing yet
            raise

    async def publish(self) -> None:
        """Send this replica's snapshot (and families) to the board now; the first time on a
        board, ask it to serve the metrics port."""
        if self.metrics_at is not None and not self._exporting:
            await self._call("serve_metrics", *self.metrics_at)
            self._exporting = True
        families = self.families() if self.families is not None else None
        await self._call("publish", self.replica, self.snapshot(), families)

    async def collect(self) -> tuple[list[ReplicaSnapshot], str]:
        """Every replica's snapshot and the scope: `"cluster"`, or `"replica"` (only this one)
        when the board cannot be reached."""
        try:
            await self.publish()
            entries = await self._call("snapshots")
        except Exception as err:  # noqa: BLE001 - any board trouble: answer with what we have
            log.warning("usage board unreachable (%r); reporting this replica only", err)
            return [ReplicaSnapshot.of(self.snapshot())], "replica"
        return [ReplicaSnapshot.of(snap, age) for snap, age in entries], "cluster"
