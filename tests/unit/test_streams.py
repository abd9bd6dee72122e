"""Responses streamed from an engine replica to the router over HTTP (issue #26): the frames,
the replica's stream server and the router's reader, with a real aiohttp server and client on
127.0.0.1 (the worker call around them is a plain async generator: no Ray, no engine)."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest
from splitserve.router.dispatch import Dispatcher
from splitserve.router.metrics import RouterMetrics
from splitserve.router.streams import StreamClient, relayed
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

from splitserve.config import parse_config
from splitserve.engine import frames
from splitserve.engine.messages import (
    GenerateChunk,
    GenerateRequest,
    HTTPCall,
    RequestRejected,
    Sampling,
    StepCost,
    WorkerError,
)
from splitserve.engine.stream_server import StreamServer, over_http

REPLICA = "SplitserveDecode#abc123"


def in_loop(test):
    """Run the coroutine function `test` as a plain test (its own event loop)."""
    def run() -> None:
        asyncio.run(test())
    run.__name__ = test.__name__
    return run


def test_frames_round_trip_in_pieces_of_any_size():
    parts = [
        GenerateChunk((), "", status=200, headers=(("content-type", "text/event-stream"),)),
        GenerateChunk((7, 70000), "", data=b"data: {\"a\": 1}\n\n", engine_ttft_s=0.25),
        GenerateChunk((8,), "", data=b"data: {\"b\": 2}\n\n"),
        GenerateChunk((9,), ""),  # tokens before a response that is not streamed began
    ]
    last = GenerateChunk((10,), "", data=b"data: [DONE]\n\n", finish_reason="length",
                         num_prompt_tokens=5, num_cached_tokens=4, kv_bytes=4096,
                         kv_transfer_s=0.002, kv_recomputed=None,
                         kv_transfer_params={"remote_engine_id": "p", "remote_block_ids": [1]},
                         engine_cost=StepCost(0.01, 0.001, None, 256))
    wire = b"".join(frames.encode_chunk(c) for c in parts) + frames.encode_end(last)
    for size in (1, 3, 17, len(wire)):
        decoder, got = frames.FrameDecoder(REPLICA), []
        for i in range(0, len(wire), size):
            decoded = decoder.feed(wire[i:i + size])
            got.extend(decoded.chunks)
        assert decoded.ended
        tokens = tuple(t for c in got for t in c.token_ids)
        assert tokens == (7, 70000, 8, 9, 10)
        assert b"".join(c.data for c in got) == b"".join(c.data for c in [*parts, last])
        # the figures are on the chunk with the response's last bytes, however the bytes came
        assert got[-1].data.endswith(last.data) and got[-1].token_ids[-1] == 10
        assert {k: getattr(got[-1], k) for k in frames.FIGURES} == {
            k: getattr(last, k) for k in frames.FIGURES}
        assert got[0].status == 200 and got[0].headers == parts[0].headers
        assert [c.engine_ttft_s for c in got if c.engine_ttft_s is not None] == [0.25]
        assert all(c.replica == REPLICA for c in got)


def test_frames_that_arrive_together_are_one_chunk():
    wire = (frames.encode_start(200, ()) + frames.encode_data((1,), b"a", None)
            + frames.encode_data((2, 3), b"bc", 0.5) + frames.encode_end())
    decoded = frames.FrameDecoder().feed(wire)
    assert [c.status for c in decoded.chunks] == [200, None]
    merged = decoded.chunks[1]
    assert (merged.token_ids, merged.data, merged.engine_ttft_s) == ((1, 2, 3), b"abc", 0.5)
    assert decoded.ended


def test_an_end_frame_after_the_start_gives_its_figures_a_chunk_of_their_own():
    last = GenerateChunk((), "", finish_reason="stop", num_prompt_tokens=3)
    wire = frames.encode_start(200, ()) + frames.encode_end(last)
    decoded = frames.FrameDecoder(REPLICA).feed(wire)
    assert [(c.status, c.finish_reason) for c in decoded.chunks] == [(200, None), (None, "stop")]
    assert decoded.chunks[1].num_prompt_tokens == 3 and decoded.chunks[1].replica == REPLICA
    assert frames.FrameDecoder().feed(frames.encode_end()).chunks == []  # no figures, no chunk


def test_bytes_after_the_end_or_an_unknown_frame_are_errors():
    with pytest.raises(frames.FrameError):
        frames.FrameDecoder().feed(frames.encode_end() + frames.encode_end())
    with pytest.raises(frames.FrameError, match="unknown frame kind 9"):
        frames.FrameDecoder().feed(frames.HEADER.pack(9, 0, 0, 0.0))
    with pytest.raises(frames.FrameError, match="figures are not readable"):
        frames.FrameDecoder().feed(frames.HEADER.pack(frames.END, 0, 0, 0.0)
                                   + frames.FIGURES_SIZE.pack(3) + b"{x}")


async def _source(chunks: list[GenerateChunk], *, fail: Exception | None = None,
                  server: StreamServer | None = None, gate: asyncio.Event | None = None,
                  events: list[str] | None = None):
    """What the engine makes of a request: `chunks`, then its figures (or `fail`, raised once
    the reader of `server`'s stream connected, so that what was queued still goes out)."""
    try:
        for chunk in chunks:
            if gate is not None:
                await gate.wait()
            yield chunk
        if fail is not None:
            while not any(slot.connected.is_set() for slot in server._slots.values()):
                await asyncio.sleep(0.01)
            raise fail
        yield GenerateChunk((), "", data=b"data: [DONE]\n\n", finish_reason="length",
                            replica=REPLICA, num_prompt_tokens=5, kv_transfer_s=0.002)
    finally:
        if events is not None:
            events.append("call closed")


def _worker(server: StreamServer, chunks: list[GenerateChunk], **kw):
    """A worker call as the engine replica makes it (`over_http`), without vLLM."""
    return over_http(server, _source(chunks, server=server, **kw), REPLICA)


async def eager(gen):
    """`gen` run ahead of its reader, as Ray runs a replica's streaming call: its items queue
    up; closing this iterator cancels it (as cancelling the call does)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump():
        try:
            async for item in gen:
                queue.put_nowait(item)
            queue.put_nowait(done)
        except Exception as err:  # noqa: BLE001 - handed to the reader
            queue.put_nowait(err)
        finally:
            await gen.aclose()

    task = asyncio.create_task(pump())
    try:
        while (item := await queue.get()) is not done:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _closed(server: StreamServer) -> bool:
    """Whether every stream's call ended (within a few seconds: a call whose stream was read
    whole ends in the background)."""
    for _ in range(500):
        if server.open_streams == 0:
            return True
        await asyncio.sleep(0.01)
    return False


@contextlib.asynccontextmanager
async def _serving():
    server, client = StreamServer("127.0.0.1"), StreamClient()
    await server.start()
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()


async def _recorded(gen, items: list):
    async for item in gen:
        items.append(item)
        yield item


@in_loop
async def test_a_stream_is_read_whole_with_the_figures_on_its_last_bytes():
    body = [GenerateChunk((), "", status=200, headers=(("content-type", "text/event-stream"),)),
            *(GenerateChunk((i,), "", data=f"data: {i}\n\n".encode()) for i in range(50))]
    async with _serving() as (server, client):
        items: list[GenerateChunk] = []
        got = [c async for c in relayed(eager(_recorded(_worker(server, body), items)), client)]
        assert got[0].status == 200
        assert [t for c in got for t in c.token_ids] == list(range(50))
        assert b"".join(c.data for c in got) == b"".join(c.data for c in body) + b"data: [DONE]\n\n"
        # the router has the figures with the response's end, not after it: a client that
        # hangs up at [DONE] cannot cut them off
        assert got[-1].data.endswith(b"data: [DONE]\n\n") and got[-1].finish_reason == "length"
        assert got[-1].num_prompt_tokens == 5 and got[-1].kv_transfer_s == 0.002
        assert [i.stream_url is not None for i in items] == [True]  # the call: the address only
        assert all(c.stream_url is None for c in got)
        assert await _closed(server)  # the call ended after the stream, by itself


@in_loop
async def test_the_reader_does_not_wait_for_the_call_to_end_after_a_whole_stream():
    ended, release = [], asyncio.Event()

    async def call():
        async for item in _worker(server, [GenerateChunk((1,), "", data=b"x")]):
            yield item
        await release.wait()  # e.g. the call's end still on its way from the replica
        ended.append(True)

    async with _serving() as (server, client):
        got = [c async for c in relayed(eager(call()), client)]
        assert [t for c in got for t in c.token_ids] == [1] and got[-1].finish_reason == "length"
        assert ended == []  # the reader is done; the call ends on its own, drained
        release.set()
        assert await _closed(server)
        assert ended == [True]


@in_loop
async def test_streams_of_a_replica_share_one_connection():
    import aiohttp

    made = []

    async def on_create(*_):
        made.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    async with _serving() as (server, client):
        client._session = aiohttp.ClientSession(trace_configs=[trace])
        for i in range(5):
            body = [GenerateChunk((i,), "", data=b"x" * (100 * i))]
            got = [c async for c in relayed(eager(_worker(server, body)), client)]
            assert [t for c in got for t in c.token_ids] == [i]
        assert len(made) == 1  # each stream read to the end of its body: the connection is kept


@in_loop
async def test_a_failure_after_the_stream_began_is_the_calls_error():
    rejected = RequestRejected("abc123", "bad grammar", status=400, body=b'{"error": {}}')
    body = [GenerateChunk((1,), "", data=b"data: 1\n\n")]
    async with _serving() as (server, client):
        got = []
        with pytest.raises(RequestRejected, match="bad grammar"):
            async for chunk in relayed(eager(_worker(server, body, fail=rejected)), client):
                got.append(chunk)
        assert [c.token_ids for c in got] == [(1,)]
        assert server.open_streams == 0


@in_loop
async def test_a_call_that_ends_without_the_streams_end_is_a_worker_error():
    async def truncated():
        async for item in _worker(server, [GenerateChunk((1,), "", data=b"x")]):
            yield item
            server.discard(item.stream_url or "")  # the stream cut, the call goes on
            return

    async with _serving() as (server, client):
        with pytest.raises(WorkerError, match="stream was cut") as err:
            async for _ in relayed(eager(truncated()), client):
                pass
        assert err.value.replica == "abc123"


@in_loop
async def test_an_unreachable_stream_server_is_a_worker_error_at_once():
    async with _serving() as (server, client):
        url, _ = server.open()
        await server.stop()  # nothing listens at the address any more

        async def call():
            yield GenerateChunk((), "", replica=REPLICA, stream_url=url)
            await asyncio.Event().wait()  # never ends: the reader must not wait for it

        with pytest.raises(WorkerError, match="unreachable"):
            async for _ in relayed(eager(call()), client):
                pass


@in_loop
async def test_a_reader_that_leaves_early_ends_the_servers_response():
    gate, events = asyncio.Event(), []
    body = [GenerateChunk((i,), "", data=b"x") for i in range(10)]
    async with _serving() as (server, client):
        call = eager(_worker(server, body, gate=gate, events=events))
        stream = relayed(call, client)
        gate.set()
        first = await anext(stream)
        assert first.token_ids
        await stream.aclose()  # the client left: the dispatcher closes the relay, then the call
        await call.aclose()
        assert events == ["call closed"] and server.open_streams == 0


@in_loop
async def test_a_stream_is_served_once():
    async with _serving() as (server, client):
        url, slot = server.open()
        slot.put(frames.encode_end())
        slot.close()
        session = client._client()
        async with session.get(url) as first:
            assert first.status == 200
            assert await first.read() == frames.encode_end()
        async with session.get(url) as second:
            assert second.status == 404
        async with session.get(url.rsplit("/", 1)[0] + "/nope") as unknown:
            assert unknown.status == 404
        server.discard(url)


class _HttpDecode:
    """A decode pool handle whose replicas answer as `EngineHost.generate` does: over `server`
    when the request asks for it (`http_stream`), else one item per chunk. Each call plays the
    next script: (replica, tokens, error raised once the tokens are out)."""

    def __init__(self, server: StreamServer, scripts: list[tuple[str, list[int], Exception | None]]):
        self.server, self.scripts, self.requests, self.calls = server, list(scripts), [], []

    def options(self, **_):
        return SimpleNamespace(generate=SimpleNamespace(remote=self._remote))

    def _remote(self, req: GenerateRequest):
        self.requests.append(req)
        replica, tokens, fail = self.scripts.pop(0)

        async def chunks():
            yield GenerateChunk((), "", status=200, replica=replica,
                                headers=(("content-type", "text/event-stream"),))
            for t in tokens:
                yield GenerateChunk((t,), "", data=f"data: {t}\n\n".encode(), replica=replica)
            if fail is not None:
                raise fail
            yield GenerateChunk((), "", finish_reason="length", replica=replica)

        call = over_http(self.server, chunks(), replica) if req.http_stream else chunks()
        self.calls.append(_Call(eager(call)))
        return self.calls[-1]


class _Call:
    """Like a Serve streaming response: iterable once, and cancellable."""

    def __init__(self, agen) -> None:
        self.agen, self.cancelled = agen, False

    def __aiter__(self):
        return self.agen

    def cancel(self) -> None:
        self.cancelled = True


def _dispatch(transport: str, scripts) -> tuple[list[GenerateChunk], _HttpDecode]:
    cfg = parse_config({"mode": "colocated", "router": {"streaming": {"transport": transport}}})

    async def go():
        async with _serving() as (server, _):
            decode = _HttpDecode(server, scripts)
            d = Dispatcher({"decode": decode}, cfg.disaggregation, RouterMetrics(),
                           Tenancy.from_config(cfg), decode_migrations=1,
                           streaming=cfg.router.streaming)
            req = GenerateRequest("cmpl-1", (5, 6, 7), Sampling(max_tokens=4),
                                  http=HTTPCall("POST", "/v1/completions", json={"prompt": "x"}))
            got = [c async for c in d.stream(req, DEFAULT_TENANT)]
            await d.stream_client.close()
            assert await _closed(server)  # the call ended after the stream, by itself
            return got, decode

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "ray"])
def test_the_dispatcher_reads_a_response_alike_over_either_transport(transport):
    got, decode = _dispatch(transport, [("decode#r1", [10, 11, 12, 13], None)])
    assert [r.http_stream for r in decode.requests] == [transport == "http"]
    assert [t for c in got for t in c.token_ids] == [10, 11, 12, 13]
    assert b"".join(c.data for c in got) == b"".join(f"data: {t}\n\n".encode()
                                                     for t in (10, 11, 12, 13))
    assert got[0].status == 200 and got[-1].finish_reason == "length"
    assert all(c.stream_url is None for c in got)
    assert [c.cancelled for c in decode.calls] == [False]  # a whole response: nothing to free


def test_a_replica_failing_before_its_stream_began_migrates_the_request():
    got, decode = _dispatch("http", [("decode#r1", [], WorkerError("r1", "engine died")),
                                     ("decode#r2", [10, 11], None)])
    assert [r.avoid_replicas for r in decode.requests] == [(), ("r1",)]
    assert [t for c in got for t in c.token_ids] == [10, 11]
