"""What an idle process tree costs a server beside it (issue #26): vLLM's benchmark client
against one server, in alternating rounds with another process tree (e.g. a whole idle
splitserve deployment: Ray's daemons, Serve's controller and proxies, the replicas, an idle
engine) frozen (SIGSTOP) or running (SIGCONT). On a machine of few cores the difference is what
that tree's background wake-ups take from the measured server's engine.

    # one terminal: a plain vLLM server (as scripts/bench_dataplane.py starts it), another:
    .venv/bin/splitserve serve -c my.yaml
    .venv/bin/python scripts/probe_background.py --url http://127.0.0.1:8200 \\
        --model /root/.cache/splitserve/models/splitserve-tiny-v1 \\
        --tree $(pgrep -f 'splitserve serve') --rounds 6

`--freeze-only PID,...` freezes those processes instead of the whole tree (e.g. Ray's daemons
of a deployment while measuring that deployment: `--url` its own address). The tree is always
left running at the end. Prints each round's tokens/s and the median of running / frozen.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import bench_dataplane as bd  # noqa: E402  (vLLM's client arguments, process snapshots)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the measured server's base URL")
    p.add_argument("--model", required=True, help="the `model` its clients send (a path or name)")
    p.add_argument("--tokenizer", default=None, help="default: --model")
    p.add_argument("--tree", default=None, help="a pid: it and every process below it")
    p.add_argument("--freeze-only", default=None, help="comma-separated pids instead of --tree")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--max-concurrency", type=int, default=bd.CONCURRENCY)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if (args.tree is None) == (args.freeze_only is None):
        p.error("give one of --tree and --freeze-only")
    args.input_len, args.output_len = bd.FULL["input_len"], bd.FULL["output_len"]
    args.num_warmups = 8  # the first requests of a fresh server pay its warm-up
    return args


def frozen_pids(args: argparse.Namespace) -> list[int]:
    """The processes to freeze: --freeze-only's, or --tree's root and its descendants now."""
    if args.freeze_only:
        return [int(p) for p in args.freeze_only.split(",") if p]
    return sorted(int(p) for p in bd.descendants(bd.snapshot(), args.tree))


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def left_running(pids: list[int]) -> Iterator[None]:
    try:
        yield
    finally:
        signal_all(pids, signal.SIGCONT)


def measure(args: argparse.Namespace) -> dict:
    from vllm.benchmarks.serve import main as vllm_bench

    argv = bd.client_argv(args, args.url, args.tokenizer or args.model)
    bench = bd.client_args(argv)
    bench.model = args.model
    return vllm_bench(bench)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pids = frozen_pids(args)
    print(f"freezing {len(pids)} processes per 'frozen' run: {pids}", flush=True)
    ratios = []
    with left_running(pids):
        for i, order in enumerate(bd.round_orders(["frozen", "running"], args.rounds)):
            got = {}
            for state in order:
                signal_all(pids, signal.SIGSTOP if state == "frozen" else signal.SIGCONT)
                time.sleep(1)
                result = measure(args)
                got[state] = (result["output_throughput"], result["median_tpot_ms"])
            ratios.append(got["running"][0] / got["frozen"][0])
            print(f"round {i}: frozen {got['frozen'][0]:,.0f} tok/s (TPOT {got['frozen'][1]:.1f} "
                  f"ms), running {got['running'][0]:,.0f} tok/s (TPOT {got['running'][1]:.1f} ms):"
                  f" {ratios[-1]:.2f}", flush=True)
    print(f"median tokens/s with the processes running / frozen: {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
