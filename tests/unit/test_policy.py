"""The disaggregation rule (router/policy.py), regime by regime.

Costs are those of a GPU-like engine (10 ms a step, 0.2 ms per decoding sequence, 40 k prompt
tokens/s, 2048-token chunks) unless a test says otherwise; a fast handoff is RDMA-like (3 ms +
1 us per token), a slow one TCP-like (50 ms + 0.3 ms per token).
"""

from __future__ import annotations

import pytest
from splitserve.router.policy import (
    EngineCost,
    HandoffCost,
    PoolLoad,
    PoolView,
    PrefillPath,
    Targets,
    choose,
    decide,
    pool_views,
    predict,
)

GPU = EngineCost(step_s=0.010, per_seq_s=0.0002, per_token_s=1 / 40_000, chunk_tokens=2048)
FAST = HandoffCost(0.003, 1e-6)
SLOW = HandoffCost(0.050, 3e-4)
SLO = 0.050  # TPOT target


def _path(prompt: int, prefill: PoolView, decode: PoolView, handoff: HandoffCost = FAST,
          slo: float | None = SLO, ttft: float | None = None, output: int = 256) -> PrefillPath:
    return decide(prompt, prefill, decode, handoff, Targets(ttft, slo), output_tokens=output).path


def test_engine_cost_step_and_chunked_prefill():
    assert GPU.step(0) == pytest.approx(0.010)
    assert GPU.step(10, 100) == pytest.approx(0.010 + 0.002 + 100 / 40_000)
    assert GPU.step(48, 10_000) == pytest.approx(0.010 + 48 * 0.0002 + 2000 / 40_000)  # a chunk
    # 4096 tokens beside 48 streams: 3 steps of at most 2000 prompt tokens each
    assert GPU.prefill_s(4096, 48) == pytest.approx(4096 / 40_000 + 3 * (0.010 + 48 * 0.0002))


def test_idle_pools_keep_a_prompt_on_decode_no_handoff_beats_any_handoff():
    for prompt in (16, 512, 4096):
        assert _path(prompt, PoolView(GPU), PoolView(GPU)) is PrefillPath.LOCAL


def test_decode_bound_long_prompts_go_remote_short_ones_stay():
    # 64 streams on decode: a 4k-token prompt's chunks would stall them past the target, a
    # 64-token prompt's would not (and a handoff would cost it more than its prefill).
    decode = PoolView(GPU, streams=64)
    assert _path(4096, PoolView(GPU), decode) is PrefillPath.REMOTE
    assert _path(64, PoolView(GPU), decode, HandoffCost(0.015, 1e-6)) is PrefillPath.LOCAL


def test_prefill_bound_prompts_spill_to_a_decode_pool_with_room():
    # The prefill pool has 40 k tokens queued (1 s); decode streams a little: prefilling there
    # is faster and its chunks keep the streams within target at 1k tokens.
    prefill = PoolView(GPU, prefill_tokens=40_000)
    decode = PoolView(GPU, streams=4)
    assert _path(1024, prefill, decode) is PrefillPath.LOCAL
    # ... but not a prompt whose chunk alone breaks the target: it waits for the prefill pool.
    assert _path(8192, prefill, decode) is PrefillPath.REMOTE


def test_a_prompt_cached_on_decode_stays_there():
    decode = PoolView(GPU, streams=64, cached_tokens=4000)
    assert _path(4096, PoolView(GPU), decode) is PrefillPath.LOCAL
    uncached = PoolView(GPU, streams=64)
    assert _path(4096, PoolView(GPU), uncached) is PrefillPath.REMOTE


def test_a_prompt_cached_on_prefill_prefers_the_remote_path():
    # decode busy prefilling other prompts; prefill holds this prompt: only the pull is left.
    prefill = PoolView(GPU, cached_tokens=4096)
    decode = PoolView(GPU, streams=8, prefill_tokens=1500)
    assert _path(4096, prefill, decode) is PrefillPath.REMOTE


def test_the_handoffs_cost_moves_the_line_between_remote_and_local():
    # Decode streams 8 and has 3000 prompt tokens queued; a 1024-token prompt is predicted
    # 102 ms remote with a fast handoff (prefill 36 + pull 4 + decode's step 63), 124 ms local:
    # remote. A slow handoff (357 ms) makes local the faster path. (The prefill engine runs
    # 8k-token chunks: a stream there would break the target, so offload is out.)
    big_chunks = EngineCost(step_s=0.010, per_seq_s=0.0002, per_token_s=1 / 40_000,
                            chunk_tokens=8192)
    decode = PoolView(GPU, streams=8, prefill_tokens=3000)
    assert _path(1024, PoolView(big_chunks), decode, FAST, slo=0.08) is PrefillPath.REMOTE
    assert _path(1024, PoolView(big_chunks), decode, SLOW, slo=0.08) is PrefillPath.LOCAL


def test_whole_request_on_prefill_when_decode_cannot_keep_the_target():
    # decode's own step with one more stream is already past the target; the prefill engine,
    # even beside a full chunk, is within it.
    slow_decode = EngineCost(step_s=0.045, per_seq_s=0.001, per_token_s=1 / 40_000,
                             chunk_tokens=2048)
    small_chunks = EngineCost(step_s=0.010, per_seq_s=0.0002, per_token_s=1 / 40_000,
                              chunk_tokens=256)
    decode = PoolView(slow_decode, streams=10)
    assert _path(512, PoolView(small_chunks), decode) is PrefillPath.OFFLOAD


def test_when_no_path_keeps_the_target_the_lowest_tpot_wins():
    preds = predict(4096, PoolView(GPU), PoolView(GPU, streams=64), FAST)
    best = choose(preds, Targets(tpot_s=0.001))  # nothing is that fast
    assert best.tpot_s == min(p.tpot_s for p in preds)


def test_without_a_target_the_lowest_ttft_wins():
    preds = predict(4096, PoolView(GPU), PoolView(GPU, streams=64), FAST)
    assert choose(preds, Targets()).ttft_s == min(p.ttft_s for p in preds)


def test_a_handoff_that_breaks_the_ttft_target_loses_to_one_slow_step():
    # Beside 64 streams a 4k-token local prefill makes 74 ms steps (past the 50 ms gap
    # target), but spread over 256 tokens the streams' mean TPOT stays within it. A TCP
    # handoff of 4k tokens (1.3 s) breaks a 1 s TTFT target: the request runs whole on one
    # engine, where its TTFT is kept (on the idle prefill engine: the fastest).
    decode = PoolView(GPU, streams=64)
    assert _path(4096, PoolView(GPU), decode, FAST, ttft=1.0) is PrefillPath.REMOTE
    assert _path(4096, PoolView(GPU), decode, SLOW, ttft=1.0) is PrefillPath.OFFLOAD
    busy_prefill = PoolView(GPU, streams=4, prefill_tokens=30_000)  # 0.75 s queued there
    assert _path(4096, busy_prefill, decode, SLOW, ttft=1.0) is PrefillPath.LOCAL


def test_predictions_add_the_hop_to_every_path():
    plain = predict(1000, PoolView(GPU), PoolView(GPU), FAST)
    hopped = predict(1000, PoolView(GPU), PoolView(GPU), FAST, hop_s=0.005)
    for a, b in zip(plain, hopped, strict=True):
        assert b.ttft_s == pytest.approx(a.ttft_s + 0.005)


def test_pool_views_are_per_replica():
    load = PoolLoad(prefill_requests=4, prefill_tokens=8000, prefill_replicas=2,
                    local_prefill_tokens=300, decode_streams=30, decode_replicas=3,
                    prefill_streams=2)
    views = pool_views(load, GPU, GPU, {"decode": 64})
    assert views["prefill"].prefill_tokens == 4000 and views["prefill"].streams == 1
    assert views["decode"].streams == 10 and views["decode"].prefill_tokens == 100
    assert views["decode"].cached_tokens == 64 and views["prefill"].cached_tokens == 0


@pytest.mark.parametrize("path,pool,remote", [
    (PrefillPath.REMOTE, "decode", True), (PrefillPath.LOCAL, "decode", False),
    (PrefillPath.OFFLOAD, "prefill", False), (PrefillPath.MULTI_SEQUENCE, "decode", False),
])
def test_paths_name_their_pool(path, pool, remote):
    assert path.pool == pool and path.remote is remote


def test_a_busy_engine_finishes_its_step_before_the_prompt_starts():
    # 32 streams decoding: the prompt waits, on average, for half of the step under way
    idle = {p.path: p.ttft_s for p in predict(512, PoolView(GPU), PoolView(GPU), FAST)}
    busy = {p.path: p.ttft_s for p in predict(512, PoolView(GPU), PoolView(GPU, streams=32),
                                               FAST)}
    local_alone = GPU.prefill_s(512, 32)
    assert busy[PrefillPath.LOCAL] == pytest.approx(local_alone + 0.5 * GPU.step(32))
    assert idle[PrefillPath.LOCAL] == pytest.approx(GPU.prefill_s(512, 0))
    # the idle prefill pool starts at once: the remote path's prefill has no such wait
    assert busy[PrefillPath.OFFLOAD] == pytest.approx(idle[PrefillPath.OFFLOAD])
