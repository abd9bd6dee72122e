"""Dispatch a prepared request to the worker pools and stream back its chunks.

Colocated: the decode pool runs the whole request. Disaggregated: when the rule
(`router/policy.py`, `decide`) says so, the prefill pool computes the prompt's KV cache first (`max_tokens=1`), and the decode
request carries the handoff so that its engine pulls the KV over NIXL instead of recomputing it.
A prefill that fails or returns no usable handoff is retried on another prefill replica within
a bounded number of tries and a deadline (`router/retry.py`), then falls back to a local prefill
on the decode worker: the client never sees the prefill pool's trouble, only a slower first
token. The decode request carries a fetch deadline: a handoff that waited longer than the prefill
engine keeps its blocks is recomputed on decode instead of pulled.

Decode first: before a remote prefill, the request reserves a decode replica with a slot and KV
room for it (`routing.reservations`, through the decode pool's request router in this process);
the decode request is pinned to that replica and the prefill told its identity. While no replica
has room the request waits, holding its decode gate slot, without prefilling; past the gate's
timeout it gets the gate's 503.

With tracing on, each stream is a `splitserve.dispatch` span with the policy decision, the prefill
hop (one child span per try), the gate waits and the decode hop under it (`router/tracing.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span
from splitserve.kv_transfer.handoff import KVHandoff, fetch_deadline, prefill_request_params
from splitserve.router.backlog import Backlog
from splitserve.router.calibration import Calibration
from splitserve.router.coalescing import stream_interval
from splitserve.router.errors import APIError, bad_request, server_error, unavailable
from splitserve.router.forward import engine_request
from splitserve.router.metrics import RouterMetrics
from splitserve.router.policy import (
    PoolLoad,
    Prediction,
    PrefillPath,
    Targets,
    choose,
    pool_views,
    predict,
)
from splitserve.router.retry import (
    classify,
    failed_replica,
    migrate_decode,
    rejection,
    retry_prefill,
)
from splitserve.router.routing.decode_room import reserved_output
from splitserve.router.routing.kv_feed import KVEventFeed, pool_feed
from splitserve.router.routing.reservations import (
    DecodeReservations,
    Reservation,
    pool_reservations,
)
from splitserve.router.signals import SignalRecorder
from splitserve.router.streams import StreamClient, relayed
from splitserve.router.tenancy import Tenancy, TenancyError, Tenant
from splitserve.router.tenancy.admission import TIMEOUT_RETRY_AFTER_S, Ticket
from splitserve.router.tenancy.errors import queue_timeout
from splitserve.router.tracing import (
    ATTEMPT,
    DECODE,
    DECODE_REPLICA,
    DISPATCH,
    ENGINE_TTFT,
    FALLBACK,
    FALLBACK_REASON,
    FIRST_TOKEN,
    MIGRATION,
    NOOP_TRACING,
    PREDICTED_TPOT,
    PREDICTED_TTFT,
    PREFILL,
    PREFILL_ATTEMPT,
    PREFILL_ATTEMPTS,
    PREFILL_PATH,
    PROMPT_TOKENS,
    REPLICA,
    REQUEST_ID,
    Tracing,
    decode_attributes,
    record_failure,
)

from splitserve.config import DisaggregationConfig, StreamingConfig
from splitserve.engine.messages import GenerateChunk, GenerateRequest, PromptBlocks, ReplicaPin

log = logging.getLogger("splitserve.router")

# The output length the rule assumes for a request without `max_tokens` before any stream ended.
DEFAULT_OUTPUT = 256
# A decode replica's room also changes without this process hearing of it (other routers'
# streams end; Serve refreshes queue lengths and routing stats on its own schedule): a request
# waiting for room looks again this often, besides at once when a reservation here is released.
ROOM_RECHECK_S = 0.5


def pool_feeds(pools: dict[str, Any]) -> dict[str, KVEventFeed]:
    """The KV-event feed of each pool handle's deployment in this process (`routing.kv_feed`),
    shared with the pool's request router; none for a handle that names no deployment."""
    feeds = {}
    for pool, handle in pools.items():
        dep = getattr(handle, "deployment_id", None)
        if handle is not None and isinstance(getattr(dep, "name", None), str):
            feeds[pool] = pool_feed(dep.app_name, dep.name)
    return feeds


def decode_reservations(pools: dict[str, Any]) -> DecodeReservations | None:
    """The decode pool's reservations in this process (`routing.reservations`), shared with
    its request router; None when the decode handle names no deployment."""
    dep = getattr(pools.get("decode"), "deployment_id", None)
    if isinstance(getattr(dep, "name", None), str):
        return pool_reservations(dep.app_name, dep.name)
    return None


@dataclasses.dataclass(frozen=True)
class Handoff:
    """What `Dispatcher.handoff` did for a directly streamed request."""

    request: GenerateRequest  # as the decode replica runs it (its KV handoff, its pin)
    reservation: Reservation | None = None  # the decode replica's, until the request is routed
    pulled: int | None = None  # prompt tokens decode pulls (None: the decode engine prefills)


class Dispatcher:
    """Sends requests to pool handles; translates worker failures into `APIError`s.

    `ttft_slo_s`, `tpot_slo_s`: the deployment's targets, which the disaggregation rule keeps
    (`router/policy.py`; None: no target).
    """

    def __init__(
        self,
        pools: dict[str, Any],
        disagg: DisaggregationConfig,
        metrics: RouterMetrics,
        tenancy: Tenancy,
        signals: SignalRecorder | None = None,
        replicas: dict[str, int] | None = None,
        decode_migrations: int = 1,
        tracing: Tracing = NOOP_TRACING,
        streaming: StreamingConfig | None = None,
        tpot_slo_s: float | None = None,
        ttft_slo_s: float | None = None,
    ) -> None:
        self.pools = pools
        self.streaming = streaming or StreamingConfig()
        self.tracing = tracing
        self.disagg = disagg
        self.metrics = metrics
        self.tenancy = tenancy
        self.signals = signals or SignalRecorder(pools)
        self.decode_migrations = decode_migrations
        self.replicas = dict(replicas or {})  # ready replicas per pool (the controller updates it)
        # This replica's work in flight, for the rule: the prompt tokens each pool has still to
        # prefill for it (a remote prefill until its handoff or fallback, a prompt a pool
        # prefills itself until its first token), and the requests each pool runs for it (from
        # the hop to that pool to their end; not while a remote prefill holds a decode slot).
        self._remote_requests = 0
        self._backlog = {"prefill": Backlog(), "decode": Backlog()}
        self._streams = {"prefill": 0, "decode": 0}
        self.clock = time.monotonic
        self.targets = Targets(ttft_s=ttft_slo_s, tpot_s=tpot_slo_s)
        self.calibration = Calibration()
        # What each pool's engines hold, from their KV events: a prompt's expected cached
        # tokens per pool (the best-placed replica's), read by the rule.
        self.feeds = pool_feeds(pools)
        # Decode first: the decode replica reserved before a remote prefill (None: none to ask).
        self.reservations = decode_reservations(pools)
        # Responses the engine replicas stream over HTTP (`streaming.transport: http`)
        self.stream_client = StreamClient()

    def load(self) -> PoolLoad:
        """The pools as this router replica sees them now."""
        now = self.clock()
        return PoolLoad(
            prefill_requests=self._remote_requests,
            prefill_tokens=self._pending("prefill", now),
            prefill_replicas=self.replicas.get("prefill", 1),
            local_prefill_tokens=self._pending("decode", now),
            decode_streams=self._streams["decode"],
            decode_replicas=self.replicas.get("decode", 1),
            prefill_streams=self._streams["prefill"],
        )

    def _pending(self, pool: str, now: float) -> int:
        """`pool`'s backlog in the step model's tokens: what is left of it, scaled by how much
        slower (or faster) the pool answers than its step model says, so that the rule's
        prefill time for it is the time the pool takes."""
        backlog, model = self._backlog[pool], self._rate(pool)
        left, served = backlog.tokens(now, model), backlog.served_rate()
        return left if served is None or model <= 0 else round(left * model / served)

    def _rate(self, pool: str) -> float:
        """`pool`'s prefill tokens/s over its replicas beside this router's streams there, by
        its engines' step model (0 before they reported one)."""
        cost = self.calibration.engine_cost(pool, "decode" if pool == "prefill" else "prefill")
        if cost is None:
            return 0.0
        replicas = max(self.replicas.get(pool, 1), 1)
        return cost.prefill_rate(round(self._streams[pool] / replicas)) * replicas

    def _sent(self, pool: str, key: object, tokens: int) -> None:
        """A prompt of `tokens` went to `pool` to be prefilled there."""
        self._backlog[pool].add(key, tokens, self.clock(), self._rate(pool))

    def _answered(self, pool: str, key: object) -> None:
        """`pool` answered the prompt `key` (its first token, or its handoff)."""
        self._backlog[pool].answered(key, self.clock(), self._rate(pool),
                                     self.calibration.hop_s)

    def _dropped(self, pool: str, key: object) -> None:
        """The prompt `key` left `pool` without an answer (failed, cancelled, or answered)."""
        self._backlog[pool].remove(key, self.clock(), self._rate(pool))

    def _blocks(self, req: GenerateRequest) -> PromptBlocks | None:
        """The prompt's block hashes as the engines compute them, once per request (the pools'
        request routers read them from the request); None before any engine advertised its
        KV events. The pools share one block size (a deploy-time P/D check)."""
        for feed in self.feeds.values():
            if feed.hasher is not None:
                lora = (req.lora.name, req.lora.path) if req.lora is not None else None
                return PromptBlocks(feed.hasher.block_size, feed.prompt_hashes(
                    req.prompt_token_ids, req.cache_salt, lora))
        return None

    def cached_tokens(self, pool: str, blocks: PromptBlocks | None) -> int:
        """The prompt tokens `pool` is expected to hold: its best-placed replica's cached
        prefix, as the engines' KV events say (0 when unknown)."""
        feed = self.feeds.get(pool)
        if blocks is None or feed is None or feed.hasher is None \
                or feed.hasher.block_size != blocks.block_size:
            return 0
        return feed.cached_tokens(blocks.hashes)

    def _path(self, req: GenerateRequest, load: PoolLoad,
              blocks: PromptBlocks | None) -> tuple[PrefillPath, Prediction | None]:
        """The request's path, and the rule's prediction when the rule chose it."""
        if self.pools.get("prefill") is None:  # colocated
            return PrefillPath.COLOCATED, None
        if not req.disaggregable:
            return PrefillPath.MULTI_SEQUENCE, None
        n_prompt = len(req.prompt_token_ids)
        if self.disagg.prefill == "local" or n_prompt < self.disagg.min_remote_prompt_tokens:
            return PrefillPath.LOCAL, None
        if self.disagg.prefill == "remote":
            return PrefillPath.REMOTE, None
        costs = (self.calibration.engine_cost("prefill", "decode"),
                 self.calibration.engine_cost("decode", "prefill"))
        handoff = self.calibration.handoff_cost()
        if costs[0] is None or costs[1] is None or handoff is None:
            return PrefillPath.REMOTE, None  # not measured yet: take (and so measure) remote
        cached = {pool: self.cached_tokens(pool, blocks) for pool in ("prefill", "decode")}
        views = pool_views(load, costs[0], costs[1], cached)
        output = req.sampling.max_tokens or self.calibration.stream_tokens or DEFAULT_OUTPUT
        predictions = predict(n_prompt, views["prefill"], views["decode"], handoff,
                              hop_s=self.calibration.hop_s, output_tokens=output,
                              stream_tokens=self.calibration.stream_tokens)
        choice = choose(predictions, self.targets)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s (%d prompt tokens, %d out): %s; %s; load %s; cached %s; "
                      "hop %.1f ms; handoff %.1f + %.3f ms/token; steps %s",
                      req.request_id, n_prompt, output, choice.path.value, "; ".join(
                          f"{p.path.value} TTFT {1e3 * p.ttft_s:.1f} gap {1e3 * p.gap_s:.1f} "
                          f"TPOT {1e3 * p.tpot_s:.1f} ms" for p in predictions),
                      load, cached, 1e3 * self.calibration.hop_s, 1e3 * handoff.fixed_s,
                      1e3 * handoff.per_token_s, costs)
        return choice.path, choice

    def chunk_tokens(self, streams: int, replicas: int) -> int:
        """Tokens per streamed chunk for a request that makes a pool's streams `streams` (itself
        included) over its `replicas` replicas (adaptive coalescing, `router/coalescing.py`),
        counted in the router's metrics. The relay path and direct streaming both ask here."""
        interval = stream_interval(streams / max(replicas, 1), self.streaming)
        self.metrics.stream_intervals.labels(tokens_per_chunk=str(interval)).inc()
        return interval

    def _coalesced(self, req: GenerateRequest, pool: str, load: PoolLoad) -> GenerateRequest:
        """`req` with the tokens per streamed chunk that `pool`'s load calls for (counted)."""
        if pool == "prefill":
            streams, replicas = load.prefill_streams, load.prefill_replicas
        else:
            streams, replicas = load.decode_streams, load.decode_replicas
        interval = self.chunk_tokens(streams + 1, replicas)
        return req if interval == req.stream_interval else dataclasses.replace(
            req, stream_interval=interval
        )

    async def stream(
        self, req: GenerateRequest, tenant: Tenant, trace_context: Context | None = None
    ) -> AsyncIterator[GenerateChunk]:
        """The request's chunks, in order. Closing the iterator cancels the worker request.

        Each pool hop first takes a slot of that pool's fair admission gate (per-tenant queues,
        weighted fair order); a full decode queue is the client's 429/503. `trace_context`: the
        request's span context (tracing on; None: the ambient one), parent of the dispatch span.
        """
        load = self.load()  # one view of the pools for both decisions
        req, path, predicted, span = self._decide(req, load, trace_context)
        n_prompt = len(req.prompt_token_ids)
        blocks = req.prompt_blocks
        req = self._coalesced(req, path.pool, load)
        parent = self.tracing.context_of(span)
        start = time.perf_counter()
        try:
            # The generating pool's slot first: a request that decode cannot take is not
            # prefilled (its gate answers 429/503 before any prefill starts).
            async with self.tracing.admit(self.tenancy, path.pool, tenant, n_prompt,
                                          parent) as ticket:
                admitted = time.perf_counter()
                handed_at, held = None, None
                try:
                    if path.remote:
                        held = await self._reserve_decode(req, span)
                        if held is not None:  # decode first: the prefill knows where it goes
                            req = dataclasses.replace(
                                req, pin_replica=ReplicaPin(held.replica_id, held.key))
                        req, handed_at = await self._remote_prefill(req, tenant, parent, span)
                    # prompt tokens decode lacks, as the handoff moves them
                    pulled = max(n_prompt - (held.cached_tokens if held is not None
                                             else self.cached_tokens("decode", blocks)), 0)
                    async with aclosing(self._generate(path.pool, req, ticket,
                                                       parent)) as chunks:
                        first = True
                        async for chunk in chunks:
                            if held is not None and chunk.replica:
                                self._landed(held, chunk.replica)
                                held = None
                            if first and chunk.token_ids:
                                first = False
                                self._first_token(path, predicted, start, handed_at, pulled,
                                                  req.request_id, admitted)
                            yield chunk
                finally:
                    if held is not None and self.reservations is not None:
                        self.reservations.release(held.key)
        except BaseException as err:
            record_failure(span, err)
            raise
        finally:
            if self.reservations is not None:
                self.reservations.notify()  # a request waiting for decode room looks again
            span.end()

    def _decide(
        self, req: GenerateRequest, load: PoolLoad, trace_context: Context | None
    ) -> tuple[GenerateRequest, PrefillPath, Prediction | None, Span]:
        """The request's prefill path (counted) and its dispatch span, started; `req` with its
        prompt's block hashes."""
        blocks = self._blocks(req)
        if blocks is not None:
            req = dataclasses.replace(req, prompt_blocks=blocks)
        path, predicted = self._path(req, load, blocks)
        self.metrics.disagg_decisions.labels(path="remote" if path.remote else "local").inc()
        if path is not PrefillPath.COLOCATED:
            self.metrics.disagg_reasons.labels(reason=path.value).inc()
        span = self.tracing.start(DISPATCH, trace_context)
        if span.is_recording():
            span.set_attributes({PREFILL_PATH: path.value,
                                 PROMPT_TOKENS: len(req.prompt_token_ids)})
            if predicted is not None:
                span.set_attributes({PREDICTED_TTFT: predicted.ttft_s,
                                     PREDICTED_TPOT: predicted.tpot_s})
        return req, path, predicted, span

    async def handoff(
        self, req: GenerateRequest, tenant: Tenant, trace_context: Context | None = None
    ) -> Handoff:
        """Direct streaming's dispatch (`router/direct.py`), run before the decode replica is
        picked, for a request already admitted to the decode pool: the prefill path as `stream`
        decides it and, for a remote prefill, the decode replica's reservation (decode first)
        and the prefill hop with its retries and fallback. The returned request is what the
        decode replica runs: with its KV handoff (`kv_transfer_params`) and pinned to the
        reserved replica, or unchanged when the decode engine prefills itself. The caller
        releases the reservation once the replica is picked (`release`). The decode replica
        then streams to the client; no token comes back here."""
        req, path, _, span = self._decide(req, self.load(), trace_context)
        held = None
        try:
            if not path.remote:
                return Handoff(req)
            held = await self._reserve_decode(req, span)
            if held is not None:
                req = dataclasses.replace(req, pin_replica=ReplicaPin(held.replica_id, held.key))
            req, handed_at = await self._remote_prefill(
                req, tenant, self.tracing.context_of(span), span)
            if handed_at is None:  # fallback: the decode engine prefills
                return Handoff(req, held)
            cached = (held.cached_tokens if held is not None
                      else self.cached_tokens("decode", req.prompt_blocks))
            return Handoff(req, held, max(len(req.prompt_token_ids) - cached, 0))
        except BaseException as err:
            self.release(held)
            record_failure(span, err)
            raise
        finally:
            span.end()

    def release(self, held: Reservation | None) -> None:
        """Release a decode reservation `handoff` returned (its request is routed)."""
        if held is not None and self.reservations is not None:
            self.reservations.release(held.key)
            self.reservations.notify()  # a request waiting for decode room looks again

    def handoff_landed(self, pulled: int, first_token_s: float) -> None:
        """A remote decode's first token came `first_token_s` after its handoff returned: the
        handoff's latency for `pulled` prompt tokens, less the decode step that made the token
        (the rule's calibration)."""
        decode = self.calibration.engine_cost("decode", "prefill")
        load = self.load()
        step = 0.0 if decode is None else decode.step(
            round(load.decode_streams / max(load.decode_replicas, 1)),
            round(load.local_prefill_tokens / max(load.decode_replicas, 1)))
        self.calibration.handoff_measured(pulled, first_token_s - step)

    async def _reserve_decode(self, req: GenerateRequest, span: Span) -> Reservation | None:
        """Decode first: reserve the decode replica with a slot and KV room for `req` (the
        best-ranked by the pool's policy), before any prefill. While none has room, wait (the
        decode gate slot stays held) up to the gate's timeout, then raise its 503. None when
        there is nothing to ask (no request router up yet, no replicas): Serve routes as before.
        """
        slots = self.reservations
        if slots is None:
            return None
        gate = self.tenancy.gates["decode"]
        deadline = time.monotonic() + gate.timeout_s
        output = reserved_output(req.sampling.max_tokens, self.calibration.stream_tokens)
        waited = False
        while True:
            view = await slots.view(req)
            if view is None:
                return None
            held = slots.reserve(req, view, output)
            if held is not None:
                span.set_attribute(DECODE_REPLICA, held.replica_id)
                return held
            if not waited:
                waited = True
                self.metrics.decode_room_waits.inc()
            left = deadline - time.monotonic()
            if left <= 0:
                raise queue_timeout("decode", gate.timeout_s, TIMEOUT_RETRY_AFTER_S)
            await slots.changed(min(left, ROOM_RECHECK_S))

    def _landed(self, held: Reservation, replica: str) -> None:
        """The pinned decode request runs on `replica` (the engine host's "deployment#id"):
        release its reservation (if routing has not) and count a pin that was not kept."""
        if replica.rsplit("#", 1)[-1] != held.replica_id:
            self.metrics.decode_pin_misses.inc()
        if self.reservations is not None:
            self.reservations.release(held.key)

    async def _remote_prefill(
        self, req: GenerateRequest, tenant: Tenant, parent: Context | None, span: Span
    ) -> tuple[GenerateRequest, float | None]:
        """The prefill hop: `req` with its handoff and the time the handoff came back, or `req`
        unchanged and None when the decode worker prefills instead (fallback)."""
        key = object()
        self._remote_requests += 1
        self._sent("prefill", key, len(req.prompt_token_ids))
        try:
            handoff = await self._admitted_prefill(req, tenant, parent)
            if handoff is not None:
                self._answered("prefill", key)
        finally:
            self._remote_requests -= 1
            self._dropped("prefill", key)
        span.set_attribute(FALLBACK, handoff is None)
        if handoff is None:
            return req, None
        fetch_by = fetch_deadline(time.time(), self.disagg.kv_lease_s)
        req = dataclasses.replace(req, kv_transfer_params=handoff.decode_request_params(fetch_by))
        return req, time.perf_counter()

    def _first_token(self, path: PrefillPath, predicted: Prediction | None, start: float,
                     handed_at: float | None, pulled: int, request_id: str,
                     admitted: float) -> None:
        """Measure what the first token shows: the handoff's latency (remote), and how far the
        rule's prediction was from the TTFT it got (at DEBUG, logged with the admission
        gate's part of it)."""
        now = time.perf_counter()
        if predicted is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("request %s: %s, first token after %.1f ms (%.1f at the admission gate), "
                      "predicted %.1f ms", request_id, path.value, 1e3 * (now - start),
                      1e3 * (admitted - start), 1e3 * predicted.ttft_s)
        if handed_at is not None:
            # the handoff is what came before decode's step that made the token
            self.handoff_landed(pulled, now - handed_at)
        if predicted is not None and predicted.ttft_s > 0:
            self.metrics.ttft_prediction.labels(path=path.value).observe(
                (now - start) / predicted.ttft_s)

    async def _generate(
        self, pool: str, req: GenerateRequest, ticket: Ticket, parent: Context | None
    ) -> AsyncIterator[GenerateChunk]:
        """`req`'s chunks, generated on `pool` under its admission `ticket`, from its prompt or
        from its KV handoff. Closing the iterator cancels the worker request."""
        n_prompt = len(req.prompt_token_ids)
        # The request is one of the pool's streams while it is there; a prompt the pool
        # prefills itself is also its backlog until the first token.
        key = object()
        self._streams[pool] += 1
        if req.kv_transfer_params is None:
            self._sent(pool, key, n_prompt)
        start = time.perf_counter()
        self.signals.arrival(pool, n_prompt, req.sampling.max_tokens or 0)
        first, n_out = None, 0
        try:
            async with aclosing(self._migrating(pool, req, parent, start)) as chunks:
                async for chunk in chunks:
                    ticket.add_output(len(chunk.token_ids))
                    if chunk.token_ids and first is None:
                        first = time.perf_counter()
                        self.signals.first_token(pool, first - start)
                        self._answered(pool, key)
                    n_out += len(chunk.token_ids)
                    if chunk.engine_cost is not None:
                        self.calibration.engine_reported(pool, chunk.engine_cost)
                    yield chunk
            if first is not None:
                self.signals.finished(pool, time.perf_counter() - first, n_out)
                self.calibration.output_measured(n_out)
        finally:
            self._dropped(pool, key)
            self._streams[pool] -= 1

    async def _migrating(
        self, pool: str, req: GenerateRequest, parent: Context | None, start: float
    ) -> AsyncIterator[GenerateChunk]:
        """`req`'s chunks from `pool`. When the replica fails before any of its response went
        out, the whole request goes to a decode replica (`router.decode_migrations` times at
        most, avoiding the replicas that failed). Once some of it went out, the failure ends
        the response: vLLM's server held its state (grammar, seed, stop strings, the text so
        far), so a continuation elsewhere could not be exact, and the client gets an error
        event rather than a stream that looks whole but is not."""
        attempt = req
        migrations, replica, relayed = 0, "", False
        while True:
            hop = self.tracing.start(DECODE, parent)
            if migrations and hop.is_recording():
                hop.set_attribute(MIGRATION, migrations)
            try:
                async with aclosing(self._hop(pool, attempt, hop, start)) as chunks:
                    async for chunk in chunks:
                        replica = chunk.replica or replica
                        relayed = relayed or bool(chunk.data or chunk.token_ids)
                        yield chunk
                return
            except APIError:
                raise
            except Exception as err:  # worker crashed, engine error, replica gone
                kind = classify(err)
                if relayed or not migrate_decode(kind=kind, migrations=migrations,
                                                 max_migrations=self.decode_migrations):
                    raise _worker_error(req.request_id, err) from err
                migrations += 1
                failed = failed_replica(err) or replica
                self.metrics.decode_migrations.labels(reason=kind).inc()
                log.warning("generation of %s on %s failed before its response began (%s: %s); "
                            "sending it whole to a decode replica", req.request_id, pool, kind, err)
                pool = "decode"  # it prefills its prompt there, like a colocated run
                attempt = dataclasses.replace(
                    req, request_id=f"{req.request_id}-m{migrations}", kv_transfer_params=None,
                    pin_replica=None,
                    avoid_replicas=attempt.avoid_replicas + ((failed,) if failed else ()),
                )

    async def _hop(
        self, pool: str, req: GenerateRequest, hop: Span, start: float
    ) -> AsyncIterator[GenerateChunk]:
        """One worker call on `pool`: its chunks, traced as the `hop` span (ended here).
        Closing the iterator before the response's end cancels the worker request."""
        n_out, kv_bytes, last, first, first_ns, engine_ttft = 0, 0, None, None, None, None
        sent = time.perf_counter()
        call = engine_request(req)
        if self.streaming.transport == "http":
            call = dataclasses.replace(call, http_stream=True)
        gen = self.pools[pool].options(stream=True).generate.remote(call)
        try:
            async for chunk in relayed(gen, self.stream_client):
                if chunk.kv_bytes:
                    kv_bytes += chunk.kv_bytes
                    self.metrics.kv_transfer_bytes.observe(chunk.kv_bytes)
                if chunk.kv_transfer_s is not None:
                    self.metrics.kv_transfer_duration.observe(chunk.kv_transfer_s)
                if chunk.kv_recomputed is not None:
                    self.metrics.kv_recomputes.labels(reason=chunk.kv_recomputed).inc()
                if chunk.token_ids and first is None:
                    first, first_ns = time.perf_counter(), time.time_ns()
                    hop.add_event(FIRST_TOKEN, timestamp=first_ns)
                if chunk.engine_ttft_s is not None:
                    engine_ttft = chunk.engine_ttft_s
                    self.metrics.engine_ttft.labels(pool=pool, hop="generate").observe(engine_ttft)
                    if first is not None:  # what the hop adds to the engine's own TTFT
                        self.calibration.hop_measured(first - sent - engine_ttft)
                n_out += len(chunk.token_ids)
                last = chunk
                yield chunk
        except BaseException as err:  # failed, cancelled, or the stream closed early
            record_failure(hop, err)
            raise
        finally:
            if last is None or last.finish_reason is None:  # ended early: free the engine's
                gen.cancel()
            if hop.is_recording():
                hop.set_attributes(decode_attributes(
                    last, kv_bytes=kv_bytes, output_tokens=n_out,
                    remote=req.kv_transfer_params is not None,
                    ttft_s=None if first is None else first - start, engine_ttft_s=engine_ttft,
                ))
                self.tracing.kv_transfer(hop, last, req.kv_transfer_params, end_ns=first_ns)
            hop.end()

    async def _admitted_prefill(
        self, req: GenerateRequest, tenant: Tenant, parent: Context | None = None
    ) -> KVHandoff | None:
        """The prefill hop behind the prefill gate; a full prefill queue means "prefill locally"."""
        start = time.perf_counter()
        # The output tokens it will need in decode count here too: decode scales on them
        # before the request reaches it (controller/control.py, with_upstream_demand).
        self.signals.arrival("prefill", len(req.prompt_token_ids), req.sampling.max_tokens or 0)
        hop = self.tracing.start(PREFILL, parent)
        try:
            async with self.tracing.admit(
                self.tenancy, "prefill", tenant, len(req.prompt_token_ids),
                self.tracing.context_of(hop),
            ):
                handoff = await self._prefill(req, hop)
            if handoff is not None:
                self.signals.first_token("prefill", time.perf_counter() - start)
            return handoff
        except TenancyError as err:
            self.metrics.prefill_fallbacks.inc()
            if hop.is_recording():
                hop.set_attributes({FALLBACK: True, FALLBACK_REASON: err.reason})
            return None
        except BaseException as err:
            record_failure(hop, err)
            raise
        finally:
            hop.end()

    async def _prefill(self, req: GenerateRequest, hop: Span = INVALID_SPAN) -> KVHandoff | None:
        """The prefill step, retried on other replicas within the attempt and time budget.

        None means "prefill locally instead"; every failure, retry and fallback is counted.
        `hop`: the prefill span (tracing on), parent of one span per try.
        """
        deadline = time.monotonic() + self.disagg.prefill_timeout_s
        avoid: tuple[str, ...] = ()
        parent = self.tracing.context_of(hop)
        for attempt in range(1, self.disagg.prefill_attempts + 1):
            hop.set_attribute(PREFILL_ATTEMPTS, attempt)
            span = self.tracing.start(PREFILL_ATTEMPT, parent)
            span.set_attribute(ATTEMPT, attempt)
            try:
                return await asyncio.wait_for(
                    self._prefill_once(req, attempt, avoid, span), deadline - time.monotonic()
                )
            except Exception as err:  # noqa: BLE001 - any prefill failure is retried or local
                kind = classify(err)
                record_failure(span, err, kind=kind)
                self.metrics.prefill_failures.labels(reason=kind).inc()
                rejected = rejection(err) if kind == "rejected" else None
                if rejected is not None and rejected.body:  # vLLM's server refused it: so
                    raise _worker_error(req.request_id, err) from None  # would decode's
                log.warning("prefill of %s failed (try %d, %s): %s",
                            req.request_id, attempt, kind, err)
                replica = failed_replica(err)
                if replica:
                    span.set_attribute(REPLICA, replica)
                    if replica not in avoid:
                        avoid += (replica,)
                left = deadline - time.monotonic()
                if not retry_prefill(kind=kind, attempt=attempt,
                                     attempts=self.disagg.prefill_attempts, time_left_s=left):
                    break
                self.metrics.prefill_retries.inc()
            except BaseException as err:  # cancelled: the client is gone
                record_failure(span, err)
                raise
            finally:
                span.end()
        self.metrics.prefill_fallbacks.inc()
        if hop.is_recording():
            hop.set_attributes({FALLBACK: True, FALLBACK_REASON: "prefill_failed"})
        return None

    async def _prefill_once(
        self, req: GenerateRequest, attempt: int, avoid: tuple[str, ...],
        span: Span = INVALID_SPAN,
    ) -> KVHandoff:
        """One prefill try (`max_tokens=1`, keep the blocks); raises when it gives no handoff."""
        suffix = "" if attempt == 1 else f"-{attempt}"
        prefill_req = dataclasses.replace(
            req,
            request_id=f"{req.request_id}-prefill{suffix}",
            kv_transfer_params=prefill_request_params(),
            avoid_replicas=avoid,
            pin_replica=None,  # the pin names a decode replica; the prefill carries it as such
            decode_replica=req.pin_replica.replica_id if req.pin_replica is not None else None,
        )
        span.set_attribute(REQUEST_ID, prefill_req.request_id)
        if prefill_req.decode_replica is not None:
            span.set_attribute(DECODE_REPLICA, prefill_req.decode_replica)
        params = None
        gen = self.pools["prefill"].options(stream=True).generate.remote(
            engine_request(prefill_req))
        try:
            async for chunk in gen:
                params = chunk.kv_transfer_params or params
                self.calibration.engine_reported("prefill", chunk.engine_cost)
                if chunk.engine_ttft_s is not None:
                    self.metrics.engine_ttft.labels(pool="prefill", hop="prefill").observe(
                        chunk.engine_ttft_s)
                    span.set_attribute(ENGINE_TTFT, chunk.engine_ttft_s)
                if chunk.replica:
                    span.set_attribute(REPLICA, chunk.replica)
        except BaseException:
            gen.cancel()  # timed out or cancelled: the prefill engine aborts and frees its blocks
            raise
        return KVHandoff.from_params(params)


def _worker_error(request_id: str, err: Exception) -> APIError:
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    if isinstance(err, (BackPressureError, DeploymentUnavailableError)):
        return unavailable(f"No worker can take the request now ({type(err).__name__}).")
    rejected = rejection(err)
    if rejected is not None and rejected.body:  # vLLM's server's own answer, as it wrote it
        return APIError(rejected.status, rejected.message, param=rejected.param,
                        raw=rejected.body)
    if rejected is not None:
        return bad_request(f"The engine rejected the request: {rejected.message}",
                           param=rejected.param)
    log.exception("request %s failed in a worker", request_id)
    return server_error()
