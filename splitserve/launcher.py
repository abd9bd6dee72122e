"""`splitserve serve`: start or join Ray, deploy the application, show progress, shut down cleanly.

The launcher is a thin shell: it gathers what the pure builders need (config, device), applies
their result with Ray Serve, and reports. Ctrl-C or SIGTERM during start-up or while serving
tears everything down, in this order:

1. drain: every router replica refuses new requests (503) and gives those in flight
   `router.shutdown_grace_s` to finish, then ends the rest with an error (router/drain.py);
2. Serve: with nothing in flight, replicas stop at once (their engines' `EngineCore` processes
   with them) however long `graceful_shutdown_timeout_s` is (a scale-down's drain, up to
   `autoscaling.drain_timeout_s`); then the autoscaling controller actor;
3. Ray: the local cluster if this process started it, and any process of its tree still
   running after that (splitserve/processes.py). A joined cluster keeps running.

Why the drain comes first: Serve's own shutdown kills its HTTP proxy at once (streams are cut
without an error event), while a request whose response is not streamed keeps running in its
router replica and pool; Serve then waits for it up to each deployment's
`graceful_shutdown_timeout_s` in turn (20 s for the router, 30 s or `autoscaling.drain_timeout_s`
for a pool), past the 30 s that `serve.shutdown()` waits ("Controller failed to shut down within
30.0s"; measured: 3 such requests kept the router 20 s and the whole shutdown 30 s).

A first signal is a requested stop and exits 0 whichever phase it lands in (an orchestrator's
SIGTERM is not an error); a second signal skips the drain and Serve's shutdown, stops Ray and
the local process tree at once, and exits 130.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console

from splitserve import processes
from splitserve.app import APP_NAME, build_app, resolve_device, serve_run_options
from splitserve.config import SplitserveConfig
from splitserve.ingress import cluster_env_of, start_serve
from splitserve.kv_transfer.compat import CompatibilityError
from splitserve.models import build_tiny_model

log = logging.getLogger(__name__)

POLL_S = 0.5
# Serve reports a replica it cannot place after 30 s; a cluster that cannot grow will never place
# it, so the launcher gives up with Serve's explanation instead of waiting forever.
UNSCHEDULABLE_MARKER = "to be scheduled"
# How much longer than the routers' own bound (grace period + ENDED_CLOSE_S) the launcher waits
# for their drain reports: a router replica that does not answer by then is stopped with Serve.
DRAIN_REPLY_MARGIN_S = 10.0


class LaunchError(RuntimeError):
    """The deployment failed to start; the message says which part and why."""


class StopRequested(Exception):
    """A first SIGINT/SIGTERM arrived while the launcher was busy starting up."""


@dataclass
class Session:
    """What `start` brought up, so that `stop` can take down exactly that."""

    started_local_ray: bool
    device: str
    grace_s: float = 0.0  # router.shutdown_grace_s
    deployed: bool = False  # the application is up: its routers can drain
    stop_requested: threading.Event = field(default_factory=threading.Event)
    forced: threading.Event = field(default_factory=threading.Event)  # a second signal came
    final: bool = False  # in the last phase of `stop`: a signal no longer interrupts it


def start_ray(cfg: SplitserveConfig, *, verbose: bool) -> bool:
    """Join the cluster at `ray.address` / RAY_ADDRESS, or start a local one. True if local."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace="splitserve", log_to_driver=verbose)
        return False
    # the cluster's processes inherit the environment
    with cluster_env_of(cfg):
        init_local_ray(
            num_cpus=cfg.ray.num_cpus or os.cpu_count(),
            object_store_memory=cfg.ray.object_store_mb * 2**20,
            include_dashboard=False,
            log_to_driver=verbose,
            namespace="splitserve",
        )
    return True


def init_local_ray(**options) -> None:
    """`ray.init(**options)` for a new local cluster, tried a second time when its raylet
    missed Ray's start-up wait (a fixed 30 s in `ray._private.node`, not configurable; a busy
    machine can miss it while the raylet itself comes up fine)."""
    import ray

    try:
        ray.init(**options)
    except Exception as err:
        if "timed out during startup" not in str(err):
            raise
        log.warning("Ray's local node missed its start-up wait (%s); starting it again", err)
        ray.shutdown()
        ray.init(**options)


def _unschedulable(status) -> str | None:
    """Serve's message about a replica that no node can host, if any."""
    app = status.applications.get(APP_NAME)
    for dep in app.deployments.values() if app else ():
        if UNSCHEDULABLE_MARKER in (dep.message or ""):
            return dep.message
    return None


def _deployment_lines(status) -> dict[str, str]:
    app = status.applications.get(APP_NAME)
    if app is None:
        return {}
    lines = {}
    for name, dep in app.deployments.items():
        running = dep.replica_states.get("RUNNING", 0)
        total = sum(dep.replica_states.values())
        lines[name] = f"{dep.status.value.lower()} ({running}/{total} replicas ready)"
    return lines


def deploy(cfg: SplitserveConfig, session: Session, console: Console) -> None:
    """Deploy and block until every deployment is running; raise LaunchError on failure."""
    from ray import serve

    start_serve(cfg.router.host, cfg.router.port)
    kv_host = "127.0.0.1" if session.started_local_ray else None
    app = build_app(cfg, session.device, kv_host=kv_host)  # type: ignore[arg-type]
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve.run(app, **serve_run_options(cfg))
        except BaseException as err:  # reported by the main thread
            failure.append(err)

    runner = threading.Thread(target=run, name="serve-run", daemon=True)
    runner.start()
    shown: dict[str, str] = {}
    started = time.monotonic()
    with console.status("deploying...") as spinner:
        while runner.is_alive():
            if session.stop_requested.is_set():
                raise StopRequested
            status = serve.status()
            stuck = _unschedulable(status)
            if stuck and not cfg.ray.address and not os.environ.get("RAY_ADDRESS"):
                raise LaunchError(f"a replica cannot be placed on this machine: {stuck}")
            lines = _deployment_lines(status)
            for name, line in lines.items():
                if shown.get(name) != line:
                    console.print(f"  [bold]{name:<8}[/] {line}")
            shown = lines
            spinner.update(f"starting engines... {time.monotonic() - started:.0f}s")
            runner.join(POLL_S)
    if failure:
        raise LaunchError(f"deployment failed: {failure[0]}") from failure[0]


def drain(session: Session, console: Console) -> None:
    """Drain every router replica (`Router.drain`) and report what it did; never raises."""
    from ray import serve

    from splitserve.router.drain import ENDED_CLOSE_S

    grace = session.grace_s
    console.print(f"splitserve: draining (in-flight requests get up to {grace:g} s)...")
    try:
        handle = serve.get_deployment_handle("router", app_name=APP_NAME)
        reports = handle.broadcast("drain", grace).results(
            timeout_s=grace + ENDED_CLOSE_S + DRAIN_REPLY_MARGIN_S, return_exceptions=True
        )
    except Exception as err:  # noqa: BLE001 - Serve's shutdown ends what is left
        console.print(f"splitserve: routers did not drain ({type(err).__name__}: {err})")
        return
    done = [r for r in reports if isinstance(r, dict)]
    finished = sum(max(r["in_flight"] - r["ended"], 0) for r in done)
    ended = sum(r["ended"] for r in done)
    console.print(f"splitserve: drained {len(done)}/{len(reports)} routers: {finished} requests "
                  f"finished, {ended} ended at the end of the grace period")


def stop(session: Session, console: Console) -> None:
    """Tear down what `start` brought up (idempotent): drain, Serve, the controller, Ray, then
    any process of the local cluster's tree still running. A second signal (`session.forced`)
    skips straight to the last step."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    console.print("splitserve: shutting down...")
    tree = processes.descendants() if session.started_local_ray else {}
    try:
        if not session.forced.is_set():
            if session.deployed:
                drain(session, console)
            if session.started_local_ray:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)
            _stop_autoscaler()
    except KeyboardInterrupt:
        console.print("splitserve: second signal: stopping now")
        raise
    finally:
        session.final = True
        if session.started_local_ray:
            tree.update(processes.descendants())
        ray.shutdown()
        left = processes.stop_all(tree)
        if left:
            console.print(f"splitserve: stopped {len(left)} processes that outlived Ray: "
                          + ", ".join(left))
        console.print("splitserve: stopped")


def _stop_autoscaler() -> None:
    """End the autoscaling controller actor, if any (it is detached: on a joined cluster it
    would otherwise outlive the application by a few control periods)."""
    import ray

    from splitserve.controller.live import get_controller

    try:
        ray.kill(get_controller(), no_restart=True)
    except ValueError:  # none running
        pass


def serve_forever(cfg: SplitserveConfig, *, verbose: bool = False) -> int:
    """Run `splitserve serve` to completion; returns the process exit code."""
    console = Console(highlight=False)
    session = Session(started_local_ray=False, device="cpu", grace_s=cfg.router.shutdown_grace_s)
    _install_signal_handlers(session)
    code = 1
    try:
        code = _serve(cfg, session, console, verbose=verbose)
    except KeyboardInterrupt:  # a second signal while starting
        code = 130
    finally:
        try:
            stop(session, console)
        except KeyboardInterrupt:  # a second signal during the polite part: stop's last step ran
            code = 130
    return code


def _serve(cfg: SplitserveConfig, session: Session, console: Console, *, verbose: bool) -> int:
    """Start and serve until a signal; the exit code (stopping is the caller's)."""
    try:
        views = cfg.model_views()
        for view in views:
            if view.model.path is None:
                console.print("splitserve: preparing the built-in tiny model...")
                console.print(f"  model at {build_tiny_model(variant=view.model.tiny_variant)}")
        console.print("splitserve: starting Ray...")
        session.started_local_ray = start_ray(cfg, verbose=verbose)
        _install_signal_handlers(session)  # ray.init installs its own SIGTERM handler
        import ray

        session.device = resolve_device(cfg, ray.cluster_resources().get("GPU", 0))
        for view in views:
            pools = ", ".join(
                f"{role} x{p.replicas} (TP {p.tensor_parallel_size})"
                for role, p in view.deployed_pools().items()
            )
            console.print(f"splitserve: deploying {view.model.name} {view.mode} on "
                          f"{session.device}: {pools}")
        deploy(cfg, session, console)
        session.deployed = True
        url = f"http://{cfg.router.host}:{cfg.router.port}/v1"
        names = ", ".join(v.model.name for v in views)
        console.print(f"splitserve ready: {url}  (models {names})", style="bold green")
        console.print("Press Ctrl-C to stop.")
        while not session.stop_requested.wait(1.0):
            pass
        return 0
    except StopRequested:
        return 0
    except (LaunchError, CompatibilityError) as err:
        console.print(f"splitserve: {err}", style="bold red")
        return 1


def _install_signal_handlers(session: Session) -> None:
    def handler(signum: int, _frame) -> None:
        if not session.stop_requested.is_set():
            session.stop_requested.set()
            return
        if session.forced.is_set() or session.final:
            return  # already stopping for good: let the last step finish
        session.forced.set()
        raise KeyboardInterrupt  # second signal: stop waiting politely

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
