"""The routers' metrics on their own port (router/metrics_export.py, the usage board's part, and
the router's `/metrics` on the API port). No Ray: the board is called directly or through a fake
handle; the HTTP server is prometheus_client's real one on 127.0.0.1."""

from __future__ import annotations

import asyncio
import pickle
import socket
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from splitserve.config import parse_config
from splitserve.router.errors import APIError
from splitserve.router.metrics import RouterMetrics
from splitserve.router.metrics_export import (
    REPLICA_LABEL,
    STALE_AFTER_S,
    MetricsExport,
    merge_families,
)
from splitserve.router.usage_board import UsageBoard, UsagePublisher

from router_fakes import build_router


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _families(requests: int, tenant: str = "acme") -> list[Any]:
    """A real router registry's families after `requests` finished requests of `tenant`."""
    m = RouterMetrics()
    for _ in range(requests):
        m.requests.labels(endpoint="completions", tenant=tenant, status="200", outcome="ok").inc()
        m.ttft.labels(tenant=tenant).observe(0.2)
    return list(m.registry.collect())


def _samples(text: str, name: str) -> dict[str, float]:
    """`name`'s sample values by router replica, from a Prometheus text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels[REPLICA_LABEL]] = s.value
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_merged_families_label_every_sample_with_its_replica() -> None:
    merged = merge_families({"r2": _families(3), "r1": _families(1)})
    names = [f.name for f in merged]
    assert len(names) == len(set(names))  # one family per metric, both replicas' samples in it
    export = MetricsExport()
    export.publish("r1", _families(1))
    export.publish("r2", _families(3))
    text = generate_latest(export.registry()).decode()
    assert _samples(text, "splitserve_requests_total") == {"r1": 1.0, "r2": 3.0}
    assert _samples(text, "splitserve_time_to_first_token_seconds_count") == {"r1": 1, "r2": 3}


def test_a_replica_that_stopped_publishing_is_dropped() -> None:
    clock = FakeClock()
    export = MetricsExport(clock)
    export.publish("gone", _families(1))
    clock.now = STALE_AFTER_S / 2
    export.publish("live", _families(2))
    clock.now = STALE_AFTER_S + 1
    text = generate_latest(export.registry()).decode()
    assert _samples(text, "splitserve_requests_total") == {"live": 2.0}


def test_families_survive_pickling() -> None:
    # What crosses from a router replica to the board's actor.
    export = MetricsExport()
    export.publish("r1", pickle.loads(pickle.dumps(_families(2))))
    assert _samples(generate_latest(export.registry()).decode(),
                    "splitserve_requests_total") == {"r1": 2.0}


def test_the_board_serves_every_replica_on_its_port() -> None:
    board = UsageBoard()
    port = _free_port()
    board.serve_metrics(port, "127.0.0.1")
    board.serve_metrics(port, "127.0.0.1")  # each replica asks; the second is a no-op
    with pytest.raises(ValueError, match=f"already served on port {port}"):
        board.serve_metrics(port + 1, "127.0.0.1")
    board.publish("r1", {"n": 1}, _families(1))
    board.publish("r2", {"n": 2}, _families(4))
    board.publish("r3", {"n": 3})  # no families: usage only
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert reply.status_code == 200
    assert _samples(reply.text, "splitserve_requests_total") == {"r1": 1.0, "r2": 4.0}
    assert len(board.snapshots()) == 3


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: Any):
        async def call():
            return self.fn(*args)

        return call()


class RecordingBoard:
    """A board handle that records calls; `fail` makes the next call raise (a dead board)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail = False

    def __getattr__(self, name: str) -> _Method:
        def call(*args: Any):
            if self.fail:
                self.fail = False
                raise RuntimeError("board died")
            self.calls.append((name, *args))

        return _Method(call)


def test_the_publisher_asks_each_board_it_finds_to_serve_the_port() -> None:
    handle = RecordingBoard()
    pub = UsagePublisher(lambda: {"usage": {}}, "me", board=lambda: handle,
                         families=lambda: ["fam"], metrics_at=(9400, "0.0.0.0"))
    asyncio.run(pub.publish())
    asyncio.run(pub.publish())
    assert handle.calls == [("serve_metrics", 9400, "0.0.0.0"),
                            ("publish", "me", {"usage": {}}, ["fam"]),
                            ("publish", "me", {"usage": {}}, ["fam"])]
    handle.fail, handle.calls = True, []
    with pytest.raises(RuntimeError):
        asyncio.run(pub.publish())
    asyncio.run(pub.publish())  # a restarted board: asked again
    assert handle.calls[0] == ("serve_metrics", 9400, "0.0.0.0")


def test_without_a_port_the_publisher_sends_usage_only() -> None:
    handle = RecordingBoard()
    pub = UsagePublisher(lambda: {"usage": {}}, "me", board=lambda: handle)
    asyncio.run(pub.publish())
    assert handle.calls == [("publish", "me", {"usage": {}}, None)]


def test_the_api_port_refuses_metrics_when_they_have_their_own_port() -> None:
    router = build_router(parse_config({"observability": {"router_metrics_port": 9400}}),
                          None, None)
    with pytest.raises(APIError) as err:
        asyncio.run(type(router).metrics(router))  # the endpoint, not the registry
    assert err.value.status == 404 and err.value.code == "not_found"
    assert "observability.router_metrics_port" in err.value.message
    open_router = build_router(parse_config({}), None, None)
    reply = asyncio.run(type(open_router).metrics(open_router))
    assert reply.status_code == 200 and b"splitserve_requests_in_flight" in reply.body
