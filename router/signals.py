"""Per-pool load and latency signals of one router replica, for the autoscaling controller.

The dispatcher calls `arrival`, `first_token` and `finished` on the request path (cheap: a few
list appends); every control period `snapshot` turns them, with the admission gates' queue and
in-flight counts, into one `PoolReport` per pool and starts a new period. `ControllerLink` sends
the snapshots to the controller actor and applies the replica counts it answers with to the
gates, so a scaled pool's new replicas get requests at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from splitserve.controller.signals import MAX_LATENCY_SAMPLES, PoolReport
from splitserve.router.periodic import Periodic

log = logging.getLogger("splitserve.router")


@dataclass
class _Period:
    arrivals: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)


class LatencyObserver(Protocol):
    """Also told every latency sample (`RouterMetrics` is one: its per-pool histograms)."""

    def pool_first_token(self, pool: str, seconds: float) -> None: ...
    def pool_finished(self, pool: str, first_to_last_s: float, output_tokens: int) -> None: ...


class SignalRecorder:
    """Counts what entered each pool and how fast it was served, one period at a time.

    `observer` (optional) sees every latency sample too, uncapped and across periods."""

    def __init__(
        self, pools: Iterable[str], clock: Callable[[], float] = time.monotonic,
        observer: LatencyObserver | None = None,
    ) -> None:
        self.clock = clock
        self.observer = observer
        self._periods = {pool: _Period() for pool in pools}
        self._started = clock()

    def arrival(self, pool: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request entered `pool`'s gate (it may still wait there)."""
        p = self._periods[pool]
        p.arrivals += 1
        p.prompt_tokens += prompt_tokens
        p.output_tokens += output_tokens

    def first_token(self, pool: str, seconds: float) -> None:
        """The pool's share of a request's time to first token (see `PoolReport.ttft_s`)."""
        if self.observer is not None:
            self.observer.pool_first_token(pool, seconds)
        samples = self._periods[pool].ttft_s
        if len(samples) < MAX_LATENCY_SAMPLES:
            samples.append(seconds)

    def finished(self, pool: str, first_to_last_s: float, output_tokens: int) -> None:
        """A request finished in `pool` after `output_tokens` tokens (no TPOT for fewer than 2)."""
        if self.observer is not None:
            self.observer.pool_finished(pool, first_to_last_s, output_tokens)
        samples = self._periods[pool].tpot_s
        if output_tokens >= 2 and len(samples) < MAX_LATENCY_SAMPLES:
            samples.append(first_to_last_s / (output_tokens - 1))

    def snapshot(self, gates: Mapping[str, object]) -> dict[str, PoolReport]:
        """This period's report per pool, with each gate's `queued` and `in_flight` now; the
        next period starts. Queued prompt tokens are estimated from the period's mean prompt."""
        now = self.clock()
        period_s = max(now - self._started, 1e-3)
        out = {}
        for pool, p in self._periods.items():
            gate = gates.get(pool)
            queued = getattr(gate, "queued", 0)
            mean_prompt = p.prompt_tokens / p.arrivals if p.arrivals else 0.0
            out[pool] = PoolReport(
                t=now, period_s=period_s, arrivals=p.arrivals, prompt_tokens=p.prompt_tokens,
                output_tokens=p.output_tokens, queue_depth=queued,
                queued_tokens=round(queued * mean_prompt), running=getattr(gate, "in_flight", 0),
                ttft_s=tuple(p.ttft_s), tpot_s=tuple(p.tpot_s),
            )
        self._periods = {pool: _Period() for pool in self._periods}
        self._started = now
        return out


class ControllerLink:
    """Sends this router replica's `SignalRecorder` snapshots to the controller actor every
    `period_s`, and resizes the admission gates to the pool replica counts it answers with.

    `on_replicas(counts)` applies the counts; the link never raises into the router: a missing
    or restarting controller only skips periods (logged once until it is back).
    """

    def __init__(self, source: str, recorder: SignalRecorder, gates: Mapping[str, object],
                 period_s: float, on_replicas: Callable[[dict[str, int]], None]) -> None:
        self.source = source
        self.recorder = recorder
        self.gates = gates
        self.on_replicas = on_replicas
        self.loop = Periodic("controller report", self.report, period_s)
        self._handle = None

    async def report(self) -> None:
        """Send this period's snapshot now and apply the replica counts of the answer."""
        from splitserve.controller.live import get_controller

        reports = self.recorder.snapshot(self.gates)
        try:
            self._handle = self._handle or get_controller()
            counts = await self._handle.report.remote(self.source, reports)
        except Exception:
            self._handle = None  # the controller may be (re)starting: look it up again
            raise
        if counts:
            self.on_replicas(counts)
