"""The dispatcher's view of prefill work in flight, which feeds the spill rule (router/policy.py):
prompts count while they wait for or run a remote prefill, and while the decode worker prefills
them itself, and nothing stays counted after a request ends, fails or is abandoned.

The pool handles are fakes that stop at scripted points (no Ray); the gates, tenancy and metrics
are the real ones.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from splitserve.config import parse_config
from splitserve.engine.messages import GenerateChunk, GenerateRequest, Sampling
from splitserve.router.dispatch import Dispatcher
from splitserve.router.errors import APIError
from splitserve.router.metrics import RouterMetrics
from splitserve.router.policy import PoolLoad
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

from router_fakes import HANDOFF, StreamResponse


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


def _setup(tpot_slo_s: float | None = None, **disagg):
    # No handoff cost: the first long prompt then goes remote on idle pools (see test_policy);
    # no short-output rule: the requests' 2 output tokens would otherwise skip the handoff.
    cfg = parse_config({"mode": "disaggregated", "disaggregation": {
        "handoff_cost_tokens": 0, "short_output_tokens": 0, **disagg}})
    prefill = _Gated([GenerateChunk(token_ids=(7,), text="", kv_transfer_params=HANDOFF)])
    decode = _Gated([GenerateChunk(token_ids=(1,), text="a"), GenerateChunk((2,), "b", "length")])
    metrics = RouterMetrics()
    d = Dispatcher(
        {"prefill": prefill, "decode": decode}, cfg.disaggregation, metrics,
        Tenancy.from_config(cfg), replicas={"prefill": 1, "decode": 1}, tpot_slo_s=tpot_slo_s,
    )
    return d, prefill, decode, metrics


def _req(n: int, i: int = 0) -> GenerateRequest:
    return GenerateRequest(f"cmpl-{i}", tuple(range(n)), Sampling(max_tokens=2))


async def _drain(d, req, out: list):
    async for chunk in d.stream(req, DEFAULT_TENANT):
        out.append(chunk.token_ids)


def _reason(metrics, reason: str) -> float:
    return metrics.registry.get_sample_value(
        "splitserve_disagg_reasons_total", {"reason": reason}
    ) or 0.0


def test_remote_then_spilled_prompt_are_counted_until_prefilled_then_released():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _setup()
        out: list = []
        first = asyncio.create_task(_drain(d, _req(1536, 1), out))
        await prefill.started.wait()
        assert d.load() == PoolLoad(prefill_requests=1, prefill_tokens=1536)
        # The prefill pool is busy and decode idle: the next long prompt spills to decode.
        second = asyncio.create_task(_drain(d, _req(1000, 2), out))
        await decode.started.wait()
        assert d.load().local_prefill_tokens == 1000
        assert d.load().decode_streams == 1
        assert (_reason(metrics, "remote"), _reason(metrics, "spill")) == (1, 1)
        prefill.release.set()
        decode.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (1,), (2,), (2,)]
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_a_client_that_walks_away_releases_its_local_prefill():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, _, decode, _ = _setup(min_remote_prompt_tokens=2000)  # everything short: local
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
        d, _, decode, _ = _setup(min_remote_prompt_tokens=2000)
        decode.fail = RuntimeError("replica gone")
        decode.release.set()
        with pytest.raises(APIError):
            await _drain(d, _req(500), [])
        assert d.load() == PoolLoad()

    asyncio.run(run())


def _offload_setup():
    """Short prompts (local), and any decode stream makes decode the bottleneck."""
    return _setup(min_remote_prompt_tokens=2000, offload_margin_tokens=0, offload_to_prefill=True)


def test_an_offloaded_request_runs_whole_on_prefill_and_counts_there_until_it_ends():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _offload_setup()
        out: list = []
        first = asyncio.create_task(_drain(d, _req(100, 1), out))
        await decode.started.wait()
        assert d.load() == PoolLoad(local_prefill_tokens=100, decode_streams=1)
        second = asyncio.create_task(_drain(d, _req(500, 2), out))
        await prefill.started.wait()
        assert d.load().prefill_streams == 1
        assert d.load().prefill_tokens == 500  # its prompt, until its first token
        assert (_reason(metrics, "short"), _reason(metrics, "offload")) == (1, 1)
        [sent] = prefill.requests
        assert sent.sampling.max_tokens == 2  # the whole request, not a max_tokens=1 prefill
        assert sent.kv_transfer_params is None and sent.request_id == "cmpl-2"
        prefill.release.set()
        decode.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (2,), (7,)]
        assert d.load() == PoolLoad()

    asyncio.run(run())


def test_short_outputs_run_whole_on_the_less_loaded_pool_without_a_handoff():
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _setup(short_output_tokens=2)  # _req asks for 2 tokens
        out: list = []
        first = asyncio.create_task(_drain(d, _req(1536, 1), out))
        await decode.started.wait()  # idle pools: a tie stays on decode
        assert d.load() == PoolLoad(local_prefill_tokens=1536, decode_streams=1)
        second = asyncio.create_task(_drain(d, _req(1536, 2), out))
        await prefill.started.wait()  # decode busier: the whole request on prefill
        assert d.load().prefill_streams == 1 and d.load().prefill_tokens == 1536
        assert d.load().prefill_requests == 0  # no remote prefill in flight
        assert (_reason(metrics, "short_output"), _reason(metrics, "short_output_offload")) == (1, 1)
        [sent] = prefill.requests
        assert sent.sampling.max_tokens == 2 and sent.kv_transfer_params is None
        assert decode.requests[0].kv_transfer_params is None  # no handoff on either
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
        first = asyncio.create_task(_drain(d, _req(100, 1), out))
        await decode.started.wait()
        second = asyncio.create_task(_drain(d, _req(500, 2), out))
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
        d, _, decode, _ = _setup(min_remote_prompt_tokens=2000)
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
        d, prefill, decode, _ = _setup()
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


def test_a_slow_decode_pool_hands_whole_requests_to_prefill():
    """The dispatcher measures each pool's pace from its chunks' gaps (router/pace.py): decode
    streaming at 80 ms per token is slower than half a 100 ms TPOT target, so a request arriving
    meanwhile runs whole on the prefill pool (no handoff) and counts there until it ends."""
    async def run():
        await asyncio.wait_for(body(), 10)

    async def body():
        d, prefill, decode, metrics = _setup(tpot_slo_s=0.1, min_remote_prompt_tokens=2000,
                                             slow_decode_tpot_fraction=0.5)
        decode.chunks = [GenerateChunk((1,), "a"), GenerateChunk((2,), "b"),
                         GenerateChunk((3,), "c", "length")]
        decode.gaps = [0.08, 1.0]  # the stream is still on decode when the next request comes
        prefill.chunks = [GenerateChunk((5,), "x"), GenerateChunk((6,), "y", "length")]
        decode.release.set()
        out: list = []
        first = asyncio.create_task(_drain(d, _req(100, 1), out))  # short prompt: on decode
        while d.load().decode_pace_s == 0.0:
            await asyncio.sleep(0.01)
        assert d.load().decode_pace_s >= 0.08 and d.load().prefill_pace_s == 0.0
        second = asyncio.create_task(_drain(d, _req(100, 2), out))
        await prefill.started.wait()
        assert d.load().prefill_streams == 1
        [sent] = prefill.requests
        assert sent.sampling.max_tokens == 2 and sent.kv_transfer_params is None
        assert (_reason(metrics, "short"), _reason(metrics, "slow_decode")) == (1, 1)
        prefill.release.set()
        await asyncio.gather(first, second)
        assert sorted(out) == [(1,), (2,), (3,), (5,), (6,)]
        assert len(decode.requests) == 1 and d.load().prefill_streams == 0

    asyncio.run(run())


def test_without_a_tpot_target_no_pace_is_measured():
    d, *_ = _setup(min_remote_prompt_tokens=2000)
    assert d.pace == {} and d.load() == PoolLoad()
