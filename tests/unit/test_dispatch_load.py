"""The dispatcher applies the disaggregation rule (router/policy.py) with what it measured, and
counts the work in flight the rule reads: prompts count while they wait for or run a remote
prefill, and while a pool prefills them itself, and nothing stays counted after a request ends,
fails or is abandoned. A remote prefill starts only once its decode slot is held, and, decode
first, once a decode replica with a slot and KV room is reserved for it; the reservation is
released when the decode request is routed, or the request ends, fails or is cancelled.

The pool handles are fakes that stop at scripted points (no Ray); the gates, tenancy and metrics
are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace

import pytest
from router_fakes import HANDOFF, StreamResponse
from splitserve.router.dispatch import Dispatcher
from splitserve.router.errors import APIError
from splitserve.router.metrics import RouterMetrics
from splitserve.router.policy import PoolLoad
from splitserve.router.routing.decode_room import DecodeRoom
from splitserve.router.routing.reservations import DecodeReservations, RoomView
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

from splitserve.config import parse_config
from splitserve.engine.messages import GenerateChunk, GenerateRequest, Sampling, StepCost


class _Gated:
    """A fake pool handle whose streams wait for `release` before each chunk."""

    def __init__(self, chunks, fail: BaseException | None = None) -> None:
        self.chunks = chunks
        self.gaps: list[float] = []  # pauses before the second, third, ... chunk
        self.fail = fail
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.requests: list[GenerateRequest] = []
        self.streams: list[StreamResponse] = []

    def options(self, **_):
        return SimpleNamespace(generate=SimpleNamespace(remote=self._remote))

    def _remote(self, req):
        self.requests.append(req)
        self.streams.append(StreamResponse(self._run()))
        return self.streams[-1]

    async def _run(self):
        self.started.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        for i, c in enumerate(self.chunks):
            if 0 < i <= len(self.gaps):
                await asyncio.sleep(self.gaps[i - 1])
            yield c


# Step costs the engines would report: 1 ms a step, 1 ms per decoding sequence, 0.1 ms per
# prefilled token (10 k tokens/s), 2048-token chunks; a handoff of 20 ms + 0.01 ms per token.
COST = StepCost(0.001, 0.001, 1e-4, 2048)


def _setup(tpot_slo_s: float | None = None, calibrated: bool = True,
           tenancy: dict | None = None, **disagg):
    cfg = parse_config({"mode": "disaggregated", "disaggregation": disagg,
                        "tenancy": {"decode_max_in_flight": 4, "max_queued": 2,
                                    **(tenancy or {})}})
    prefill = _Gated([GenerateChunk(token_ids=(7,), text="", kv_transfer_params=HANDOFF)])
    decode = _Gated([GenerateChunk(token_ids=(1,), text="a"), GenerateChunk((2,), "b", "length")])
    metrics = RouterMetrics()
    d = Dispatcher(
        {"prefill": prefill, "decode": decode}, cfg.disaggregation, metrics,
        Tenancy.from_config(cfg), replicas={"prefill": 1, "decode": 1}, tpot_slo_s=tpot_slo_s,
    )
    d.clock = lambda: 0.0  # time stands still: backlogs do not drain (tests that drain set it)
    if calibrated:
        _calibrate(d)
    return d, prefill, decode, metrics


def _calibrate(d, cost: StepCost = COST, handoff_s: float = 0.02) -> None:
    """What a few served requests would have taught the dispatcher."""
    for pool in ("prefill", "decode"):
        d.calibration.engine_reported(pool, cost)
    for tokens in (100, 1000, 2000):
        d.calibration.handoff_measured(tokens, handoff_s + 1e-5 * tokens)


def _req(n: int, i: int = 0, start: int | None = None) -> GenerateRequest:
    """Request `i` with an `n`-token prompt of its own (or the tokens from `start` on)."""
    first = 100_000 * i if start is None else start
    return GenerateRequest(f"cmpl-{i}", tuple(range(first, first + n)), Sampling(max_tokens=2))


async def _drain(d, req, out: list):
    async for chunk in d.stream(req, DEFAULT_TENANT):
        out.append(chunk.token_ids)


def _reason(metrics, reason: str) -> float:
    return metrics.registry.get_sample_value(
        "splitserve_disagg_reasons_total", {"reason": reason}
    ) or 0.0


def test_remote_then_local_prompt_are_counted_until_prefilled_then_released():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _setup(tpot_slo_s=0.1)
        out: list = []
        # Idle pools: the prefill is as fast on either side and local has no handoff. With a
        # stream on decode, a 1536-token prefill there would stall it past the 100 ms target:
        # the next one goes remote.
        first = asyncio.create_task(_drain(d, _req(100, 1), out))
        await decode.started.wait()
        assert d.load() == PoolLoad(local_prefill_tokens=100, decode_streams=1)
        assert _reason(metrics, "local") == 1
        decode.started.clear()
        second = asyncio.create_task(_drain(d, _req(1536, 2), out))
        await asyncio.sleep(0)
        await prefill.started.wait()
        assert d.load().prefill_requests == 1 and d.load().prefill_tokens == 1536
        # its decode slot is held, but it is no stream of decode's before its handoff
        assert d.load().decode_streams == 1
        prefill.release.set()
        decode.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (1,), (2,), (2,)]
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_cold_start_takes_the_remote_path_and_measures_it():
    async def run():
        d, prefill, decode, metrics = _setup(calibrated=False)
        prefill.release.set()
        decode.release.set()
        decode.chunks = [GenerateChunk((1,), "a"),
                         GenerateChunk((2,), "b", "length", engine_cost=COST)]
        prefill.chunks = [GenerateChunk((7,), "", kv_transfer_params=HANDOFF, engine_cost=COST)]
        await _drain(d, _req(1000, 1), [])
        assert _reason(metrics, "remote") == 1
        assert len(d.calibration.handoff) == 1  # the handoff was measured ...
        assert d.calibration.engine_cost("decode", "prefill") is not None  # ... and the engines
        await _drain(d, _req(1000, 2), [])  # now the rule decides, and its prediction is scored
        assert metrics.registry.get_sample_value(
            "splitserve_ttft_prediction_ratio_count", {"path": "local"}) == 1

    asyncio.run(asyncio.wait_for(run(), 10))


def test_at_debug_each_decision_logs_every_paths_prediction_and_the_load(caplog):
    async def run():
        d, prefill, decode, _ = _setup(tpot_slo_s=0.1)
        prefill.release.set()
        decode.release.set()
        with caplog.at_level(logging.DEBUG, logger="splitserve.router"):
            await _drain(d, _req(1000, 1), [])
        [line] = [r.getMessage() for r in caplog.records if "prompt tokens" in r.getMessage()]
        assert line.startswith("request cmpl-1 (1000 prompt tokens, 2 out): local; ")
        # local: 1000 tokens x 0.1 ms + one step's 1 ms, then its stream alone, 1 + 1 ms a step
        assert "local TTFT 101.0 gap 2.0 TPOT 2.0 ms" in line, line
        assert "remote TTFT " in line and "offload TTFT " in line and "decode_streams=0" in line

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_prompt_decode_already_holds_stays_there():
    async def run():
        d, prefill, decode, metrics = _setup(tpot_slo_s=0.1)
        prefill.release.set()
        decode.release.set()
        hold = asyncio.create_task(_drain(d, _req(16, 9), []))  # a stream keeps decode busy
        decode.gaps = [0.5]
        await asyncio.sleep(0)
        # A long prompt beside a stream: its local prefill would break the TPOT target: remote.
        await _drain(d, _req(1600, 1, start=0), [])
        assert _reason(metrics, "remote") == 1
        # The same prompt plus a turn: decode holds its blocks (they were pulled there), so
        # only the new tokens are prefilled, on decode.
        await _drain(d, _req(1650, 2, start=0), [])
        assert _reason(metrics, "local") >= 1 and _reason(metrics, "remote") == 1
        assert decode.requests[-1].kv_transfer_params is None
        await hold

    asyncio.run(asyncio.wait_for(run(), 10))


def test_no_prefill_starts_for_a_request_decode_cannot_take():
    """Decode first: the decode slot is taken before the remote prefill starts. With decode's
    slots full, a request waits at the decode gate without prefilling, and one that finds the
    gate's queue full too gets its 429 without a prefill."""
    async def run():
        d, prefill, decode, _ = _setup(prefill="remote")
        prefill.release.set()
        held = [asyncio.create_task(_drain(d, _req(500, i), [])) for i in range(4)]
        while d.tenancy.gates["decode"].in_flight < 4:
            await asyncio.sleep(0.01)
        while len(decode.requests) < 4:
            await asyncio.sleep(0.01)
        prefills = len(prefill.requests)
        waiting = [asyncio.create_task(_drain(d, _req(500, 10 + i), [])) for i in range(2)]
        while d.tenancy.gates["decode"].queued < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(APIError) as err:
            await _drain(d, _req(500, 20), [])
        assert err.value.status == 429
        assert len(prefill.requests) == prefills  # neither the waiting nor the refused prefilled
        decode.release.set()
        await asyncio.gather(*held, *waiting)
        assert len(prefill.requests) == prefills + 2  # the waiting ones, once they had a slot
        assert d.load() == PoolLoad()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_client_that_walks_away_releases_its_local_prefill():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, _, decode, _ = _setup(prefill="local")
        stream = d.stream(_req(500), DEFAULT_TENANT)
        task = asyncio.create_task(stream.__anext__())
        await decode.started.wait()
        assert d.load().local_prefill_tokens == 500
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_a_failed_decode_releases_its_local_prefill():
    async def run():
        d, _, decode, _ = _setup(prefill="local")
        decode.fail = RuntimeError("replica gone")
        decode.release.set()
        with pytest.raises(APIError):
            await _drain(d, _req(500), [])
        assert d.load() == PoolLoad()

    asyncio.run(run())


def _offload_setup():
    """Decode slow enough per stream that two streams there break a 4 ms TPOT target, which a
    stream on the prefill engine keeps (it prefills in 16-token chunks)."""
    d, prefill, decode, metrics = _setup(tpot_slo_s=0.004, calibrated=False)
    _calibrate(d)
    d.calibration.engine_reported("decode", StepCost(0.001, 0.002, 1e-4, 2048))
    d.calibration.engine_reported("prefill", StepCost(0.001, 0.001, 1e-4, 16))
    return d, prefill, decode, metrics


def test_an_offloaded_request_runs_whole_on_prefill_and_counts_there_until_it_ends():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _offload_setup()
        out: list = []
        first = asyncio.create_task(_drain(d, _req(10, 1), out))
        await decode.started.wait()
        assert d.load() == PoolLoad(local_prefill_tokens=10, decode_streams=1)
        second = asyncio.create_task(_drain(d, _req(10, 2), out))
        await prefill.started.wait()
        assert d.load().prefill_streams == 1
        assert d.load().prefill_tokens == 10  # its prompt, until its first token
        assert (_reason(metrics, "local"), _reason(metrics, "offload")) == (1, 1)
        [sent] = prefill.requests
        assert sent.sampling.max_tokens == 2  # the whole request, not a max_tokens=1 prefill
        assert sent.kv_transfer_params is None and sent.request_id == "cmpl-2"
        prefill.release.set()
        decode.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (2,), (7,)]
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_an_offloaded_request_whose_prefill_replica_fails_continues_on_decode():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _offload_setup()
        prefill.fail = RuntimeError("replica gone")
        out: list = []
        first = asyncio.create_task(_drain(d, _req(10, 1), out))
        await decode.started.wait()
        second = asyncio.create_task(_drain(d, _req(10, 2), out))
        await prefill.started.wait()
        prefill.release.set()
        decode.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (1,), (2,), (2,)]  # the second stream came from decode
        assert decode.requests[1].request_id == "cmpl-2-m1"
        assert metrics.registry.get_sample_value(
            "splitserve_decode_migrations_total", {"reason": "replica"}) == 1
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_closing_the_stream_after_a_chunk_cancels_the_worker_request_at_once():
    """A client that stops reading between chunks: closing the dispatcher's stream closes every
    nested generator there and then (not when the event loop finalizes them later), so the
    worker request is cancelled and the gate slot and load released before `aclose` returns."""
    async def run():
        d, _, decode, _ = _setup(prefill="local")
        decode.release.set()
        stream = d.stream(_req(500), DEFAULT_TENANT)
        assert (await stream.__anext__()).token_ids == (1,)
        assert d.load().decode_streams == 1
        await stream.aclose()
        assert decode.streams[0].cancelled
        assert d.load() == PoolLoad()
        assert d.tenancy.gates["decode"].in_flight == 0

    asyncio.run(run())


def test_a_remote_prompt_reports_its_output_tokens_to_both_pools():
    # The controller sizes decode on what enters prefill too (control.with_upstream_demand).
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, _ = _setup(prefill="remote")
        out: list = []
        task = asyncio.create_task(_drain(d, _req(1536, 1), out))
        await prefill.started.wait()
        early = d.signals.snapshot({})
        assert (early["prefill"].arrivals, early["prefill"].output_tokens) == (1, 2)
        assert early["decode"].arrivals == 0  # not there yet
        prefill.release.set()
        decode.release.set()
        await task
        late = d.signals.snapshot({})
        assert (late["decode"].arrivals, late["decode"].output_tokens) == (1, 2)

    asyncio.run(run())


class _Rooms:
    """The decode pool's request router as the reservations see it: two replicas, each with a
    10 000-token KV cache, ranked a then b; a test sets their figures."""

    def __init__(self) -> None:
        self.rooms = {rid: DecodeRoom(rid, queue_depth=1, max_ongoing=8,
                                      kv_capacity_tokens=10_000) for rid in ("a", "b")}

    def set(self, rid: str, **figures) -> None:
        self.rooms[rid] = dataclasses.replace(self.rooms[rid], **figures)

    def room_view(self, req):
        return RoomView(("a", "b"), tuple(self.rooms.values()))


def _decode_first(routed_releases: bool = True, **tenancy):
    """A remote-prefill dispatcher whose decode pool has the replicas of `_Rooms`; the fake
    decode pool answers from the replica a request was pinned to and, with `routed_releases`,
    releases its reservation when it is sent (Serve's on_request_routed)."""
    d, prefill, decode, metrics = _setup(prefill="remote", tenancy=tenancy)
    rooms = _Rooms()
    d.reservations = DecodeReservations("decode")
    d.reservations.attach(rooms)
    remote = decode._remote

    def routed(req):
        if req.pin_replica is not None:
            if routed_releases:
                d.reservations.release(req.pin_replica.reservation)
            pinned = f"decode#{req.pin_replica.replica_id}"
            decode.chunks = [dataclasses.replace(c, replica=c.replica or pinned)
                             for c in decode.chunks]
        return remote(req)

    decode._remote = routed
    return d, prefill, decode, metrics, rooms


def _counter(metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_decode_first_reserves_a_replica_with_room_and_pins_the_request_there():
    async def run():
        d, prefill, decode, metrics, rooms = _decode_first()
        rooms.set("a", kv_usage=0.95)  # 500 tokens free: not enough for the prompt
        task = asyncio.create_task(_drain(d, _req(1000, 1), []))
        await prefill.started.wait()
        assert d.reservations.held() == {"b": (1, 1002)}  # prompt + max_tokens, held meanwhile
        [sent] = prefill.requests
        assert sent.decode_replica == "b" and sent.pin_replica is None
        prefill.release.set()
        await decode.started.wait()
        assert decode.requests[0].pin_replica.replica_id == "b"
        assert d.reservations.held() == {}  # released once routed
        decode.release.set()
        await task
        assert _counter(metrics, "splitserve_decode_pin_misses_total") == 0
        assert _counter(metrics, "splitserve_decode_room_waits_total") == 0

    asyncio.run(asyncio.wait_for(run(), 10))


def test_no_prefill_starts_while_no_decode_replica_has_kv_room():
    async def run():
        d, prefill, decode, metrics, rooms = _decode_first()
        prefill.release.set()
        decode.release.set()
        for rid in ("a", "b"):
            rooms.set(rid, kv_usage=1.0)
        task = asyncio.create_task(_drain(d, _req(1000, 1), []))
        while _counter(metrics, "splitserve_decode_room_waits_total") < 1:
            await asyncio.sleep(0.01)
        assert prefill.requests == [] and d.tenancy.gates["decode"].in_flight == 1
        rooms.set("b", kv_usage=0.5)
        d.reservations.notify()  # what a release or a stream's end does
        await task
        assert [r.decode_replica for r in prefill.requests] == ["b"]
        assert d.reservations.held() == {} and d.load() == PoolLoad()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_request_no_decode_replica_can_take_in_time_gets_503_without_prefilling():
    async def run():
        d, prefill, _, _, rooms = _decode_first(queue_timeout_s=0.2)
        for rid in ("a", "b"):
            rooms.set(rid, queue_depth=8)  # every slot taken
        with pytest.raises(APIError) as err:
            await _drain(d, _req(1000, 1), [])
        assert err.value.status == 503
        assert prefill.requests == []
        assert d.reservations.held() == {} and d.tenancy.gates["decode"].in_flight == 0

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_client_gone_during_the_prefill_releases_its_reservation():
    async def run():
        d, prefill, _, _, _ = _decode_first()
        task = asyncio.create_task(_drain(d, _req(1000, 1), []))
        await prefill.started.wait()
        assert d.reservations.held() == {"a": (1, 1002)}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert d.reservations.held() == {} and d.load() == PoolLoad()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_failed_decode_releases_its_reservation_and_a_pin_not_kept_is_counted():
    async def run():
        d, prefill, decode, metrics, _ = _decode_first(routed_releases=False)
        prefill.release.set()
        decode.fail = RuntimeError("replica gone")
        decode.release.set()
        with pytest.raises(APIError):
            await _drain(d, _req(1000, 1), [])
        assert d.reservations.held() == {}
        decode.fail = None
        decode.chunks = [dataclasses.replace(c, replica="decode#b") for c in decode.chunks]
        await _drain(d, _req(1000, 2), [])  # pinned to a, answered by b
        assert decode.requests[-1].pin_replica.replica_id == "a"
        assert _counter(metrics, "splitserve_decode_pin_misses_total") == 1
        assert d.reservations.held() == {}

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_prompt_counts_what_is_left_of_it_at_the_pool_s_measured_prefill_rate():
    """A queued prompt drains at the rate the engines measured (10 k tokens/s here, 2048-token
    chunks, one stream beside them), so a prompt half done counts half."""
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, _, decode, _ = _setup(prefill="local")
        now = [0.0]
        d.clock = lambda: now[0]
        task = asyncio.create_task(_drain(d, _req(1000), []))
        await decode.started.wait()
        assert d.load().local_prefill_tokens == 1000
        rate = d.calibration.engine_cost("decode", "prefill").prefill_rate(1)
        now[0] = 500 / rate
        assert d.load().local_prefill_tokens == 500
        now[0] = 2.0
        assert d.load().local_prefill_tokens == 0
        assert d.load().decode_streams == 1  # it still runs there
        decode.release.set()
        await task
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_a_pool_slower_than_its_step_model_shows_a_longer_backlog():
    """The backlog is given in the step model's tokens: once the pool has answered prompts
    at half the model's rate, what is left counts double, so the rule's prefill time for it is
    the time the pool takes."""
    d, _, _, _ = _setup(prefill="local")
    model = d._rate("decode")
    backlog = d._backlog["decode"]
    for i in range(4):  # answered at half the modelled rate
        backlog.add(i, 1000, now=10.0 * i, rate=model)
        backlog.answered(i, now=10.0 * i + 2000 / model, rate=model)
    backlog.add("q", 600, now=100.0, rate=model)
    d.clock = lambda: 100.0
    assert d.load().local_prefill_tokens == 1200
