"""CPU time per process and per thread, read from Linux's /proc (for the probe scripts).

`tasks(per_thread)` yields one `Task` per process, or per thread of the processes whose title
`per_thread(title)` accepts; the probes sum or key them as they need. A process or thread that
ends while it is read is skipped.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Task:
    """One process (tid == pid) or one of its threads, with the CPU time it used so far."""

    pid: str
    title: str  # the process's argv[0] (vLLM sets it, e.g. "VLLM::Worker")
    tid: str
    name: str  # the thread's name (comm)
    cores: str  # the cores it may run on (Cpus_allowed_list)
    cpu_s: float  # user + system seconds
    ppid: str = ""  # the parent process's id (of the process, for a thread too)


def _title(proc: str) -> str | None:
    try:
        with open(proc + "/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None


def _task(pid: str, title: str, path: str) -> Task | None:
    try:
        with open(path + "/stat") as f:
            head, rest = f.read().rsplit(") ", 1)
        with open(path + "/status") as f:
            cores = f.read().split("Cpus_allowed_list:")[1].split()[0]
    except (OSError, IndexError, ValueError):
        return None
    fields = rest.split()
    return Task(
        pid=pid, title=title, tid=path.rsplit("/", 1)[1], name=head.split(" (", 1)[1],
        cores=cores, cpu_s=(int(fields[11]) + int(fields[12])) / HZ, ppid=fields[1],
    )


def tasks(per_thread: Callable[[str], bool] = lambda title: False) -> Iterator[Task]:
    """Every process now, split into its threads where `per_thread(title)` is true."""
    for proc in glob.glob("/proc/[0-9]*"):
        title = _title(proc)
        if title is None:
            continue
        paths = glob.glob(proc + "/task/[0-9]*") if per_thread(title) else [proc]
        for path in paths:
            task = _task(proc[6:], title, path)
            if task is not None:
                yield task
