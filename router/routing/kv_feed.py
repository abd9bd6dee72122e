"""One pool's KV-event subscriptions in a router process, and the index they feed.

Each engine replica publishes vLLM's KV events on a ZMQ PUB socket and advertises where in its
routing stats (`EventSource`, from `EngineHost.record_routing_stats`). A `KVEventFeed` per pool
per process (`pool_feed`) holds the pool's `KVIndex`; the pool's request router
(`replica_router.PolicyRequestRouter`) tells it the current replicas on every routing decision
(`sync`), and the dispatcher (`router/dispatch.py`) reads the same index for the disaggregation
rule's expected cached tokens. A daemon thread owns the sockets: it subscribes to each
replica's endpoint, replays each new replica's history from its publisher's replay endpoint,
applies the batches in order (`kv_order.Sequencer`), and forgets a replica that is gone.

Thread safety: the index is read and written under one lock; `sync`, `matched_blocks` and
`cached_tokens` never block on the network.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitserve.router.routing.kv_index import KVIndex
from splitserve.router.routing.kv_order import Sequencer, Step
from splitserve.router.routing.per_pool import PerPool
from splitserve.router.routing.vllm_hash import PromptHasher

log = logging.getLogger("splitserve.router")

# How long the feed's thread waits for its sockets before it looks at the wanted replicas again.
POLL_MS = 100
# A replay is answered by the publisher's own thread at its next poll (every 0.1 s in vLLM); past
# this the engine is taken as gone or stuck, and the live stream is taken from where it is.
REPLAY_TIMEOUT_S = 5.0
# Live batches handled per socket per turn, so one busy engine does not starve the others.
BATCHES_PER_TURN = 64
END_SEQ = -1  # vLLM's end-of-replay marker (ZmqEventPublisher.END_SEQ)


@dataclass(frozen=True)
class EventSource:
    """Where a replica publishes its KV events and how its blocks are hashed."""

    endpoint: str  # ZMQ PUB address, e.g. tcp://10.0.0.5:41234
    replay_endpoint: str | None  # ZMQ ROUTER address of the publisher's replay buffer
    block_size: int  # the engine's KV block size in tokens
    hash_algo: str = "sha256"  # the engine's prefix_caching_hash_algo

    def to_stats(self) -> dict[str, Any]:
        """The form `record_routing_stats` carries (plain values)."""
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "block_size": self.block_size, "hash_algo": self.hash_algo}

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any] | None) -> EventSource | None:
        """A replica's source from its routing stats; None when it publishes none."""
        d = (stats or {}).get("kv_events")
        if not d or not d.get("endpoint"):
            return None
        return cls(str(d["endpoint"]), d.get("replay_endpoint"), int(d["block_size"]),
                   str(d.get("hash_algo", "sha256")))


class KVEventFeed:
    """A pool's KV-event index in this process, kept current by a subscriber thread."""

    def __init__(self, name: str, index: KVIndex | None = None) -> None:
        self.name = name
        self.index = index if index is not None else KVIndex()
        self.hasher: PromptHasher | None = None
        self._lock = threading.Lock()
        self._wanted: dict[str, EventSource] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---- the routers' side (any thread) ---------------------------------------------------

    def sync(self, sources: Mapping[str, EventSource]) -> None:
        """The pool's replicas now, id -> where it publishes. Cheap when nothing changed; the
        thread subscribes to new replicas and forgets those that are gone."""
        if sources and (self._thread is None or not self._thread.is_alive()):
            self._start()
        if sources == self._wanted:
            return
        self._wanted = dict(sources)
        first = next(iter(sources.values()), None)
        if first is not None and (self.hasher is None or (self.hasher.block_size,
                                  self.hasher.algo) != (first.block_size, first.hash_algo)):
            try:
                self.hasher = PromptHasher(first.block_size, first.hash_algo)
            except ValueError as err:
                log.warning("KV-event routing of %s is off: %s", self.name, err)

    def _start(self) -> None:
        """(Re)start the subscriber thread: a thread that died (logged) starts over with fresh
        subscriptions and replays, so the index is rebuilt."""
        if self._closed:
            return
        with self._lock:
            for rid in self.index.replicas():
                self.index.forget_replica(rid)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kv-events-{self.name}")
        self._thread.start()

    def prompt_hashes(self, token_ids: Sequence[int], cache_salt: str | None,
                      lora: tuple[str, str] | None = None) -> tuple[int, ...]:
        """The prompt's block hashes as this pool's engines compute them (() before any
        replica advertised its events)."""
        hasher = self.hasher
        return () if hasher is None else hasher.hashes(token_ids, cache_salt, lora)

    def matched_blocks(self, block_hashes: Sequence[int], replica_ids: Collection[str],
                       media: Collection[str] | None = None) -> dict[str, int]:
        """`KVIndex.matched_blocks` under the feed's lock."""
        with self._lock:
            return self.index.matched_blocks(block_hashes, replica_ids, media)

    def cached_tokens(self, block_hashes: Sequence[int]) -> int:
        """The prompt tokens the pool's best-placed replica holds: its leading blocks times the
        block size (the pool's router sends a prompt to its longest cached prefix unless that
        replica is overloaded, so this is what the prompt can expect to find cached there)."""
        hasher = self.hasher
        if hasher is None or not block_hashes:
            return 0
        with self._lock:
            held = self.index.matched_blocks(block_hashes, self.index.replicas())
        return max(held.values(), default=0) * hasher.block_size

    def resize(self, max_blocks: int) -> None:
        """`KVIndex.resize` under the feed's lock."""
        with self._lock:
            self.index.resize(max_blocks)

    def close(self) -> None:
        """Stop the thread (it closes its sockets within one poll)."""
        self._closed = True

    # ---- the subscriber thread ------------------------------------------------------------

    def _run(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        ctx = zmq.Context()
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        poller = zmq.Poller()
        subs: dict[str, _Subscription] = {}
        try:
            while not self._closed:
                self._follow(ctx, poller, subs, decoder)
                ready = dict(poller.poll(POLL_MS))
                for rid, sub in list(subs.items()):
                    if sub.sock in ready:
                        self._drain(ctx, rid, sub, decoder)
        except Exception:
            log.exception("KV-event feed of %s stopped", self.name)
        finally:
            for sub in subs.values():
                sub.sock.close(linger=0)
            ctx.term()

    def _follow(self, ctx: Any, poller: Any, subs: dict[str, _Subscription], decoder: Any) -> None:
        """Open subscriptions for new replicas (with a replay of their history), close and
        forget those no longer wanted."""
        import zmq

        wanted = self._wanted
        for rid in [r for r, s in subs.items() if wanted.get(r) != s.source]:
            sub = subs.pop(rid)
            poller.unregister(sub.sock)
            sub.sock.close(linger=0)
            with self._lock:
                self.index.forget_replica(rid)
        for rid, source in wanted.items():
            if rid in subs:
                continue
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(source.endpoint)
            poller.register(sock, zmq.POLLIN)
            subs[rid] = sub = _Subscription(sock, source, Sequencer())
            self._replay(ctx, rid, sub, decoder)

    def _drain(self, ctx: Any, rid: str, sub: _Subscription, decoder: Any) -> None:
        import zmq

        for _ in range(BATCHES_PER_TURN):
            try:
                _topic, seq_bytes, payload = sub.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            step = sub.seq.live(seq)
            if step is Step.REPLAY:
                self._replay(ctx, rid, sub, decoder)
                step = sub.seq.live(seq)
                if step is Step.REPLAY:
                    step = sub.seq.give_up_gap(seq)
            if step is Step.APPLY:
                self._apply(rid, decoder.decode(payload).events, reset=False)

    def _replay(self, ctx: Any, rid: str, sub: _Subscription, decoder: Any) -> bool:
        """Ask the replica's publisher for its batches from the first one missing; apply them.
        False when it did not answer in time (or has no replay endpoint)."""
        import zmq

        if not sub.source.replay_endpoint:
            return False
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.connect(sub.source.replay_endpoint)
            sock.send_multipart([b"", sub.seq.replay_from().to_bytes(8, "big")])
            while sock.poll(int(REPLAY_TIMEOUT_S * 1000)):
                frames = sock.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    sub.seq.replay_ended()
                    return True
                step = sub.seq.replayed(seq)
                if step is not Step.SKIP:
                    self._apply(rid, decoder.decode(frames[-1]).events,
                                reset=step is Step.RESET)
            log.warning("KV events of %s/%s: no replay answer from %s", self.name, rid,
                        sub.source.replay_endpoint)
            return False
        finally:
            sock.close(linger=0)

    def _apply(self, rid: str, events: list[Any], *, reset: bool) -> None:
        with self._lock:
            if reset:
                log.info("KV events of %s/%s: history lost, rebuilding", self.name, rid)
                self.index.forget_replica(rid)
            if rid in self._wanted:  # not one that went away meanwhile
                self.index.apply(rid, events)


@dataclass
class _Subscription:
    sock: Any
    source: EventSource
    seq: Sequencer


_FEEDS: PerPool[KVEventFeed] = PerPool(KVEventFeed)


def pool_feed(app: str, deployment: str) -> KVEventFeed:
    """The process's feed of one pool deployment (made on first use, shared after): the
    request router that routes within the pool and the dispatcher read the same index."""
    return _FEEDS.get(app, deployment)
