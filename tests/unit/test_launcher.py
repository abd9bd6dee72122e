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
