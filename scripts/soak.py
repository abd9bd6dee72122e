"""Soak: steady mixed load on the default disaggregated deployment for a long time; zero errors
and flat memory are the pass conditions (issue 8).

    .venv/bin/python scripts/soak.py [--minutes 30] [--rate 0.5] [--prompt-len 16-1500]
        [--output-len 8-128] [--cancel-fraction 0.1] [--sample-s 60] [--seed 0]
        [--out bench-results/soak]

One deployment (the default config: 1 prefill + 1 decode worker, conditional disaggregation;
Ray in this process through `tests.conftest.running_deployment`). Poisson arrivals at `--rate`
for `--minutes`, prompt and output lengths uniform over the given ranges (every prompt fresh: no
prefix-cache reuse), all streamed. A `--cancel-fraction` of the requests are abandoned by the
client after their first token (the connection is closed): they must free everything they held,
and are counted apart. Every `--sample-s` the resident memory (RSS) of every process of the Ray
cluster (GCS, raylet, Serve controller and proxy, router and worker replicas, vLLM EngineCore
processes) is sampled.

Engine processes are labelled with the pool of the replica that started them
(`VLLM::Worker (prefill) [pid]`).

Pass: no request failed, and no process's RSS grew by more than `--rss-growth` (fraction) over
the second half of the run: from the first sample at or after half the run's duration to the
last (`splitserve.bench.memory`). A cache that fills once per new input shape grows early and
levels off, which is bounded warm-up, not a leak; a leak keeps its rate and shows in the second
half too (a linear leak of twice the limit over the run fails). Start, half-way, end and peak
RSS and the growth over the whole run are reported for every process all the same. Writes
results.json and requests.jsonl under --out and prints a table; exit status 1 when the run did
not pass.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.bench.client import Target, completion_body, make_client, send_one
from splitserve.bench.memory import grew, memory_table
from splitserve.bench.results import RequestResult
from splitserve.bench.stats import percentiles
from splitserve.bench.workload import BenchRequest, LengthSpec, WorkloadSpec, build_workload
from tests.conftest import free_port, running_deployment, test_config

MODEL = "splitserve-tiny"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=0.5, help="requests per second (Poisson)")
    p.add_argument("--prompt-len", default="16-1500")
    p.add_argument("--output-len", default="8-128")
    p.add_argument("--cancel-fraction", type=float, default=0.1)
    p.add_argument("--sample-s", type=float, default=60.0, help="RSS sampling period")
    p.add_argument("--rss-growth", type=float, default=0.10, help="allowed growth per process over the 2nd half")
    p.add_argument("--warmup", type=int, default=8, help="unmeasured requests first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/soak")
    return p.parse_args(argv)


def process_label(proc: psutil.Process) -> str:
    """A stable, readable name for a cluster process (its Ray/vLLM title, else its command)."""
    try:
        cmd = proc.cmdline()
        title = cmd[0] if cmd else proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid-{proc.pid}"
    if "raylet" in title or "gcs_server" in title:
        return Path(title.split()[0]).name
    if title.startswith("ray::"):  # Ray retitles an actor with the method it runs: drop that
        return title.split(" ")[0].split(".")[0][:60]
    if title.startswith("VLLM::"):  # an engine process: name the pool of the replica it serves
        return f"{title.split(' ')[0][:40]} ({engine_pool(proc)})"
    return proc.name()


def engine_pool(proc: psutil.Process) -> str:
    """The Serve deployment (prefill, decode, ...) whose replica started this engine process."""
    try:
        for parent in proc.parents():
            cmd = parent.cmdline()
            if cmd and "ServeReplica:" in cmd[0]:
                return cmd[0].split(" ")[0].split(".")[0].rsplit(":", 1)[-1]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return "?"


def sample_rss() -> dict[str, int]:
    """RSS bytes of every process under this driver (the local Ray cluster), by label + pid."""
    out = {}
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            out[f"{process_label(proc)} [{proc.pid}]"] = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    out[f"driver (load generator) [{os.getpid()}]"] = psutil.Process().memory_info().rss
    return out


async def abandon_after_first_token(client, target: Target, req: BenchRequest, t0: float):
    """A streamed request that the client walks away from once its first token arrived."""
    rec = RequestResult(req.index, req.arrival_s, len(req.prompt), req.max_tokens)
    rec.sent_s = time.perf_counter() - t0
    sent = time.perf_counter()
    try:
        async with client.stream(
            "POST", "completions", json=completion_body(target.model, req)
        ) as resp:
            rec.status_code = resp.status_code
            if resp.status_code != 200:
                rec.error = (await resp.aread()).decode("utf-8", "replace")[:300]
                return rec
            async for data in resp.aiter_bytes():
                if b'"text"' in data:
                    rec.ttft_s = time.perf_counter() - sent
                    break  # leaving the block closes the connection mid-stream
    except Exception as err:  # noqa: BLE001 - recorded, counted as a failure
        rec.error = f"{type(err).__name__}: {err}"
    rec.e2e_s = time.perf_counter() - sent
    return rec


async def run_load(target: Target, requests: list[BenchRequest], cancel: set[int],
                   sample_s: float, samples: list[dict[str, Any]]) -> list[RequestResult]:
    """The schedule, with RSS samples every `sample_s` while it runs."""
    async with make_client(target) as client:
        t0 = time.perf_counter()

        async def one(req: BenchRequest) -> RequestResult:
            await asyncio.sleep(max(0.0, req.arrival_s - (time.perf_counter() - t0)))
            if req.index in cancel:
                return await abandon_after_first_token(client, target, req, t0)
            return await send_one(client, target, req, t0)

        async def sampler() -> None:
            while True:
                samples.append({"t_s": round(time.perf_counter() - t0, 1),
                                "rss": await asyncio.to_thread(sample_rss)})
                await asyncio.sleep(sample_s)

        sampling = asyncio.create_task(sampler())
        try:
            results = await asyncio.gather(*(one(r) for r in requests))
        finally:
            sampling.cancel()
        samples.append({"t_s": round(time.perf_counter() - t0, 1),
                        "rss": await asyncio.to_thread(sample_rss)})
        return list(results)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 when it passed."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = max(1, round(args.minutes * 60 * args.rate))
    spec = WorkloadSpec(num_requests=n, prompt_len=LengthSpec.parse(args.prompt_len),
                        output_len=LengthSpec.parse(args.output_len), rate=args.rate,
                        seed=args.seed)
    requests = build_workload(spec)
    warm = build_workload(WorkloadSpec(**{**spec.__dict__, "num_requests": args.warmup,
                                         "seed": args.seed + 1000, "rate": 1.0}))
    rng = np.random.default_rng([args.seed, 7])
    cancel = {int(i) for i in rng.choice(n, size=round(n * args.cancel_fraction), replace=False)}
    cfg = test_config(**{"router.port": free_port()})
    samples: list[dict[str, Any]] = []
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with running_deployment(cfg) as base:
        target = Target(f"{base}/v1", MODEL, timeout_s=600)
        asyncio.run(run_load(target, warm, set(), 3600, []))
        print(f"[soak] warm; {n} requests over {args.minutes:g} min at {args.rate:g} req/s")
        t = time.perf_counter()
        results = asyncio.run(run_load(target, requests, cancel, args.sample_s, samples))
        wall = time.perf_counter() - t
    done = [r for r in results if r.index not in cancel]
    abandoned = [r for r in results if r.index in cancel]
    failed = [r for r in results if r.error is not None]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    memory = memory_table(samples)
    grown = grew(memory, args.rss_growth)
    summary = {
        "started": started, "args": vars(args), "wall_s": round(wall, 1),
        "requests": {"sent": len(results), "completed": sum(r.error is None for r in done),
                     "abandoned_by_client": len(abandoned), "failed": len(failed),
                     "errors": dict(Counter((r.status_code, r.error) for r in failed)
                                    .most_common(10)) if failed else {}},
        "ttft_s": percentiles(ttft) if ttft else {},
        "memory": memory, "samples": samples,
        "passed": not failed and not grown,
    }
    summary["requests"]["errors"] = {str(k): v for k, v in summary["requests"]["errors"].items()}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    with open(out / "requests.jsonl", "w") as f:
        f.writelines(json.dumps(r.__dict__) + "\n" for r in results)
    print(f"[soak] {summary['requests']} in {wall / 60:.1f} min")
    print(f"{'process':<52}{'start MiB':>10}{'half MiB':>9}{'end MiB':>9}{'peak MiB':>9}"
          f"{'growth':>8}{'2nd half':>9}")
    for m in memory:
        print(f"{m['process'][:51]:<52}{m['start_mib']:>10}{m['judged_from_mib']:>9}"
              f"{m['end_mib']:>9}{m['peak_mib']:>9}{m['growth']:>8.1%}{m['judged_growth']:>9.1%}")
    print(f"[soak] {'PASSED' if summary['passed'] else 'FAILED'}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
