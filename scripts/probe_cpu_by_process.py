"""Where the CPU goes under a closed-loop streaming load: CPU cores used per process (engine
processes per thread, with their core affinity) while N streams run against a deployment.

    flock /tmp/engine.lock .venv/bin/python scripts/probe_cpu_by_process.py colocated
    flock /tmp/engine.lock .venv/bin/python scripts/probe_cpu_by_process.py offload

`colocated`: 2 colocated engines; `disaggregated`: the default conditional policy; `offload`:
conditional with whole requests offloaded to the prefill engine. STREAMS (default 64) streams
of 128-token prompts and 256 output tokens, started 0.25 s apart, each repeating for 60 s.
Prints the mean TPOT the client saw, then cores used per process (or engine thread).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import openai
import proc_cpu  # (scripts/proc_cpu.py: this script's folder is on sys.path)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import running_deployment, test_config

MODES = {
    "colocated": {"mode": "colocated", "pools.decode.replicas": 2},
    "disaggregated": {"mode": "disaggregated"},
}


def cpu_seconds() -> dict[tuple[str, str, str, str, str], float]:
    """CPU seconds so far: per process, and per thread for vLLM's engine processes; keyed
    (pid, process title, tid, thread name, allowed cores)."""
    return {
        (t.pid, t.title, t.tid, t.name, t.cores): t.cpu_s
        for t in proc_cpu.tasks(lambda title: title.startswith("VLLM::"))
    }


async def load(base: str, streams: int, seconds: float) -> list[float]:
    """Closed-loop streams until `seconds` pass; each finished request's mean TPOT."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", timeout=600)
    end, tpots = time.time() + seconds, []

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.25)
        while time.time() < end:
            s = await client.completions.create(
                model="splitserve-tiny", prompt=[10 + (i * 7 + k) % 400 for k in range(128)],
                max_tokens=256, stream=True, extra_body={"ignore_eos": True},
            )
            first = last = None
            async for _ in s:
                last = time.perf_counter()
                first = first or last
            tpots.append((last - first) / 255)

    await asyncio.gather(*(one(i) for i in range(streams)))
    return tpots


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "colocated"
    streams = int(os.environ.get("STREAMS", "64"))
    with running_deployment(test_config(**MODES[mode])) as base:
        before, t0 = cpu_seconds(), time.time()
        tpots = asyncio.run(load(base, streams, 60))
        after, dt = cpu_seconds(), time.time() - t0
    print(f"{mode}: {len(tpots)} requests, mean TPOT {1e3 * statistics.mean(tpots):.1f} ms")
    used = sorted(((v - before.get(k, 0.0)) / dt, k) for k, v in after.items())
    for cores, (pid, title, tid, name, allowed) in reversed(used):
        if cores >= 0.01:
            print(f"{cores:6.3f} cores  {title[:40]:40} pid {pid} tid {tid} {name:16} on {allowed}")


if __name__ == "__main__":
    main()
