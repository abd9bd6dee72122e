"""`splitserve serve` as a user runs it: start, answer with the `openai` client, stop on SIGTERM,
leave no Ray or vLLM process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import openai
import psutil
import pytest

from tests.conftest import free_port, wait_healthy


def _descendants(pid: int) -> dict[int, str]:
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = f"{p.name()} {' '.join(p.cmdline())[:200]}"
        except psutil.Error:
            pass
    return out


def _alive(pids: dict[int, str]) -> dict[int, str]:
    alive = {}
    for pid, name in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive[pid] = name
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.engine
def test_serve_answers_then_stops_cleanly(tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitserve.cli", "serve", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=600, proc=proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="splitserve-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert r.usage.completion_tokens == 8
        # The router answers before `serve.run` has returned to the launcher; the user sees
        # "ready" a moment later, and stops the server after that.
        deadline = time.monotonic() + 300
        while "splitserve ready" not in (tmp_path / "serve.log").read_text(errors="replace") and (
            time.monotonic() < deadline
        ):
            time.sleep(1)
        tree = _descendants(proc.pid)
        names = " ".join(tree.values())
        assert "raylet" in names and "EngineCore" in names, names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 0
        deadline = time.monotonic() + 90
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(1)
        assert _alive(tree) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
        log.seek(0)
        output = log.read()
        print(output)  # shown by pytest when the test fails
    assert "splitserve ready: http://127.0.0.1" in output
    assert "splitserve: stopped" in output


def _serve_failing(tmp_path, config_text: str, timeout: int, **env: str) -> str:
    """Run `splitserve serve` on a config that must fail; its exit code 1 and flattened stdout."""
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(config_text)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "splitserve.cli",
            "serve",
            "-c",
            str(cfg),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "RAY_ADDRESS": "", "COLUMNS": "400", **env},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    flat = " ".join(out.stdout.split())
    assert "splitserve: stopped" in flat  # torn down cleanly after the failure
    return flat


def test_incompatible_pools_fail_at_deploy_time(tmp_path):
    """A P/D mismatch stops `serve` before any engine starts, with a message naming both sides."""
    flat = _serve_failing(
        tmp_path, "pools:\n  prefill: {block_size: 128}\n  decode: {block_size: 256}\n", 180
    )
    assert "different KV block sizes" in flat
    assert "block_size=128" in flat and "block_size=256" in flat


def test_bad_config_exits_2_naming_the_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("router:\n  prot: 80\n")
    out = subprocess.run(
        [sys.executable, "-m", "splitserve.cli", "serve", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "router.prot: unknown key" in out.stderr


def test_unplaceable_replica_fails_instead_of_hanging(tmp_path):
    """An engine needing more cores than the machine has is an error with Serve's reason."""
    flat = _serve_failing(
        tmp_path,
        "mode: colocated\npools:\n  decode: {tensor_parallel_size: 64}\n",
        240,
        # Serve's own 30 s grace before it calls a replica unschedulable, shortened for the test
        RAY_SERVE_SLOW_STARTUP_WARNING_S="3",
        RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S="3",
    )
    assert "cannot be placed" in flat
