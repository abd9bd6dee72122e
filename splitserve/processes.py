"""The local processes `splitserve serve` started, and stopping any that outlive Ray's shutdown.

A local Ray cluster is a tree under the launcher: gcs_server, raylet, the dashboard agents, the
worker processes (Serve's controller, proxy and replicas) and, under each engine replica, vLLM's
`EngineCore` (and its workers). `ray.shutdown()` stops the processes Ray started; a process whose
parent died first (an `EngineCore` whose replica was killed) is re-parented and no longer shows in
the tree, so the launcher records the tree before it shuts anything down and afterwards stops
what is still running: SIGTERM, then SIGKILL after `TERM_WAIT_S`.
"""

from __future__ import annotations

import os

import psutil

# How long a process gets to exit after SIGTERM before SIGKILL (the usual supervisor default).
TERM_WAIT_S = 5.0


def descendants(pid: int | None = None) -> dict[int, psutil.Process]:
    """Every live descendant of `pid` (default: this process), by pid."""
    try:
        children = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    return {p.pid: p for p in children}


def alive(procs: dict[int, psutil.Process]) -> dict[int, psutil.Process]:
    """The processes of `procs` still running (the same process: psutil checks the start time,
    so a reused pid does not count; a zombie counts as gone)."""
    out = {}
    for pid, p in procs.items():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = p
        except psutil.Error:
            pass
    return out


def describe(p: psutil.Process) -> str:
    """`pid name` of a process, for a log line."""
    try:
        return f"{p.pid} {p.name()}"
    except psutil.Error:
        return str(p.pid)


def stop_all(procs: dict[int, psutil.Process], term_wait_s: float = TERM_WAIT_S) -> list[str]:
    """Stop every process of `procs` still running: SIGTERM, wait up to `term_wait_s`, then
    SIGKILL. Returns the ones that had to be stopped (`describe`), for the log."""
    left = alive(procs)
    stopped = [describe(p) for p in left.values()]
    for p in left.values():
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, survivors = psutil.wait_procs(list(left.values()), timeout=term_wait_s)
    for p in survivors:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(survivors, timeout=term_wait_s)
    return stopped
