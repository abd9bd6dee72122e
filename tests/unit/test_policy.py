"""Conditional disaggregation decisions and the KV handoff object (pure, no Ray)."""

from __future__ import annotations

import pytest

from splitserve.config import DisaggregationConfig
from splitserve.kv_transfer.handoff import HandoffError, KVHandoff, prefill_request_params
from splitserve.router.policy import PoolLoad, PrefillPath, prefill_path

# No handoff cost here: these cases compare the two backlogs alone (the cost has its own tests);
# no offload and short prompts always on decode either (their own tests below).
CFG = DisaggregationConfig(
    min_remote_prompt_tokens=100, max_prefill_queue=4, decode_stream_cost_tokens=50,
    handoff_cost_tokens=0, offload_to_prefill=False, short_prompts_either_pool=False,
)
IDLE = PoolLoad()


def _path(prompt, cached=0, load=IDLE, cfg=CFG) -> PrefillPath:
    return prefill_path(prompt_tokens=prompt, expected_cached_tokens=cached, load=load, cfg=cfg)


def _assert_path(got: PrefillPath, want: PrefillPath, whole_on_prefill: PrefillPath) -> None:
    """`got` is `want`, runs on prefill exactly when it is `whole_on_prefill`, and moves KV
    only when it is REMOTE."""
    assert got is want
    assert got.pool == ("prefill" if want is whole_on_prefill else "decode")
    assert not got.remote or want is PrefillPath.REMOTE


@pytest.mark.parametrize(
    ("prompt", "cached", "load", "want"),
    [
        (99, 0, IDLE, PrefillPath.SHORT),  # too short: local
        (100, 0, IDLE, PrefillPath.REMOTE),  # at the threshold: remote
        (500, 450, IDLE, PrefillPath.SHORT),  # mostly cached: the uncached part is short
        (5000, 6000, IDLE, PrefillPath.SHORT),  # cached beyond the prompt never goes negative
        # 3 prefills of 100 tokens ahead vs 8 decoding streams = 400 token-equivalents: remote
        (500, 0, PoolLoad(prefill_requests=3, prefill_tokens=300, decode_streams=8),
         PrefillPath.REMOTE),
        (500, 0, PoolLoad(prefill_requests=4), PrefillPath.QUEUE_FULL),  # backed up: local
        # one long prompt prefilling, decode idle: share the prefill work (spill)
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536), PrefillPath.SPILL),
        # ... unless decode is busier: 1536 / 1 < (1000 + 20 streams x 50) / 1
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1000,
                           decode_streams=20), PrefillPath.REMOTE),
        # equal backlogs go remote (decode steps stay free of prefill)
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1536),
         PrefillPath.REMOTE),
        # backlogs are per replica: 2 prefill replicas halve 1536 below decode's 1000
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, prefill_replicas=2,
                           local_prefill_tokens=1000), PrefillPath.REMOTE),
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1000,
                           decode_replicas=2), PrefillPath.SPILL),
    ],
)
def test_prefill_path(prompt, cached, load, want):
    got = _path(prompt, cached, load)
    assert got is want
    assert got.remote is (want is PrefillPath.REMOTE)


def test_spill_off_sends_long_prompts_remote_until_the_queue_is_full():
    cfg = CFG.model_copy(update={"spill_to_decode": False})
    busy = PoolLoad(prefill_requests=3, prefill_tokens=10_000)
    assert _path(1536, load=busy, cfg=cfg) is PrefillPath.REMOTE
    assert _path(1536, load=PoolLoad(prefill_requests=4), cfg=cfg) is PrefillPath.QUEUE_FULL


def test_the_handoff_cost_keeps_prompts_on_a_decode_pool_with_spare_capacity():
    cfg = CFG.model_copy(update={"handoff_cost_tokens": 256})
    assert _path(1536, load=IDLE, cfg=cfg) is PrefillPath.SPILL  # both idle: no handoff wins
    # decode streaming 6 requests (6 x 50 = 300 > 256): remote keeps its steps free
    assert _path(1536, load=PoolLoad(decode_streams=6), cfg=cfg) is PrefillPath.REMOTE
    # decode already prefilling 200 tokens, the prefill pool nothing: 0 + 256 > 200, local
    assert _path(1536, load=PoolLoad(local_prefill_tokens=200), cfg=cfg) is PrefillPath.SPILL
    assert _path(1536, load=PoolLoad(local_prefill_tokens=300), cfg=cfg) is PrefillPath.REMOTE


OFFLOAD_CFG = CFG.model_copy(update={"offload_to_prefill": True, "offload_margin_tokens": 200})


@pytest.mark.parametrize(
    ("prompt", "load", "want"),
    [
        # decode streams 5 x 50 = 250 > idle prefill pool + 200: the prefill pool runs it all
        (10, PoolLoad(decode_streams=5), PrefillPath.OFFLOAD),
        (1536, PoolLoad(decode_streams=5), PrefillPath.OFFLOAD),
        # 4 x 50 = 200 is not more than the margin: the usual rules (short: local)
        (10, PoolLoad(decode_streams=4), PrefillPath.SHORT),
        # the prefill pool's own streams count: 10 x 50 > 4 x 50 + 200, but 8 x 50 is not
        (10, PoolLoad(decode_streams=10, prefill_streams=4), PrefillPath.OFFLOAD),
        (10, PoolLoad(decode_streams=8, prefill_streams=4), PrefillPath.SHORT),
        # ... and so do its prompts: 1000 tokens in remote prefill outweigh 20 streams
        (10, PoolLoad(decode_streams=20, prefill_requests=1, prefill_tokens=1000),
         PrefillPath.SHORT),
        # decode busy prefilling prompts (not streaming) is not a reason: prompts go remote
        (1536, PoolLoad(local_prefill_tokens=5000), PrefillPath.REMOTE),
        # per replica: 2 decode replicas halve decode's streams below the margin
        (10, PoolLoad(decode_streams=5, decode_replicas=2), PrefillPath.SHORT),
        # a full prefill queue takes nothing more, whole requests included
        (10, PoolLoad(decode_streams=50, prefill_requests=4), PrefillPath.SHORT),
    ],
)
def test_offload_runs_whole_requests_on_prefill_when_decode_is_the_bottleneck(prompt, load, want):
    got = _path(prompt, load=load, cfg=OFFLOAD_CFG)
    _assert_path(got, want, whole_on_prefill=PrefillPath.OFFLOAD)


def test_offload_off_keeps_requests_on_decode():
    cfg = OFFLOAD_CFG.model_copy(update={"offload_to_prefill": False})
    assert _path(10, load=PoolLoad(decode_streams=50), cfg=cfg) is PrefillPath.SHORT


def test_offloaded_streams_balance_the_two_pools():
    """Streams arriving one by one and never finishing: with offload on they split between the
    pools up to the margin, instead of all landing on decode (what wastes a prefill engine on
    decode-heavy load)."""
    load = PoolLoad()
    for _ in range(40):
        path = _path(10, load=load, cfg=OFFLOAD_CFG)
        if path is PrefillPath.OFFLOAD:
            load = PoolLoad(decode_streams=load.decode_streams,
                            prefill_streams=load.prefill_streams + 1)
        else:
            load = PoolLoad(decode_streams=load.decode_streams + 1,
                            prefill_streams=load.prefill_streams)
    # decode ends at most margin / cost + 1 streams ahead: 200 / 50 = 4, + 1
    assert load.prefill_streams + load.decode_streams == 40
    assert 0 < load.decode_streams - load.prefill_streams <= 5


SHORT_OUT_CFG = CFG.model_copy(update={"short_output_tokens": 32})


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "load", "want"),
    [
        # both idle: a tie stays on decode, as the first request on two colocated engines
        (1536, 16, IDLE, PrefillPath.SHORT_OUTPUT),
        (1536, 32, IDLE, PrefillPath.SHORT_OUTPUT),  # at the threshold
        # decode prefilling one prompt, prefill idle: the whole request goes to prefill
        (1536, 16, PoolLoad(local_prefill_tokens=1536), PrefillPath.SHORT_OUTPUT_OFFLOAD),
        # decode's streams count too: 2 x 50 > an idle prefill pool
        (1536, 16, PoolLoad(decode_streams=2), PrefillPath.SHORT_OUTPUT_OFFLOAD),
        # the prefill pool busier (a remote prefill, an offloaded stream) than decode: decode
        (1536, 16, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1000),
         PrefillPath.SHORT_OUTPUT),
        (1536, 16, PoolLoad(prefill_streams=3, decode_streams=2), PrefillPath.SHORT_OUTPUT),
        # per replica: decode's 3000 tokens over 2 replicas still outweigh prefill's 1000
        (1536, 16, PoolLoad(prefill_requests=1, prefill_tokens=1000, local_prefill_tokens=3000,
                            decode_replicas=2), PrefillPath.SHORT_OUTPUT_OFFLOAD),
        # a full prefill queue takes nothing more
        (1536, 16, PoolLoad(prefill_requests=4, local_prefill_tokens=10_000),
         PrefillPath.SHORT_OUTPUT),
        # short prompts with short outputs take the rule too (no handoff either way)
        (10, 1, PoolLoad(decode_streams=2), PrefillPath.SHORT_OUTPUT_OFFLOAD),
        # longer outputs, or none given: the prompt's rules (remote on idle pools here)
        (1536, 33, IDLE, PrefillPath.REMOTE),
        (1536, None, IDLE, PrefillPath.REMOTE),
    ],
)
def test_short_outputs_run_whole_on_the_less_loaded_pool(prompt, max_tokens, load, want):
    got = prefill_path(prompt_tokens=prompt, expected_cached_tokens=0, load=load,
                       cfg=SHORT_OUT_CFG, max_tokens=max_tokens)
    _assert_path(got, want, whole_on_prefill=PrefillPath.SHORT_OUTPUT_OFFLOAD)


def test_short_output_rule_off_leaves_the_prompt_rules():
    cfg = SHORT_OUT_CFG.model_copy(update={"short_output_tokens": 0})
    for max_tokens in (1, 16):
        got = prefill_path(prompt_tokens=1536, expected_cached_tokens=0, load=IDLE, cfg=cfg,
                           max_tokens=max_tokens)
        assert got is PrefillPath.REMOTE


def test_short_outputs_alternate_between_the_pools_like_two_colocated_engines():
    """Long prompts with short outputs arriving while earlier ones prefill: each goes whole to the
    pool with less work ahead, so the two engines take turns and none takes the handoff."""
    load = {"prefill": 0, "decode": 0}
    paths = []
    for _ in range(6):
        path = prefill_path(
            prompt_tokens=1536, expected_cached_tokens=0, cfg=SHORT_OUT_CFG, max_tokens=16,
            load=PoolLoad(prefill_tokens=load["prefill"], local_prefill_tokens=load["decode"]),
        )
        load[path.pool] += 1536
        paths.append(path)
    assert paths == [PrefillPath.SHORT_OUTPUT, PrefillPath.SHORT_OUTPUT_OFFLOAD] * 3


SLO = 0.1  # TPOT target 100 ms; a fraction of 0.5 makes the limit 50 ms
SLOW_CFG = CFG.model_copy(update={"slow_decode_tpot_fraction": 0.5})


def _slow(prompt, load, max_tokens=256, cfg=SLOW_CFG, tpot_slo_s=SLO) -> PrefillPath:
    return prefill_path(prompt_tokens=prompt, expected_cached_tokens=0, load=load, cfg=cfg,
                        max_tokens=max_tokens, tpot_slo_s=tpot_slo_s)


@pytest.mark.parametrize(
    ("prompt", "load", "want"),
    [
        # decode's streams at 60 ms per token, nothing on prefill: whole requests go there
        (10, PoolLoad(decode_streams=40, decode_pace_s=0.06), PrefillPath.SLOW_DECODE),
        (1536, PoolLoad(decode_streams=40, decode_pace_s=0.06), PrefillPath.SLOW_DECODE),
        # at or under the limit: the prompt rules (short prompt local, long one remote)
        (10, PoolLoad(decode_streams=40, decode_pace_s=0.05), PrefillPath.SHORT),
        (1536, PoolLoad(decode_streams=40, decode_pace_s=0.03), PrefillPath.REMOTE),
        # the prefill pool's own streams as slow or slower: no gain in moving
        (10, PoolLoad(decode_streams=9, decode_pace_s=0.06, prefill_streams=5,
                      prefill_pace_s=0.06), PrefillPath.SHORT),
        (10, PoolLoad(decode_streams=9, decode_pace_s=0.08, prefill_streams=5,
                      prefill_pace_s=0.07), PrefillPath.SLOW_DECODE),
        # ... or as many streams per replica: a burst alternates instead of herding
        (10, PoolLoad(decode_streams=5, decode_pace_s=0.08, prefill_streams=5),
         PrefillPath.SHORT),
        (10, PoolLoad(decode_streams=9, decode_pace_s=0.08, prefill_streams=5,
                      prefill_replicas=2), PrefillPath.SLOW_DECODE),
        # decode's pace lingers for the meter's window after its last stream ended: no streams,
        # nothing to relieve
        (10, PoolLoad(decode_pace_s=0.08), PrefillPath.SHORT),
        # a full prefill queue takes nothing more
        (10, PoolLoad(decode_pace_s=0.2, prefill_requests=4), PrefillPath.SHORT),
    ],
)
def test_slow_decode_runs_whole_requests_on_the_faster_prefill_pool(prompt, load, want):
    got = _slow(prompt, load)
    _assert_path(got, want, whole_on_prefill=PrefillPath.SLOW_DECODE)


def test_slow_decode_rule_off_without_a_target_or_with_fraction_zero():
    load = PoolLoad(decode_streams=8, decode_pace_s=0.5)
    assert _slow(1536, load, tpot_slo_s=None) is PrefillPath.REMOTE
    assert DisaggregationConfig().slow_decode_tpot_fraction == 0  # off by default
    off = SLOW_CFG.model_copy(update={"slow_decode_tpot_fraction": 0.0})
    assert _slow(1536, load, cfg=off) is PrefillPath.REMOTE
    # a higher fraction raises the limit: 0.9 x 100 ms = 90 ms > 60 ms
    lax = SLOW_CFG.model_copy(update={"slow_decode_tpot_fraction": 0.9})
    assert _slow(1536, PoolLoad(decode_streams=8, decode_pace_s=0.06), cfg=lax) is PrefillPath.REMOTE


def test_a_burst_beside_slow_decode_streams_alternates_between_the_pools():
    """Arrivals faster than the paces move (decode stays slow, prefill's streams have no pace
    yet): the stream counts keep the prefill pool from taking the whole burst."""
    streams = {"prefill": 0, "decode": 1}
    for _ in range(9):
        path = _slow(10, PoolLoad(decode_streams=streams["decode"], decode_pace_s=0.08,
                                  prefill_streams=streams["prefill"]))
        streams[path.pool] += 1
    assert streams == {"prefill": 5, "decode": 5}


def test_short_outputs_keep_their_own_rule_when_decode_is_slow():
    """A short output goes to the pool with less work ahead either way: the slow-decode rule
    is for the streams that would hold a decode slot for long."""
    cfg = SLOW_CFG.model_copy(update={"short_output_tokens": 32})
    load = PoolLoad(decode_streams=3, decode_pace_s=0.2, prefill_requests=1, prefill_tokens=500)
    assert _slow(1536, load, max_tokens=16, cfg=cfg) is PrefillPath.SHORT_OUTPUT
    assert _slow(1536, load, max_tokens=33, cfg=cfg) is PrefillPath.SLOW_DECODE


EITHER_CFG = CFG.model_copy(update={"short_prompts_either_pool": True})


@pytest.mark.parametrize(
    ("prompt", "load", "want"),
    [
        (99, IDLE, PrefillPath.SHORT),  # idle pools: a tie stays on decode
        # decode streaming (2 x 50) against an idle prefill pool: the whole request there
        (99, PoolLoad(decode_streams=2), PrefillPath.SHORT_OFFLOAD),
        # the prefill pool busier: decode
        (99, PoolLoad(decode_streams=2, prefill_requests=1, prefill_tokens=500),
         PrefillPath.SHORT),
        (99, PoolLoad(decode_streams=2, prefill_streams=3), PrefillPath.SHORT),
        # a full prefill queue takes nothing more
        (99, PoolLoad(decode_streams=50, prefill_requests=4), PrefillPath.SHORT),
        # a long enough prompt keeps its own rules
        (100, PoolLoad(decode_streams=2), PrefillPath.REMOTE),
    ],
)
def test_short_prompts_run_whole_on_the_less_loaded_pool(prompt, load, want):
    got = _path(prompt, load=load, cfg=EITHER_CFG)
    _assert_path(got, want, whole_on_prefill=PrefillPath.SHORT_OFFLOAD)


def test_short_prompts_alternate_between_the_pools_like_two_colocated_engines():
    """Short prompts with long outputs (decode-heavy load): whole requests spread over both
    engines by their streams, as colocation spreads them, with no handoff."""
    streams = {"prefill": 0, "decode": 0}
    for _ in range(10):
        path = _path(64, cfg=EITHER_CFG, load=PoolLoad(
            decode_streams=streams["decode"], prefill_streams=streams["prefill"]))
        streams[path.pool] += 1
        assert not path.remote
    assert streams == {"prefill": 5, "decode": 5}


def test_by_default_no_prompt_pays_a_handoff_dearer_than_its_prefill():
    """The default threshold is the handoff's cost: the decode-heavy mix's 128-token prompts
    prefill on a busy decode worker (BENCHMARKS.md, session 13), a prompt as long as the
    handoff's cost goes remote."""
    cfg = DisaggregationConfig()
    assert cfg.min_remote_prompt_tokens == cfg.handoff_cost_tokens
    busy = PoolLoad(decode_streams=60)  # decode streaming: the spill rule keeps prompts off it
    assert _path(128, load=busy, cfg=cfg) is PrefillPath.SHORT
    assert _path(cfg.handoff_cost_tokens - 1, load=busy, cfg=cfg) is PrefillPath.SHORT
    assert _path(cfg.handoff_cost_tokens, load=busy, cfg=cfg) is PrefillPath.REMOTE


def test_zero_threshold_sends_everything_remote():
    cfg = DisaggregationConfig(min_remote_prompt_tokens=0, spill_to_decode=False)
    assert _path(1, cfg=cfg) is PrefillPath.REMOTE


def test_alternating_arrivals_share_prefill_between_the_pools():
    """Long prompts arriving while earlier ones are still prefilling: with an idle decode pool
    the decisions alternate, so both engines prefill (what two colocated engines would do)."""
    load = {"remote": 0, "local": 0}
    paths = []
    for _ in range(6):
        path = _path(1536, load=PoolLoad(
            prefill_requests=load["remote"] // 1536, prefill_tokens=load["remote"],
            local_prefill_tokens=load["local"],
        ))
        load["remote" if path.remote else "local"] += 1536
        paths.append(path.value)
    assert paths == ["remote", "spill"] * 3


PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[3, 4, 5]],
    "remote_engine_id": "prefill-abc",
    "remote_request_id": "cmpl-1-prefill",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "tp_size": 1,
    "remote_num_tokens": 300,
    "remote_blocks_expiry_time": None,
}


def test_handoff_round_trip():
    h = KVHandoff.from_params(PARAMS)
    assert (h.engine_id, h.host, h.port, h.tp_size, h.num_tokens) == (
        "prefill-abc", "127.0.0.1", 5601, 1, 300,
    )
    assert h.num_blocks == 3
    decode = h.decode_request_params()
    assert decode["do_remote_prefill"] is True and decode["do_remote_decode"] is False
    assert decode["remote_block_ids"] == [[3, 4, 5]]
    assert prefill_request_params() == {"do_remote_decode": True}


@pytest.mark.parametrize("missing", ["remote_engine_id", "remote_block_ids", "remote_host"])
def test_handoff_missing_field_is_refused(missing):
    params = {k: v for k, v in PARAMS.items() if k != missing}
    with pytest.raises(HandoffError, match=missing):
        KVHandoff.from_params(params)


def test_no_params_is_refused():
    with pytest.raises(HandoffError):
        KVHandoff.from_params(None)
