"""A simulated pool: its replicas, routing, scaling, device accounting and metric samples.

Routing is power-of-two-choices (what Ray Serve's request router does): two random ready
replicas, the less loaded wins. Prefill queues live on the replicas; decode admission waits in
one pool-level FIFO when no replica has a free sequence slot and KV room.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np
from splitserve.controller.autoscale import PoolSample
from splitserve.controller.profiles import ReplicaCost
from splitserve.controller.sim.replica import DRAINING, GONE, READY, STARTING, Replica

# vLLM's max_num_batched_tokens for the OpenAI server on GPUs with >= 70 GiB: one prefill step
# takes at most this many prompt tokens.
PREFILL_TOKEN_BUDGET = 8192
# A GPU replica's start-up: process + CUDA init, weights from local NVMe, CUDA-graph capture.
# Assumption for an 8B-70B model (~40-90 s observed in practice); the CPU measured ~25 s.
REPLICA_STARTUP_S = 60.0


@dataclass(frozen=True)
class PoolSpec:
    """One simulated pool: its role, replica cost model and bounds."""

    role: str  # "prefill" | "decode" | "colocated"
    cost: ReplicaCost
    replicas: int  # ready at t = 0
    max_seqs: int = 512
    prefill_budget: int = PREFILL_TOKEN_BUDGET
    startup_s: float = REPLICA_STARTUP_S
    max_replicas: int = 4096


class Pool:
    """Mutable state of one pool during a simulation run."""

    def __init__(self, spec: PoolSpec, rng: random.Random, horizon_s: float,
                 first: list[float], arrival_s: list[float]) -> None:
        self.spec, self.cost, self.rng, self.horizon = spec, spec.cost, rng, horizon_s
        self.first, self.arrival_s = first, arrival_s  # the run's per-request arrays
        self.kv_tokens = spec.cost.kv_capacity_tokens
        self.replicas: list[Replica] = []
        self.routable: list[Replica] = []
        self.backlog: deque[int] = deque()  # prefill side: no ready replica yet
        self.backlog_tokens = 0
        self.wait: deque[int] = deque()  # decode side: no replica with room
        self.alloc, self.device_s, self.acct_t = 0, 0.0, 0.0
        self.next_id = 0
        self.reset_period()

    def reset_period(self) -> None:
        """Zero the per-control-period counters."""
        self.arrivals, self.tokens, self.out_tokens = 0, 0, 0
        self.ttfts: list[float] = []
        self.tpots: list[float] = []

    def first_token(self, req: int, t: float) -> None:
        """Record request `req`'s first token (a colocated pool samples it as its TTFT)."""
        self.first[req] = t
        if self.spec.role == "colocated":
            self.ttfts.append(t - self.arrival_s[req])

    # --- devices and scaling -------------------------------------------------------------
    def _account(self, now: float) -> None:
        t = min(now, self.horizon)
        if t > self.acct_t:
            self.device_s += self.alloc * self.cost.devices * (t - self.acct_t)
            self.acct_t = t

    def add(self, now: float, ready: bool) -> Replica:
        """A new replica (ready at once, or starting: the caller schedules its READY)."""
        self._account(now)
        rep = Replica(self.next_id, self, now)
        self.next_id += 1
        self.alloc += 1
        self.replicas.append(rep)
        if ready:
            self.mark_ready(rep)
        return rep

    def mark_ready(self, rep: Replica) -> None:
        """`rep` finished starting and takes traffic."""
        rep.state = READY
        self.routable.append(rep)

    def retire(self, rep: Replica, now: float) -> None:
        """Release `rep`'s devices (it is idle, or was still starting)."""
        self._account(now)
        rep.state = GONE
        rep.version += 1
        self.alloc -= 1
        self.replicas.remove(rep)

    def counts(self) -> tuple[int, int]:
        """(ready, starting) replicas."""
        starting = sum(1 for r in self.replicas if r.state == STARTING)
        return len(self.routable), starting

    def scale_to(self, n: int, now: float) -> tuple[list[Replica], list[int]]:
        """Move ready + starting toward `n`: returns (replicas started, requests to re-route)."""
        ready, starting = self.counts()
        n = min(n, self.spec.max_replicas)
        if n > ready + starting:
            return [self.add(now, ready=False) for _ in range(n - ready - starting)], []
        excess, orphans = ready + starting - n, []
        for rep in [r for r in reversed(self.replicas) if r.state == STARTING][:excess]:
            self.retire(rep, now)
            excess -= 1
        victims = sorted(self.routable, key=lambda r: (r.n, r.pq_tokens, r.prefilling))[:excess]
        for rep in victims:
            rep.state = DRAINING
            self.routable.remove(rep)
            orphans.extend(rep.pq)
            rep.pq.clear()
            rep.pq_tokens = 0
            if rep.idle:
                self.retire(rep, now)
        return [], orphans

    # --- routing -----------------------------------------------------------------------------
    def pick_prefill(self) -> Replica | None:
        """The replica that queues a new prompt (power of two choices on queued tokens)."""
        r = self.routable
        n = len(r)
        if n < 2:
            return r[0] if r else None
        rand = self.rng.random
        a, b = r[int(rand() * n)], r[int(rand() * n)]
        return a if (a.pq_tokens, a.prefilling, a.n) <= (b.pq_tokens, b.prefilling, b.n) else b

    def has_room(self, rep: Replica, need: int) -> bool:
        """A free sequence slot and KV for `need` more tokens."""
        return rep.n < self.spec.max_seqs and rep.kv_used + need <= self.kv_tokens

    def pick_decode(self, need: int) -> Replica | None:
        """A replica with room for a sequence of `need` KV tokens, or None (it must wait)."""
        r = self.routable
        n = len(r)
        if not n:
            return None
        rand = self.rng.random
        a, b = r[int(rand() * n)], r[int(rand() * n)]
        best = a if a.n <= b.n else b
        if self.has_room(best, need):
            return best
        roomy = [x for x in r if self.has_room(x, need)]
        return min(roomy, key=lambda x: x.n) if roomy else None

    # --- metrics -----------------------------------------------------------------------------
    def sample(self, now: float, period_s: float) -> PoolSample:
        """This period's metrics as the controller would scrape them."""
        ready, starting = self.counts()
        live = [r for r in self.replicas if r.state in (READY, DRAINING)]
        kv_cap = ready * self.kv_tokens
        return PoolSample(
            t=now, ready=ready, starting=starting,
            arrival_rate=self.arrivals / period_s, token_rate=self.tokens / period_s,
            out_token_rate=self.out_tokens / period_s,
            queue_depth=sum(len(r.pq) for r in live) + len(self.backlog) + len(self.wait),
            queued_tokens=float(sum(r.pq_tokens for r in live) + self.backlog_tokens),
            running=sum(r.n + len(r.batch) for r in live),
            kv_usage=sum(r.kv_used for r in self.routable) / kv_cap if kv_cap else 0.0,
            ttft_p90_s=float(np.percentile(self.ttfts, 90)) if self.ttfts else None,
            tpot_p90_s=float(np.percentile(self.tpots, 90)) if self.tpots else None,
        )
