"""Tracing's cost: the router's latency and highest request rate with tracing off, sampled at 5 %,
and at 100 %, every recorded span exported over OTLP/HTTP.

    .venv/bin/python scripts/bench_tracing.py [--rounds 2] [--variants off,5%,100%] [--requests 200]
        [--concurrency 1,4,16] [--level-seconds 6] [--prompt-len 160] [--seed 0]
        [--out bench-results/tracing]

One deployment per variant, started in turn (off, 5 %, 100 %, then again for each further round,
so slow drifts of the shared machine hit every variant alike): mode disaggregated, one prefill
and one decode engine, `disaggregation.prefill: remote` and a `--prompt-len`-token
prompt (`min_remote_prompt_tokens` 0), so every request takes the whole remote path and
records the most spans: root, admission, dispatch, prefill hop, KV transfer, decode hop. The
traced variants export to an OTLP/HTTP sink run by this script on 127.0.0.1 (a stand-in for a
collector: it parses each export and counts its spans, then answers 200), so the router pays
for what a production deployment pays: span creation, the batch processor and protobuf export.

Per deployment:
- **Latency**: `--requests` sequential `max_tokens=1` completions, alternating with the same
  request sent to the decode engine's Serve handle directly (`splitserve.bench.overhead`).
  The router path's p50/p99 and its median paired difference from the direct path; the direct
  path absorbs the machine's noise of the moment, not the remote prefill, which it does not do.
- **Highest rate**: a closed loop through the router at each `--concurrency` level.
- **Spans exported per request**: what the sink received over the requests the router
  finished (its `/metrics`); about 0.05x and 1x the spans of one trace for the traced variants.

Writes results.json under --out (rewritten after each deployment) and prints a table.
Time: about 3 minutes per deployment on 2 cores (mostly start-up), 18 with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitserve.bench.overhead import paired_overhead, sweep
from splitserve.bench.report import write_json
from tests.conftest import running_deployment, test_config

TOKENS = (10, 500)  # the tiny model's ordinary token ids
VARIANTS = {"off": None, "5%": 0.05, "100%": 1.0}  # name -> sample ratio (None: tracing off)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="deployments per variant, interleaved")
    p.add_argument("--variants", default=",".join(VARIANTS), help="a subset of off,5%%,100%%")
    p.add_argument("--requests", type=int, default=200, help="sequential pairs per deployment")
    p.add_argument("--concurrency", default="1,4,16", help="closed-loop levels")
    p.add_argument("--level-seconds", type=float, default=6.0)
    p.add_argument("--prompt-len", type=int, default=160)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/tracing")
    args = p.parse_args(argv)
    args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    return args


class OtlpSink:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that counts what it receives (spans, exports,
    bytes) and answers 200: the collector's side of the export, without a collector."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans = self.exports = self.bytes = 0
        lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest.FromString(body)
                n = sum(len(s.spans) for r in req.resource_spans for s in r.scope_spans)
                with lock:
                    sink.spans += n
                    sink.exports += 1
                    sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        """The URL to configure as `tracing.otlp_endpoint`."""
        return f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def counts(self) -> tuple[int, int, int]:
        """(spans, exports, bytes) received so far."""
        return self.spans, self.exports, self.bytes


def router_requests(base: str) -> int:
    """Requests the router has finished, from its `/metrics` (`splitserve_requests_total`)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=10).text
    return int(sum(s.value for f in text_string_to_metric_families(text)
                   if f.name == "splitserve_requests" for s in f.samples
                   if s.name == "splitserve_requests_total"))


def variant_config(ratio: float | None, endpoint: str):
    """The benchmark deployment with tracing off (`ratio` None) or sampled at `ratio`."""
    overrides: dict[str, Any] = {
        "mode": "disaggregated",
        "disaggregation.prefill": "remote",  # every prompt takes the NIXL path
        "disaggregation.min_remote_prompt_tokens": 0,  # every prompt takes the handoff
    }
    if ratio is not None:
        overrides["tracing"] = {"enabled": True, "sample_ratio": ratio, "otlp_endpoint": endpoint}
    return test_config(**overrides)


def run_variant(args: argparse.Namespace, name: str, sink: OtlpSink) -> dict[str, Any]:
    """One deployment of variant `name`: latency pairs, the rate sweep, spans exported."""
    from ray import serve

    ids = [int(t) for t in np.random.default_rng(args.seed).integers(*TOKENS, args.prompt_len)]
    start = time.perf_counter()
    with running_deployment(variant_config(VARIANTS[name], sink.endpoint)) as base:
        print(f"[{name}] ready after {time.perf_counter() - start:.0f} s", flush=True)
        handle = serve.get_deployment_handle("decode", app_name="splitserve")
        before, served_before = sink.counts(), router_requests(base)
        over = asyncio.run(paired_overhead(base, handle, ids, pairs=args.requests, warmup=10))
        rates = asyncio.run(sweep(base, handle, ids, [{}], args.concurrency, args.level_seconds))
        sent = router_requests(base) - served_before
    time.sleep(1.0)  # the router's batch processor flushes at shutdown; let the sink finish
    spans, exports, nbytes = (a - b for a, b in zip(sink.counts(), before, strict=True))
    return {
        "variant": name,
        "sample_ratio": VARIANTS[name],
        "overhead": over,
        "throughput": rates,
        "exported": {"spans": spans, "exports": exports, "bytes": nbytes,
                     "router_requests": sent,
                     "spans_per_request": round(spans / sent, 3) if sent else None},
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per deployment (latency in ms, rates in completed requests/s)."""
    print(f"{'tracing':<8}{'router p50':>11}{'p99':>8}{'paired diff':>12}{'max req/s':>10}"
          f"{'spans/req':>10}   req/s by concurrency")
    for r in rows:
        o, t = r["overhead"], r["throughput"]
        by_c = " ".join(f"{p['concurrency']}:{p['requests_per_s']}" for p in t["points"])
        print(f"{r['variant']:<8}{o['router_p50_ms']:>11}{o['router_p99_ms']:>8}"
              f"{o['paired_diff_median_ms']:>12}{t['max_requests_per_s']:>10}"
              f"{r['exported']['spans_per_request']!s:>10}   {by_c}")


def main(argv: list[str] | None = None) -> None:
    """Every variant `--rounds` times, interleaved; results.json rewritten after each."""
    args = parse_args(argv)
    out = Path(args.out)
    sink = OtlpSink()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "args": vars(args),
        "runs": [],
    }
    for _ in range(args.rounds):
        for name in args.variants:
            doc["runs"].append(run_variant(args, name, sink))
            write_json(out / "results.json", doc)
    print_table(doc["runs"])
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
