"""Pool state as this router replica sees it, read when Prometheus scrapes (no bookkeeping).

    registry.register(PoolStateCollector(tenancy.gates, dispatcher.replicas))

Gauges, one series per pool (`prefill`, `decode`):
  splitserve_pool_requests_running   requests holding a slot of the pool's admission gate
  splitserve_pool_requests_waiting   requests waiting in the gate (fair queue)
  splitserve_pool_max_in_flight      the gate's capacity (follows the replica count)
  splitserve_pool_replicas           ready replicas: configured, or the controller's last count

`running` / `waiting` mean what vLLM's `vllm:num_requests_running` / `_waiting` mean for one
engine, for the whole pool behind this router replica (sum over router replicas for the total).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RUNNING = "splitserve_pool_requests_running"
WAITING = "splitserve_pool_requests_waiting"
CAPACITY = "splitserve_pool_max_in_flight"
REPLICAS = "splitserve_pool_replicas"


class GateView(Protocol):
    """What the collector reads of a `FairAdmission` gate."""

    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    max_in_flight: int


class PoolStateCollector(Collector):
    """Reads the gates and the replica counts (both live objects, shared, never copied)."""

    def __init__(self, gates: Mapping[str, GateView], replicas: Mapping[str, int]) -> None:
        self.gates = gates
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        """One gauge family per figure, one sample per pool."""
        families = {
            RUNNING: GaugeMetricFamily(
                RUNNING, "Requests holding a pool gate slot.", labels=["pool"]
            ),
            WAITING: GaugeMetricFamily(
                WAITING, "Requests waiting in a pool gate.", labels=["pool"]
            ),
            CAPACITY: GaugeMetricFamily(CAPACITY, "A pool gate's capacity.", labels=["pool"]),
            REPLICAS: GaugeMetricFamily(
                REPLICAS, "Ready replicas of a pool (config or controller).", labels=["pool"]
            ),
        }
        for pool, gate in sorted(self.gates.items()):
            families[RUNNING].add_metric([pool], gate.in_flight)
            families[WAITING].add_metric([pool], gate.queued)
            families[CAPACITY].add_metric([pool], gate.max_in_flight)
            families[REPLICAS].add_metric([pool], self.replicas.get(pool, 0))
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        """The families without samples (lets the registry check names at registration)."""
        for name in (RUNNING, WAITING, CAPACITY, REPLICAS):
            yield GaugeMetricFamily(name, "", labels=["pool"])
