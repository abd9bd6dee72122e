"""The routers' metrics port on a real Ray + Serve (no vLLM engine): the usage board is a
deployment-scoped actor pinned to the Ray head (`node:__internal_head__`), and serves every
replica's families on the configured port, labelled `router_replica` (router/metrics_export.py).
The router's own request path is covered by tests/unit/test_metrics_export.py."""

from __future__ import annotations

import os
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from splitserve.launcher import init_local_ray
from splitserve.router.metrics import RouterMetrics
from splitserve.router.metrics_export import REPLICA_LABEL
from splitserve.router.usage_board import UsagePublisher, deployment_actor_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve_app():
    """Ray in this process with two replicas that publish like router replicas; yields the
    metrics port."""
    import ray
    from ray import serve

    port = _free_port()

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0},
                      deployment_actors=[deployment_actor_config()])
    class Publisher:
        def __init__(self) -> None:
            self.metrics = RouterMetrics()
            self.pub = UsagePublisher(
                lambda: {"usage": {}}, serve.get_replica_context().replica_id.unique_id,
                families=lambda: list(self.metrics.registry.collect()),
                metrics_at=(port, "127.0.0.1"),
            )

        async def __call__(self, _request) -> str:
            self.metrics.in_flight.inc()
            await self.pub.publish()
            return self.pub.replica

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a second try when Ray's raylet misses its fixed 30-s start-up wait (a CI run did, on two
    # cores still stopping the previous module's cluster)
    init_local_ray(num_cpus=1, include_dashboard=False, object_store_memory=100 * 2**20,
                   log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
        serve.run(Publisher.bind(), route_prefix="/", name="metrics-port-test")
        yield port, serve.get_app_handle("metrics-port-test")
    finally:
        serve.shutdown()
        ray.shutdown()


def test_every_replica_is_served_on_the_heads_metrics_port(serve_app) -> None:
    port, handle = serve_app
    seen: set[str] = set()
    for _ in range(50):  # until both replicas have published (Serve picks one per call)
        seen.add(handle.remote(None).result(timeout_s=60))
        if len(seen) == 2:
            break
    assert len(seen) == 2
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    in_flight = {
        s.labels[REPLICA_LABEL]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "splitserve_requests_in_flight" and s.value >= 1
    }
    assert in_flight == seen
