"""The routers' `/metrics` on a port of their own (`observability.router_metrics_port`).

Each router replica keeps its own Prometheus registry (`router/metrics.py`). With a metrics port
configured, the replicas send their collected families to the usage board with their usage
snapshot (`router/usage_board.py`, once a second), and the board, which runs on the Ray head
node, serves them all on that port, each sample labelled `router_replica`:

    replica ──publish(replica, snapshot, registry.collect())──▶ UsageBoard ──▶ :port/metrics

So the per-tenant figures leave the API port (which the Ingress and the serve Service expose)
for a port only the pod network reaches, one scrape target whatever the number of replicas.
`merge_families` is pure; `MetricsExport` holds the latest families and runs the HTTP server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

log = logging.getLogger("splitserve.router")

REPLICA_LABEL = "router_replica"
# A replica that has not published for this long is gone (a replica publishes every second):
# its series end, as they would if Prometheus scraped it directly.
STALE_AFTER_S = 10.0


def merge_families(per_replica: Mapping[str, Iterable[Metric]]) -> list[Metric]:
    """One family per metric name holding every replica's samples, each with the label
    `router_replica` = the replica's id. Families keep their first-seen documentation and type."""
    merged: dict[str, Metric] = {}
    for replica in sorted(per_replica):
        for fam in per_replica[replica]:
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples.extend(
                s._replace(labels={**s.labels, REPLICA_LABEL: replica}) for s in fam.samples
            )
    return list(merged.values())


class MetricsExport:
    """The latest families of each router replica, served on a port once `serve` is called.

    Lives in the usage board's actor: one per router deployment, on the head node. Its methods
    never block on I/O (the HTTP server runs in prometheus_client's daemon thread).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[str, tuple[list[Metric], float]] = {}
        self.port: int | None = None

    def publish(self, replica: str, families: list[Metric]) -> None:
        """Replace `replica`'s families (collected whole each time)."""
        self._latest[replica] = (families, self._clock())

    def collect(self) -> list[Metric]:
        """Every live replica's families, merged (the Prometheus collector's `collect`)."""
        now = self._clock()
        for replica, (_, at) in list(self._latest.items()):
            if now - at > STALE_AFTER_S:
                del self._latest[replica]
        return merge_families({r: fams for r, (fams, _) in self._latest.items()})

    def registry(self) -> CollectorRegistry:
        """A registry whose only collector is this export."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def serve(self, port: int, host: str) -> None:
        """Serve `/metrics` on `host:port` (idempotent; a second, different port is refused)."""
        if self.port is not None:
            if self.port != port:
                raise ValueError(f"router metrics already served on port {self.port}")
            return
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry())
        self.port = port
        log.info("router metrics served on %s:%d", host, port)
