"""The discrete-event loop: router, prefill pool, KV transfer, decode pool and controller.

Events live in one heap of (time, seq, kind, replica-or-batch, version). Arrivals are not heap
events: the loop merges the sorted arrival array with the heap. Per request there are O(1)
events (a prefill batch, a transfer, a decode join, a finish), never one per token.

A request's life, disaggregated: arrive -> router queues it on a prefill replica -> prefill
batch done (prefill-stage latency sampled) -> KV transfer (fixed overhead + bytes / NIC
bandwidth) -> decode admission (waits for a slot and KV room) -> first token after one decode
step -> last token. Colocated: the same pool prefills (pausing its decode; the prefill step
samples the first token) and decodes.

With `routing` (a deployment's `DisaggregationConfig`), each disaggregated arrival asks the
router's own rule (`decide`, router/policy.py) where it goes, with a `PoolLoad` counted from the
simulated pools exactly as the dispatcher counts its own (`router/dispatch.py`) and the costs the
router would measure taken from the profile (`profile_costs`): REMOTE as above; LOCAL prefills
on a decode replica, which pauses its decode for the prompt as a colocated replica does; OFFLOAD
runs the whole request on a prefill replica, which then decodes it too. Without `routing` every
prompt goes remote (the planner's pure disaggregation).
"""

from __future__ import annotations

import heapq
import math
import random
import time

import numpy as np
from splitserve.controller.control import Controller
from splitserve.controller.sim.pool import Pool, PoolSpec
from splitserve.controller.sim.replica import DRAINING, STARTING, Replica
from splitserve.controller.sim.trace import Trace
from splitserve.router.backlog import Backlog
from splitserve.router.policy import (
    EngineCost,
    HandoffCost,
    PoolLoad,
    PrefillPath,
    Targets,
    decide,
    pool_views,
)

from splitserve.config import DisaggregationConfig

PREFILL_DONE, DECODE, XFER, READY, TICK = range(5)
PENDING, DONE, REJECTED = 0, 1, 2


class Simulation:
    """One run over one trace. `pools`: {"prefill", "decode"} or {"colocated"}. `routing`:
    disaggregated only, the conditional-disaggregation settings the router's policy decides
    with (None: every prompt is prefilled remotely). `router_replicas`: how many router
    replicas share the traffic; each decides with its own share of the work in flight (the
    policy's counts are per router replica), modelled as 1/`router_replicas` of the pools'.
    `tpot_slo_s`, `ttft_slo_s`: the targets the rule keeps (None: no target)."""

    def __init__(self, trace: Trace, specs: dict[str, PoolSpec], controller: Controller,
                 seed: int = 0, drain_s: float = 600.0,
                 routing: DisaggregationConfig | None = None, router_replicas: int = 1,
                 tpot_slo_s: float | None = None, ttft_slo_s: float | None = None) -> None:
        if router_replicas < 1:
            raise ValueError("router_replicas must be at least 1")
        self.trace, self.ctl, self.router_replicas = trace, controller, router_replicas
        # Plain lists: per-element access from Python is several times faster than numpy's.
        self.arrival = trace.arrival_s.tolist()
        self.prompt, self.output = trace.prompt.tolist(), trace.output.tolist()
        # Prefix-cache hits: prompt tokens a prefill skips; queues count the tokens computed.
        self.cached = None if trace.cached is None else trace.cached.tolist()
        self.work = (self.prompt if self.cached is None
                     else [p - c for p, c in zip(self.prompt, self.cached, strict=True)])
        n = len(trace)
        self.first, self.finish = [math.nan] * n, [math.nan] * n
        self.status = [PENDING] * n
        rng = random.Random(seed)
        self.pools = {role: Pool(s, rng, trace.spec.duration_s, self.first, self.arrival)
                      for role, s in specs.items()}
        self.front = self.pools.get("prefill") or self.pools["colocated"]
        self.back = self.pools.get("decode") or self.pools["colocated"]
        self.end_t = trace.spec.duration_s + drain_s
        # Requests that decode on the replica that prefilled them: all of them when colocated.
        self.local = [self.front is self.back] * n
        self.routing = routing if self.front is not self.back else None
        self.tpot_slo_s = tpot_slo_s  # the TPOT target the rule keeps
        if self.routing is not None:
            context = float(np.mean(trace.prompt)) if n else 0.0
            self.costs = profile_costs(self.front, self.back, context)
            self.mean_output = max(round(float(np.mean(trace.output))), 1) if n else 256
        self.targets = Targets(ttft_s=ttft_slo_s, tpot_s=tpot_slo_s)
        self.paths: dict[PrefillPath, int] = {}  # decisions taken, by path
        # The router's view of its work in flight, counted as router/dispatch.py counts it.
        self.remote_reqs = 0  # remote prefills, until their handoff
        # prompt tokens left to prefill per pool (remote prompts until their handoff, local
        # ones until prefilled), drained at the pool's prefill rate
        self.backlog = {"prefill": Backlog(), "decode": Backlog()}
        # requests on each pool from their hop there to their end (decode: from the handoff)
        self.decode_streams = self.offloaded = 0
        self.heap: list = []
        self.seq = 0
        self.timeline: list[dict] = []
        self.events = 0
        for pool in self.pools.values():
            for _ in range(pool.spec.replicas):
                pool.add(0.0, ready=True)

    def push(self, t: float, kind: int, obj, version: int = 0) -> None:
        """Schedule an event."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, version))

    def run(self) -> dict:
        """Run to completion (or `drain_s` past the trace); returns per-request outcome arrays."""
        wall = time.perf_counter()
        arrivals, n, i = self.arrival, len(self.arrival), 0
        self.push(self.ctl.period_s, TICK, None)
        heap, pop = self.heap, heapq.heappop
        handlers = (self._prefill_done, self._decode, self._xfer, self._ready)
        while i < n or heap:
            if heap and (i >= n or heap[0][0] < arrivals[i]):
                t, _, kind, obj, version = pop(heap)
                if t > self.end_t:
                    break
                self.events += 1
                if kind != TICK:
                    handlers[kind](t, obj, version)
                elif not self._tick(t, i < n):
                    continue
            else:
                self._arrive(arrivals[i], i)
                i += 1
        for pool in self.pools.values():
            pool._account(self.trace.spec.duration_s)
        # Every token reaches the client after the router's path (0 unless the profile has one).
        hop = self.back.cost.acc.router_latency_s
        return {"first": np.array(self.first) + hop, "finish": np.array(self.finish) + hop,
                "status": np.array(self.status, np.int8),
                "paths": {p.value: k for p, k in self.paths.items()},
                "wall_s": time.perf_counter() - wall, "events": self.events}

    # --- prefill side ------------------------------------------------------------------------
    def _arrive(self, now: float, req: int) -> None:
        p, o = self.prompt[req], self.output[req]
        path = PrefillPath.REMOTE
        if self.routing is not None:
            path = self._decide(p, self.cached[req] if self.cached is not None else 0, o, now)
            self.paths[path] = self.paths.get(path, 0) + 1
        remote_side = path is PrefillPath.REMOTE or path.pool == "prefill"
        pool = self.front if remote_side else self.back
        pool.arrivals += 1
        pool.tokens += p
        pool.out_tokens += o
        if p + o > self.back.kv_tokens:
            self.status[req] = REJECTED  # can never fit one decode replica's KV
            return
        if self.front is self.back:
            pass  # colocated
        elif path is PrefillPath.REMOTE:
            self.remote_reqs += 1
            self._sent("prefill", req, p, now)
        else:  # prefilled where it decodes: a decode replica, or a prefill one (whole request)
            self.local[req] = True
            self._sent(path.pool, req, p, now)
            if path.pool == "prefill":
                self.offloaded += 1
            else:
                self.decode_streams += 1
        self._route(pool, req, now)

    def _decide(self, prompt: int, cached: int, output: int, now: float) -> PrefillPath:
        """The router's choice for a prompt (`Dispatcher._path`, with the profile's costs)."""
        cfg = self.routing
        if cfg.prefill == "local" or prompt < cfg.min_remote_prompt_tokens:
            return PrefillPath.LOCAL
        if cfg.prefill == "remote":
            return PrefillPath.REMOTE
        prefill, decode, handoff = self.costs
        views = pool_views(self.load(now), prefill, decode,
                           {"prefill": cached, "decode": cached})
        return decide(prompt, views["prefill"], views["decode"], handoff, self.targets,
                      output_tokens=output, stream_tokens=self.mean_output).path

    def load(self, now: float) -> PoolLoad:
        """The pools as one router replica sees them at `now` (`Dispatcher.load`): its share
        of the work in flight (Serve spreads requests evenly over router replicas), every
        replica."""
        r = self.router_replicas
        return PoolLoad(
            prefill_requests=round(self.remote_reqs / r),
            prefill_tokens=round(self._pending("prefill", now) / r),
            prefill_replicas=len(self.front.routable),
            local_prefill_tokens=round(self._pending("decode", now) / r),
            decode_streams=round(self.decode_streams / r),
            decode_replicas=len(self.back.routable),
            prefill_streams=round(self.offloaded / r),
        )

    def _rate(self, role: str) -> float:
        """`role`'s prefill tokens/s over its replicas (`Dispatcher._rate`, profile costs)."""
        if self.routing is None:
            return 0.0
        pool = self.front if role == "prefill" else self.back
        cost = self.costs[0] if role == "prefill" else self.costs[1]
        reps = max(len(pool.routable), 1)
        streams = self.offloaded if role == "prefill" else self.decode_streams
        return cost.prefill_rate(round(streams / reps)) * reps

    def _sent(self, role: str, req: int, tokens: int, now: float) -> None:
        if self.routing is not None:
            self.backlog[role].add(req, tokens, now, self._rate(role))

    def _answered(self, role: str, reqs: list[int], now: float) -> None:
        if self.routing is not None:
            for req in reqs:
                self.backlog[role].answered(req, now, self._rate(role))

    def _pending(self, role: str, now: float) -> float:
        """`role`'s backlog in the step model's tokens (`Dispatcher._pending`)."""
        backlog, model = self.backlog[role], self._rate(role)
        left, served = backlog.tokens(now, model), backlog.served_rate()
        return left if served is None or model <= 0 else left * model / served

    def _route(self, pool: Pool, req: int, now: float) -> None:
        rep = pool.pick_prefill()
        p = self.work[req]
        if rep is None:
            pool.backlog.append(req)
            pool.backlog_tokens += p
            return
        rep.pq.append(req)
        rep.pq_tokens += p
        if not rep.prefilling:
            self._start_prefill(rep, now)

    def _start_prefill(self, rep: Replica, now: float) -> None:
        pool = rep.pool
        # Prompts that decode here take only what fits this replica's KV and slots.
        batch, tokens, sq = rep.take_prefill_batch(
            self.prompt, pool.spec.prefill_budget, self.output, pool.kv_tokens,
            pool.spec.max_seqs, self.cached, self.local)
        if not batch:
            return  # waits for decodes to free KV
        latency = pool.cost.prefill_s(tokens, len(batch), sq)
        rep.advance(now)  # decode (colocated, local or offloaded sequences) pauses from here
        rep.batch, rep.prefilling = batch, True
        rep.version += 1
        # A PP prefill replica is free for the next batch after one stage; this batch's KV is
        # complete only after all of them (replicas that decode too are not pipelined here).
        pipelined = pool is not self.back and rep.n == 0 and not any(self.local[r] for r in batch)
        stage = latency / pool.cost.pp if pipelined else latency
        rep.tail_s = latency - stage
        self.push(now + stage, PREFILL_DONE, rep)

    def _prefill_done(self, now: float, rep: Replica, _version: int) -> None:
        pool, batch, done_t = rep.pool, rep.batch, now + rep.tail_s
        rep.advance(now)
        rep.batch, rep.prefilling = [], False
        if rep.pq:
            self._start_prefill(rep, now)  # prefill first: a colocated decode stays paused
        local, prompt = self.local, self.prompt
        mine = [r for r in batch if local[r]]
        if mine:  # decode here (KV reserved); the prefill step sampled the first token
            output, stamp = self.output, pool.first_token
            for req in mine:
                stamp(req, now)
                rep.join(req, prompt[req], output[req], reserved=True)
            self._answered(pool.spec.role, mine, now)  # counted until its first token
            self._reschedule(rep, now)
        remote = [r for r in batch if not local[r]] if mine else batch
        if remote:  # the KV moves to the decode pool, the decode request enters its gate
            arrival = self.arrival
            pool.ttfts.extend([done_t - arrival[r] for r in remote])
            self.remote_reqs -= len(remote)
            self._answered("prefill", remote, now)
            longest = max(prompt[r] for r in remote)
            self.push(done_t + pool.cost.kv_transfer_s(longest), XFER, remote)
        self._settle(rep, now)

    # --- decode side -------------------------------------------------------------------------
    def _xfer(self, now: float, batch: list[int], _version: int) -> None:
        back, output = self.back, self.output
        back.arrivals += len(batch)
        back.out_tokens += sum(output[r] for r in batch)
        self.decode_streams += len(batch)  # on decode from its handoff
        self._admit(back, batch, now)

    def _admit(self, pool: Pool, reqs: list[int], now: float) -> None:
        touched: dict[Replica, None] = {}  # insertion-ordered: runs stay deterministic
        prompt, output = self.prompt, self.output
        for req in reqs:
            p, o = prompt[req], output[req]
            rep = None if pool.wait else pool.pick_decode(p + o)
            if rep is None:
                pool.wait.append(req)
                continue
            rep.advance(now)
            rep.join(req, p, o)
            touched[rep] = None
        for rep in touched:
            self._reschedule(rep, now)

    def _reschedule(self, rep: Replica, now: float) -> None:
        """Retime after a batch change and schedule the next finish (stale ones are skipped)."""
        rep.retime(rep.pool.cost)
        rep.version += 1
        t = rep.next_finish_t()
        if t < math.inf:
            self.push(t, DECODE, rep, rep.version)

    def _decode(self, now: float, rep: Replica, version: int) -> None:
        if version != rep.version:
            return  # stale: the batch changed after this was scheduled
        rep.advance(now)
        done = rep.pop_finished(self.prompt, self.output)
        first, finish, status, output = self.first, self.finish, self.status, self.output
        tpots = rep.pool.tpots
        if rep.pool is self.back:
            self.decode_streams -= len(done)
        else:
            self.offloaded -= len(done)
        for req in done:
            finish[req] = now
            status[req] = DONE
            tpots.append((now - first[req]) / max(output[req] - 1, 1))
        if rep.pq and not rep.prefilling and rep.state != DRAINING:
            self._start_prefill(rep, now)  # colocated: freed KV lets waiting prompts in
        self._fill(rep, now)

    def _fill(self, rep: Replica, now: float) -> None:
        """Admit waiting sequences into `rep` while it has room, then reschedule it."""
        pool, prompt, output = rep.pool, self.prompt, self.output
        wait = pool.wait
        while wait and rep.state != DRAINING:
            req = wait[0]
            p, o = prompt[req], output[req]
            if not pool.has_room(rep, p + o):
                break
            wait.popleft()
            rep.advance(now)
            rep.join(req, p, o)
        self._reschedule(rep, now)
        self._settle(rep, now)

    def _settle(self, rep: Replica, now: float) -> None:
        """A draining replica with nothing left gives its devices back."""
        if rep.state == DRAINING and rep.idle:
            rep.pool.retire(rep, now)

    # --- control -----------------------------------------------------------------------------
    def _ready(self, now: float, rep: Replica, _version: int) -> None:
        if rep.state != STARTING:
            return  # cancelled while starting
        pool = rep.pool
        pool.mark_ready(rep)
        backlog, pool.backlog, pool.backlog_tokens = list(pool.backlog), type(pool.backlog)(), 0
        for req in backlog:
            self._route(pool, req, now)
        self._fill(rep, now)

    def _tick(self, now: float, arrivals_left: bool) -> bool:
        busy = arrivals_left or any(
            r.n or r.pq or r.prefilling for p in self.pools.values() for r in p.replicas
        ) or any(p.wait or p.backlog for p in self.pools.values())
        if not busy:
            return False
        period = self.ctl.period_s
        samples = {role: pool.sample(now, period) for role, pool in self.pools.items()}
        decisions = self.ctl.step(samples)
        for role, pool in self.pools.items():
            started, orphans = pool.scale_to(decisions[role].replicas, now)
            for rep in started:
                self.push(now + pool.spec.startup_s, READY, rep)
            for req in orphans:
                self._route(pool, req, now)
            self.timeline.append(_row(role, samples[role], decisions[role], pool))
            pool.reset_period()
        self.push(now + period, TICK, None)
        return True


def profile_costs(front: Pool, back: Pool,
                  context_tokens: float) -> tuple[EngineCost, EngineCost, HandoffCost]:
    """What the router would measure on these pools, from their profiles: each pool's step cost
    (a line through its decode steps at 1 and 32 sequences of `context_tokens` each, and its
    prefill's marginal cost per token) and the handoff (the KV transfer)."""

    def engine(pool: Pool) -> EngineCost:
        cost, chunk = pool.cost, pool.spec.prefill_budget
        one = cost.decode_step_s(1, context_tokens)
        many = cost.decode_step_s(32, 32 * context_tokens)
        per_seq = max((many - one) / 31, 0.0)
        per_token = max((cost.prefill_s(2 * chunk) - cost.prefill_s(chunk)) / chunk, 0.0)
        return EngineCost(max(one - per_seq, 0.0), per_seq, per_token, chunk)

    c = front.cost
    per_token = (c.kv_transfer_s(1000) - c.kv_transfer_s(0)) / 1000
    handoff = HandoffCost(c.kv_transfer_s(0), per_token)
    return engine(front), engine(back), handoff


def _row(role: str, s, decision, pool: Pool) -> dict:
    return {"t": s.t, "pool": role, "ready": s.ready, "starting": s.starting,
            "desired": decision.replicas, "reason": decision.reason,
            "devices": pool.alloc * pool.cost.devices, "arrival_rate": round(s.arrival_rate, 3),
            "queue": s.queue_depth, "running": s.running, "kv_usage": round(s.kv_usage, 4),
            "ttft_p90_s": s.ttft_p90_s, "tpot_p90_s": s.tpot_p90_s}
