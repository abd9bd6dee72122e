"""Exit codes of `splitserve serve` when a signal lands during start-up or while serving.

Ray and Serve are replaced by stubs here only to steer the signal into one phase; the real launch
path, signals included, is exercised end to end in tests/e2e/test_serve_cli.py.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from splitserve import launcher
from splitserve.config import SplitserveConfig


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(launcher, "start_ray", lambda cfg, verbose: calls.append("ray") or False)
    monkeypatch.setattr(launcher, "resolve_device", lambda cfg, gpus: "cpu")
    monkeypatch.setattr(launcher, "stop", lambda session, console: calls.append("stop"))
    import ray

    monkeypatch.setattr(ray, "cluster_resources", dict)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield calls
    for s, h in old.items():
        signal.signal(s, h)


def _cfg(tmp_path) -> SplitserveConfig:
    (tmp_path / "config.json").write_text("{}")
    return SplitserveConfig.model_validate({"model": {"path": str(tmp_path)}})


def test_first_signal_during_startup_is_a_clean_stop(stubbed, monkeypatch, tmp_path):
    """The real `deploy` loop is still waiting on serve.run when SIGTERM arrives."""
    from ray import serve

    never = threading.Event()
    monkeypatch.setattr(serve, "start", lambda **kw: None)
    monkeypatch.setattr(serve, "run", lambda app, **kw: never.wait(30))
    monkeypatch.setattr(serve, "status", lambda: None)
    monkeypatch.setattr(launcher, "build_app", lambda cfg, device, kv_host: "app")
    monkeypatch.setattr(launcher, "_unschedulable", lambda status: None)
    monkeypatch.setattr(launcher, "_deployment_lines", lambda status: {})
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        assert launcher.serve_forever(_cfg(tmp_path)) == 0
    finally:
        never.set()
    assert stubbed == ["ray", "stop"]


def test_first_signal_while_serving_is_a_clean_stop(stubbed, monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "deploy", lambda cfg, session, console: None)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    assert launcher.serve_forever(_cfg(tmp_path)) == 0
    assert stubbed == ["ray", "stop"]


def test_second_signal_forces_exit_130(stubbed, monkeypatch, tmp_path):
    def deploy(cfg, session, console):
        os.kill(os.getpid(), signal.SIGINT)
        assert session.stop_requested.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # raises KeyboardInterrupt in this (main) thread

    monkeypatch.setattr(launcher, "deploy", deploy)
    assert launcher.serve_forever(_cfg(tmp_path)) == 130
    assert stubbed == ["ray", "stop"]


# ---- stop: drain, Serve, controller, Ray, then the local process tree ------------------------


@pytest.fixture
def teardown(monkeypatch):
    """The real `stop` with Ray, Serve and the process tree replaced by recorders (the order is
    what is tested here; tests/e2e/test_shutdown.py runs it for real)."""
    import ray
    from ray import serve

    calls: list[tuple] = []

    class Broadcast:
        def __init__(self, grace):
            self.grace = grace

        def results(self, timeout_s, return_exceptions):
            calls.append(("drain", self.grace))
            return [{"in_flight": 3, "ended": 1, "left": 0}]

    class Handle:
        def broadcast(self, method, grace):
            assert method == "drain"
            return Broadcast(grace)

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("ray.shutdown",)))
    monkeypatch.setattr(serve, "get_deployment_handle", lambda name, app_name: Handle())
    monkeypatch.setattr(serve, "shutdown", lambda: calls.append(("serve.shutdown",)))
    monkeypatch.setattr(serve, "delete", lambda name: calls.append(("serve.delete", name)))
    monkeypatch.setattr(launcher, "_stop_autoscaler", lambda: calls.append(("autoscaler",)))
    monkeypatch.setattr(launcher.processes, "descendants", lambda: {1: "raylet"})
    monkeypatch.setattr(launcher.processes, "stop_all",
                        lambda tree: calls.append(("stop_all", dict(tree))) or [])
    return calls


def _console():
    from rich.console import Console

    return Console(file=open(os.devnull, "w"))


def test_stop_drains_then_shuts_down_serve_then_ray_then_the_tree(teardown):
    session = launcher.Session(started_local_ray=True, device="cpu", grace_s=12.5, deployed=True)
    launcher.stop(session, _console())
    assert teardown == [("drain", 12.5), ("serve.shutdown",), ("autoscaler",), ("ray.shutdown",),
                        ("stop_all", {1: "raylet"})]


def test_stop_on_a_joined_cluster_deletes_only_the_app_and_stops_no_process(teardown):
    session = launcher.Session(started_local_ray=False, device="cpu", grace_s=5, deployed=True)
    launcher.stop(session, _console())
    assert teardown == [("drain", 5), ("serve.delete", "splitserve"), ("autoscaler",),
                        ("ray.shutdown",), ("stop_all", {})]


def test_stop_before_the_app_is_up_does_not_drain(teardown):
    session = launcher.Session(started_local_ray=True, device="cpu", grace_s=5)
    launcher.stop(session, _console())
    assert [c[0] for c in teardown] == ["serve.shutdown", "autoscaler", "ray.shutdown", "stop_all"]


def test_forced_stop_skips_drain_and_serve_but_still_stops_ray_and_the_tree(teardown):
    session = launcher.Session(started_local_ray=True, device="cpu", grace_s=5, deployed=True)
    session.forced.set()
    launcher.stop(session, _console())
    assert teardown == [("ray.shutdown",), ("stop_all", {1: "raylet"})]


def test_second_signal_during_the_drain_stops_everything_and_exits_130(
    teardown, monkeypatch, tmp_path
):
    import ray

    monkeypatch.setattr(launcher, "start_ray", lambda cfg, verbose: True)
    monkeypatch.setattr(launcher, "resolve_device", lambda cfg, gpus: "cpu")
    monkeypatch.setattr(ray, "cluster_resources", dict)
    monkeypatch.setattr(launcher, "deploy", lambda cfg, session, console: None)

    def drain(session, console):
        teardown.append(("drain",))
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal: raises KeyboardInterrupt here

    monkeypatch.setattr(launcher, "drain", drain)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        assert launcher.serve_forever(_cfg(tmp_path)) == 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert teardown == [("drain",), ("ray.shutdown",), ("stop_all", {1: "raylet"})]


def test_stop_all_kills_a_process_that_ignores_sigterm():
    import subprocess
    import sys

    from splitserve import processes

    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        tree = processes.descendants()
        assert child.pid in tree
        stopped = processes.stop_all({child.pid: tree[child.pid]}, term_wait_s=0.5)
        assert stopped and stopped[0].startswith(f"{child.pid} ")
        assert processes.alive({child.pid: tree[child.pid]}) == {}
        # psutil reaped its own child: the status says SIGTERM was ignored and SIGKILL ended it
        assert tree[child.pid].returncode == -signal.SIGKILL
    finally:
        child.kill()
