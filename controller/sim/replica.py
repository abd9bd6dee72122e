"""One simulated engine replica: a prefill queue and a continuously batched decode batch.

Decode uses a step clock instead of per-token events: every running sequence gains one token per
engine step, so the replica keeps `steps` (tokens each running sequence has gained since the
replica started) and advances it at 1 / step_time. A sequence that joins at step S_j with n
output tokens finishes at step S_j + n. Step time is recomputed from the cost model whenever the
batch changes (join, finish, prefill pause), so the simulation costs O(log batch) per request,
not per token. A colocated replica pauses its decode clock while it runs a prefill batch
(prefill first, as vLLM's scheduler without chunking and DistServe's colocated baseline do).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"


class Replica:
    """Mutable simulation state of one replica (simulator-internal, not an interface)."""

    __slots__ = (
        "batch",
        "ctx_base",
        "fin",
        "firsts",
        "id",
        "kv_used",
        "last_t",
        "n",
        "pool",
        "pq",
        "pq_tokens",
        "prefilling",
        "started_t",
        "state",
        "step_s",
        "steps",
        "tail_s",
        "version",
    )

    def __init__(self, rid: int, pool, started_t: float) -> None:
        self.id, self.pool, self.state, self.started_t = rid, pool, STARTING, started_t
        self.pq: deque[int] = deque()  # request ids waiting for prefill here
        self.pq_tokens = 0
        self.batch: list[int] = []  # the prefill batch running now
        self.prefilling = False  # a colocated replica's decode is paused meanwhile
        self.tail_s = 0.0  # PP: the running batch's latency beyond its first stage
        self.steps = 0.0
        self.last_t = started_t
        self.step_s = math.inf
        self.fin: list[tuple[float, int]] = []  # (finish step, request id) of running sequences
        self.n = 0  # running sequences
        self.ctx_base = 0.0  # sum(prompt_i - join_step_i); contexts sum to ctx_base + n x steps
        self.kv_used = 0  # KV tokens reserved (prompt + output of each running sequence)
        self.version = 0  # bumps whenever a scheduled decode event becomes stale
        self.firsts: deque[tuple[float, int]] = deque()  # (step of first token, request id)

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing running."""
        return not self.pq and not self.prefilling and self.n == 0

    def advance(self, now: float) -> None:
        """Move the step clock to `now` at the current step time (paused while prefilling),
        stamping the exact time of every first token passed on the way."""
        if self.n and not self.prefilling:
            steps = self.steps + (now - self.last_t) / self.step_s
            firsts = self.firsts
            while firsts and firsts[0][0] <= steps + 1e-9:
                s, req = firsts.popleft()
                self.pool.first_token(req, self.last_t + (s - self.steps) * self.step_s)
            self.steps = steps
        self.last_t = now

    def retime(self, cost) -> None:
        """Recompute the step time after the batch changed (call `advance` first)."""
        if self.n == 0:
            self.step_s = math.inf
        else:
            self.step_s = cost.decode_step_s(self.n, self.ctx_base + self.n * self.steps)

    def next_finish_t(self) -> float:
        """When the next running sequence finishes at the current pace (inf: none / paused)."""
        if not self.n or self.prefilling:
            return math.inf
        return self.last_t + max(0.0, self.fin[0][0] - self.steps) * self.step_s

    def join(self, req: int, prompt: int, output: int, reserved: bool = False) -> None:
        """Start decoding `req` at the current step. Without `reserved`, its KV arrived from
        elsewhere (a handoff): KV for its prompt and whole output is reserved now, and its
        first token comes after one step. With `reserved`, this replica prefilled it and
        reserved the KV then, and the prefill step sampled its first token (the caller stamps
        it): it joins as if one step old, with `output - 1` tokens to go."""
        start = self.steps - 1 if reserved else self.steps
        heapq.heappush(self.fin, (start + output, req))
        if not reserved:
            self.firsts.append((self.steps + 1, req))  # joins come in step order: sorted
            self.kv_used += prompt + output
        self.n += 1
        self.ctx_base += prompt - start

    def pop_finished(self, prompts: list[int], outputs: list[int]) -> list[int]:
        """Remove and return the sequences whose last token is out by the current step."""
        done, fin, limit = [], self.fin, self.steps + 1e-6
        while fin and fin[0][0] <= limit:
            fs, req = heapq.heappop(fin)
            p, o = prompts[req], outputs[req]
            self.n -= 1
            self.ctx_base -= p - (fs - o)
            self.kv_used -= p + o
            done.append(req)
        if self.n == 0:
            self.ctx_base = 0.0
        return done

    def take_prefill_batch(self, prompts: list[int], budget: int, outputs: list[int] | None = None,
                           kv_tokens: int = 0, max_seqs: int = 0,
                           cached: list[int] | None = None,
                           local: list[bool] | None = None) -> tuple[list[int], int, int]:
        """Pop queued prompts up to `budget` computed tokens (at least one): (batch, tokens
        computed, attention work in squared tokens). A prompt of p tokens whose first c are in
        the prefix cache (`cached`) computes n = p - c tokens over a context of p: work
        n^2 + 2nc (n^2 = p^2 without a cache hit). With `outputs`, the prompts that decode on
        this replica (all of them, or those flagged in `local`: a colocated replica, a decode
        replica prefilling locally, a prefill replica running an offloaded request) are taken
        only while their prompt + output KV and a sequence slot fit, and reserved now: the
        engine never prefills what it cannot then decode (the batch may be empty). The others
        (remote prefills) hand their KV on and reserve nothing here."""
        batch, tokens, sq, pq, seqs = [], 0, 0, self.pq, 0
        while pq:
            req = pq[0]
            p = prompts[req]
            c = cached[req] if cached is not None else 0
            n = p - c
            if batch and tokens + n > budget:
                break
            if outputs is not None and (local is None or local[req]):
                need = p + outputs[req]
                if self.kv_used + need > kv_tokens or self.n + seqs >= max_seqs:
                    break
                self.kv_used += need
                seqs += 1
            batch.append(pq.popleft())
            tokens += n
            sq += n * n + 2 * n * c
        self.pq_tokens -= tokens
        return batch, tokens, sq
