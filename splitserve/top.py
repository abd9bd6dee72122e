"""`splitserve top`: live pool state in the terminal, from the routers' `/metrics`.

    splitserve top [--url http://127.0.0.1:8000] [--url ...] [--interval 2] [--once]

Every interval it scrapes each router URL, adds the replicas' figures up (`parse` + `merge`,
pure), and redraws (`render`, pure): per pool the replicas, gate slots in use and waiting, and
TTFT / TPOT quantiles; requests per second by outcome; where prefill ran; tokens per second.
Rates and quantiles are over the last interval (since the router started on the first draw).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

# Series are keyed by (sample name, sorted label items).
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
# Gauges that are the same on every router replica: merged by max, not summed.
_SHARED = {"splitserve_pool_replicas"}


@dataclass(frozen=True)
class Scrape:
    """Every sample of one or more `/metrics` texts, at time `t` (seconds, monotonic)."""

    t: float
    samples: dict[SeriesKey, float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= set(ls))

    def label_values(self, name: str, label: str) -> list[str]:
        """The values `label` takes in `name`'s samples, sorted."""
        found = (dict(ls).get(label) for n, ls in self.samples if n == name)
        return sorted({v for v in found if v is not None})


def parse(text: str, t: float) -> Scrape:
    """A scrape from Prometheus text exposition."""
    samples: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return Scrape(t, samples)


def merge(scrapes: Iterable[Scrape]) -> Scrape:
    """Several router replicas' scrapes as one: sums, except shared gauges (max)."""
    scrapes = list(scrapes)
    out: dict[SeriesKey, float] = defaultdict(float)
    for scrape in scrapes:
        for key, v in scrape.samples.items():
            out[key] = max(out[key], v) if key[0] in _SHARED else out[key] + v
    return Scrape(max((s.t for s in scrapes), default=0.0), dict(out))


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' `histogram_quantile` over cumulative `(le, count)` buckets; None if empty."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, prev_le, prev_count = q * buckets[-1][1], 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            width = count - prev_count
            return le if width <= 0 else prev_le + (le - prev_le) * (rank - prev_count) / width
        prev_le, prev_count = le, count
    return prev_le


def _buckets(
    cur: Scrape, prev: Scrape | None, name: str, **labels: str
) -> list[tuple[float, float]]:
    les = {dict(ls)["le"] for n, ls in cur.samples if n == f"{name}_bucket"}
    out = []
    for le in les:
        count = cur.value(f"{name}_bucket", le=le, **labels)
        if prev is not None:
            count -= prev.value(f"{name}_bucket", le=le, **labels)
        out.append((float(le), count))
    return out


def _quantiles(cur: Scrape, prev: Scrape | None, name: str, **labels: str) -> str:
    b = _buckets(cur, prev, name, **labels)
    qs = [histogram_quantile(q, b) for q in (0.5, 0.9)]
    return " / ".join("-" if v is None else f"{v * 1000:.0f}" for v in qs)


def _rate(cur: Scrape, prev: Scrape | None, name: str, **labels: str) -> float:
    if prev is None or cur.t <= prev.t:
        return 0.0
    return max(cur.value(name, **labels) - prev.value(name, **labels), 0.0) / (cur.t - prev.t)


def pool_table(cur: Scrape, prev: Scrape | None) -> Table:
    """One row per pool: replicas, gate slots, waiting, TTFT and TPOT p50 / p90."""
    table = Table(title="pools", title_justify="left")
    for col in ("pool", "replicas", "running", "waiting", "capacity",
                "TTFT p50/p90 ms", "TPOT p50/p90 ms"):
        table.add_column(col, justify="left" if col == "pool" else "right")
    for pool in cur.label_values("splitserve_pool_replicas", "pool"):
        table.add_row(
            pool,
            f"{cur.value('splitserve_pool_replicas', pool=pool):.0f}",
            f"{cur.value('splitserve_pool_requests_running', pool=pool):.0f}",
            f"{cur.value('splitserve_pool_requests_waiting', pool=pool):.0f}",
            f"{cur.value('splitserve_pool_max_in_flight', pool=pool):.0f}",
            _quantiles(cur, prev, "splitserve_pool_time_to_first_token_seconds", pool=pool),
            _quantiles(cur, prev, "splitserve_pool_time_per_output_token_seconds", pool=pool),
        )
    return table


def traffic_table(cur: Scrape, prev: Scrape | None) -> Table:
    """Requests per second by outcome, where prefill ran, tokens per second, in flight."""
    table = Table(title="traffic (per second)", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("in flight", f"{cur.value('splitserve_requests_in_flight'):.0f}")
    for outcome in cur.label_values("splitserve_requests_total", "outcome"):
        rate = _rate(cur, prev, "splitserve_requests_total", outcome=outcome)
        table.add_row(f"requests {outcome}", f"{rate:.2f}")
    for path in cur.label_values("splitserve_disagg_decisions_total", "path"):
        rate = _rate(cur, prev, "splitserve_disagg_decisions_total", path=path)
        table.add_row(f"prefill {path}", f"{rate:.2f}")
    table.add_row("prompt tokens", f"{_rate(cur, prev, 'splitserve_prompt_tokens_total'):.1f}")
    table.add_row("generated tokens",
                  f"{_rate(cur, prev, 'splitserve_generation_tokens_total'):.1f}")
    table.add_row("TTFT p50/p90 ms",
                  _quantiles(cur, prev, "splitserve_time_to_first_token_seconds"))
    return table


def render(cur: Scrape, prev: Scrape | None = None) -> Group:
    """The screen: the pool table, then the traffic table."""
    return Group(pool_table(cur, prev), traffic_table(cur, prev))


def scrape(urls: list[str], timeout_s: float = 5.0) -> Scrape:
    """Every router URL's `/metrics` now, merged."""
    import httpx

    now = time.monotonic()
    texts = [httpx.get(f"{u.rstrip('/')}/metrics", timeout=timeout_s).text for u in urls]
    return merge(parse(text, now) for text in texts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`splitserve top`'s options."""
    p.add_argument("--url", action="append", help="router base URL; repeat for several "
                   "router replicas (default: http://127.0.0.1:8000)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    p.add_argument("--once", action="store_true", help="print one screen and exit")


def run(args: argparse.Namespace) -> int:
    """Draw until interrupted (or once)."""
    from rich.console import Console
    from rich.live import Live

    urls = args.url or ["http://127.0.0.1:8000"]
    console = Console()
    prev = scrape(urls)
    if args.once:
        console.print(render(prev))
        return 0
    with Live(render(prev), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(args.interval)
                cur = scrape(urls)
                live.update(render(cur, prev), refresh=True)
                prev = cur
        except KeyboardInterrupt:
            return 0
